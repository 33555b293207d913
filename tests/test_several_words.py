"""A flag that takes several words (argparse's nargs='+', rl-zoo's `--hyperparams n_envs:4
learning_rate:0.001`; issue 53 item 1): given as a list in an `args:` mapping, with `--set
KEY=[...]` and in a `--params` file, and one word of it searched by `optimize` (`search:` key
`hyperparams.learning_rate`). Real runs of a test project's own argparse script on the local host and
over the sshd fixture; the config's refusals at their line without a host."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers import new_project, remote_tempdir

from thrust_remote.core.config import parse_config_text
from thrust_remote.core.errors import ConfigError, UsageError
from thrust_remote.run import arguments

# one worker runs this module's tests: they share one project and one host workdir
pytestmark = pytest.mark.xdist_group("test_several_words")

# rl-zoo's way: `--hyperparams key:value ...` read word by word; the words it got are printed as is
HP_PY = '''\
import argparse
import json

parser = argparse.ArgumentParser()
parser.add_argument("--hyperparams", nargs="+", required=True)
parser.add_argument("--tags", nargs="*", default=None)
args = parser.parse_args()
hyperparams = dict(word.split(":", 1) for word in args.hyperparams)
print("SEEN " + json.dumps({"hyperparams": args.hyperparams, "tags": args.tags}), flush=True)
lr = float(hyperparams["learning_rate"])
print("THRUST_METRICS " + json.dumps({"step": 1, "score": -((lr - 0.003) ** 2)}), flush=True)
'''

JOBS = """\
jobs:
  zoo:
    script: hp.py
    args: {hyperparams: [n_envs:4, learning_rate:0.001], tags: []}
    objective: {metric: score, mode: max}
search:
  zoo:
    hyperparams.learning_rate: {low: 1.0e-4, high: 1.0e-2, log: true}
