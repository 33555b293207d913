"""Browser benchmark: Snake policies in headless Chromium through onnxruntime-web (wasm).

For the MLP and the CNN policy of trainer/policy.py at the sizes `train snake` uses (untrained weights:
speed does not depend on training), it measures:
- session load: fetch + sha256 + InferenceSession.create, as the page reports it;
- inference per move: `policy.act(obs)` (tensor, session.run, argmax) on a live game, N moves;
- sustained play at the "max" speed for a few seconds: moves/s and frames drawn per second (FPS).

    .venv/bin/python bench/bench_web.py [--moves 2000] [--seconds 5] [--threads 1 2]

Needs chromium (/usr/bin/chromium), web/node_modules (make web-deps) and the venv (playwright, torch).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from thrust_remote.play.serve import HEADLESS_CHROMIUM_ARGS as CHROMIUM_ARGS  # noqa: E402
from thrust_remote.play.serve import PlayServer, Site, default_web_dir  # noqa: E402

GRID = 10


def export(kind: str, public: Path) -> dict[str, Any]:
    """Export trainer/policy.py's `kind` policy for 10x10 Snake to public/<kind>.onnx + .json."""
    import torch

    from trainer.policy import build_policy

    obs_dim = 3 * GRID * GRID + 8
    torch.manual_seed(0)
    policy = build_policy(kind, obs_dim, 3, hidden=256, grid_size=GRID).eval()
    path = public / f"{kind}.onnx"
    try:
        from trainer.export import export_onnx
    except ImportError:
        export_onnx = None
    if export_onnx is not None:
        export_onnx(
            policy, path, env_name="snake", grid_size=GRID, action_mode="relative",
            policy_kind=kind, steps=0, final_return=None,
        )  # fmt: skip
        if not path.with_suffix(".json").exists() and (path.parent / "manifest.json").exists():
            (path.parent / "manifest.json").rename(path.with_suffix(".json"))
    else:
        torch.onnx.export(
            policy, (torch.zeros(2, obs_dim),), str(path), input_names=["obs"],
            output_names=["logits", "value"], opset_version=18, dynamo=True, external_data=False,
            dynamic_shapes={"obs": {0: torch.export.Dim("batch")}}, verbose=False,
        )  # fmt: skip
        data = path.read_bytes()
        manifest = {
            "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "opset": 18,
            "env": "snake", "grid_size": GRID, "action_mode": "relative", "obs_dim": obs_dim,
            "n_actions": 3, "policy": kind, "steps": 0,
            "inputs": [{"name": "obs", "shape": ["batch", obs_dim]}],
        }  # fmt: skip
        path.with_suffix(".json").write_text(json.dumps(manifest))
    params = sum(p.numel() for p in policy.parameters())
    return {"kind": kind, "params": params, "bytes": path.stat().st_size}


MEASURE_MOVES = """async (n) => {
  const t = window.thrust;
  t.state.paused = true;
  const p = t.state.policy;
  const g = new t.snake.SnakeGame({ gridSize: p.settings.gridSize,
                                    appleSource: t.snake.uniformApples(t.snake.mulberry32(1)) });
  let obs = g.observation();
  for (let i = 0; i < 50; i++) await p.act(obs);  // warm-up
  const times = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const a = await p.act(obs);
    times.push(performance.now() - t0);
    const r = g.step(a);
    obs = r.terminated || r.truncated ? g.reset() : r.obs;
  }
  t.state.paused = false;
  return times;
}"""


def run_page(context: Any, url: str, moves: int, seconds: float) -> dict[str, float]:
    page = context.new_page()
    try:
        started = time.perf_counter()
        page.goto(url)
        page.wait_for_function("window.thrust !== undefined")
        page.evaluate("window.thrust.ready")
        page_load_s = time.perf_counter() - started
        error = page.evaluate("window.thrust.state.error")
        if error:
            raise RuntimeError(error)
        load = page.evaluate("window.thrust.loadTimings")
        times = sorted(page.evaluate(MEASURE_MOVES, moves))
        before = page.evaluate("[performance.now(), window.thrust.state.moves, window.thrust.state.totalFrames]")
        time.sleep(seconds)
        after = page.evaluate("[performance.now(), window.thrust.state.moves, window.thrust.state.totalFrames]")
        elapsed = (after[0] - before[0]) / 1000
        isolated = page.evaluate("crossOriginIsolated")
    finally:
        page.close()
    return {
        "page_load_ms": page_load_s * 1000,
        "session_ms": load["sessionMs"],
        "sha_ms": load["verifyMs"],
        "infer_mean_ms": statistics.fmean(times),
        "infer_p50_ms": times[len(times) // 2],
        "infer_p95_ms": times[int(len(times) * 0.95)],
        "moves_per_s": (after[1] - before[1]) / elapsed,
        "fps": (after[2] - before[2]) / elapsed,
        "isolated": float(isolated),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=2000, help="moves timed one by one per model")
    parser.add_argument("--seconds", type=float, default=5.0, help="sustained play at max speed")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="ort wasm numThreads to try")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        public = Path(tmp) / "public"
        public.mkdir()
        infos = [export(kind, public) for kind in ("mlp", "cnn")]
        with (
            PlayServer(Site(web_dir=default_web_dir(), public_dir=public), port=0) as server,
            sync_playwright() as pw,
        ):
            context = pw.chromium.launch_persistent_context(
                str(Path(tmp) / "profile"), executable_path=args.chromium, headless=True, args=CHROMIUM_ARGS
            )
            try:
                for info in infos:
                    for threads in args.threads:
                        url = f"{server.url}?model={info['kind']}&speed=max&threads={threads}"
                        result = run_page(context, url, args.moves, args.seconds)
                        rows.append({**info, "threads": threads, **result})
            finally:
                context.close()

    header = (
        f"{'policy':<6} {'params':>8} {'onnx KB':>8} {'thr':>3} {'session ms':>10} {'page load ms':>12} "
        f"{'infer mean/p50/p95 ms':>22} {'moves/s':>8} {'FPS':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        infer = f"{r['infer_mean_ms']:.3f}/{r['infer_p50_ms']:.3f}/{r['infer_p95_ms']:.3f}"
        print(
            f"{r['kind']:<6} {r['params']:>8} {r['bytes'] / 1024:>8.0f} {r['threads']:>3} {r['session_ms']:>10.0f} "
            f"{r['page_load_ms']:>12.0f} {infer:>22} {r['moves_per_s']:>8.0f} {r['fps']:>5.0f}"
        )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
