"""Run one function call in a fresh Python process and return its result (NOTE [ Bench isolation ]).

A measurement on the GPU leaves state behind that no public API resets: cuDNN's cached execution plans, the
libraries' workspaces, the caching allocator's mapped segments. ``run_isolated`` gives a call a process of its
own, started with ``spawn`` (a fresh interpreter: no CUDA context inherited from the parent), and returns what
the call returned. The function and its arguments travel by pickle between our own processes; nothing from a
request is unpickled here.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import ParamSpec, TypeVar

__all__ = ["IsolatedProcessError", "run_isolated"]

P = ParamSpec("P")
R = TypeVar("R")


class IsolatedProcessError(RuntimeError):
    """The child process died before it returned (killed, out of host memory, a crash in native code)."""


def run_isolated(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Call ``fn(*args, **kwargs)`` in a fresh ``spawn``-ed process and return its result.

    ``fn`` and its arguments must be picklable (module-level functions, ``functools.partial`` of them, value
    objects). An exception raised by ``fn`` is raised here as it was raised there.

    Raises:
        IsolatedProcessError: the process ended without returning (e.g. killed by a signal or ``os._exit``).
    """
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        future = pool.submit(fn, *args, **kwargs)
        try:
            return future.result()
        except BrokenProcessPool as exc:
            name = getattr(fn, "__qualname__", None) or getattr(getattr(fn, "func", None), "__qualname__", repr(fn))
            raise IsolatedProcessError(
                f"the process measuring {name} ended without a result (killed, out of host memory, or a crash in "
                "native code); its output above says more"
            ) from exc
