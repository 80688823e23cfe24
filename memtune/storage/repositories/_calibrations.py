"""GPU types' calibrations: one JSON object per GPU type key, with who measured or sent it.

The repository stores what it is given (callers check it with ``memtune.tuner.calibration.Calibration.from_data``):
``put`` replaces a GPU type's calibration, ``add_first`` keeps the one already stored (NOTE [ Calibrations in the
service ] in ``memtune.api.service.worker``: the first measurement of a GPU type is the one every worker uses).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from memtune.storage._storage_errors import NotFoundError
from memtune.storage.orm import CalibrationRow, utcnow
from memtune.storage.records import CalibrationRecord
from memtune.storage.repositories._convert import to_calibration

__all__ = ["CalibrationRepository"]


def _checked(gpu_key: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with ``gpu`` set to ``gpu_key``; ValueError when it names another GPU type."""
    if not gpu_key:
        raise ValueError("a calibration needs a GPU type key")
    named = data.get("gpu", gpu_key)
    if named != gpu_key:
        raise ValueError(f"calibration data names GPU type {named!r}, not {gpu_key!r} (field 'gpu')")
    return {**copy.deepcopy(dict(data)), "gpu": gpu_key}


class CalibrationRepository:
    """Calibrations in ``mt_calibrations``, keyed by GPU type key (``h200``)."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def get(self, gpu_key: str) -> CalibrationRecord:
        row = self.s.get(CalibrationRow, gpu_key)
        if row is None:
            raise NotFoundError(f"no calibration of GPU type {gpu_key!r} is stored")
        return to_calibration(row)

    def find(self, gpu_key: str) -> CalibrationRecord | None:
        row = self.s.get(CalibrationRow, gpu_key)
        return None if row is None else to_calibration(row)

    def list_all(self, gpu_keys: Sequence[str] | None = None) -> list[CalibrationRecord]:
        """Every stored calibration (of ``gpu_keys`` only, when given), by key."""
        q = select(CalibrationRow).order_by(CalibrationRow.gpu_key)
        if gpu_keys is not None:
            q = q.where(CalibrationRow.gpu_key.in_(list(gpu_keys)))
        return [to_calibration(r) for r in self.s.scalars(q)]

    def put(self, gpu_key: str, data: Mapping[str, Any], *, source: str, measured_by: str | None) -> CalibrationRecord:
        """Store ``data`` as ``gpu_key``'s calibration, replacing a stored one (its ``created_at`` is kept).

        Raises:
            ValueError: ``data`` names another GPU type in ``gpu``.
        """
        stored = _checked(gpu_key, data)
        row = self.s.get(CalibrationRow, gpu_key)
        now = utcnow()
        if row is None:
            row = CalibrationRow(gpu_key=gpu_key, created_at=now)
            self.s.add(row)
        row.data = stored
        row.source = source
        row.measured_by = measured_by
        row.updated_at = now
        self.s.flush()
        return to_calibration(row)

    def add_first(
        self, gpu_key: str, data: Mapping[str, Any], *, source: str, measured_by: str | None
    ) -> tuple[CalibrationRecord, bool]:
        """Store ``data`` unless ``gpu_key`` has a calibration already; ``(stored, created)``: the stored one wins.

        Two writers racing on one GPU type: one insert fails with ``ConflictError`` when the session commits; read
        the winner with ``find`` in a new session.

        Raises:
            ValueError: ``data`` names another GPU type in ``gpu``.
        """
        stored = _checked(gpu_key, data)
        existing = self.s.get(CalibrationRow, gpu_key)
        if existing is not None:
            return to_calibration(existing), False
        now = utcnow()
        row = CalibrationRow(
            gpu_key=gpu_key, data=stored, source=source, measured_by=measured_by, created_at=now, updated_at=now
        )
        self.s.add(row)
        self.s.flush()
        return to_calibration(row), True
