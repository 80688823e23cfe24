"""GPU types' calibrations as the service sees them: its database's first, else this host's files.

The order (NOTE [ Calibrations in the service ] in ``memtune.api.service.worker``): the calibration stored in the
service's database (``mt_calibrations``), else this host's ``memtune.tuner.calibration.calibration_for`` (the user's
file, then the committed one; workers install none), else none (headroom 0). A worker passes the calibration found to
the job's search (NOTE [ Calibration is an input ] in ``memtune.tuner.calibration``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.orm import Session

from memtune.storage.records import CalibrationRecord, HeadroomSource
from memtune.storage.repositories import CalibrationRepository
from memtune.tuner import CalibrationError
from memtune.tuner.calibration import Calibration, calibration_for

__all__ = ["ServiceCalibration", "ServiceOrigin", "effective_calibration", "job_headroom", "stored_calibration"]

ServiceOrigin = Literal["database", "user file", "committed", "none"]
"""Where the service found a GPU type's calibration."""

log = logging.getLogger("memtune.api")

_ORIGINS: dict[str, ServiceOrigin] = {
    "installed": "database",
    "user file": "user file",
    "committed": "committed",
    "none": "none",
}


@dataclass(frozen=True)
class ServiceCalibration:
    """A GPU type's calibration in effect, where it was found, and its database row when it came from there."""

    calibration: Calibration
    origin: ServiceOrigin
    record: CalibrationRecord | None = None


def stored_calibration(record: CalibrationRecord) -> Calibration | None:
    """The calibration of a database row, or None (with a warning) when the row's data is malformed."""
    try:
        return Calibration.from_data(record.data, gpu=record.gpu_key)
    except CalibrationError as e:
        log.warning("the stored calibration of GPU type %r is ignored: %s", record.gpu_key, e)
        return None


def effective_calibration(
    session: Session, gpu_key: str, *, stored: Mapping[str, CalibrationRecord] | None = None
) -> ServiceCalibration:
    """The calibration of ``gpu_key`` the service uses (see the module's docstring).

    Args:
        session: a database session.
        gpu_key: the GPU type's key (``h200``).
        stored: every stored calibration by key, when the caller read them already (no query then).
    """
    row = stored.get(gpu_key) if stored is not None else CalibrationRepository(session).find(gpu_key)
    in_database = stored_calibration(row) if row is not None else None
    if in_database is not None:
        return ServiceCalibration(in_database, "database", row)
    try:
        local = calibration_for(gpu_key)
    except CalibrationError as e:  # a malformed file on this host: as if there were none, said in the log
        log.warning("the calibration file of GPU type %r is ignored: %s", gpu_key, e)
        return ServiceCalibration(Calibration(gpu_key), "none")
    return ServiceCalibration(local, _ORIGINS[local.origin])


def job_headroom(session: Session, gpu_key: str, requested: float | None) -> tuple[float, HeadroomSource]:
    """The headroom a new job of ``gpu_key`` is searched at, and where it came from: ``requested`` when given, else
    the GPU type's calibration in effect (``effective_calibration``; 0 with ``none``)."""
    if requested is not None:
        return requested, "request"
    found = effective_calibration(session, gpu_key)
    return found.calibration.headroom, found.origin
