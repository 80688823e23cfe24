"""A worker's calibrations: those of the database installed in its process, and the first calibration of a GPU type
measured (or taken from this host's file) before a job's search (NOTE [ Calibrations in the service ] in
``memtune.api.worker``).

``install_stored_calibrations`` installs the database's calibrations of the GPU types a worker serves;
``FirstCalibration`` calibrates a job's GPU type first where it has none, with ``calibrate_fn`` (``measure_calibration``
by default, about a minute). Headrooms are shares of a budget (0 to 1).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtune.api.job_lease import LeaseLost, LeaseWatch
from memtune.api.job_profiles import stored_model
from memtune.api.job_validation import validation_refusal
from memtune.storage import ConflictError, Database, StorageError
from memtune.storage.records import CalibrationRecord, Job
from memtune.storage.repositories import CalibrationRepository, JobLease, JobRepository
from memtune.tuner import CalibrationError
from memtune.tuner.calibration import Calibration, calibration_for, install_calibration, installed_calibrations

__all__ = ["CalibrateFn", "FirstCalibration", "install_stored_calibrations", "measure_calibration"]

log = logging.getLogger("memtune.worker")


CalibrateFn = Callable[[Callable[[str], None]], Mapping[str, Any]]
"""Measures the calibration of this process's GPU type and returns its JSON object (``memtune.tuner.calibration``),
given a function it calls with progress text; ``measure_calibration`` by default (NOTE [ Calibrations in the
service ])."""


def measure_calibration(progress: Callable[[str], None]) -> dict[str, Any]:
    """Measure this process's GPU type's calibration (``memtune.tuner.measure.calibrate.calibrate``, NOTE [ Calibrating
    a GPU type ]; about a minute) and return its JSON object. The file it writes is temporary: the database keeps it.

    Raises:
        TunerError: no CUDA device, or the reference plans did not run.
    """
    from memtune.tuner.measure.calibrate import calibrate

    with tempfile.TemporaryDirectory(prefix="memtune-calibration-") as tmp:
        return dict(calibrate(output=Path(tmp) / "calibration.json", progress=progress).data)


def install_stored_calibrations(db: Database, gpu_keys: Sequence[str] | None, worker_id: str) -> list[str]:
    """Install the database's calibrations of the GPU types ``gpu_keys`` (all, when None: a worker serving every one)
    in this process; the keys of those in effect. ``worker_id`` names the worker in the log. Never raises: a database
    error or a malformed row is logged and the calibrations installed before stay."""
    try:
        with db.session() as s:
            records = CalibrationRepository(s).list_all(gpu_keys)
    except StorageError as e:
        log.warning("worker %s: the stored calibrations could not be read: %s", worker_id, e)
        return []
    installed = installed_calibrations()
    keys: list[str] = []
    for record in records:
        current = installed.get(record.gpu_key)
        if current is None or current.data != record.data:
            try:
                install_calibration(record.data)
            except CalibrationError as e:
                log.warning("worker %s: the stored calibration of %r is ignored: %s", worker_id, record.gpu_key, e)
                continue
            log.info("worker %s: installed the stored calibration of GPU type %r", worker_id, record.gpu_key)
        keys.append(record.gpu_key)
    return keys


@dataclass
class FirstCalibration:
    """Calibrates a job's GPU type before its search where the type has no calibration (NOTE [ Calibrations in the
    service ]).

    Args:
        db: the database holding the calibrations and the job.
        worker_id: recorded as who measured a calibration this worker stores.
        calibrate_fn: measures this GPU type's calibration.
        local_gpu: the GPU type of this worker's CUDA device, or None without one.
    """

    db: Database
    worker_id: str
    calibrate_fn: CalibrateFn
    local_gpu: Callable[[], str | None]

    def _needs_calibration(self, job: Job) -> Calibration | None:
        """This host's calibration of the job's GPU type (origin ``user file`` or ``none``) when this worker is to
        calibrate the type first (NOTE [ Calibrations in the service ]); None when it is not."""
        if job.validate_top_k <= 0:
            return None
        with self.db.session() as s:
            if CalibrationRepository(s).find(job.gpu_key) is not None:
                return None
        try:
            local = calibration_for(job.gpu_key)
        except CalibrationError as e:
            log.warning("job %s: this host's calibration file is ignored: %s", job.id, e)
            local = Calibration(job.gpu_key)
        if local.origin not in ("user file", "none") or validation_refusal(stored_model(self.db, job), job) is not None:
            return None
        return local if self.local_gpu() == job.gpu_key else None

    def run(self, job: Job, lease: JobLease, watch: LeaseWatch) -> tuple[Job, str | None]:
        """Calibrate the job's GPU type before its search when it has no calibration (NOTE [ Calibrations in the
        service ]); the job (at the new headroom when its own came from no calibration) and what happened, for its
        validation note (None when nothing was done). Never raises but LeaseLost."""
        local = self._needs_calibration(job)
        if local is None:
            return job, None
        key = job.gpu_key
        self._pending_note(job, lease, watch, f"GPU type {key!r} has no calibration: calibrating it on this worker")
        try:
            record, created, how = self._first_calibration(job, lease, watch, local)
            cal = install_calibration(record.data)
            if created:
                text = f"calibrated GPU type {key!r} first ({how}; headroom {cal.headroom:g}), stored for every worker"
            else:
                by = record.measured_by or "another worker"
                text = f"GPU type {key!r} was calibrated by {by} meanwhile (headroom {cal.headroom:g}); it is used"
            if job.headroom_source == "none":
                job = self._search_at(job, lease, watch, cal.headroom)
                text += "; this job is searched at that headroom (it had none)"
        except LeaseLost:
            raise
        except Exception as e:
            log.warning("job %s: calibrating GPU type %r failed: %s", job.id, key, e, exc_info=True)
            text = f"calibrating GPU type {key!r} failed, so its plans are searched at headroom {job.headroom:g}: "
            text = (text + f"{type(e).__name__}: {e}")[:2000]
        else:
            log.info("job %s: %s", job.id, text)
        self._pending_note(job, lease, watch, text)
        return job, text

    def _first_calibration(
        self, job: Job, lease: JobLease, watch: LeaseWatch, local: Calibration
    ) -> tuple[CalibrationRecord, bool, str]:
        """This host's calibration file of the job's GPU type, else one measured now, stored unless one was stored
        meanwhile: ``(stored, created, how it was got)``."""
        key = job.gpu_key
        if local.origin == "user file":
            how, data = "from this host's `memtune calibrate` file", local.to_data()
        else:
            how = "measured on this worker's GPU"
            data = dict(
                self.calibrate_fn(
                    lambda what: self._pending_note(job, lease, watch, f"calibrating GPU type {key!r}: {what}")
                )
            )
        record, created = self._store_first(Calibration.from_data(data, gpu=key))
        return record, created, how

    def _search_at(self, job: Job, lease: JobLease, watch: LeaseWatch, headroom: float) -> Job:
        """Store ``headroom`` (from the database's calibration) as the job's; the job with it."""
        with self.db.session() as s:
            st = JobRepository(s).set_headroom(lease, headroom, "database")
        if st.lost:
            raise LeaseLost
        watch.note(st.lost, st.cancel)
        return dataclasses.replace(job, headroom=headroom, headroom_source="database")

    def _store_first(self, cal: Calibration) -> tuple[CalibrationRecord, bool]:
        """Store ``cal`` unless its GPU type has one already (the first stored wins); ``(stored, created)``."""
        try:
            with self.db.session() as s:
                return CalibrationRepository(s).add_first(
                    cal.gpu, cal.to_data(), source=cal.source, measured_by=self.worker_id
                )
        except ConflictError:  # another worker stored one between our look and our insert
            with self.db.session() as s:
                return CalibrationRepository(s).get(cal.gpu), False

    def _pending_note(self, job: Job, lease: JobLease, watch: LeaseWatch, text: str) -> None:
        """Show ``text`` as the job's validation note before its search (the events stream shows it)."""
        try:
            with self.db.session() as s:
                st = JobRepository(s).set_validation(lease, "pending", note=text)
            watch.note(st.lost, st.cancel)
        except Exception as e:  # like a missed heartbeat: the work goes on
            log.warning("job %s: note write failed: %s", job.id, e)
