"""The lower bound ``memtune tune`` prints, computed beside the search.

# NOTE [ Bound beside the search ]
``memtune tune`` prints, under the best plan, the least step any plan can take at the budget
(``memtune.tuner.bound.step_lower_bound``, NOTE [ Budget bound ]). It depends on the profile and the budget alone, not
on the search, and on VGG-16 at 13 GiB it took 1.3-1.5 s of the README job's CPU (pricing some 330 workspace caps and
solving one linear program) after the search's 14. So the command starts it in a forked child process before the
search and reads its answer when it prints: on a machine with a second core idle the answer is ready when the search
ends. The child runs at a lower priority (``nice``), so it takes no time from the search where the cores are busy.
The answer is the one computed in the command's own process (the same code on the same profile); where no child can
be forked (no ``fork`` start method), it failed, or it gave no answer, the bound is computed in the process as
before, so a failure there shows as it did. Where the child's solver gave no answer (``BoundError``), ``result``
raises that error, as the command's own solver would. ``memtune.tuner.bound`` imports SciPy's solver only to solve
(about a second of the command's own time before: the child imports it, the command's process no longer does).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from memtune.profiler import Profile
    from memtune.tuner.bound import StepBound

__all__ = ["BoundBeside"]

_NICE = 10  # the child's niceness above the command's


class BoundBeside:
    """``step_lower_bound(Simulator(profile, optimizer), budget_bytes)`` from a child process started now.

    Args:
        profile: the profile the search tunes.
        optimizer: the optimizer whose state the simulator counts.
        budget_bytes: the budget the bound is for, bytes.
    """

    def __init__(self, profile: Profile, optimizer: str, budget_bytes: int) -> None:
        self._args = (profile, optimizer, budget_bytes)
        self._proc: Any = None
        self._conn: Connection | None = None
        if "fork" not in multiprocessing.get_all_start_methods():
            return
        ctx = multiprocessing.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(send, *self._args), name="memtune-bound", daemon=True)
        try:
            proc.start()
        except OSError:  # no process to spare: the bound is computed when asked for
            receive.close()
            send.close()
            return
        send.close()
        self._proc, self._conn = proc, receive

    def result(self) -> StepBound:
        """The bound: the child's answer, else computed here.

        Raises:
            BoundError: the solver stopped without an answer (``step_lower_bound``), in the child or here.
        """
        answer: tuple[str, Any] | None = None
        if self._conn is not None:
            try:
                answer = self._conn.recv()
            except (EOFError, OSError):  # the child died without an answer
                answer = None
            self.close()
        if answer is not None and answer[0] == "bound":
            bound: StepBound = answer[1]
            return bound
        if answer is not None and answer[0] == "no answer":
            from memtune.tuner import BoundError

            raise BoundError(answer[1])
        from memtune.tuner import Simulator
        from memtune.tuner.bound import step_lower_bound

        profile, optimizer, budget_bytes = self._args
        return step_lower_bound(Simulator(profile, optimizer), budget_bytes)

    def close(self) -> None:
        """Stop the child if it still runs and release the pipe (safe to call twice)."""
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.terminate()
            self._proc.join()
            self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _child(send: Connection, profile: Profile, optimizer: str, budget_bytes: int) -> None:
    """The child: the bound, or the solver's message where it gave no answer, or a mark that something else failed
    (the command then computes the bound itself)."""
    with contextlib.suppress(OSError):
        os.nice(_NICE)
    try:
        from memtune.tuner import BoundError, Simulator
        from memtune.tuner.bound import step_lower_bound

        try:
            answer: tuple[str, Any] = ("bound", step_lower_bound(Simulator(profile, optimizer), budget_bytes))
        except BoundError as exc:
            answer = ("no answer", str(exc))
        except Exception as exc:  # the command computes it again and shows what failed
            answer = ("failed", repr(exc))
        send.send(answer)
    finally:
        send.close()
