"""`doctor --host H` of a Slurm cluster's login node: what only the scheduler and a compute node can say
(docs/architecture.md, "Slurm clusters").

    agent slurm-check --workdir W [--partition P] [--account A] [--time T] [--option OPT]...
    agent slurm-probe --file F          (run by srun on a compute node)

`slurm-check` answers a JSON list of rows `{id, title, status, detail, fix}` (doctor's Check): the
partition (sinfo: up, its nodes, their GPUs as gres, its time limit), the host's time against it, the
job's options as sbatch would take them (`sbatch --test-only`: the account and QOS accepted, nothing
submitted), and one short `srun` on one node: a file written here read back there (the workdir is
shared), and the `python:` with its torch (and CUDA on a partition with GPUs) as a compute node sees
them. Each probe has a deadline and never raises: a failure is a row with its fix.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import secrets
import subprocess
import sys

from .loginenv import LOGIN_ENV

CALL_S = 30.0
JOB_FRAMEWORK = "torch"
SRUN_WAIT_S = 20  # srun --immediate: a cluster with no free node now says so rather than queue the check


def _run(argv: list[str], timeout: float = CALL_S) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]}: no answer within {timeout:g} s"
    return done.returncode, (done.stdout + done.stderr).strip()


def _row(cid: str, title: str, status: str, detail: str, fix: str | None = None) -> dict:
    return {"id": cid, "title": title, "status": status, "detail": detail, "fix": fix}


def minutes(text: str) -> float | None:
    """Slurm's time (MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]) in minutes; None for UNLIMITED or unreadable."""
    m = re.match(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$", text.strip())
    if not m:
        return None
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return days * 1440 + (a or 0) * 60 + (b or 0) + (c or 0) / 60
    if c is not None:  # HH:MM:SS
        return a * 60 + b + c / 60
    if b is not None:  # MM:SS
        return a + b / 60
    return float(a)


SINFO = ["sinfo", "--noheader", "--format=%P|%a|%l|%D|%G"]
COMMANDS_ROW = "slurm-commands"  # Slurm's own commands fail: every other row would only repeat it
NO_PARTITION = "partitions"  # a row's key when the partition asked is not the cluster's: the ones it has
# where the laptop puts the key doctor names (it knows the host's name and its thrust.yaml)
LOGIN_SHELL_FIX = "login_shell"


def commands_row(said: str) -> dict:
    """sinfo failed in the agent's environment: is Slurm there in the login environment (/etc/profile,
    ~/.profile), where a plain `sh -c` never looks? Then the fix is the host's `login_shell: true`."""
    code, out = _run(["sh", "-c", LOGIN_ENV + 'exec "$@"', "sh", *SINFO])
    if code == 0:
        return _row(COMMANDS_ROW, "Slurm's commands", "fail",
                    f"sinfo fails in the plain `sh -c` that commands over SSH get ({said[-200:]}), but works in "
                    "a login shell (/etc/profile, ~/.profile): Slurm is set up only by the login environment",
                    LOGIN_SHELL_FIX)
    return _row(COMMANDS_ROW, "Slurm's commands", "fail", f"sinfo failed: {said[-300:]}; in a login shell: "
                f"{out[-200:]}", "make `sinfo` work on this host over SSH (SLURM_CONF, the munge daemon); in "
                "a login shell it fails too, so ask the cluster's admins how Slurm is set up")


def partition_rows(partition: str | None, time_limit: str | None) -> tuple[list[dict], bool]:
    """The partition's rows, and whether it has GPUs."""
    code, out = _run(SINFO)
    if code != 0:
        return [commands_row(out)], False
    parts = {}
    for line in out.splitlines():
        name, avail, limit, nodes, gres = (line.split("|") + [""] * 5)[:5]
        parts[name.rstrip("*")] = (name.endswith("*"), avail, limit, nodes, gres)
    chosen = partition or next((n for n, p in parts.items() if p[0]), None)
    if chosen not in parts:
        row = _row("slurm-partition", "Slurm partition", "fail",
                   f"no partition {chosen!r}; this cluster has {', '.join(sorted(parts)) or 'none'}",
                   "set partition: to one of them")
        return [{**row, NO_PARTITION: sorted(parts)}], False
    _, avail, limit, nodes, gres = parts[chosen]
    gpus = "gpu" in gres
    rows = [_row("slurm-partition", "Slurm partition", "ok" if avail == "up" else "fail",
                 f"{chosen}{'' if partition else ' (the default)'}: {avail}, {nodes} node(s), GPUs: "
                 f"{gres if gpus else 'none'}, time limit {limit}",
                 None if avail == "up" else "ask the cluster's admins, or choose another partition:")]
    asked, most = minutes(time_limit) if time_limit else None, minutes(limit)
    if time_limit and asked is not None and most is not None and asked > most:
        rows.append(_row("slurm-time", "time limit", "fail", f"time: {time_limit} is over {chosen}'s {limit}",
                         f"set time: to {limit} or less"))
    else:
        rows.append(_row("slurm-time", "time limit", "ok",
                         f"{time_limit or 'the partition default'} (partition limit {limit})"))
    return rows, gpus


def submit_row(options: list[str]) -> dict:
    """The job's options as sbatch would take them, nothing submitted (`--test-only`)."""
    code, out = _run(["sbatch", "--test-only", *options, "--wrap=true"])
    if code == 0:
        return _row("slurm-submit", "sbatch accepts the job", "ok", out.splitlines()[-1][:300] if out else "accepted")
    return _row("slurm-submit", "sbatch accepts the job", "fail", out[-400:],
                "fix the host's account:, partition:, time: or sbatch: (qos...) in thrust.yaml as Slurm says")


def node_rows(workdir: str, options: list[str], gpus: bool) -> list[dict]:
    """One srun on one node: the shared workdir, and python/torch there."""
    token = secrets.token_hex(8)
    probe_dir = os.path.join(os.path.expanduser(workdir), ".thrust", "slurm")
    os.makedirs(probe_dir, mode=0o700, exist_ok=True)
    path = os.path.join(probe_dir, f"shared-{token}")
    with open(path, "w") as fh:
        fh.write(token)
    try:
        argv = ["srun", f"--immediate={SRUN_WAIT_S}", "--nodes=1", "--ntasks=1", *options,
                sys.executable, os.path.abspath(sys.argv[0]), "slurm-probe", "--file", path]
        code, out = _run(argv, timeout=SRUN_WAIT_S + CALL_S)
    finally:
        os.unlink(path)
    answer = None
    for line in reversed(out.splitlines()):
        try:
            answer = json.loads(line)
            break
        except ValueError:
            continue
    if not isinstance(answer, dict):
        busy = "Unable to allocate" in out or "Immediate" in out or code == 124  # no node free within the wait
        return [_row("slurm-node", "a compute node runs the job's python", "warn" if busy else "fail",
                     f"srun on one node did not answer: {out[-300:]}",
                     "try again when a node is free" if busy else
                     "python: must be a path the compute nodes have (a shared venv, a module's python), and "
                     "~/.cache/thrust-remote (where the agent runs from) on a filesystem they mount")]
    node = answer.get("hostname")
    rows = [_row("slurm-shared", "workdir shared with the compute nodes",
                 "ok" if answer.get("token") == token else "fail",
                 f"{node} read the file written here" if answer.get("token") == token else
                 f"{node} cannot read {path}: {answer.get('error')}",
                 None if answer.get("token") == token else "set workdir: to a directory the compute nodes mount "
                 "(home, /scratch, the project space)")]
    torch = answer.get("torch")
    rows.append(_row("slurm-python", "python and torch on a compute node", "ok" if torch else "fail",
                     f"{node}: python {answer.get('python')}, torch {torch or answer.get('torch_error')}",
                     None if torch else "install torch for that python (pip install torch), or point python: at "
                     "one that has it on the compute nodes"))
    if gpus:
        cuda = answer.get("cuda")
        rows.append(_row("slurm-cuda", "CUDA on a GPU node", "ok" if cuda else "warn",
                         f"{node}: torch.cuda.is_available() is {cuda} (the check's srun asked no GPU)",
                         None if cuda else "a torch built for CUDA sees the GPUs a job asks for (train --gpus N)"))
    return rows


def probe(path: str) -> dict:
    """On the compute node: the file read back, python, torch (imported here, where the job would)."""
    import platform
    import socket

    out: dict = {"hostname": socket.gethostname(), "python": platform.python_version()}
    try:
        with open(path) as fh:
            out["token"] = fh.read().strip()
    except OSError as exc:
        out["error"] = str(exc)
    try:
        # Whether torch imports on this node is the question (an ImportError is the answer), as envcheck's
        # torch probe asks it in a child; by name, so the agent itself never depends on torch.
        torch = importlib.import_module(JOB_FRAMEWORK)
        out["torch"] = torch.__version__
        out["cuda"] = bool(torch.cuda.is_available())
    except Exception as exc:  # noqa: BLE001 - whatever import torch raises is the answer
        out["torch_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("slurm-check")
    p.add_argument("--workdir", required=True)
    p.add_argument("--partition", default="")
    p.add_argument("--time", default="")
    p.add_argument("--option", action="append", default=[], help="an sbatch option of the job (repeated)")
    p.add_argument("--partition-only", action="store_true", help="sinfo's rows only: train's check before the sync")
    p = sub.add_parser("slurm-probe")
    p.add_argument("--file", required=True)
    args = parser.parse_args(argv)
    if args.cmd == "slurm-probe":
        print(json.dumps(probe(args.file)))
        return 0
    rows, gpus = partition_rows(args.partition or None, args.time or None)
    if args.partition_only:
        print(json.dumps(rows))
        return 0
    if rows[0]["id"] == COMMANDS_ROW:  # sbatch would fail alike: not for the reason its row names
        print(json.dumps([*rows, *(_row(cid, title, "skip", "needs Slurm's commands (the row above)") for cid, title in
                                   (("slurm-submit", "sbatch accepts the job"),
                                    ("slurm-node", "a compute node runs the job's python")))]))
        return 0
    rows.append(submit_row(args.option))
    # the check's own srun: two minutes, no warning signal; the job's other options as given
    # (sbatch's own --signal and --no-requeue, which srun does not take, left out)
    quick = [o for o in args.option if not o.startswith(("--signal=", "--time=", "--no-requeue"))] + ["--time=2"]
    if rows[0]["status"] == "ok":
        rows += node_rows(args.workdir, quick, gpus)
    else:  # no partition to run on: the node's rows would only repeat sinfo's answer, slowly
        rows.append(_row("slurm-node", "a compute node runs the job's python", "skip", "needs a partition that is up"))
    print(json.dumps(rows))
    return 0