"""


@pytest.fixture(scope="module")
def zoo(sshd, tmp_path_factory) -> tuple[Path, Path]:
    """(project, the sshd host's workdir): a fresh git repo of a user's own, not this repository."""
    workdir = remote_tempdir(sshd) / "zoo"
    proj = new_project(tmp_path_factory.mktemp("zoo") / "project", sshd, workdir, files={"hp.py": HP_PY},
                       jobs=JOBS, message="an rl-zoo-like script")
    return proj, workdir


def _run_id(text: str) -> str:
    return re.search(r"launching run (\S+)", text).group(1)  # type: ignore[union-attr]


def _seen(run_dir: Path) -> dict:
    """What the script's argparse got, from its own line in the run's log."""
    line = next(ln for ln in (run_dir / "log").read_text().splitlines() if ln.startswith("SEEN "))
    return json.loads(line.removeprefix("SEEN "))


# ------------------------------------------------------------------------------------------ real runs

@pytest.mark.parametrize(("host", "given", "hyperparams"), [
    ("local", [], ["n_envs:4", "learning_rate:0.001"]),
    ("sandbox", [], ["n_envs:4", "learning_rate:0.001"]),
    # the whole list from the command line (a YAML flow list, as in thrust.yaml), then one word of it
    ("local", ["--set", "hyperparams=[n_envs:8, learning_rate:2.0e-3, gamma:0.99]", "--set",
               "hyperparams.n_envs=16"], ["n_envs:16", "learning_rate:2.0e-3", "gamma:0.99"]),
    ("sandbox", ["--set", "hyperparams=[n_envs:8, learning_rate:2.0e-3, gamma:0.99]", "--set",
                 "hyperparams.n_envs=16"], ["n_envs:16", "learning_rate:2.0e-3", "gamma:0.99"]),
])
def test_train_hands_the_script_each_word_of_the_flag(cli, zoo, host, given, hyperparams):
    proj, workdir = zoo
    done = cli("train", "zoo", "--host", host, "--no-fetch", *given, cwd=proj)
    assert done.returncode == 0, done.stderr
    where = proj if host == "local" else workdir
    seen = _seen(where / ".thrust" / "runs" / _run_id(done.stderr))
    assert seen == {"hyperparams": hyperparams, "tags": []}  # `tags: []`: the flag alone (nargs='*')


def test_a_params_file_gives_a_whole_list_or_one_word(cli, zoo, tmp_path):
    proj, _ = zoo
    params = tmp_path / "params.yaml"
    params.write_text("hyperparams: [n_envs:2, learning_rate:0.5]\ntags: [a, b]\n")
    whole = cli("train", "zoo", "--host", "local", "--no-fetch", "--params", str(params), cwd=proj)
    assert whole.returncode == 0, whole.stderr
    seen = _seen(proj / ".thrust" / "runs" / _run_id(whole.stderr))
    assert seen == {"hyperparams": ["n_envs:2", "learning_rate:0.5"], "tags": ["a", "b"]}
    params.write_text("params: {hyperparams.learning_rate: 0.25}\n")  # optimize's best-params file's shape
    word = cli("train", "zoo", "--host", "local", "--no-fetch", "--params", str(params), cwd=proj)
    assert word.returncode == 0, word.stderr
    seen = _seen(proj / ".thrust" / "runs" / _run_id(word.stderr))
    assert seen["hyperparams"] == ["n_envs:4", "learning_rate:0.25"]


@pytest.mark.slow
def test_optimize_searches_one_word_and_its_best_params_train_again(cli, zoo):
    """Each trial sets the word's value after its `:`; the trial's parameter is `hyperparams.learning_rate`
    (Optuna's, the summary's, the best-params file's), and `train --params BEST` gives the same word."""
    proj, workdir = zoo
    result = cli("optimize", "zoo", "--trials", "2", "--seed", "1", "--json", cwd=proj, timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["counts"]["done"] == 2, out
    for trial in out["trials"]:
        assert set(trial["params"]) == {"hyperparams.learning_rate"}
        lr = trial["params"]["hyperparams.learning_rate"]
        seen = _seen(workdir / ".thrust" / "runs" / trial["run_id"])
        assert seen["hyperparams"][0] == "n_envs:4" and len(seen["hyperparams"]) == 2
        assert float(seen["hyperparams"][1].removeprefix("learning_rate:")) == pytest.approx(lr)
        assert trial["value"] == pytest.approx(-((lr - 0.003) ** 2))
    best = yaml.safe_load(Path(out["best_params_file"]).read_text())
    lr = best["params"]["hyperparams.learning_rate"]
    again = cli("train", "zoo", "--no-fetch", "--params", out["best_params_file"], cwd=proj)
    assert again.returncode == 0, again.stderr
    seen = _seen(workdir / ".thrust" / "runs" / _run_id(again.stderr))
    assert float(seen["hyperparams"][1].removeprefix("learning_rate:")) == pytest.approx(lr)


@pytest.mark.parametrize(("sets", "words"), [
    (["hyperparams=[n_envs:4"], ["--set hyperparams: not valid YAML", "a value that starts with [ is a list",
                                 "for the text itself, quote it: --set \"hyperparams='[n_envs:4'\""]),
    (["hyperparams=[n_envs: 4]"], ["--set hyperparams: expected a list of words", "write key:value"]),
    (["hyperparams.gamma=0.9"], ["hyperparams.gamma: jobs.zoo.args.hyperparams has no word gamma:VALUE",
                                 "--set 'hyperparams=[n_envs:4, learning_rate:0.001, gamma:VALUE]'"]),
])
def test_a_bad_set_of_several_words_is_64_before_anything_connects(cli, zoo, sets, words):
    proj, _ = zoo
    refused = cli("train", "zoo", "--host", "local", *[a for s in sets for a in ("--set", s)], cwd=proj)
    err = " ".join(refused.stderr.split())
    assert refused.returncode == 64, refused.stderr
    assert all(w in err for w in words), err
    assert "Traceback" not in err and "launching run" not in err


# ------------------------------------------------------------------------------------------ no host

def _job_arguments(body: str, sets: list[str], params: dict | None = None) -> list[str]:
    job = parse_config_text(textwrap.dedent(body), Path("thrust.yaml")).job("j")
    return arguments.job_arguments(job, arguments.parse_sets(sets), params or {})


def test_words_are_written_as_given_in_the_jobs_style_and_a_dotted_flag_stays_a_flag():
    body = "jobs:\n  j:\n    script: t.py\n    args: {hyperparams: [n_envs:4, lr=1.0e-3], config: c.py}\n"
    assert _job_arguments(body, ["config.lr=3", "title='[draft]'"], {"hyperparams.lr": 0.5}) == [
        "--hyperparams", "n_envs:4", "lr=0.5", "--config", "c.py", "--config.lr", "3", "--title", "[draft]"]
    single = body.replace("script: t.py", "script: t.py\n    flags: {style: '-k value'}")
    assert _job_arguments(single, [])[:3] == ["-hyperparams", "n_envs:4", "lr=1.0e-3"]
    # a job whose flags are one word each keeps a value in brackets as its text (Hydra's own list syntax)
    hydra = "jobs:\n  j:\n    command: [python, train.py]\n"
    assert _job_arguments(hydra, ["model.layers=[64,64]"]) == ["model.layers=[64,64]"]
    with pytest.raises(UsageError, match=r"--layers: 2 words for one flag, but the job's flags are written "
                                         r"'--key=value'"):
        _job_arguments(hydra.replace("command: [python, train.py]", "script: t.py\n    flags: {style: "
                                     "'--key=value'}"), [], {"layers": ["64", "64"]})


@pytest.mark.parametrize(("body", "words"), [
    ("jobs:\n  j:\n    script: t.py\n    args: {hyperparams: [n_envs: 4]}\n",
     ":4: jobs.j.args.hyperparams: expected one word per item, like [n_envs:4, learning_rate:0.001], got a "
     "mapping (a word 'key: value' with a space is a mapping: write key:value, or quote it)"),
    ("jobs:\n  j:\n    script: t.py\n    args:\n      hyperparams:\n        - n_envs:4\n        - [a, b]\n",
     ":7: jobs.j.args.hyperparams: expected one word per item"),
    ("jobs:\n  j:\n    kind: trainer\n    args: {num-envs: [4, 8]}\n",
     ":4: jobs.j.args.num-envs: the built-in trainer's flags take one value each, got a list"),
    ("jobs:\n  j:\n    script: t.py\n    flags: {style: '--key=value'}\n    args: {layers: [64, 64]}\n",
     ":5: jobs.j.args.layers: a list is several words after one flag, but this job's flags are written "
     "'--key=value' (one word each)"),
    ("search:\n  j:\n    hyperparams.gamma: {low: 0.9, high: 0.99}\njobs:\n  j:\n    script: t.py\n"
     "    args: {hyperparams: [n_envs:4, learning_rate:0.001]}\n",
     ":3: search.j.hyperparams.gamma: jobs.j.args.hyperparams has no word gamma:VALUE for a trial to set"),
])
def test_a_list_the_job_cannot_take_is_78_at_its_line(body, words):
    with pytest.raises(ConfigError) as err:
        parse_config_text(body, Path("thrust.yaml"))
    assert err.value.exit_code == 78 and words in err.value.message, err.value.message


def test_a_searched_word_the_list_lacks_says_what_to_add():
    body = ("jobs:\n  j:\n    script: t.py\n    args: {hyperparams: [n_envs=4]}\n"
            "search:\n  j:\n    hyperparams.gamma: {low: 0.9, high: 0.99}\n")
    with pytest.raises(ConfigError) as err:
        parse_config_text(body, Path("thrust.yaml"))
    assert err.value.hint == ("add it to jobs.j.args.hyperparams (thrust.yaml:4), like hyperparams: "
                              "[n_envs=4, gamma=VALUE]")
