"""The age stop's clock (agent/agewatch.py), without a run: it fires once at the age, never after the
job ended, and says the age as max_duration: writes it. The stop on real hosts: tests/test_max_duration.py."""

from __future__ import annotations

import threading

import pytest

from thrust_remote.agent import agewatch

pytestmark = pytest.mark.core


def test_a_job_that_ends_before_its_age_is_never_stopped():
    fired: list[str] = []
    done = threading.Event()
    thread = agewatch.watch(3600.0, done, fired.append)
    assert thread.is_alive()
    done.set()  # the job ended: the watch ends at once, without a word
    thread.join(5)
    assert fired == [] and not thread.is_alive()


def test_the_watch_fires_at_its_deadline_and_only_once():
    fired: list[str] = []
    done = threading.Event()
    thread = agewatch.watch(0.05, done, fired.append)
    thread.join(5)
    assert fired == ["it reached its max_duration of 0.05s"] and not thread.is_alive()


@pytest.mark.parametrize(("seconds", "said"), [(8 * 3600, "8h"), (5400, "1h30m"), (90, "1m30s"), (45, "45s")])
def test_a_duration_is_said_as_max_duration_takes_it(seconds, said):
    assert agewatch.describe(seconds) == said
