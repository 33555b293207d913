"""What a new user sees first (issue 53, item 17): `doctor` on a project without a cargo job spares a
terminal the tch-rs rows, `init`'s thrust.yaml shows (commented) the keys a real project reaches for,
and `--json` keeps the `›` stages on stderr while stdout carries the one JSON object."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

from helpers import FAKE_FAST, FAKE_JOB, commit, fake_files, git_init

from envcheck.checks import CHECK_IDS
from thrust_remote.cli.init import TEMPLATE
from thrust_remote.core.config import load_config, parse_config_text

# a terminal, as rich sees one (FORCE_COLOR, read when a process makes its consoles: hence cli.process);
# NO_COLOR keeps the words plain
TERMINAL = {"FORCE_COLOR": "1", "NO_COLOR": "1", "COLUMNS": "160"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# the rows only a tch-rs (cargo) job has anything to say about (envcheck.checks.CARGO_ONLY)
CARGO_ONLY = ("rust-toolchain", "libtorch-use-pytorch", "ld-library-path", "ld-preload", "rustflags-no-as-needed",
              "stale-build", "release-build", "cuda-flag", "binary-links-cuda", "build-rs-no-as-needed")


def _rows(stdout: str) -> set[str]:
    """The check ids of a doctor table's rows."""
    cells = (line.split("│") for line in ANSI.sub("", stdout).splitlines())
    return {parts[2].strip() for parts in cells if len(parts) > 3} & set(CHECK_IDS)


def _config(path: Path, jobs: str = "") -> Path:
    path.write_text(f"hosts:\n  local:\n    python: {sys.executable}\n    workdir: {path.parent}\n" + jobs)
    return path


# ---------------------------------------------------------------------------------------------- doctor


def test_doctor_on_a_terminal_leaves_out_the_cargo_rows_of_a_python_project(cli, tmp_path: Path) -> None:
    cfg = _config(tmp_path / "thrust.yaml")
    shown = cli.process("--config", str(cfg), "doctor", env=TERMINAL)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    rows = _rows(shown.stdout)
    assert rows == set(CHECK_IDS) - set(CARGO_ONLY), rows
    note = ANSI.sub("", shown.stdout).splitlines()[-1]
    assert note.startswith(f"{len(CARGO_ONLY)} tch-rs (cargo) checks left out (no cargo job in "), note
    # the command the note names works as printed and shows every row
    every = shlex.split(note.split("every check: ", 1)[1])
    assert every[0] == "thrust-remote" and "--all" in every
    everything = cli.process(*every[1:], env=TERMINAL)
    assert everything.returncode == 0, everything.stderr
    assert _rows(everything.stdout) == set(CHECK_IDS)
    assert "left out" not in everything.stdout
    # --json stays complete: every id, in order (the ids are envcheck's contract)
    doc = json.loads(cli.process("--config", str(cfg), "doctor", "--json", env=TERMINAL).stdout)
    assert [c["id"] for c in doc["checks"]] == list(CHECK_IDS)


def test_doctor_shows_the_cargo_rows_when_the_project_or_the_job_is_cargo(cli, tmp_path: Path) -> None:
    cargo = "jobs:\n  rs:\n    kind: cargo\n    example: train_probe\n  ppo:\n    script: train.py\n"
    cfg = _config(tmp_path / "thrust.yaml", cargo)
    shown = cli.process("--config", str(cfg), "doctor", env=TERMINAL)
    assert set(CARGO_ONLY) <= _rows(shown.stdout), shown.stdout
    assert "left out" not in shown.stdout
    # asked about a python job of that project: its cargo rows say nothing, so they are left out, and why
    ppo = cli.process("--config", str(cfg), "doctor", "--job", "ppo", env=TERMINAL)
    assert not set(CARGO_ONLY) & _rows(ppo.stdout), ppo.stdout
    assert "checks left out ('ppo' is a python job); every check: thrust-remote" in ANSI.sub("", ppo.stdout)


# ------------------------------------------------------------------------------------------------ init


def test_init_shows_files_setup_shared_a_slurm_host_and_the_run_bounds_commented(cli, tmp_path: Path) -> None:
    made = cli("init", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    written = (tmp_path / "thrust.yaml").read_text()
    for key in ("scheduler: slurm", "partition:", "files:", "setup:", "shared:", "max_duration:", "idle_stop:"):
        assert any(line.lstrip().startswith("#") and key in line for line in written.splitlines()), key
    # commented: the file loads as before, with only `local`
    cfg = load_config(tmp_path / "thrust.yaml", environ={})
    assert [h.name for h in cfg.host_list([])] == ["local"] and "ppo" not in cfg.jobs
    # and each example is a working entry once its `# ` goes
    live = "\n".join(re.sub(r"^(\s+)# ", r"\1", line) for line in TEMPLATE.splitlines())
    cfg = parse_config_text(live, tmp_path / "thrust.yaml")
    hpc, ppo = cfg.host("hpc"), cfg.job("ppo")
    assert hpc.slurm is not None and hpc.slurm.partition == "gpu"
    assert ppo.files and ppo.setup and ppo.shared
    assert ppo.max_duration == 8 * 3600 and ppo.idle_stop is not None


# ------------------------------------------------------------------------------------------------ --json


def test_json_keeps_the_stage_lines_on_stderr(cli, tmp_path: Path) -> None:
    proj = git_init(tmp_path / "p")
    for name, text in fake_files().items():
        (proj / name).parent.mkdir(parents=True, exist_ok=True)
        (proj / name).write_text(text)
    (proj / "thrust.yaml").write_text("jobs:\n" + FAKE_JOB)
    commit(proj, "a project with the fake job")
    trained = cli("train", "fake", "--host", "local", *FAKE_FAST, "--json", cwd=proj)
    assert trained.returncode == 0, trained.stderr
    run_id = json.loads(trained.stdout)["run_id"]  # stdout is the one JSON object
    stages = [line for line in trained.stderr.splitlines() if line.startswith("› ")]
    assert f"› launching run {run_id}" in stages and "› fetching the model" in stages, trained.stderr
    for argv in (["logs", run_id, "--follow", "--json"], ["watch", run_id, "--json"]):
        again = cli(*argv, cwd=proj)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["run_id"] == run_id
        assert "› fetching the model" in again.stderr.splitlines(), (argv, again.stderr)
