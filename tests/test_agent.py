"""The host agent as the host runs it: the zipapp built from thrust_remote/agent (deterministic, by
content hash), its subcommands' argv and JSON (write-file, lease, poll, git-state, missing-modules,
preflight), and payload.run_pyz's upload-and-retry and missing-python error."""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

import thrust_remote.agent
from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import ExitCode, UnreachableError
from thrust_remote.host import payload
from thrust_remote.host.runner import LocalRunner
from thrust_remote.host.session import HostPaths, HostSession

AGENT_DIR = Path(next(iter(thrust_remote.agent.__path__)))


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("agent") / "agent.pyz"
    path.write_bytes(payload.agent().data)
    return path


def agent(pyz: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    # -I: isolated, as on a host where thrust_remote is not importable
    return subprocess.run([sys.executable, "-I", str(pyz), *args], input=stdin, capture_output=True, text=True,
                          timeout=60, check=False)


def answer(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


class HomeRunner(LocalRunner):
    """A LocalRunner whose home is a test directory (where payloads are uploaded)."""

    def __init__(self, home: Path) -> None:
        super().__init__()
        self._test_home = str(home)

    def home(self) -> str:
        return self._test_home


# ------------------------------------------------------------------------------ the zipapp


def test_zipapp_is_deterministic_and_self_contained() -> None:
    first = payload.agent()
    again = payload.build_zipapp("agent", AGENT_DIR, "thrust_agent", "__main__")
    assert first.data == again.data and first.sha256 == again.sha256
    archive = zipfile.ZipFile(io.BytesIO(first.data))
    names = archive.namelist()
    assert names[0] == "__main__.py"
    assert {"thrust_agent/__main__.py", "thrust_agent/supervisor.py", "thrust_agent/lease.py",
            "thrust_agent/poll.py"} <= set(names)
    assert all(archive.getinfo(n).date_time == (1980, 1, 1, 0, 0, 0) for n in names)
    assert first.remote == f"~/.cache/thrust-remote/agent-{first.sha256[:16]}.pyz"


def test_unknown_subcommand_is_a_usage_error_and_xfer_is_imported_lazily(pyz: Path) -> None:
    proc = agent(pyz, "nope")
    assert proc.returncode == 2 and "usage: agent" in proc.stderr
    # `status` works whether or not the xfer module (another engineer's) is in the package
    st = answer(agent(pyz, "status", "--run-dir", "/nonexistent/run-1"))
    assert st["state"] == "LOST" and st["run_id"] == "run-1"


# `agent scalars` alone runs with the job's venv python and site-packages (docs/architecture.md, "The host
# agent"): it may import tensorboard, inside its functions only, so importing the module needs nothing
VENV_ONLY = {"scalars.py": {"tensorboard"}}


def test_agent_imports_only_the_standard_library_and_itself() -> None:
    for source in AGENT_DIR.glob("*.py"):
        tree = ast.parse(source.read_text())
        top_level = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        top_level |= {(n.module or "").split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom)}
        assert not top_level & VENV_ONLY.get(source.name, set()), source.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: the agent's own modules
                    continue
                tops = {(node.module or "").split(".")[0]}
            else:
                continue
            allowed = sys.stdlib_module_names | {"__future__"} | VENV_ONLY.get(source.name, set())
            assert tops <= allowed, (source.name, tops)


# ------------------------------------------------------------------------------ the unpacked copy
# payload_start: a payload's first start unpacks it beside itself, compiled; later starts run from there.
CLI = """import json, sys

def main():
    print(json.dumps({"file": __file__, "first": sys.path[0]}))
    if sys.argv[1:] == ["fail"]:
        raise RuntimeError("asked to fail")
    return 0
"""


def _tiny_payload(tmp_path: Path) -> Path:
    """A payload of one module that says where it was imported from: `tiny-<sha>.pyz`, as on a host."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "__init__.py").write_text("")
    (tmp_path / "src" / "cli.py").write_text(CLI)
    built = payload.build_zipapp("tiny", tmp_path / "src", "tiny", "cli")
    pyz = tmp_path / "cache" / Path(built.remote).name
    pyz.parent.mkdir()
    pyz.write_bytes(built.data)
    return pyz


def _start(pyz: Path, *args: str) -> subprocess.Popen:
    # PYTHONDONTWRITEBYTECODE: the copy is compiled all the same (it is thrust-remote's own cache)
    return subprocess.Popen([sys.executable, "-S", str(pyz), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def _ran(pyz: Path, *args: str) -> tuple[int, dict | None, str]:
    proc = _start(pyz, *args)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, json.loads(out) if out.strip() else None, err


def test_a_payload_runs_from_its_compiled_copy_from_its_second_start_on(tmp_path: Path) -> None:
    pyz = _tiny_payload(tmp_path)
    copy = pyz.with_suffix("")
    assert _ran(pyz)[1] == {"file": str(copy / "tiny" / "cli.py"), "first": str(copy)}
    compiled = copy / "tiny" / "__pycache__" / f"cli.{sys.implementation.cache_tag}.pyc"
    made = compiled.stat().st_mtime_ns
    assert _ran(pyz)[1]["first"] == str(copy)
    assert compiled.stat().st_mtime_ns == made  # read, not compiled again
    rc, _out, err = _ran(pyz, "fail")
    assert rc == 1 and "RuntimeError: asked to fail" in err
    assert f'File "{copy / "tiny" / "cli.py"}"' in err  # the traceback names a file that exists
    assert sorted(p.name for p in pyz.parent.iterdir()) == [copy.name, pyz.name]  # nothing half-made beside it


def test_first_starts_at_once_leave_one_copy_and_no_parts(tmp_path: Path) -> None:
    pyz = _tiny_payload(tmp_path)
    starts = [_start(pyz) for _ in range(8)]  # torchrun's ranks, a Slurm step's nodes
    answers = [json.loads(p.communicate(timeout=60)[0]) for p in starts]
    assert all(p.returncode == 0 for p in starts)
    assert {a["file"].split("/tiny/")[0] for a in answers} <= {str(pyz), str(pyz.with_suffix(""))}
    assert sorted(p.name for p in pyz.parent.iterdir()) == [pyz.with_suffix("").name, pyz.name]


def test_a_copy_that_cannot_be_made_runs_the_zip_and_a_cut_unpacking_is_cleared_later(tmp_path: Path) -> None:
    from thrust_remote.host import payload_start

    pyz = _tiny_payload(tmp_path)
    blocker = pyz.with_suffix("")
    blocker.write_text("not a directory")  # where the copy goes: it cannot be made
    rc, out, _err = _ran(pyz)
    assert rc == 0 and out == {"file": str(pyz / "tiny" / "cli.py"), "first": str(pyz)}  # the zip, as before
    assert sorted(p.name for p in pyz.parent.iterdir()) == [blocker.name, pyz.name]
    blocker.unlink()
    cut = pyz.parent / f"{blocker.name}{payload_start.PART}cut"  # a first start killed while unpacking
    fresh = pyz.parent / f"{blocker.name}{payload_start.PART}now"  # one unpacking this moment
    for part in (cut, fresh):
        (part / "tiny").mkdir(parents=True)
    old = time.time() - payload_start.STALE_PART_S - 60
    os.utime(cut, (old, old))
    assert payload_start.unpacked(str(pyz)) == str(blocker)  # in this process: what a first start does
    assert sorted(p.name for p in pyz.parent.iterdir()) == sorted([blocker.name, fresh.name, pyz.name])
    assert payload_start.unpacked(str(pyz)) == str(blocker)  # made: found, not made again
    assert payload_start.unpacked(str(tmp_path / "cache" / "no-such.pyz")) is None  # no zip to unpack
    assert payload_start.unpacked(str(tmp_path / "src" / "cli.py")) is None  # not a payload
    assert _ran(pyz)[1]["first"] == str(blocker)


# ------------------------------------------------------------------------------ write-file


def test_write_file_is_atomic_owner_only_and_makes_parents(pyz: Path, tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "secret.json"
    proc = agent(pyz, "write-file", str(target), stdin='{"token": "x"}')
    assert proc.returncode == 0, proc.stderr
    got = answer(proc)
    assert got["path"] == str(target) and got["bytes"] == 14 and len(got["sha256"]) == 64
    assert target.read_text() == '{"token": "x"}'
    assert (target.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["secret.json"]  # no temporary left behind


# ------------------------------------------------------------------------------ lease


def test_lease_create_is_exclusive_and_renew_release_need_our_token(pyz: Path, tmp_path: Path) -> None:
    lease = str(tmp_path / "studies" / "s.driver.json")
    assert answer(agent(pyz, "lease", "read", lease)) == {"present": False, "text": "", "lease": {}}
    ours = json.dumps({"hostname": "a", "pid": 1, "heartbeat": 1.0, "token": "tok-a"})
    made = agent(pyz, "lease", "create", lease, stdin=ours)
    assert made.returncode == 0 and answer(made) == {"created": True}
    again = agent(pyz, "lease", "create", lease, stdin="other")
    assert again.returncode == 3 and answer(again) == {"created": False}
    read = answer(agent(pyz, "lease", "read", lease))
    assert read["present"] and read["lease"]["token"] == "tok-a" and read["text"] == ours

    theirs = agent(pyz, "lease", "renew", lease, "--token", "tok-b", stdin="stolen")
    assert theirs.returncode == 3 and answer(theirs) == {"renewed": False}
    assert Path(lease).read_text() == ours
    renewed = json.dumps({"hostname": "a", "pid": 1, "heartbeat": 2.0, "token": "tok-a"})
    assert answer(agent(pyz, "lease", "renew", lease, "--token", "tok-a", stdin=renewed)) == {"renewed": True}
    assert json.loads(Path(lease).read_text())["heartbeat"] == 2.0

    assert answer(agent(pyz, "lease", "release", lease, "--token", "tok-b")) == {"released": False}
    assert Path(lease).exists()
    assert answer(agent(pyz, "lease", "release", lease, "--token", "tok-a")) == {"released": True}
    assert not Path(lease).exists()


def test_lease_read_of_junk_counts_as_present_but_empty(pyz: Path, tmp_path: Path) -> None:
    lease = tmp_path / "s.driver.json"
    lease.write_text("not json")
    assert answer(agent(pyz, "lease", "read", str(lease))) == {"present": True, "text": "not json", "lease": {}}


def test_lease_stop_writes_the_stop_file(pyz: Path, tmp_path: Path) -> None:
    stop = tmp_path / "studies" / "s.stop"
    assert answer(agent(pyz, "lease", "stop", str(stop))) == {"path": str(stop)}
    assert stop.read_text().startswith(time.strftime("%Y-"))


# ------------------------------------------------------------------------------ poll


def _run_dir(root: Path, name: str, *, metrics: str = "", exit_code: int | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": name, "slot": "gpu0", "marker": "m"}))
    (d / "metrics.jsonl").write_text(metrics)
    (d / "log").write_text("line 1\nboom\n")
    if exit_code is not None:
        (d / "exit_code").write_text(json.dumps({"exit_code": exit_code, "ended_at": "now"}))
    return d


def test_poll_answers_state_and_whole_new_metric_lines(pyz: Path, tmp_path: Path) -> None:
    done = _run_dir(tmp_path, "t1", metrics='{"step": 1}\n{"step": 2}\n{"step": 3', exit_code=0)
    failed = _run_dir(tmp_path, "t2", exit_code=3)
    missing = tmp_path / "t3"
    request = [[str(done), 0], [str(failed), 0], [str(missing), 7]]
    started = time.monotonic()
    got = answer(agent(pyz, "poll", "--runs", json.dumps(request), "--stop-file", str(tmp_path / "stop"),
                       "--wait", "20"))
    assert time.monotonic() - started < 10  # a run has ended: no waiting
    assert got["stop"] is False
    one = got["runs"][str(done)]
    assert one["state"] == "FINISHED" and one["exit_code"] == 0 and one["slot"] == "gpu0"
    assert one["data"] == '{"step": 1}\n{"step": 2}\n' and one["offset"] == 24 and one["more"] is False
    assert got["runs"][str(failed)]["state"] == "FAILED" and got["runs"][str(failed)]["log_tail"] == "line 1\nboom\n"
    assert got["runs"][str(missing)] == {"state": "MISSING", "data": "", "offset": 7, "more": False}
    later = answer(agent(pyz, "poll", "--runs", json.dumps([[str(done), 24]]), "--stop-file", "/nonexistent"))
    assert later["runs"][str(done)]["data"] == "" and later["runs"][str(done)]["offset"] == 24


def test_poll_returns_early_on_the_stop_file(pyz: Path, tmp_path: Path) -> None:
    stop = tmp_path / "s.stop"
    stop.write_text("now")
    started = time.monotonic()
    got = answer(agent(pyz, "poll", "--runs", "[]", "--stop-file", str(stop), "--wait", "30"))
    assert got == {"runs": {}, "stop": True} and time.monotonic() - started < 10


# ------------------------------------------------------------------------------ probes and checkout


def test_missing_modules_and_preflight_miss(pyz: Path, tmp_path: Path) -> None:
    assert answer(agent(pyz, "missing-modules", "json", "surely_not_a_module_x")) == ["surely_not_a_module_x"]
    miss = answer(agent(pyz, "preflight", "--cache-dir", str(tmp_path), "--extra", "job"))["miss"]
    assert miss.startswith(str(tmp_path / "preflight-")) and miss.endswith(".json")
    Path(miss).write_text(json.dumps({"host": "h", "facts": {}, "checks": []}))
    assert answer(agent(pyz, "preflight", "--cache-dir", str(tmp_path), "--extra", "job"))["host"] == "h"
    other = answer(agent(pyz, "preflight", "--cache-dir", str(tmp_path), "--extra", "another job"))
    assert other["miss"] != miss


def test_a_kept_preflight_report_is_keyed_by_what_it_depends_on(monkeypatch, tmp_path: Path) -> None:
    """In this process (the zipapp's own run is above): the same job on the same python finds the report
    kept for it, whole; another job, or other GPUs made visible (CUDA_VISIBLE_DEVICES: the GPUs the report
    lists), is a miss; the versions and modules a job's setup asks about are the installed ones."""
    from importlib.metadata import version

    from thrust_remote.agent import probe

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    miss = json.loads(probe.preflight(str(tmp_path), "job"))["miss"]
    Path(miss).write_text('{"host": "h", "checks": []}')
    assert json.loads(probe.preflight(str(tmp_path), "job")) == {"host": "h", "checks": []}
    assert "miss" in json.loads(probe.preflight(str(tmp_path), "another job"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert json.loads(probe.preflight(str(tmp_path), "job"))["miss"] != miss
    assert probe.dist_versions(["pytest", "surely-no-such-dist"]) == {"pytest": version("pytest"),
                                                                      "surely-no-such-dist": None}
    assert probe.missing_modules(["json", "surely_not_a_module_x"]) == ["surely_not_a_module_x"]


def test_git_state_of_a_directory_that_is_no_repository(pyz: Path, tmp_path: Path) -> None:
    got = answer(agent(pyz, "git-state", "--workdir", str(tmp_path), "--commit", "0" * 40))
    free = got.pop("free_bytes")  # the room there (the refusal of a tree the disk cannot take)
    assert got == {"git": True, "repo": False, "entries": 0, "some": []} and isinstance(free, int) and free > 0
    (tmp_path / "notes.txt").write_text("a user's file")  # what a first sync must not overwrite: named
    got = answer(agent(pyz, "git-state", "--workdir", str(tmp_path), "--commit", "0" * 40))
    assert (got["entries"], got["some"]) == (1, ["notes.txt"])


# ------------------------------------------------------------------------------ run_pyz and HostSession


def test_run_pyz_uploads_when_the_host_lacks_it_then_reuses_it(tmp_path: Path) -> None:
    runner = HomeRunner(tmp_path)
    host = HostConfig(name="local", python=sys.executable)
    result, uploaded = payload.run_pyz(runner, host, payload.agent(), ["missing-modules", "json"])
    assert uploaded and result.ok and json.loads(result.stdout) == []
    remote = tmp_path / payload.agent().remote.removeprefix("~/")
    assert remote.is_file()
    result, uploaded = payload.run_pyz(runner, host, payload.agent(), ["missing-modules", "json"])
    assert not uploaded and result.ok


def test_run_pyz_streams_and_still_recognises_a_missing_file(tmp_path: Path) -> None:
    runner = HomeRunner(tmp_path)
    host = HostConfig(name="local", python=sys.executable)
    chunks: list[tuple[str, bytes]] = []
    result, uploaded = payload.run_pyz(runner, host, payload.agent(), ["list", "--runs-dir", str(tmp_path / "r")],
                                       on_bytes=lambda n, c: chunks.append((n, c)))
    assert uploaded and result.ok
    assert json.loads(b"".join(c for n, c in chunks if n == "out")) == []


def test_a_missing_python_is_exit_69_naming_it(tmp_path: Path) -> None:
    runner = HomeRunner(tmp_path)
    host = HostConfig(name="local", python="/nonexistent/bin/python3")
    with pytest.raises(UnreachableError) as err:
        payload.run_pyz(runner, host, payload.agent(), ["list", "--runs-dir", str(tmp_path)])
    assert err.value.exit_code == ExitCode.UNAVAILABLE
    assert "python '/nonexistent/bin/python3' not found" in err.value.message
    # the hint offers what doctor would find there (item 12 of issue 53), never doctor itself, which
    # stops at the same python: the python with torch, or how to list the host's
    hint = err.value.hint or ""
    assert "hosts.local" in hint and "set `python:" in hint and "doctor" not in hint, hint


def test_host_session_agent_argv_and_json(tmp_path: Path) -> None:
    runner = HomeRunner(tmp_path)
    session = HostSession(runner, HostConfig(name="local", python="~/py/bin/python"), HostPaths(str(tmp_path)))
    argv = session.agent_argv("status", "--run-dir", "/x")
    # a stdlib-only subcommand runs without site-packages (-S); one that looks for torch does not
    assert argv == [f"{tmp_path}/py/bin/python", "-S", str(tmp_path / payload.agent().remote.removeprefix("~/")),
                    "status", "--run-dir", "/x"]
    assert "-S" not in session.agent_argv("missing-modules", "torch")
    real = HostSession(runner, HostConfig(name="local", python=sys.executable), HostPaths(str(tmp_path)))
    assert real.agent_json("runs", "list", "--runs-dir", str(tmp_path / "none")) == []
    assert os.path.exists(argv[2])  # uploaded on the way


def test_a_follower_whose_session_ended_stops_even_when_the_log_is_silent(pyz: Path, tmp_path: Path) -> None:
    """`logs --follow` of a quiet run (a queued one, a job that prints nothing) whose SSH session went away
    (its parent gone) ends by itself, instead of waiting on the host until the run prints something."""
    gate = tmp_path / "go"
    started = agent(pyz, "launch", "--run-dir", str(tmp_path / "runs" / "r1"), "--cwd", str(tmp_path), "--lock",
                    str(tmp_path / "launch.lock"), "--marker", "m-r1", "--",
                    "sh", "-c", f'while [ ! -e {gate} ]; do sleep 0.1; done')
    assert started.returncode == 0, started.stderr
    session = subprocess.Popen(["sh", "-c", f'{sys.executable} -I {pyz} logs --run-dir {tmp_path / "runs" / "r1"} '
                                            '--follow & echo $!; wait'], stdout=subprocess.PIPE, text=True)
    follower = int(session.stdout.readline())
    try:
        session.kill()  # the session's shell ends: the follower is orphaned
        session.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _running(follower):
            time.sleep(0.05)
        assert not _running(follower), "the orphaned follower is still there"
    finally:
        gate.touch()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _old_python() -> str | None:
    """pyenv's 3.8 on these machines: the oldest python the agent promises to run on."""
    found = shutil.which("python3.8")
    if found is None:
        return None
    probe = subprocess.run([found, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True,
                           env={**os.environ, "PYENV_VERSION": "3.8.18"}, check=False)
    return found if probe.returncode == 0 and "(3, 8)" in probe.stdout else None


@pytest.mark.parametrize("ended", ["exit record", "lost"])
def test_list_files_of_an_ended_run_leaves_out_a_later_runs_files_on_the_oldest_python(
        pyz: Path, tmp_path: Path, ended: str) -> None:
    """A run's files under the shared checkout are the ones written while it went: up to its exit record,
    or, for a LOST run (no record: its host restarted), up to its log's last write. Before, a LOST run had
    no end, so `fetch`/`resume` took a later run's checkpoint for its own. Run with python 3.8 when this
    machine has it (the agent's promise: `isinstance(x, int | float)` passed every test here and failed
    there)."""
    cwd, run_dir = tmp_path / "checkout", tmp_path / "checkout" / ".thrust" / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (cwd / "ckpt").mkdir()
    now = time.time()
    (run_dir / "run.json").write_text(json.dumps({"cwd": str(cwd), "started_ts": now - 100, "pid": 2 ** 22 + 7,
                                                  "pid_start": 1}))
    (run_dir / "log").write_text("its last line\n")
    os.utime(run_dir / "log", (now - 50, now - 50))
    if ended == "exit record":
        (run_dir / "exit_code").write_text(json.dumps({"exit_code": 0, "ended_ts": now - 50}))
    for name, age in (("ckpt-1.pt", 60), ("ckpt-2.pt", 10)):  # its own; a later run's
        (cwd / "ckpt" / name).write_bytes(b"x")
        os.utime(cwd / "ckpt" / name, (now - age, now - age))
    python = _old_python() or sys.executable
    proc = subprocess.run([python, "-I", str(pyz), "list-files", "--run-dir", str(run_dir), "--", "ckpt/*.pt"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "PYENV_VERSION": "3.8.18"})
    assert proc.returncode == 0, proc.stderr
    got = answer(proc)
    assert [f["path"] for f in got["files"]] == ["ckpt/ckpt-1.pt"] and got["newer"] == 1
