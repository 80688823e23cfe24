"""A job's calibration: the one its search is priced with, and the first calibration of a GPU type measured (or taken
from this host's file) before a job's search (NOTE [ Calibrations in the service ] in ``memtune.api.service.worker``).

``job_calibration`` is the calibration of a job's GPU type as the service finds it (the database's, else this host's
files), passed to the search (NOTE [ Calibration is an input ] in ``memtune.tuner.calibration``): nothing is installed
in the process, so no job's prices depend on another's. ``FirstCalibration`` calibrates a job's GPU type first where
it has none, with ``calibrate_fn`` (``measure_calibration`` by default, about a minute), and hands back the calibration
it stored. Headrooms are shares of a budget (0 to 1).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtune.api.service._calibration_lookup import effective_calibration
from memtune.api.service._job_lease import LeaseLost, LeaseWatch
from memtune.api.service._job_profiles import stored_model
from memtune.api.service._job_validation import validation_refusal
from memtune.storage import ConflictError, Database
from memtune.storage.records import CalibrationRecord, Job
from memtune.storage.repositories import CalibrationRepository, JobLease, JobRepository
from memtune.tuner import CalibrationError
from memtune.tuner.calibration import Calibration, calibration_for

__all__ = ["CalibrateFn", "FirstCalibration", "job_calibration", "measure_calibration"]

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


def job_calibration(db: Database, job: Job) -> Calibration:
    """The calibration ``job``'s search is priced with (NOTE [ Calibrations in the service ]): ``Calibration.from_data``
    of the database's row for ``job.gpu_key``, else this host's file of the type (the user's, then the committed one;
    ``calibration_for``), else an empty one. Installs nothing. A malformed row or file is logged and passed over.

    Raises:
        StorageError: the database could not be read (the job fails, naming it, rather than be priced otherwise).
    """
    with db.session() as s:
        return effective_calibration(s, job.gpu_key).calibration


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

    def run(self, job: Job, lease: JobLease, watch: LeaseWatch) -> tuple[Job, str | None, Calibration | None]:
        """Calibrate the job's GPU type before its search when it has no calibration (NOTE [ Calibrations in the
        service ]). Returns the job (at the new headroom when its own came from no calibration), what happened, for
        its validation note, and the calibration stored for the type, for the job's search; the last two None when
        nothing was done, the calibration None too when calibrating failed (``job_calibration`` then). Installs
        nothing. Never raises but LeaseLost."""
        local = self._needs_calibration(job)
        if local is None:
            return job, None, None
        key = job.gpu_key
        self._pending_note(job, lease, watch, f"GPU type {key!r} has no calibration: calibrating it on this worker")
        cal: Calibration | None = None
        try:
            record, created, how = self._first_calibration(job, lease, watch, local)
            cal = Calibration.from_data(record.data, gpu=record.gpu_key)
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
            cal = None
            log.warning("job %s: calibrating GPU type %r failed: %s", job.id, key, e, exc_info=True)
            text = f"calibrating GPU type {key!r} failed, so its plans are searched at headroom {job.headroom:g}: "
            text = (text + f"{type(e).__name__}: {e}")[:2000]
        else:
            log.info("job %s: %s", job.id, text)
        self._pending_note(job, lease, watch, text)
        return job, text, cal

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
