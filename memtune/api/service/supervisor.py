"""``memtune serve``'s watch over its worker process: restarted with back-off when it dies, given up on loudly.

# NOTE [ Supervised worker ]
A worker process that dies (a SIGKILL, an out-of-memory kill, a crash in a library) used to stay a zombie while
``/healthz`` answered 200 and new jobs stayed ``queued``. ``WorkerSupervisor`` starts the worker, reaps it when it
exits and starts it again after a back-off (1, 2, 4 … 60 s), logging each exit as an error with its exit code. A
worker that exits ``max_restarts`` times within ``window_s`` is not started again: the supervisor logs that it gave
up (critical) and its state stays ``down``. ``/healthz`` reads the state: ``up`` answers 200; ``restarting`` (between
an exit and the next start) and ``down`` answer 503 ``degraded``. A job the dead worker had claimed is reclaimed by
the next worker once its heartbeat is stale (``stale_after_s``), as for a worker on another host.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Literal

__all__ = ["WorkerState", "WorkerSupervisor"]

log = logging.getLogger(__name__)

WorkerState = Literal["up", "restarting", "down"]


class WorkerSupervisor:
    """Run ``start()``'s process and keep it running (NOTE [ Supervised worker ]).

    Args:
        start: starts the worker process.
        stop: stops it (terminate, then kill).
        backoff_s: waits before the first, second … restart; the last repeats.
        max_restarts: exits within ``window_s`` after which the supervisor gives up.
        window_s: seconds over which exits are counted.
        poll_s: seconds between looks at the process.
    """

    def __init__(
        self,
        start: Callable[[], subprocess.Popen[bytes]],
        stop: Callable[[subprocess.Popen[bytes]], None],
        *,
        backoff_s: Sequence[float] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0),
        max_restarts: int = 5,
        window_s: float = 600.0,
        poll_s: float = 0.5,
    ) -> None:
        if not backoff_s or max_restarts < 1:
            raise ValueError("a supervisor needs at least one back-off and one restart")
        self._start, self._stop = start, stop
        self.backoff_s, self.max_restarts, self.window_s, self.poll_s = tuple(backoff_s), max_restarts, window_s, poll_s
        self._exits: deque[float] = deque()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._state: WorkerState = "down"
        self._thread: threading.Thread | None = None
        self.restarts = 0

    @property
    def state(self) -> WorkerState:
        """``up`` while the worker runs, ``restarting`` between an exit and the next start, ``down`` given up."""
        return self._state

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return None if proc is None else proc.pid

    def start(self) -> None:
        """Start the worker and the thread that watches it."""
        with self._lock:
            self._proc, self._state = self._start(), "up"
        self._thread = threading.Thread(target=self._watch, name="memtune-worker-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching, then stop the worker."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5 + self.poll_s)
        with self._lock:
            if self._proc is not None:
                self._stop(self._proc)

    def _watch(self) -> None:
        while not self._stopping.wait(self.poll_s):
            proc = self._proc
            code = None if proc is None else proc.poll()  # poll reaps an exited child: no zombie
            if code is None:
                continue
            now = time.monotonic()
            self._exits.append(now)
            while self._exits and now - self._exits[0] > self.window_s:
                self._exits.popleft()
            if len(self._exits) >= self.max_restarts:
                self._state = "down"
                log.critical(
                    "the job worker exited %d times within %.0f s (last exit code %s); not starting it again: jobs "
                    "stay queued until a worker runs (memtune worker, or restart memtune serve)",
                    len(self._exits),
                    self.window_s,
                    code,
                )
                return
            wait = self.backoff_s[min(len(self._exits) - 1, len(self.backoff_s) - 1)]
            self._state = "restarting"
            log.error("the job worker exited with code %s; starting it again in %.1f s", code, wait)
            if self._stopping.wait(wait):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                self._proc, self._state = self._start(), "up"
            self.restarts += 1
