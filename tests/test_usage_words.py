"""A trial refused by argparse over a flag of several words names the searched word it came from
(`search: {JOB: {hyperparams.learning_rate: ...}}`, issue 53 item 1): the study's config error points at
that key's line, not at the job's `args:`."""

from __future__ import annotations

from pathlib import Path

from thrust_remote.core.config import parse_config_text
from thrust_remote.optimize.usage import UsageSources, usage_error

CONFIG = """\
jobs:
  zoo:
    script: hp.py
    args: {hyperparams: [n_envs:4, learning_rate:0.001], seed: 1}
search:
  zoo:
    seed: {low: 1, high: 9}
    hyperparams.learning_rate: {low: 1.0e-4, high: 1.0e-2, log: true}
"""

USAGE = "usage: hp.py [-h] --hyperparams HYPERPARAMS [HYPERPARAMS ...]\n"


def _sources(fixed: dict[str, object] | None = None) -> UsageSources:
    config = parse_config_text(CONFIG, Path("/project/thrust.yaml"))
    return UsageSources(config, config.jobs["zoo"], fixed or {})


def test_a_refused_word_of_a_flag_names_the_searched_word_and_its_line():
    refused = f"{USAGE}hp.py: error: argument --hyperparams: invalid word: 'learning_rate:abc'\n"
    error = usage_error(2, refused, 3, _sources())
    assert error is not None
    assert error.message.split(": trial 3 exited 2")[0].endswith("thrust.yaml:8: search.zoo.hyperparams.learning_rate")


def test_a_stray_word_names_the_searched_word_it_is():
    # a flag that takes one word: the second is argparse's stray argument
    stray = f"{USAGE}hp.py: error: unrecognized arguments: learning_rate:0.003\n"
    error = usage_error(2, stray, 1, _sources())
    assert error is not None
    assert error.message.split(": trial 1 exited 2")[0].endswith("thrust.yaml:8: search.zoo.hyperparams.learning_rate")


def test_a_word_given_by_set_names_that_set():
    config = parse_config_text(CONFIG.split("search:")[0], Path("/project/thrust.yaml"))
    sources = UsageSources(config, config.jobs["zoo"], {"hyperparams.n_envs": "x"})
    error = usage_error(2, f"{USAGE}hp.py: error: argument --hyperparams: invalid word: 'n_envs:x'\n", 1, sources)
    assert error is not None
    assert error.message.startswith("--set hyperparams.n_envs: trial 1"), error
