"""A name the job refused, read from its log's last lines (issue 53, found trying rl-baselines3-zoo and
nanoGPT): the refused flag comes first, with the spelling that reaches it; the flag style only when the
job refused the form. Followed over the sshd in tests/test_hint_table.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from thrust_remote.core.config import parse_config_text
from thrust_remote.run import flags

ZOO_USAGE = """\
usage: train.py [-h] [--algo {a2c,ppo}] [--env ENV] [-tb TENSORBOARD_LOG]
                [-n N_TIMESTEPS] [--num-threads NUM_THREADS]
                [--eval-freq EVAL_FREQ] [-f LOG_FOLDER]
"""


def _job(tmp_path: Path, flags_yaml: str = "") -> object:
    config = parse_config_text(f"jobs:\n  j:\n    script: t.py\n{flags_yaml}", tmp_path / "thrust.yaml")
    return config.job("j")


def test_an_underscored_flag_argparse_refused_leads_with_dashes_not_the_style(tmp_path: Path) -> None:
    tail = ZOO_USAGE + "train.py: error: unrecognized arguments: --n_timesteps 512\n"
    job = _job(tmp_path)
    hint = flags.refused_hint(job, tail, gave_flags=True)
    assert hint is not None and hint.startswith("the job does not take --n_timesteps: its flags are written with "
                                                "dashes (-n N_TIMESTEPS)"), hint
    assert "--set n-timesteps=..." in hint and "flags: {names: dashes}" in hint and "style" not in hint, hint
    refusal = flags.refused_name(job, tail, {"n_timesteps": "512", "seed": "1"})
    assert (refusal.key, refusal.instead, refusal.dashed) == ("n_timesteps", "n-timesteps", True)


def test_a_close_name_in_the_usage_is_offered_and_none_is_invented(tmp_path: Path) -> None:
    usage = "usage: t.py [-h] [--learning_rate LEARNING_RATE] [--seed SEED]\n"
    job = _job(tmp_path)
    refusal = flags.refused_name(job, usage + "t.py: error: unrecognized arguments: --learning_rat 3\n",
                                 {"learning_rat": "3"})
    assert (refusal.instead, refusal.dashed) == ("learning_rate", False)
    none = flags.refused_name(job, usage + "t.py: error: unrecognized arguments: --gamma 3\n", {"gamma": "3"})
    assert none is not None and none.instead is None
    assert flags.refused_hint(job, usage + "t.py: error: unrecognized arguments: --gamma 3\n",
                              gave_flags=True) == "the job does not take --gamma; its --help lists the flags it takes"


@pytest.mark.parametrize(("tail", "given", "key"), [
    ('  File "<string>", line 47, in <module>\nValueError: Unknown config key: max_iter\n', {"max_iter": "10"},
     "max_iter"),
    ("KeyError: 'max_iter'\n", {"max_iter": "10", "lr": "0.1"}, "max_iter"),
    ("Could not override 'max_iter'.\nKey 'max_iter' is not in struct\n", {"max_iter": "10"}, "max_iter"),
    # the value is what was refused, not the name: no refusal of a name
    ("ValueError: unknown optimizer 'adamw2'\n", {"optimizer": "adamw2"}, None),
    ("RuntimeError: CUDA out of memory\n", {"batch_size": "4096"}, None),
    # a name only somewhere far up the log is not why it died
    ("Unknown config key: max_iter\n" + "ok\n" * 5 + "RuntimeError: boom\n", {"max_iter": "10"}, None),
])
def test_a_line_of_the_jobs_own_that_refuses_a_given_name(tmp_path: Path, tail: str, given: dict, key: str) -> None:
    refusal = flags.refused_name(_job(tmp_path, "    flags: {style: '--key=value'}\n"), tail, given)
    assert (refusal.key if refusal else None) == key


def test_argparse_refusing_the_form_still_names_the_style(tmp_path: Path) -> None:
    """`lr=0.1` (a key=value job) to argparse: the form was refused, so the style is the hint."""
    tail = "usage: t.py [-h] [--lr LR]\nt.py: error: unrecognized arguments: lr=0.1\n"
    hint = flags.refused_hint(_job(tmp_path, "    flags: {style: key=value}\n"), tail, gave_flags=True)
    assert hint is not None and "flags: {style: '--key value'}" in hint, hint


def test_a_configurators_refusal_offers_the_closest_name_the_script_sets(tmp_path: Path) -> None:
    """nanoGPT's configurator lists no names, but train.py sets them at its top: max_iter -> max_iters."""
    job = _job(tmp_path, "    flags: {style: '--key=value'}\n")
    script = "import os\nmax_iters = 600000  # total\nlr_decay_iters: int = 600000\nif max_iters == 3:\n    x = 1\n"
    refusal = flags.refused_name(job, "ValueError: Unknown config key: max_iter\n", {"max_iter": "10"})
    close = flags.with_script_names(refusal, "train.py", script)
    assert (close.instead, close.source) == ("max_iters", "train.py")
    far = flags.refused_name(job, "ValueError: Unknown config key: warmup\n", {"warmup": "5"})
    assert flags.with_script_names(far, "train.py", script).instead is None
