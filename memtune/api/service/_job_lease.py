"""A worker's hold on one claimed job: the lease watch that heartbeats it, and the exception that drops the job.

A worker heartbeats the lease of the job it runs from a thread of its own (``LeaseWatch``) and remembers whether the
job was reclaimed by another worker (a lost lease) or cancelled; a step that finds the lease lost raises ``LeaseLost``
and the worker drops the job without writing (NOTE [ Job claims ] in ``memtune.storage.repositories._jobs``).
"""

from __future__ import annotations

import logging
import threading

from memtune.storage import Database
from memtune.storage.repositories import JobLease, JobRepository

__all__ = ["LeaseLost", "LeaseWatch"]

log = logging.getLogger("memtune.worker")


class LeaseLost(Exception):
    """The job was reclaimed by another worker: stop without writing."""


class LeaseWatch:
    """Heartbeats one lease on a thread and remembers whether it was lost or a cancel was asked.

    Args:
        db: the database holding the job.
        lease: the claimed job's lease.
        interval_s: seconds between two heartbeats.
    """

    def __init__(self, db: Database, lease: JobLease, interval_s: float) -> None:
        self.db = db
        self.lease = lease
        self.interval_s = interval_s
        self.lost = False
        self.cancel = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{lease.job_id[:8]}", daemon=True)

    def start(self) -> None:
        """Start heartbeating on the watch's thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop heartbeating; waits up to 10 s for the thread."""
        self._stop.set()
        self._thread.join(timeout=10)

    def note(self, lost: bool, cancel: bool) -> None:
        """Remember a lost lease or a cancel a database write reported (once seen, they stay)."""
        self.lost = self.lost or lost
        self.cancel = self.cancel or cancel

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with self.db.session() as s:
                    st = JobRepository(s).heartbeat(self.lease)
                self.note(st.lost, st.cancel)
            except Exception as e:  # a missed heartbeat is retried; the job is reclaimed only after many
                log.warning("heartbeat of job %s failed: %s", self.lease.job_id, e)
            if self.lost:
                return

    def should_stop(self) -> bool:
        """Whether the job's work should stop: its lease was lost or a cancel was asked."""
        return self.lost or self.cancel
