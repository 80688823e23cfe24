"""``/v1/profiles/{id}``: a stored profile."""

from __future__ import annotations

from fastapi import APIRouter

from memtune.api.service._deps import DbDep, IdPath, ReadAccess
from memtune.api.service._views import profile_public
from memtune.api.service.schemas import ProfilePublic
from memtune.storage.repositories import ProfileRepository

__all__ = ["router"]

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])


@router.get("/{profile_id}", response_model=ProfilePublic)
def get_profile(profile_id: IdPath, db: DbDep, _read: ReadAccess) -> ProfilePublic:
    """A stored profile (per-stage forward/backward ms, saved bytes, transfer ms; measured or modeled).

    ``profile_id`` is 1 to 2**31 - 1; anything else (0, negative, more than the database's ids hold) is 422."""
    with db.session() as s:
        return profile_public(ProfileRepository(s).get(profile_id))
