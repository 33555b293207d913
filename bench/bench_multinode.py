"""One run over several hosts on this machine: two-node vs one-node training throughput, and the launch
overhead of N = 1, 2, 4 nodes. Target: launch time grows by <= 0.3 s per extra node.

    .venv/bin/python bench/bench_multinode.py [--repeat 3] [--total-steps 100000] [--num-envs 64]

Every "host" is an entry of thrust.yaml pointing at one private loopback sshd (tests/conftest.py's) with
a workdir of its own: loopback nodes are allowed when every node is on 127.0.0.1 (docs/architecture.md,
"Several hosts"). The "laptop" is a clone of this repo; every command is the `thrust-remote` console
script, as a user runs it.

1. Throughput of the same built-in trainer run (cartpole, --total-steps, --num-envs, target-return=0
   so it runs to the end), each round interleaved with the order rotated so that load from other
   processes hits every method alike:
   - `thrust-remote train cartpole --host a0 --json --no-fetch` (one host, one process, no torchrun);
   - `thrust-remote train cartpole --host a0 --host a1 --json --no-fetch` (two nodes, torchrun's c10d
     rendezvous, gloo, one process each; --no-fetch on both: see thrust_train);
   - peers without thrust-remote: `python -m trainer.train ...` and `torchrun --standalone
     --nproc-per-node=2 -m trainer.train ...` (the 2-process figure's natural peer).
   Steps/s three ways: steady (the trainer's metrics.jsonl, first to last report: training only),
   trainer (steps / the trainer's own wall, THRUST_DONE: + torch import, process group, export) and
   end to end (steps / the command's wall: + sync, preflight, setup, launch; bench_train_overhead.py
   times the fetch).
2. Launch overhead: `thrust-remote train cartpole --host ... --detach --json`, wall time from the
   command's start to every node launched; cold (fresh workdirs each round: sync from nothing, a new
   venv; the payloads in ~/.cache are shared) and warm (already synced and set up). Each run is
   stopped (`thrust-remote stop RUN`, checked STOPPED) before the next. Then the same launch in this
   process, each stage timed (open sessions, check = sync + preflight, agree, setup, plan, launch,
   index; every remote command; the laptop's and the host's CPU): the stage walls show which grows
   with N, and whether the nodes really overlap (stage wall ~ the slowest node, not the sum).
Every figure: median (min-max) of --repeat rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from conftest import VENV_BIN, SSHServer, _start_sshd  # noqa: E402

from thrust_remote.core.config import load_config  # noqa: E402
from thrust_remote.host.fleet import Fleet  # noqa: E402
from thrust_remote.host.ssh import SSHRunner  # noqa: E402
from thrust_remote.host.ssh import runner as ssh_runner  # noqa: E402
from thrust_remote.run import lifecycle, multinode, stages, vocab  # noqa: E402

NODES = (1, 2, 4)
LONG_STEPS = "100000000"  # a detached launch's run: stopped long before it would end


def fig(values: Sequence[float], unit: str = "", digits: int = 2) -> str:
    """median (min-max), n: a figure and its spread."""
    if not values:
        return "-"
    return (f"{statistics.median(values):.{digits}f}{unit} ({min(values):.{digits}f}-{max(values):.{digits}f}, "
            f"n={len(values)})")


class Lab:
    """The sshd, the project clone with its thrust.yaml, and the CLI run there."""

    def __init__(self, root: Path, cold_rounds: int) -> None:
        self.root = root
        self.server: SSHServer = _start_sshd(root / "sshd")
        self.project = root / "project"
        subprocess.run(["git", "clone", "-q", str(REPO), str(self.project)], check=True)
        subprocess.run(["git", "-C", str(self.project), "remote", "remove", "origin"], check=True)
        names = ["a0", "a1"] + [f"w{n}_{i}" for n in NODES for i in range(n)]
        names += [f"c{r}_{n}_{i}" for r in range(cold_rounds) for n in NODES for i in range(n)]
        self.yaml = self._write_yaml(names)
        self.stop_s: list[float] = []  # `stop RUN` of each detached launch
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("THRUST_")}
        self.env.update({"PYTHONPATH": str(REPO), "COLUMNS": "200", "NO_COLOR": "1"})

    def _write_yaml(self, names: list[str]) -> Path:
        hc = self.server.host_config()
        lines = [f"default_host: {names[0]}", "hosts:"]
        for name in names:
            lines += [f"  {name}:", f"    address: {hc.address}", f"    workdir: {self.root / 'hosts' / name}",
                      f"    python: {hc.python}", f"    identity: {hc.identity}",
                      f"    known_hosts: {hc.known_hosts}", "    connect_timeout: 10"]
        path = self.project / "thrust.yaml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def cli(self, *args: str, timeout: float = 600) -> tuple[float, subprocess.CompletedProcess]:
        t0 = time.perf_counter()
        done = subprocess.run([str(VENV_BIN / "thrust-remote"), *args], capture_output=True, text=True,
                              env=self.env, cwd=self.project, timeout=timeout)
        return time.perf_counter() - t0, done

    def cli_json(self, *args: str) -> tuple[float, dict[str, Any]]:
        seconds, done = self.cli(*args)
        if done.returncode != 0:
            raise SystemExit(f"thrust-remote {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
        return seconds, json.loads(done.stdout)

    def close(self) -> None:
        os.killpg(self.server.wrapper.pid, signal.SIGKILL)  # sshd, its sessions and every job under it
        self.server.wrapper.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


# ------------------------------------------------------------------------------------------ throughput

def trainer_args(steps: int, envs: int) -> list[str]:
    return ["--total-steps", str(steps), "--num-envs", str(envs), "--target-return", "0", "--log-interval", "1"]


def read_metrics(run_dir: Path) -> dict[str, float]:
    """Steady steps/s from metrics.jsonl: first to last report (the trainer's own clock, training only)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    first, last = rows[0], rows[-1]
    span = last["wall_s"] - first["wall_s"]
    return {"steady_sps": (last["step"] - first["step"]) / span if span > 0 else float("nan"),
            "first_report_s": first["wall_s"]}


# steps/s three ways: training only; the trainer process's whole life; the command's
SPS: dict[str, Callable[[dict[str, float]], float]] = {
    "steady": lambda r: r["steady_sps"],
    "trainer wall": lambda r: r["steps"] / r["trainer_wall"],
    "end to end": lambda r: r["steps"] / r["wall"],
}


def thrust_train(lab: Lab, hosts: Sequence[str], steps: int, envs: int) -> dict[str, float]:
    """One `train --json --no-fetch` run; its figures from global rank 0's run dir, whichever node that is:
    torchrun's c10d rendezvous orders the nodes by (local address, pid), not by --node-rank, so on
    loopback rank 0 lands on node 1 about half the time (then no node exports: see BENCHMARKS.md)."""
    sets = [x for k, v in (("total-steps", steps), ("num-envs", envs), ("target-return", 0), ("log-interval", 1))
            for x in ("--set", f"{k}={v}")]
    wall, out = lab.cli_json("train", "cartpole", *[x for h in hosts for x in ("--host", h)], *sets, "--json",
                             "--no-fetch")
    if out["state"] != "FINISHED":
        raise SystemExit(f"the run ended {out['state']}: {out}")
    for node, host in enumerate(hosts):
        run_dir = lab.root / "hosts" / host / ".thrust" / "runs" / out["run_id"]
        done = [x for x in (run_dir / "log").read_text().splitlines() if x.startswith("THRUST_DONE ")]
        if done:
            fin = json.loads(done[-1].split(" ", 1)[1])
            return {"wall": wall, "steps": fin["step"], "trainer_wall": fin["wall_s"], "rank0_node": node,
                    **read_metrics(run_dir), **{f"t_{k}": v for k, v in out["timings"].items()}}
    raise SystemExit(f"run {out['run_id']}: no node's log has THRUST_DONE")


def peer_train(lab: Lab, nproc: int, steps: int, envs: int, round_no: int) -> dict[str, float]:
    run_dir = lab.root / "peer" / f"p{nproc}-{round_no}"
    args = [*trainer_args(steps, envs), "--env", "cartpole", "--run-dir", str(run_dir),
            "--export", str(run_dir / "model.onnx")]
    launcher = ([str(VENV_BIN / "torchrun"), "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1
                else [str(VENV_BIN / "python"), "-u"])
    env = {**lab.env, "PYTHONPATH": str(lab.project)}
    t0 = time.perf_counter()
    done = subprocess.run([*launcher, "-m", "trainer.train", *args], capture_output=True, text=True, env=env,
                          cwd=lab.project, timeout=600)
    wall = time.perf_counter() - t0
    line = next((x for x in done.stdout.splitlines() if x.startswith("THRUST_DONE ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"peer nproc={nproc} exited {done.returncode}:\n{done.stderr[-3000:]}")
    fin = json.loads(line.split(" ", 1)[1])
    return {"wall": wall, "steps": fin["step"], "trainer_wall": fin["wall_s"], **read_metrics(run_dir)}


def throughput(lab: Lab, repeat: int, steps: int, envs: int) -> dict[str, list[dict[str, float]]]:
    methods: dict[str, Callable[[int], dict[str, float]]] = {
        "thrust-remote, 1 host (1 process)": lambda r: thrust_train(lab, ["a0"], steps, envs),
        "python -m trainer.train (peer, 1 process)": lambda r: peer_train(lab, 1, steps, envs, r),
        "thrust-remote, 2 hosts (1 process each)": lambda r: thrust_train(lab, ["a0", "a1"], steps, envs),
        "torchrun --standalone --nproc-per-node=2 (peer)": lambda r: peer_train(lab, 2, steps, envs, r),
    }
    thrust_train(lab, ["a0", "a1"], 2048, 8)  # the one-time sync and venv of both nodes: not counted
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in methods}
    names = list(methods)
    for r in range(repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate who goes first
            rows[name].append(methods[name](r))
            print(f"  round {r + 1}: {name}: {rows[name][-1]['steps'] / rows[name][-1]['wall']:.0f} steps/s "
                  "end to end", file=sys.stderr, flush=True)
    return rows


def show_throughput(rows: dict[str, list[dict[str, float]]], steps: int, envs: int) -> None:
    print(f"\n1. cartpole, --total-steps {steps}, --num-envs {envs} (total over ranks), target-return 0; "
          "steps/s, median (min-max, n)")
    print(f"{'method':48} {'steady (metrics)':>26} {'trainer wall':>26} {'end to end':>26}")
    for name, rs in rows.items():
        cells = [fig([key(r) for r in rs], digits=0) for key in SPS.values()]
        print(f"{name:48} {cells[0]:>26} {cells[1]:>26} {cells[2]:>26}")
    one, two = rows["thrust-remote, 1 host (1 process)"], rows["thrust-remote, 2 hosts (1 process each)"]
    p1, p2 = rows["python -m trainer.train (peer, 1 process)"], rows["torchrun --standalone --nproc-per-node=2 (peer)"]

    def med(rs: list[dict[str, float]], key: Callable[[dict[str, float]], float]) -> float:
        return statistics.median(key(r) for r in rs)

    for label, key in SPS.items():
        print(f"ratio 2 nodes / 1 node, {label}: {med(two, key) / med(one, key):.2f}x "
              f"(peers: torchrun 2 procs / 1 process {med(p2, key) / med(p1, key):.2f}x; "
              f"thrust-remote 2 nodes / torchrun 2 procs {med(two, key) / med(p2, key):.2f}x)")
    print("where the time goes (s, median (min-max, n)):")
    for name, rs in (("1 host", one), ("2 hosts", two)):
        stages = [k for k in rs[0] if k.startswith("t_")]
        parts = {k[2:]: [r[k] for r in rs] for k in stages}
        parts["trainer (THRUST_DONE wall_s)"] = [r["trainer_wall"] for r in rs]
        parts["  of it before the first report"] = [r["first_report_s"] for r in rs]
        parts["rest (CLI start, torchrun + rendezvous, follow)"] = [
            r["wall"] - r["trainer_wall"] - sum(r[k] for k in stages) for r in rs]
        parts["command wall"] = [r["wall"] for r in rs]
        print(f"  {name}: " + "; ".join(f"{k} {fig(v)}" for k, v in parts.items()))
    away = sum(1 for r in two if r["rank0_node"] != 0)
    print(f"2 hosts: global rank 0 ran on node 1 in {away} of {len(two)} runs (no model exported in those)")


# ------------------------------------------------------------------------------------------ launch

def launch_cli(lab: Lab, hosts: Sequence[str]) -> float:
    """Wall of `train --detach --json` over `hosts`; the run is then stopped and checked STOPPED."""
    wall, out = lab.cli_json("train", "cartpole", *[x for h in hosts for x in ("--host", h)], "--set",
                             f"total-steps={LONG_STEPS}", "--set", "target-return=0", "--detach", "--json")
    stop(lab, out["run_id"])
    return wall


def stop(lab: Lab, run_id: str) -> None:
    seconds, done = lab.cli("stop", run_id)
    lab.stop_s.append(seconds)
    if done.returncode != 0:
        raise SystemExit(f"stop {run_id} exited {done.returncode}: {done.stderr[-2000:]}")
    _, st = lab.cli_json("status", run_id, "--json")
    nodes = [n for n in st.get("nodes") or [] if isinstance(n, dict)]  # one node: run.json's, no states
    if st["state"] != "STOPPED" or any(n.get("state") == "RUNNING" for n in nodes):
        raise SystemExit(f"{run_id} is not stopped after stop: {st}")


class Spans:
    """Start and end of every call of the wrapped functions (in any thread), by stage name."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float]] = []
        self.undo: list[tuple[Any, str, Any]] = []

    def wrap(self, module: Any, attr: str, stage: str) -> None:
        fn = getattr(module, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.rows.append((stage, t0, time.perf_counter()))  # list.append: safe across threads

        self.undo.append((module, attr, fn))
        setattr(module, attr, timed)

    def restore(self) -> None:
        for module, attr, fn in reversed(self.undo):
            setattr(module, attr, fn)

    def walls(self) -> dict[str, tuple[float, float]]:
        """stage -> (its wall: first start to last end, the slowest single call)."""
        out: dict[str, tuple[float, float]] = {}
        for stage in dict.fromkeys(s for s, _, _ in self.rows):
            mine = [(a, b) for s, a, b in self.rows if s == stage]
            out[stage] = (max(b for _, b in mine) - min(a for a, _ in mine), max(b - a for a, b in mine))
        return out


def host_cpu(server: SSHServer) -> float:
    """CPU seconds of every process the loopback sshd has reaped (its cutime + cstime): the host side of
    the commands. Read once the sessions are gone; a detached job still running is not in it."""
    deadline = time.monotonic() + 10
    while server.sessions() and time.monotonic() < deadline:
        time.sleep(0.05)  # a closed connection's sshd exits, and is reaped, a moment later
    fields = Path(f"/proc/{server._sshd_pid()}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # stat fields 16, 17


def launch_profiled(lab: Lab, hosts: Sequence[str]) -> dict[str, tuple[float, float]]:
    """The launch of `train --detach` in this process (what cli/train.py calls), each stage timed."""
    config = load_config(lab.yaml, environ={})
    host_cfgs = config.host_list(list(hosts))
    request = vocab.TrainRequest(job=config.job("cartpole"), host=host_cfgs[0], detach=True,
                                 sets=[f"total-steps={LONG_STEPS}", "target-return=0"])
    spans = Spans()
    for module, attr, stage in ((stages, "check", "check (sync+preflight)"), (multinode, "agree", "agree"),
                                (stages, "set_up", "setup"), (multinode, "plan", "plan"),
                                (multinode, "_launch_node", "launch"), (lifecycle, "_launch_one", "launch"),
                                (lifecycle, "_remember", "index"),
                                (ssh_runner, "connect", "  ssh connect (in check)"),
                                (SSHRunner, "run", "  remote commands")):
        spans.wrap(module, attr, stage)
    cpu0, host0 = time.process_time(), host_cpu(lab.server)
    try:
        t0 = time.perf_counter()
        sessions = Fleet(config, runner_for=SSHRunner.from_host).open_all(host_cfgs)
        spans.rows.append(("open sessions", t0, time.perf_counter()))
        try:
            launched = lifecycle.start(config, request, sessions, vocab.NullReporter()).launched
            total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        finally:
            for s in sessions:
                s.close()
    finally:
        spans.restore()
    host = host_cpu(lab.server) - host0
    stop(lab, launched[0].run_id)
    commands = sum(1 for stage, _, _ in spans.rows if stage == "  remote commands") / len(hosts)
    return {**spans.walls(), "total": (total, total), "laptop CPU (all threads)": (cpu, cpu),
            "host CPU (all nodes)": (host, host),
            "remote commands per node": (commands, commands)}


def launch_overhead(lab: Lab, repeat: int) -> tuple[dict[int, list[float]], dict[int, list[float]],
                                                     dict[int, list[dict[str, tuple[float, float]]]]]:
    cold: dict[int, list[float]] = {n: [] for n in NODES}
    warm: dict[int, list[float]] = {n: [] for n in NODES}
    prof: dict[int, list[dict[str, tuple[float, float]]]] = {n: [] for n in NODES}
    for r in range(repeat):
        order = list(NODES[r % 3:] + NODES[:r % 3])
        for n in order:
            cold[n].append(launch_cli(lab, [f"c{r}_{n}_{i}" for i in range(n)]))
            print(f"  launch round {r + 1}: cold N={n} {cold[n][-1]:.2f} s", file=sys.stderr, flush=True)
        if r == 0:  # the warm hosts' own first run: not counted
            for n in NODES:
                launch_cli(lab, [f"w{n}_{i}" for i in range(n)])
        for n in order:
            warm[n].append(launch_cli(lab, [f"w{n}_{i}" for i in range(n)]))
            prof[n].append(launch_profiled(lab, [f"w{n}_{i}" for i in range(n)]))
        print(f"  launch round {r + 1}: warm " + ", ".join(f"N={n} {warm[n][-1]:.2f} s" for n in NODES),
              file=sys.stderr, flush=True)
    return cold, warm, prof


def slope(per_n: dict[int, list[float]]) -> float:
    """Least-squares seconds per extra node over the medians."""
    xs, ys = list(per_n), [statistics.median(v) for v in per_n.values()]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def show_launch(lab: Lab, cold: dict[int, list[float]], warm: dict[int, list[float]],
                prof: dict[int, list[dict[str, tuple[float, float]]]]) -> None:
    floor = [lab.cli("hosts")[0] for _ in range(3)]
    print("\n2. launch overhead: `train cartpole --host ... --detach --json`, command start to every node launched, "
          "s, median (min-max, n)")
    print(f"   (the CLI's own start, `thrust-remote hosts`: {fig(floor)})")
    print(f"{'N':>3} {'cold (fresh workdirs)':>28} {'warm (synced, set up)':>28}")
    for n in NODES:
        print(f"{n:>3} {fig(cold[n]):>28} {fig(warm[n]):>28}")
    s_warm, s_cold = slope(warm), slope(cold)
    two_four = (statistics.median(warm[4]) - statistics.median(warm[2])) / 2
    print(f"growth per extra node (least squares over the medians): warm {s_warm:.3f} s, cold {s_cold:.3f} s; "
          f"warm N=2 to 4 (both over torchrun; N=1 is the one-host path): {two_four:.3f} s")
    print(f"target <= 0.3 s per extra node (warm): {'met' if s_warm <= 0.3 else f'NOT met, by {s_warm - 0.3:.2f} s'}; "
          f"`stop RUN` after each launch (not counted): {fig(lab.stop_s)}")
    print("in-process stage walls (first start to last end over the nodes) [slowest single node], s, median:")
    stages = list(prof[NODES[-1]][0])
    print(f"{'stage':24} " + " ".join(f"{f'N={n}':>16}" for n in NODES) + f" {'per extra node':>15}")
    for stage in stages:  # a stage one host does not run (the plan: N=1) shows "-" there
        walls = {n: [p[stage][0] for p in prof[n] if stage in p] for n in NODES}
        cells = [f"{statistics.median(walls[n]):.3f} [{statistics.median(p[stage][1] for p in prof[n]):.3f}]"
                 if walls[n] else "-" for n in NODES]
        ran = {n: w for n, w in walls.items() if w}
        print(f"{stage:24} " + " ".join(f"{c:>16}" for c in cells) + f" {slope(ran):>15.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds of every figure")
    ap.add_argument("--total-steps", type=int, default=100_000, help="the throughput run's env steps")
    ap.add_argument("--num-envs", type=int, default=64, help="the throughput run's envs (over all ranks)")
    ap.add_argument("--skip", choices=["throughput", "launch"], help="leave one part out")
    args = ap.parse_args()
    started = time.perf_counter()
    lab = Lab(Path(tempfile.mkdtemp(prefix="thrust-bench-multinode-")), args.repeat)
    try:
        rows = throughput(lab, args.repeat, args.total_steps, args.num_envs) if args.skip != "throughput" else None
        launch = launch_overhead(lab, args.repeat) if args.skip != "launch" else None
        load = os.getloadavg()
        print(f"bench_multinode: {os.cpu_count()} cores, loopback sshd, {args.repeat} rounds; "
              f"load avg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {time.perf_counter() - started:.0f} s in all")
        if rows is not None:
            show_throughput(rows, args.total_steps, args.num_envs)
        if launch is not None:
            show_launch(lab, *launch)
    finally:
        lab.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
