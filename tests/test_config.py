"""thrust.yaml: a bad file names file, line and field (exit 78); precedence flags > env > file."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import git_init

from thrust_remote.core.config import LOCAL, load_config, parse_config_text
from thrust_remote.core.errors import ConfigError, ExitCode
from thrust_remote.core.names import parse_address

GOOD = """\
default_host: sandbox
hosts:
  sandbox:
    address: gpu-box
    workdir: ~/thrust
    python: python3
    identity: null
    known_hosts: ~/.ssh/known_hosts
    host_key_policy: strict
    gpus: [0, 1, 2, 3]
  other:
    address: me@10.0.0.5:2222
jobs:
  snake:
    kind: python
    args: {env: snake, total-steps: 20000000}
    export: web/public/snake.onnx
  snake-rs:
    kind: cargo
    toolchain: nightly
    example: train_snake_multi_v2
    args: [--mode, shared, --epochs, 1000, --cuda]
    artifact: models/snake.onnx
    tch_version: auto
search:
  snake:
    learning-rate: {low: 1.0e-4, high: 3.0e-3, log: true}
    num-envs: {choices: [1024, 4096, 16384]}
"""


def test_design_example_parses():
    cfg = parse_config_text(GOOD, Path("thrust.yaml"))
    assert cfg.default_host == "sandbox"
    assert cfg.host("sandbox").gpus == (0, 1, 2, 3)
    assert cfg.host("other").address == "me@10.0.0.5:2222"
    assert LOCAL in cfg.hosts and cfg.host(LOCAL).is_local
    assert cfg.job("snake").args == {"env": "snake", "total-steps": 20000000}
    assert cfg.job("snake-rs").args == ("--mode", "shared", "--epochs", "1000", "--cuda")
    assert cfg.job("cartpole").args == {"env": "cartpole"}  # built-in still there
    assert cfg.search["snake"]["learning-rate"] == {"low": 1.0e-4, "high": 3.0e-3, "log": True}


def test_no_file_gives_local_host_and_builtin_jobs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(environ={})
    assert cfg.path is None
    assert cfg.default_host == LOCAL
    assert set(cfg.jobs) >= {"snake", "cartpole"}


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        ("hosts:\n  a:\n    address: box\n    colour: red\n", 4, "hosts.a.colour", "unknown key"),
        ("hosts:\n  a:\n    address: box\n    gpus: 3\n", 4, "hosts.a.gpus", "list"),
        ("hosts:\n  a:\n    address: box\n    gpus: [0, x]\n", 4, "hosts.a.gpus", "GPU index"),
        ("hosts:\n  a:\n    address: '-oProxyCommand=x'\n", 3, "hosts.a.address", "starts with '-'"),
        ("hosts:\n  a:\n    address: 'a;b'\n", 3, "hosts.a.address", "not a valid host"),
        ("hosts:\n  a:\n    address: 'u$(id)@box'\n", 3, "hosts.a.address", "user"),
        ("hosts:\n  a:\n    address: box:99999\n", 3, "hosts.a.address", "port"),
        ("hosts:\n  a:\n    workdir: /x\n", 2, "hosts.a.address", "missing"),
        ("hosts:\n  a:\n    address: box\n    host_key_policy: yolo\n", 4, "hosts.a.host_key_policy", "strict"),
        ("hosts:\n  '-x':\n    address: box\n", 2, "hosts.-x", "starts with '-'"),
        ("default_host: nowhere\n", 1, "default_host", "not a host"),
        ("jobs:\n  j:\n    kind: java\n", 3, "jobs.j.kind", "python, cargo"),
        ("jobs:\n  j:\n    kind: cargo\n", 2, "jobs.j.example", "example"),
        ("jobs:\n  j:\n    args: [a, b]\n", 3, "jobs.j.args", "mapping"),
        ("jobs:\n  j:\n    env: {'A B': 1}\n", 3, "jobs.j.env.A B", "environment"),
        ("search:\n  snake:\n    lr: {low: 1, high: 0.5}\n", 3, "search.snake.lr.high", "greater"),
        ("search:\n  snake:\n    lr: {low: 0, high: 1, log: true}\n", 3, "search.snake.lr.low", "log"),
        ("colour: red\n", 1, "colour", "unknown key"),
        ("hosts:\n  a:\n    address: box\n  a:\n    address: box2\n", 4, "hosts.a", "duplicate"),
        ("hosts: [\n", 2, "", "not valid YAML"),
        # an unclosed bracket is found lines later: the line named is the one to fix, where it opened
        ("jobs:\n  a:\n    script: a.py\n    args: [--x, 1\n\nhosts:\n  b:\n    address: x@y\n", 4, "",
         "flow sequence that starts here; at line 6"),
        ("jobs:\n  j:\n    script: a.py\n    args: 5\n", 4, "jobs.j.args", "a list of arguments like [--lr, '0.1'] or "
         "a mapping"),
        ("hosts:\n  a:\n    address: box\n    connect_timeout: soon\n", 4, "hosts.a.connect_timeout", "number"),
        ("hosts:\n  a:\n    address: box\n    cpu_slots: 0\n", 4, "hosts.a.cpu_slots", "integer >= 1"),
        # an empty value is None, said as such (never an internal YAML error)
        ("hosts:\n  a:\n    address: box\n    cpu_slots:\n", 4, "hosts.a.cpu_slots", "got None"),
        ("hosts:\n  a:\n    address: box\n    workdir:\n", 4, "hosts.a.workdir", "expected a string, got nothing"),
        ("default_host:\n", 1, "default_host", ""),
    ],
)
def test_bad_config_names_file_line_and_field(tmp_path, text, line, field, words):
    path = tmp_path / "thrust.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    message = info.value.message
    assert message.startswith(f"{path}:{line}: "), message
    assert field in message
    assert words in message
    assert info.value.exit_code == ExitCode.CONFIG == 78


def test_cli_bad_config_exit_78_without_traceback(cli, tmp_path):
    (tmp_path / "thrust.yaml").write_text("hosts:\n  a:\n    address: box\n    colour: red\n")
    result = cli("hosts", cwd=tmp_path)
    assert result.returncode == 78
    assert "thrust.yaml:4: hosts.a.colour: unknown key" in result.stderr
    assert "Traceback" not in result.stderr
    debug = cli("--debug", "hosts", cwd=tmp_path)
    assert debug.returncode == 78 and "Traceback" in debug.stderr  # --debug adds the traceback, keeps the code
    assert "thrust.yaml:4: hosts.a.colour: unknown key" in debug.stderr


def test_precedence_flag_over_env_over_file(tmp_path):
    path = tmp_path / "thrust.yaml"
    path.write_text("default_host: a\nhosts:\n  a:\n    address: box-a\n  b:\n    address: box-b\n")
    assert load_config(path, environ={}).default_host == "a"
    assert load_config(path, environ={"THRUST_HOST": "b"}).default_host == "b"
    assert load_config(path, environ={"THRUST_HOST": "b"}, default_host="local").default_host == "local"
    assert load_config(environ={"THRUST_CONFIG": str(path)}).path == path


def test_env_host_with_metacharacters_is_refused(tmp_path):
    with pytest.raises(ConfigError):
        load_config(environ={"THRUST_HOST": "-oProxyCommand=x"})


def test_config_found_in_parent_directory(tmp_path, monkeypatch):
    (tmp_path / "thrust.yaml").write_text("hosts:\n  a:\n    address: box\n")
    sub = tmp_path / "sub" / "dir"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    cfg = load_config(environ={})
    assert cfg.path == tmp_path / "thrust.yaml"
    assert cfg.root == tmp_path


@pytest.mark.parametrize(
    ("text", "host", "user", "port"),
    [
        ("gpu-box", "gpu-box", None, None),
        ("me@gpu.example.com", "gpu.example.com", "me", None),
        ("me@10.0.0.5:2222", "10.0.0.5", "me", 2222),
        ("me@[::1]:22", "::1", "me", 22),
    ],
)
def test_address_forms(text, host, user, port):
    a = parse_address(text)
    assert (a.host, a.user, a.port) == (host, user, port)


@pytest.mark.parametrize("text", ["-x", "a b", "a;b", "$(id)", "u`id`@h", "h:0", "h:x", "", "[zz]:1", "@h"])
def test_bad_addresses(text):
    with pytest.raises(ValueError, match="address|host|user|port"):
        parse_address(text)


def test_init_writes_a_config_that_loads_and_never_overwrites(cli, tmp_path):
    first = cli("init", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    written = (tmp_path / "thrust.yaml").read_text()
    assert "host_key_policy" in written
    cfg = load_config(tmp_path / "thrust.yaml", environ={})
    assert cfg.default_host == LOCAL
    (tmp_path / "thrust.yaml").write_text("default_host: local\n# mine\n")
    again = cli("init", cwd=tmp_path)
    assert again.returncode == ExitCode.USAGE
    assert (tmp_path / "thrust.yaml").read_text() == "default_host: local\n# mine\n"


def test_init_in_a_subfolder_writes_at_the_projects_top_and_never_shadows_its_config(cli, tmp_path):
    project = git_init(tmp_path / "project", identity=False)
    (project / "src" / "deep").mkdir(parents=True)
    made = cli("init", cwd=project / "src" / "deep")
    assert made.returncode == 0, made.stderr
    assert (project / "thrust.yaml").is_file() and not (project / "src" / "deep" / "thrust.yaml").exists()
    again = cli("init", cwd=project / "src")
    assert again.returncode == ExitCode.USAGE
    assert f"{project / 'thrust.yaml'} already configures this directory" in again.stderr
    assert not (project / "src" / "thrust.yaml").exists()


def test_config_elsewhere_only_configures_the_git_tree_you_stand_in(tmp_path, monkeypatch):
    project = git_init(tmp_path / "project", identity=False)
    (project / "sub").mkdir()
    elsewhere = tmp_path / "elsewhere" / "thrust.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text("hosts:\n  a:\n    address: box\n")
    monkeypatch.chdir(project / "sub")
    cfg = load_config(elsewhere, environ={})
    assert cfg.root == project  # not elsewhere/: the project is where the command runs
    assert cfg.given_path == str(elsewhere.resolve()) and cfg.host("a").config_path == str(elsewhere.resolve())
    # named through THRUST_CONFIG counts as given too; a file found upwards is not repeated in hints
    assert load_config(environ={"THRUST_CONFIG": str(elsewhere)}).given_path == str(elsewhere.resolve())
    (project / "thrust.yaml").write_text("hosts:\n  a:\n    address: box\n")
    found = load_config(environ={})
    assert found.root == project and found.given_path is None and found.host("a").config_path is None


def test_config_elsewhere_without_git_makes_the_cwd_the_project(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere" / "thrust.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text("default_host: local\n")
    here = tmp_path / "plain"
    here.mkdir()
    monkeypatch.chdir(here)
    assert load_config(elsewhere, environ={}).root == here


def test_hosts_through_a_pipe_prints_every_value_whole(cli, tmp_path):
    """`hosts | cat` at 50 columns: plain columns, the long workdir and python whole (a new user saw
    `trialb…` and `~/thru…` in a box table)."""
    workdir = "~/a-rather-long-workdir-name/that-would-not-fit/in-fifty-columns"
    (tmp_path / "thrust.yaml").write_text(
        f"hosts:\n  trialbox-gpu-host:\n    address: trial@trialbox.example\n    workdir: {workdir}\n"
        "    python: ~/venvs/torch-2.13/bin/python\ndefault_host: trialbox-gpu-host\n")
    result = cli("hosts", cwd=tmp_path, env={"COLUMNS": "50"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["host", "address", "workdir", "python", "host", "keys"]
    row = next(line for line in lines if line.startswith("trialbox-gpu-host"))
    assert row.split() == ["trialbox-gpu-host", "(default)", "trial@trialbox.example", workdir,
                           "~/venvs/torch-2.13/bin/python", "strict"]


def test_an_unknown_host_from_thrust_host_says_where_it_came_from(cli, tmp_path):
    (tmp_path / "thrust.yaml").write_text("hosts:\n  box:\n    address: u@box.example\n")
    result = cli("runs", cwd=tmp_path, env={"THRUST_HOST": "zzz"})
    assert result.returncode == 68, result.stderr
    assert "unknown host 'zzz' (from THRUST_HOST in your environment)" in result.stderr
    assert "unset THRUST_HOST or set it to a known host" in result.stderr
    named = cli("runs", "--host", "zzz", cwd=tmp_path)  # typed: nothing about the environment
    assert named.returncode == 68 and "THRUST_HOST" not in named.stderr
