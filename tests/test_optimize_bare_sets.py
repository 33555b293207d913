"""`optimize --set` takes what `train --set` takes (issue 56 item 5, for a study), over a real sshd: a bare
word (`--set=-m`, Hydra's multirun) reaches every trial as it is, first; a `--set` that is none of
KEY=VALUE, KEY or a bare word is refused with an example written as the job takes its flags (KEY=VALUE
words for a `key=value` job), never the built-in trainer's `KEY like total-steps`."""

from __future__ import annotations

import json

from helpers import new_project, remote_tempdir

from thrust_remote.core.errors import ExitCode

# A Hydra-like script: key=value words, and -m before them; what it got is its metric's proof
SCORE_PY = '''\
import json, os, sys
words = sys.argv[1:]
with open(os.path.join(os.environ["THRUST_RUN_DIR"], "argv.json"), "w") as f:
    json.dump(words, f)
lr = float(next(w for w in words if w.startswith("lr="))[3:])
print("THRUST_METRICS " + json.dumps({"step": 1, "score": lr}), flush=True)
'''

JOBS = """\
jobs:
  hydra:
    script: score.py
    flags: {style: key=value}
    objective: {metric: score, mode: max}
search:
  hydra: {lr: {choices: [0.1]}}
"""


def test_optimize_set_takes_a_bare_word_and_refuses_in_the_jobs_own_style(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "proj", sshd, workdir, files={"score.py": SCORE_PY}, jobs=JOBS)

    refused = cli("optimize", "hydra", "--trials", "1", "--set", "no such=1", cwd=proj)
    assert refused.returncode == ExitCode.USAGE, (refused.stdout, refused.stderr)
    said = " ".join(refused.stderr.split())
    assert "total-steps" not in said and "learning_rate=0.1" in said and "--set=-m" in said, said
    assert "Traceback" not in said

    ran = cli("optimize", "hydra", "--trials", "1", "--seed", "1", "--set=-m", "--json", cwd=proj, timeout=300)
    assert ran.returncode == 0, ran.stderr
    trial = json.loads(ran.stdout)["trials"][0]
    assert trial["state"] == "COMPLETE", ran.stdout
    argv = json.loads((workdir / ".thrust" / "runs" / trial["run_id"] / "argv.json").read_text())
    assert argv[0] == "-m" and "lr=0.1" in argv and "m=true" not in argv, argv
