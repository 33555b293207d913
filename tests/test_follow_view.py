"""The log follower at the CLI edge: the terminal view survives any metrics line (nulls, no total
yet, lines split across chunks); the plain view copies the bytes exactly (a transcript == the log)."""

from __future__ import annotations

import json

from thrust_remote.cli.follow import LogView

CHUNKS = [
    b"starting\nTHRUST_INFO {\"device\": \"cpu\"}\nTHRUST_MET",
    b'RICS {"step": 0, "total_steps": null, "return_mean": null, "sps": null}\n',
    b'THRUST_METRICS {"step": 4096, "total_steps": 8192, "return_mean": 12.5, "sps": 30000.0, "gpu_util": null}\n',
    "caf\u00e9 \u2713 half a ".encode()[:-1],
    "caf\u00e9 \u2713 half a ".encode()[-1:] + b"line\nTHRUST_METRICS not json\nno newline at the end",
]


def test_terminal_view_takes_nulls_split_lines_and_junk():
    with LogView("run-1", fancy=True) as view:
        for chunk in CHUNKS:
            view.feed(chunk)
    assert view.last["step"] == 4096
    assert view.last["return_mean"] == 12.5


def test_plain_view_copies_bytes_exactly(capfdbinary):
    with LogView("run-1", fancy=False) as view:
        for chunk in CHUNKS:
            view.feed(chunk)
    out = capfdbinary.readouterr().out
    assert out == b"".join(CHUNKS)
    assert json.loads(json.dumps(view.last))["total_steps"] == 8192
