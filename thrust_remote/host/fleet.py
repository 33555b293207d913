"""The configured hosts as one fleet: a call fanned out over several of them at once.

(fabric's `Group`: one function over every host, one result per host.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def each(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """fn over every item at once; the first node's error (in node order) is raised after all end.
    One item runs in the caller's thread: a Ctrl-C then stops it where it is (a pool's worker would
    carry on to its end)."""
    if len(items) == 1:
        return [fn(items[0])]
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
    for future in futures:
        future.result()  # raises the first error in node order
    return [f.result() for f in futures]
