"""Workers' heartbeats: which worker processes are alive, and which queued GPU types none of them serves.

# NOTE [ Worker heartbeats ]
A worker (``memtune.api.service.worker.Worker``) writes a row of ``mt_workers`` when it starts and refreshes its
``last_seen`` every ``heartbeat_interval_s`` from a thread of its own, idle or busy, and deletes it when it stops
cleanly. A worker
whose ``last_seen`` is older than ``stale_after_s`` (the same limit after which its running job is reclaimed) is taken
as
dead: killed, out of memory, on a host that went away. ``/healthz`` then reads, for every GPU type with a queued job,
whether a live worker serves it (one that serves every GPU type, or that one by name), and answers 503 ``degraded``
naming the GPU types none serves: before, a killed worker left ``/healthz`` at 200 and new jobs queued for ever. A
dead worker's row stays until it is older than a day; every live worker's heartbeat prunes older ones (``prune``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from memtune.storage.orm import JobRow, WorkerRow, utcnow

__all__ = ["WorkerRecord", "WorkerRepository"]

#: a dead worker's row is deleted once it has not been seen for this long
PRUNE_AFTER = timedelta(days=1)


@dataclass(frozen=True)
class WorkerRecord:
    """One worker's heartbeat row."""

    id: str
    gpu_keys: tuple[str, ...] | None
    started_at: datetime
    last_seen: datetime

    def serves(self, gpu_key: str) -> bool:
        """Whether it claims jobs of GPU type ``gpu_key``."""
        return self.gpu_keys is None or gpu_key in self.gpu_keys


class WorkerRepository:
    """Rows of ``mt_workers`` (NOTE [ Worker heartbeats ])."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def beat(self, worker_id: str, gpu_keys: Sequence[str] | None) -> None:
        """Say ``worker_id`` is alive now, serving ``gpu_keys`` (None: every GPU type)."""
        row = self.s.get(WorkerRow, worker_id)
        now = utcnow()
        if row is None:
            self.s.add(
                WorkerRow(
                    id=worker_id, gpu_keys=None if gpu_keys is None else list(gpu_keys), started_at=now, last_seen=now
                )
            )
        else:
            row.last_seen = now
            row.gpu_keys = None if gpu_keys is None else list(gpu_keys)
        self.s.flush()

    def gone(self, worker_id: str) -> None:
        """Delete ``worker_id``'s row: it stopped cleanly."""
        self.s.execute(delete(WorkerRow).where(WorkerRow.id == worker_id))

    def prune(self) -> int:
        """Delete the rows of workers not seen for ``PRUNE_AFTER``; how many."""
        result = self.s.execute(delete(WorkerRow).where(WorkerRow.last_seen < utcnow() - PRUNE_AFTER))
        return int(result.rowcount or 0)  # type: ignore[attr-defined]

    def all(self) -> list[WorkerRecord]:
        rows = self.s.scalars(select(WorkerRow).order_by(WorkerRow.last_seen.desc()))
        return [
            WorkerRecord(r.id, None if r.gpu_keys is None else tuple(r.gpu_keys), r.started_at, r.last_seen)
            for r in rows
        ]

    def alive(self, stale_after_s: float) -> list[WorkerRecord]:
        """Workers seen within ``stale_after_s`` seconds."""
        since = utcnow() - timedelta(seconds=stale_after_s)
        return [w for w in self.all() if w.last_seen >= since]

    def unserved(self, stale_after_s: float) -> list[str]:
        """The GPU types of queued jobs that no live worker serves, sorted."""
        queued = set(self.s.scalars(select(JobRow.gpu_key).where(JobRow.state == "queued").distinct()))
        live = self.alive(stale_after_s)
        return sorted(g for g in queued if not any(w.serves(g) for w in live))
