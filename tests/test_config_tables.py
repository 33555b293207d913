"""core/config/'s key tables against the key lists its messages name: a key a message offers has a
parser, and a parser's key is one the messages offer (an unknown key's hint lists what is accepted)."""

from __future__ import annotations

from thrust_remote.core.config import hosts, jobs, loader


def test_each_job_key_but_kind_has_one_parser():
    assert set(jobs.JOB_VALUES) == set(jobs.JOB_KEYS) - {"kind"}
    assert set(jobs.KIND_ONLY) <= set(jobs.JOB_KEYS)


def test_each_host_key_is_a_plain_value_or_a_slurm_key():
    assert set(hosts.HOST_VALUES) | set(hosts.SLURM_KEYS) == set(hosts.HOST_KEYS)
    assert not set(hosts.HOST_VALUES) & set(hosts.SLURM_KEYS)


def test_the_top_level_keys_are_the_sections_in_the_order_the_message_lists():
    assert loader.TOP_KEYS == ("default_host", "hosts", "groups", "jobs", "search", "notify",
                               "files", "setup", "shared")
