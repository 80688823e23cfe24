"""An uploaded ``.pt2`` archive checked in a child process, within a time limit (NOTE [ Upload limits ] in
``memtune.profiler._exported_checks``).

``memtune.profiler.exported.check_exported`` is pure Python over a graph of up to 100,000 nodes: a hostile archive can
keep it busy for tens of seconds, and a thread of the API would hold the interpreter lock the event loop needs (its
``json`` parse and dump hold it throughout). So each upload is checked in a process of its own, forked from a
``multiprocessing`` fork server that has imported torch once (``spawn`` where there is none), and the event loop only
waits on a pipe from a worker thread. Past the time limit the process is killed and the upload refused with a 422
``exported_check_timeout``; nothing is stored. The child sends back the ``CheckedProgram``, or the ``ExportedError``
it raised (profiler errors pickle with their fields).
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

import anyio.to_thread

from memtune.api.service._problems import ProblemError
from memtune.profiler import ProfilerError
from memtune.profiler.exported import CheckedProgram, check_exported

__all__ = ["check_upload"]

#: imported once by the fork server, so a check starts warm (``torch.export`` alone takes seconds to import); with
#: ``__main__`` the server runs the main script (``memtune``'s, uvicorn's) once, where each child would re-run it
_PRELOAD = [
    "__main__",
    "memtune.profiler.exported",
    "torch.export.pt2_archive.constants",
    "memtune.api.service._exported_upload",
]


def _context() -> BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)  # no effect once the server runs: it has them then
        return ctx
    return multiprocessing.get_context("spawn")


def _check(conn: Connection, data: bytes, kwargs: dict[str, Any]) -> None:
    """The child: check, and send ``("ok", checked)``, ``("refused", error)`` or ``("failed", text)``."""
    try:
        result: tuple[str, Any] = ("ok", check_exported(data, **kwargs))
    except ProfilerError as e:
        result = ("refused", e)
    except Exception as e:  # a bug of the check: reported, not hidden
        result = ("failed", f"{type(e).__name__}: {e}")
    conn.send(result)
    conn.close()


def _stop(process: Any) -> None:
    if process.pid is None:  # never started
        return
    if process.is_alive():
        process.kill()
    process.join()


async def check_upload(
    data: bytes,
    *,
    max_bytes: int,
    int_high: int | None,
    max_tensor_bytes: int | None,
    memory_of: str,
    time_limit_s: float,
) -> CheckedProgram:
    """``check_exported`` of ``data`` in a child process, killed after ``time_limit_s`` seconds of checking.

    Args:
        data, max_bytes, int_high, max_tensor_bytes, memory_of: as for ``memtune.profiler.exported.check_exported``.
        time_limit_s: seconds the check may take (the child's start is not counted).

    Returns:
        The checked program.

    Raises:
        ExportedError: the archive is refused (its subclasses for a size over a limit).
        ProblemError: 422 ``exported_check_timeout`` past the time limit, 500 ``exported_check_failed`` when the
            child died without an answer.
    """
    ctx = _context()
    receive, send = ctx.Pipe(duplex=False)
    kwargs = {"max_bytes": max_bytes, "int_high": int_high, "max_tensor_bytes": max_tensor_bytes}
    process = ctx.Process(  # type: ignore[attr-defined]
        target=_check, args=(send, data, {**kwargs, "memory_of": memory_of}), name="memtune-upload-check", daemon=True
    )
    try:
        await anyio.to_thread.run_sync(process.start)  # the first start boots the fork server (seconds)
        send.close()
        if not await anyio.to_thread.run_sync(receive.poll, time_limit_s):
            raise ProblemError(
                422,
                "exported_check_timeout",
                "Exported program took too long to check",
                f"checking the archive took over {time_limit_s:g} s (MEMTUNE_MAX_EXPORTED_CHECK_S) and was stopped; "
                "nothing was stored. A model's training graph has some thousands of nodes: send the program as "
                "torch.export.save wrote it, without dead code",
                limit_s=time_limit_s,
            )
        try:
            kind, value = await anyio.to_thread.run_sync(receive.recv)
        except EOFError:
            kind, value = "failed", "the checking process ended without an answer"
    finally:
        receive.close()
        send.close()
        await anyio.to_thread.run_sync(_stop, process)
    if kind == "ok":
        assert isinstance(value, CheckedProgram)
        return value
    if kind == "refused":
        raise value
    raise ProblemError(
        500,
        "exported_check_failed",
        "Exported program check failed",
        f"the archive's check failed ({value}, exit code {process.exitcode}); see the server log",
    )
