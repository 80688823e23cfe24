"""GPU types: upsert from a profile's ``DeviceIdentity``, list, find the same architecture."""

from __future__ import annotations

import hashlib
import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from memtune.profiler import DeviceIdentity
from memtune.storage.orm import GpuTypeRow
from memtune.storage.records import GpuType
from memtune.storage.repositories._convert import to_gpu
from memtune.storage.storage_errors import NotFoundError

__all__ = ["GpuRepository", "identity_hash"]

_IDENTITY_FIELDS = (
    "name",
    "compute_capability",
    "sm_count",
    "memory_bytes",
    "pcie_gen",
    "pcie_width",
    "driver",
    "cudnn_version",
)


def identity_hash(identity: DeviceIdentity) -> str:
    """SHA-256 (hex) of the structured identity fields, in a canonical JSON form: stable across runs."""
    data = {f: getattr(identity, f) for f in _IDENTITY_FIELDS}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class GpuRepository:
    """GPU types in ``mt_gpu_types``, keyed by the identity's short key (``h200``)."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def upsert(self, identity: DeviceIdentity) -> GpuType:
        """Insert the GPU type or update its identity fields (a newer driver, a measured identity)."""
        row = self.s.get(GpuTypeRow, identity.key)
        if row is None:
            row = GpuTypeRow(key=identity.key)
            self.s.add(row)
        for f in _IDENTITY_FIELDS:
            setattr(row, f, getattr(identity, f))
        row.identity_hash = identity_hash(identity)
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
