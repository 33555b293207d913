"""core/files.py: the laptop's one atomic write. A write that fails half-way leaves the old file whole
and no temp file beside it; a finished one is owner-only unless asked otherwise. And host/runner.py's
Landing: many downloads placed by one sync."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from thrust_remote.core.files import copy_atomic, write_atomic


def test_a_write_is_whole_and_owner_only(tmp_path: Path):
    path = write_atomic(tmp_path / "deep" / "index.json", '{"a": 1}\n')
    assert path.read_text() == '{"a": 1}\n'
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["index.json"]


def test_a_write_that_fails_half_way_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch):
    path = write_atomic(tmp_path / "model.onnx", b"old model")

    class Boom(Exception):
        pass

    class Source:  # a copy whose source breaks after the first block, like a disk or a link failing
        def __init__(self) -> None:
            self.calls = 0

        def read(self, size: int = -1) -> bytes:
            self.calls += 1
            if self.calls > 1:
                raise Boom
            return b"new half"

    src = tmp_path / "src.onnx"
    src.write_bytes(b"x")
    real = shutil.copyfileobj
    monkeypatch.setattr(shutil, "copyfileobj", lambda _inp, out, _n=0: real(Source(), out))
    with pytest.raises(Boom):
        copy_atomic(src, path)
    assert path.read_bytes() == b"old model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "src.onnx"]


def test_a_copy_is_readable_by_the_page(tmp_path: Path):
    src = tmp_path / "kept.onnx"
    src.write_bytes(b"\x08\x07onnx")
    dst = copy_atomic(src, tmp_path / "public" / "snake.onnx")
    assert dst.read_bytes() == src.read_bytes() and os.stat(dst).st_mode & 0o777 == 0o644


def test_landed_downloads_take_their_names_together_in_order_and_a_stopped_transfer_still_lands(tmp_path: Path):
    """host/runner.Landing: verified parts wait for one sync, then each is renamed over its destination
    (an old file stays whole until then); a changed file keeps its place among the outcomes; parts still
    held when a transfer's consumer stops it (`settle`) land all the same, their outcomes unsaid."""
    from thrust_remote.host.runner import LANDING_BYTES, FileChangedError, Landing, open_part

    old = tmp_path / "f1"
    old.write_bytes(b"old")
    landing = Landing()
    held = []
    for i in range(3):
        fout, part = open_part(tmp_path / f"f{i}")
        with fout:
            fout.write(f"new {i}".encode())
        held.append(part)
        assert not landing.add((part, tmp_path / f"f{i}", f"sha{i}"), 5)
        if i == 0:
            assert not landing.add(FileChangedError("swapped"))
    assert old.read_bytes() == b"old"  # nothing placed before the landing
    outcomes = list(landing.place())
    assert [o if isinstance(o, str) else "changed" for o in outcomes] == ["sha0", "changed", "sha1", "sha2"]
    assert [(tmp_path / f"f{i}").read_bytes() for i in range(3)] == [b"new 0", b"new 1", b"new 2"]
    assert not any(p.exists() for p in held)
    fout, part = open_part(tmp_path / "late")
    with fout:
        fout.write(b"late")
    assert landing.add((part, tmp_path / "late", "x"), LANDING_BYTES)  # enough bytes: a landing is due
    landing.settle()
    assert (tmp_path / "late").read_bytes() == b"late" and not part.exists() and not landing.held
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f0", "f1", "f2", "late"]
