"""Profiles: store a ``Profile`` once per (model, GPU type, batch, dtype, source) and load it back."""

from __future__ import annotations

from sqlalchemy import case, select
from sqlalchemy.orm import Session

from memtune.profiler import Profile
from memtune.storage._storage_errors import NotFoundError
from memtune.storage.orm import ProfileRow
from memtune.storage.records import ProfileRecord
from memtune.storage.repositories._convert import to_profile
from memtune.storage.repositories._gpus import GpuRepository

__all__ = ["ProfileRepository"]


class ProfileRepository:
    """Profiles in ``mt_profiles``; storing one upserts its GPU type."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def store(self, model_id: str, profile: Profile) -> ProfileRecord:
        """Store ``profile`` for ``model_id`` (replacing the JSON of an existing row with the same key)."""
        GpuRepository(self.s).upsert(profile.device)
        q = select(ProfileRow).where(
            ProfileRow.model_id == model_id,
            ProfileRow.gpu_key == profile.device.key,
            ProfileRow.batch == profile.batch,
            ProfileRow.dtype == profile.dtype,
            ProfileRow.source == profile.source,
        )
        row = self.s.scalar(q)
        if row is None:
            row = ProfileRow(
                model_id=model_id,
                gpu_key=profile.device.key,
                batch=profile.batch,
                dtype=profile.dtype,
                source=profile.source,
            )
            self.s.add(row)
        row.profile_json = profile.to_json()
        self.s.flush()
        return to_profile(row)

    def find(self, model_id: str, gpu_key: str, batch: int, dtype: str) -> ProfileRecord | None:
        """The stored profile for this key, ``measured`` preferred over ``modeled``; None when absent."""
        q = (
            select(ProfileRow)
            .where(
                ProfileRow.model_id == model_id,
                ProfileRow.gpu_key == gpu_key,
                ProfileRow.batch == batch,
                ProfileRow.dtype == dtype,
            )
            .order_by(
                case((ProfileRow.source == "measured", 0), else_=1),
                ProfileRow.id.desc(),
            )
            .limit(1)
        )
        row = self.s.scalar(q)
        return None if row is None else to_profile(row)

    def get(self, profile_id: int) -> ProfileRecord:
        row = self.s.get(ProfileRow, profile_id)
        if row is None:
            raise NotFoundError(f"profile {profile_id} does not exist")
        return to_profile(row)
