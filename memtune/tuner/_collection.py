"""Python's garbage collector during a search: collecting the youngest objects less often.

# NOTE [ Garbage collection in a search ]
A search makes millions of short-lived objects (each simulation's lists and tuples) that die by reference count, and
keeps tens of thousands (the descent memo's results, the trials). CPython's cyclic collector nevertheless runs a
young collection every 700 net allocations of container objects, and then the older ones: on the README's VGG-16 job
at 13 GiB, 615 young, 56 middle and 5 full collections, which walked the several hundred thousand objects the imports
made, 0.85-0.95 s of the job's 13-14 s of CPU, for next to no garbage. While a search runs (``tune``, nested or from
several threads) the thresholds are at least (10,000, 20, 20): 164, 13 and 1 collections, 0.30-0.34 s. They are
restored when the last search ends. Nothing in the search waits for a collection (it holds no finalizers), so its
results are the same.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

__all__ = ["collecting_less", "fewer_collections"]

SEARCH_THRESHOLDS = (10_000, 20, 20)
"""The collector's least thresholds per generation while a search runs (NOTE [ Garbage collection in a search ])."""

_lock = threading.Lock()
_running = 0
_saved: tuple[int, int, int] = (0, 0, 0)

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the collector's thresholds to ``SEARCH_THRESHOLDS`` (where lower) until the last such block ends."""
    global _running, _saved
    with _lock:
        if _running == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(*(max(a, b) for a, b in zip(_saved, SEARCH_THRESHOLDS, strict=True)))
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0:
                gc.set_threshold(*_saved)


def collecting_less(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run inside ``fewer_collections``."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with fewer_collections():
            return fn(*args, **kwargs)

    return run
