"""GPU types: upsert from a profile's ``DeviceIdentity``, list, find the same architecture (NOTE [ GPU identity ] in
``memtune.storage.records``)."""

from __future__ import annotations

import dataclasses

from sqlalchemy import select
from sqlalchemy.orm import Session

from memtune.profiler import DeviceIdentity
from memtune.storage._storage_errors import NotFoundError
from memtune.storage.orm import GpuTypeRow
from memtune.storage.records import GpuType, identity_hash
from memtune.storage.repositories._convert import to_gpu

__all__ = ["GpuRepository", "identity_hash"]


class GpuRepository:
    """GPU types in ``mt_gpu_types``, keyed by the identity's short key (``h200``)."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def upsert(self, identity: DeviceIdentity) -> GpuType:
        """Insert the GPU type or update its identity fields (a newer driver, a measured identity)."""
        gpu = GpuType.from_identity(identity)
        row = self.s.get(GpuTypeRow, gpu.key)
        if row is None:
            row = GpuTypeRow(key=gpu.key)
            self.s.add(row)
        for column, value in dataclasses.asdict(gpu).items():
            if column != "key":  # the primary key, set when the row is made
                setattr(row, column, value)
        self.s.flush()
        return to_gpu(row)

    def get(self, key: str) -> GpuType:
        row = self.s.get(GpuTypeRow, key)
        if row is None:
            raise NotFoundError(f"GPU type {key!r} is not stored; GET /v1/gpus lists the known ones")
        return to_gpu(row)

    def find(self, key: str) -> GpuType | None:
        row = self.s.get(GpuTypeRow, key)
        return None if row is None else to_gpu(row)

    def list_all(self) -> list[GpuType]:
        return [to_gpu(r) for r in self.s.scalars(select(GpuTypeRow).order_by(GpuTypeRow.key))]

    def same_architecture(self, compute_capability: str) -> list[GpuType]:
        """GPU types with this compute capability (e.g. ``9.0``), by key."""
        q = select(GpuTypeRow).where(GpuTypeRow.compute_capability == compute_capability)
        return [to_gpu(r) for r in self.s.scalars(q.order_by(GpuTypeRow.key))]
