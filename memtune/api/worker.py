"""The job worker: claims queued jobs, gets a profile, runs the Optuna search, stores plans and progress.

A worker claims jobs atomically (NOTE [ Job claims ] in ``memtune.storage.repositories.jobs``) for the GPU types
it serves, heartbeats while it works, and writes progress (trials done / total, best so far) at most every
``progress_interval_s``. A job whose worker died (no heartbeat for ``stale_after_s``) is claimed again by
another worker; its Optuna study lives in the same database (``RDBStorage``) under the job's
``study_name``, so ``memtune.tuner.search.tune`` resumes it with every finished trial kept and fails the dead
worker's stale RUNNING trial (Optuna heartbeat, ``grace_period`` shorter than ``stale_after_s``).

Headroom: the search runs at the job's ``headroom`` (resolved when the job was submitted: the GPU type's
calibration unless the request gave one; NOTE [ Calibrations in the service ]), like ``memtune tune``: a plan is
feasible when its simulated peak fits ``budget_bytes * (1 - headroom)`` (NOTE [ Headroom ] in ``memtune.tuner.search``),
which leaves the caching allocator slack under the real cap. The job's ``budget_bytes`` and the stored results'
stay the budget asked for; their ``feasible`` flag is the search's, judged with the headroom.

Profiles: a stored profile for (model, GPU type, batch, dtype) is reused; else a committed measured
profile from ``memtune.profiler.library`` (zoo models at their default parameters); else a roofline profile
(``memtune.profiler.modeled``), built on the ``meta`` device so no memory is allocated. An exported program
(``memtune.profiler.exported``) is profiled by its module stages (``profile_module``): on this worker's GPU when it is
of the job's type, else its compute on the CPU and its copies from the job's GPU type's roofline spec. The search's
results are labeled ``simulated`` (the numbers come from the simulator, whatever the profile's source); the plans
validated on the GPU are stored again, labeled ``measured`` (NOTE [ Measured validation ]).

# NOTE [ Compiler points in the service ]
A plan may run the whole model compiled by ``torch.compile`` at one activation budget, priced by a compiler point of
the profile (NOTE [ Whole-model compile ] in ``memtune.tuner.whole``). A job's ``compile`` says what the worker does
about those points, after it has the job's profile and before the search:

* ``off``: the search runs on the profile without its compiler points, so no plan compiles the whole model.
* ``auto`` (the default): the profile's points are candidates. Where it has none and this worker's CUDA device is of
  the job's GPU type, the worker measures the model compiled whole at activation budgets ``COMPILE_BUDGETS`` (1, 0.5,
  0.25): a zoo model or spec by ``memtune.tuner.runtime.whole.measure_compiler_points``, each budget in a fresh process;
  an exported program by ``measure_module_points`` in this process, on the program loaded onto the GPU (NOTE [ Compiler
  points of a module ]). The points are stored with the profile, so later jobs of the model, batch and dtype reuse
  them. A budget that fails to compile is left out, named in the job's ``compile_note``; where none compiles, or the
  measurement fails, the note says why and the plans are eager. A worker without a GPU of the type plans eager, and
  the note says so.
* ``on``: as ``auto``, except that where the profile has no points and this worker cannot measure them (no CUDA GPU
  of the job's type) the job fails, its error naming the GPU type and how to get points. Compiling that fails on a
  GPU of the type still plans eager, as under ``auto``: the worker tried.

The job's ``compile_note`` says what is happening while it happens (the events stream shows it) and how it went. The
search serves a point where it fits and beats every searched plan; the job's best plan is then named ``compiled whole
<budget>``. The zoo and spec points are measured as ``memtune bench`` measures a step (SGD with momentum), like the
points ``memtune profile --compiler-sweep`` keeps.

# NOTE [ Measured validation ]
A job with ``validate_top_k`` > 0 asks the worker to measure its best plans on the GPU after the search:

1. The simulated results are stored first (they are served while the plans are measured) and the job's
   ``validation_state`` becomes ``running``.
2. The top ``validate_top_k`` distinct plans that fit the budget less the job's headroom (feasible in
   the search), by simulated step ms (a tie goes to the Optuna best, then Pareto points, then baselines),
   and after them the search's best plan without algorithm choice when the best plan chooses cuDNN
   algorithms and it is not among them (stored as ``optuna (no algorithm choice)``; NOTE [ Measured
   selection ] in ``memtune.tuner.search``: the plan served is the fastest measured, so algorithm choice is
   served only where the GPU measured it faster),
   are measured by ``memtune.tuner.runtime.validate.validate_plans``, each configuration in a fresh process that
   builds the model from its stored definition (NOTE [ Bench isolation ] in ``memtune.tuner.runtime.bench``: in one
   process, cuDNN's cached fallbacks of one capped plan slowed the next): the unplanned step first,
   then each plan under ``budget_guard`` at the job's full budget, the headroom being the allocator's
   slack (allocator settings as for ``memtune bench``: NOTE [ Allocator retries ]), ``validate_iters``
   timed steps after 3 warm-up steps. Each start is written to the job (``validation_note``: "validating
   plan i/k (name) on <device>"), so the events stream shows it. Cancellation and a lost lease are checked
   between two plans.
3. Each plan that ran is stored as a ``measured`` result under the name and kind of its simulated row,
   with the simulated numbers beside it (``predicted_step_ms``, ``predicted_peak_bytes``); a plan that ran
   out of memory or failed is named, with the error, in the note. The unplanned step's measurement is
   stored on the job (``measured_unconstrained_*``).

Validation never fails a job whose search succeeded. It is ``skipped``, with the reason in the note and
a warning in the log, when the worker has no CUDA device or a GPU of another type (measured numbers for an
H200 plan must come from an H200), when no plan fits, or when the job's optimizer is not ``sgd`` (the
measured step is SGD with momentum); it is ``failed``, with the error in the note, on anything unexpected.
In every case the simulated results stand.

# NOTE [ Calibrations in the service ]
A GPU type's calibration (``memtune.tuner.calibration``; above all its headroom, the share of a budget the search leaves
to the caching allocator) is kept in the service's database, one per GPU type (``mt_calibrations``). Where the
service looks for one, the first found wins:

1. the database's: sent with ``PUT /v1/gpus/{key}/calibration``, or measured by a worker (below);
2. the host's files: the user's (``memtune calibrate``), then the committed one (``memtune/tuner/data``);
3. none: headroom 0, so plans are searched right up to the budget.

A job's headroom is resolved in that order when it is submitted (unless the request gives one) and stored with
where it came from (``headroom_source``). A worker installs the database's calibrations of the GPU types it
serves in its process (``memtune.tuner.calibration.install_calibration``) when it starts and before each job, so that
its searches (compute scales, allocator prices) use them too.

First measurement: a GPU type with no calibration in the database nor a committed one is calibrated by the first
worker about to measure plans of it on its own GPU: a job of that type with ``validate_top_k`` > 0 that validation
would not skip, on a worker whose CUDA device is of that type. Before the job's search the worker takes this host's
``memtune calibrate`` file of the type when it has one, else measures one (``calibrate_fn``: by default
``memtune.tuner.runtime.calibrate.calibrate`` into a temporary file, NOTE [ Calibrating a GPU type ], about a minute);
stores it unless another worker stored one first (the first stored is kept: a later one replaces it only through
``PUT``); installs it; and, when the job's headroom came from no calibration (``none``), searches the job at the new
headroom (stored on the job, ``headroom_source`` ``database``), so that the first plan measured on a new GPU type
runs within its budget. The job's validation note says what is happening while it happens, and how it went at the
end. Calibrating never fails a job: a failure is named in the note, with a warning in the log, and the job goes on
at the headroom it had.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from uuid import uuid4

import optuna

from memtune.storage import ConflictError, Database, StorageError
from memtune.storage.database import engine_kwargs
from memtune.storage.records import CalibrationRecord, Job, ModelRecord, ResultIn
from memtune.storage.repositories import (
    CalibrationRepository,
    JobLease,
    JobRepository,
    ModelRepository,
    ProfileRepository,
    ResultRepository,
    WorkerRepository,
)
from memtune.tuner import CalibrationError
from memtune.tuner.calibration import Calibration, calibration_for, install_calibration, installed_calibrations

if TYPE_CHECKING:
    from memtune.api.settings import Settings
    from memtune.profiler import CompilerPoint, DeviceIdentity, Profile
    from memtune.tuner import Candidate, TuneResult
    from memtune.tuner.runtime.validate import ValidationRun

__all__ = [
    "COMPILE_BUDGETS",
    "VALIDATION_WARMUP",
    "CalibrateFn",
    "CompilerPointsFn",
    "Validator",
    "Worker",
    "cuda_gpu_key",
    "default_worker_id",
    "measure_calibration",
    "measure_job_compiler_points",
]

VALIDATION_WARMUP = 3
"""Untimed steps before each configuration's timed ones (NOTE [ Measured validation ])."""

log = logging.getLogger("memtune.worker")


def default_worker_id() -> str:
    """``host:pid:random``: unique per process, readable in the claims table."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:6]}"


class _LeaseLost(Exception):
    """The job was reclaimed by another worker: stop without writing."""


Validator = Callable[..., "ValidationRun"]
"""Measures plans on the GPU, called like ``memtune.tuner.runtime.validate.validate_plans`` (the default). It must raise
``memtune.tuner.runtime.validate.ValidationUnavailable`` when it cannot measure here (no CUDA device, another GPU type);
the worker then records the validation as skipped, with the reason."""


CalibrateFn = Callable[[Callable[[str], None]], Mapping[str, Any]]
"""Measures the calibration of this process's GPU type and returns its JSON object (``memtune.tuner.calibration``),
given
a function it calls with progress text; ``measure_calibration`` by default (NOTE [ Calibrations in the service ])."""


def measure_calibration(progress: Callable[[str], None]) -> dict[str, Any]:
    """Measure this process's GPU type's calibration (``memtune.tuner.runtime.calibrate.calibrate``, NOTE [ Calibrating
    a GPU type ]; about a minute) and return its JSON object. The file it writes is temporary: the database keeps it.

    Raises:
        TunerError: no CUDA device, or the reference plans did not run.
    """
    from memtune.tuner.runtime.calibrate import calibrate

    with tempfile.TemporaryDirectory(prefix="memtune-calibration-") as tmp:
        return dict(calibrate(output=Path(tmp) / "calibration.json", progress=progress).data)


COMPILE_BUDGETS = (1.0, 0.5, 0.25)
"""Activation budgets at which a worker measures a job's model compiled whole (NOTE [ Compiler points in the
service ]), those of ``memtune.tune(..., compile=True)``."""


CompilerPointsFn = Callable[
    [ModelRecord, bytes | None, "Profile", str, Callable[[str], None]],
    "tuple[Sequence[CompilerPoint], Mapping[float, str]]",
]
"""Measures a model compiled whole at ``COMPILE_BUDGETS`` on this worker's GPU, called with the stored model, its
exported program's archive (None for a zoo model or a spec), the job's profile, its optimizer, and a function it calls
with progress text; returns the points measured and the error of each budget that failed.
``measure_job_compiler_points`` by default (NOTE [ Compiler points in the service ])."""


def measure_job_compiler_points(
    model: ModelRecord, archive: bytes | None, profile: Profile, optimizer: str, progress: Callable[[str], None]
) -> tuple[tuple[CompilerPoint, ...], dict[float, str]]:
    """The compiler points of ``model`` at ``COMPILE_BUDGETS``, measured on this process's CUDA device (NOTE
    [ Compiler points in the service ]), and the error of each budget that failed.

    Raises:
        RuntimeError: no CUDA device.
    """
    if model.kind == "exported":
        import torch

        from memtune.tuner.runtime.whole import measure_module_points

        if archive is None:
            raise ValueError(f"model {model.id} is an exported program, but its archive was not given")
        module, inputs = _load_exported(model, archive, torch.device("cuda", 0))
        return measure_module_points(
            module,
            inputs,
            profile,
            COMPILE_BUDGETS,
            optimizer=optimizer,
            progress=lambda _done, _total, what: progress(what),
        )
    from memtune.api.model_refs import stored_chain_builder
    from memtune.tuner.runtime.whole import measure_compiler_points

    points, rows = measure_compiler_points(
        stored_chain_builder(model), profile, COMPILE_BUDGETS, progress=lambda what: progress(f"measuring {what}")
    )
    errors = {
        float(r.compile_budget): r.error
        for r in rows
        if r.kind == "compiler" and r.compile_budget is not None and r.error
    }
    return points, errors


class _NoCompilerPoints(Exception):
    """A job with ``compile`` ``on`` whose points this worker can neither find nor measure: the job fails with it."""


def cuda_gpu_key() -> str | None:
    """The GPU type (``memtune.profiler.devices.gpu_key``) of this process's CUDA device 0, or None without CUDA."""
    import torch

    from memtune.profiler.devices import gpu_key

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return gpu_key(props.name, props.total_memory)


@dataclass
class _Validation:
    """How one job's measured validation went, to be written with the job's finish."""

    state: Literal["done", "skipped", "failed", "cancelled"]
    note: str
    device: str | None = None
    measured: list[ResultIn] = field(default_factory=list)
    unconstrained_step_ms: float | None = None
    unconstrained_peak_bytes: int | None = None
    simulated_stored: bool = False


class _Watch:
    """Heartbeats one lease on a thread and remembers whether it was lost or a cancel was asked."""

    def __init__(self, db: Database, lease: JobLease, interval_s: float) -> None:
        self.db = db
        self.lease = lease
        self.interval_s = interval_s
        self.lost = False
        self.cancel = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{lease.job_id[:8]}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def note(self, lost: bool, cancel: bool) -> None:
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
        return self.lost or self.cancel


class Worker:
    """Claims and runs tuning jobs against one database.

    Thread safety: ``start`` runs the loop on one background thread; ``run_once`` may be called directly
    (tests, ``memtune worker --once``) but not concurrently with a started loop.

    Args:
        db: the database (the same URL holds the Optuna studies).
        worker_id: recorded on claimed jobs; ``host:pid:random`` by default.
        gpu_keys: GPU types served; None for every GPU type (profiles are modeled when none is stored).
        heartbeat_interval_s: seconds between job heartbeats.
        stale_after_s: a running job with no heartbeat for this long is reclaimed.
        poll_interval_s: idle wait between claim attempts, seconds.
        progress_interval_s: least seconds between two progress writes.
        validator: measures a job's top plans on the GPU (NOTE [ Measured validation ]); None for
            ``memtune.tuner.runtime.validate.validate_plans``, which measures on this process's CUDA device.
        calibrate_fn: measures this GPU type's calibration where none exists (NOTE [ Calibrations in the
            service ]); None for ``measure_calibration``.
        local_gpu: the GPU type of this worker's CUDA device, or None without one; None for ``cuda_gpu_key``.
        compiler_points_fn: measures a job's model compiled whole where its profile has no compiler points (NOTE
            [ Compiler points in the service ]); None for ``measure_job_compiler_points``.
    """

    def __init__(
        self,
        db: Database,
        *,
        worker_id: str | None = None,
        gpu_keys: Sequence[str] | None = None,
        heartbeat_interval_s: float = 2.0,
        stale_after_s: float = 30.0,
        poll_interval_s: float = 0.5,
        progress_interval_s: float = 0.5,
        validator: Validator | None = None,
        calibrate_fn: CalibrateFn | None = None,
        local_gpu: Callable[[], str | None] | None = None,
        compiler_points_fn: CompilerPointsFn | None = None,
    ) -> None:
        if heartbeat_interval_s >= stale_after_s:
            raise ValueError(
                f"heartbeat_interval_s ({heartbeat_interval_s}) must be below stale_after_s ({stale_after_s}), "
                "or live jobs would be reclaimed"
            )
        self.db = db
        self.worker_id = worker_id or default_worker_id()
        self.gpu_keys = list(gpu_keys) if gpu_keys else None
        self.heartbeat_interval_s = heartbeat_interval_s
        self.stale_after_s = stale_after_s
        self.poll_interval_s = poll_interval_s
        self.progress_interval_s = progress_interval_s
        self.validator = validator
        self.calibrate_fn: CalibrateFn = calibrate_fn or measure_calibration
        self._local_gpu = local_gpu or cuda_gpu_key
        self.compiler_points_fn: CompilerPointsFn = compiler_points_fn or measure_job_compiler_points
        self._local_gpu_key: tuple[str | None] | None = None  # read once, on first need
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._optuna: optuna.storages.RDBStorage | None = None

    @classmethod
    def from_settings(cls, db: Database, settings: Settings, *, worker_id: str | None = None) -> Worker:
        return cls(
            db,
            worker_id=worker_id,
            gpu_keys=settings.worker_gpus or None,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            stale_after_s=settings.stale_after_s,
            poll_interval_s=settings.poll_interval_s,
            progress_interval_s=settings.progress_interval_s,
        )

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Run the claim loop on a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"memtune-worker-{self.worker_id}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the loop to stop (a running job stops at its next trial and is left to be reclaimed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        """Claim and run jobs until ``stop``; waits ``poll_interval_s`` when there is none. Says it is alive every
        ``heartbeat_interval_s`` meanwhile, from a thread of its own (NOTE [ Worker heartbeats ] in
        ``memtune.storage.repositories.workers``)."""
        log.info("worker %s serving %s", self.worker_id, self.gpu_keys or "every GPU type")
        beater = threading.Thread(target=self._beat, name=f"memtune-heartbeat-{self.worker_id}", daemon=True)
        beater.start()
        try:
            self.refresh_calibrations()
            while not self._stop.is_set():
                try:
                    job_id = self.run_once()
                except Exception:  # the database went away: keep the worker alive and retry
                    log.exception("worker %s: claim failed", self.worker_id)
                    job_id = None
                if job_id is None:
                    self._stop.wait(self.poll_interval_s)
        finally:
            self._stop.set()
            beater.join(timeout=self.heartbeat_interval_s + 5)
            try:
                with self.db.session() as s:
                    WorkerRepository(s).gone(self.worker_id)
            except Exception as e:  # it goes stale instead
                log.warning("worker %s: could not delete its heartbeat: %s", self.worker_id, e)

    def _beat(self) -> None:
        """Write this worker's heartbeat now and every ``heartbeat_interval_s`` until ``stop``; a failed write is
        logged, and the next one tried (NOTE [ Worker heartbeats ])."""
        while True:
            try:
                with self.db.session() as s:
                    WorkerRepository(s).beat(self.worker_id, self.gpu_keys)
                    WorkerRepository(s).prune()
            except Exception as e:
                log.warning("worker %s: heartbeat failed: %s", self.worker_id, e)
            if self._stop.wait(self.heartbeat_interval_s):
                return

    def run_once(self) -> str | None:
        """Claim one job and run it to a terminal state; the job id, or None when nothing was claimable."""
        with self.db.session() as s:
            claimed = JobRepository(s).claim(self.worker_id, gpu_keys=self.gpu_keys, stale_after_s=self.stale_after_s)
        if claimed is None:
            return None
        job, lease = claimed
        log.info("worker %s claimed job %s (attempt %d)", self.worker_id, job.id, lease.attempt)
        self._process(job, lease)
        return job.id

    # ---- Optuna ------------------------------------------------------------------------------------
    def _optuna_storage(self) -> optuna.storages.RDBStorage:
        if self._optuna is None:
            hb = max(1, round(self.heartbeat_interval_s))
            grace = max(hb + 1, int(self.stale_after_s / 2))
            with warnings.catch_warnings():  # the heartbeat is "experimental" in Optuna; we rely on it knowingly
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self._optuna = optuna.storages.RDBStorage(
                    self.db.url,
                    engine_kwargs=engine_kwargs(self.db.url),
                    heartbeat_interval=hb,
                    grace_period=grace,
                )
        return self._optuna

    # ---- calibrations (NOTE [ Calibrations in the service ]) ------------------------------------------
    def refresh_calibrations(self) -> list[str]:
        """Install the database's calibrations of the GPU types this worker serves (all, when it serves every one)
        in this process; the keys of those in effect. Never raises: a database error or a malformed row is logged
        and the calibrations installed before stay."""
        try:
            with self.db.session() as s:
                records = CalibrationRepository(s).list_all(self.gpu_keys)
        except StorageError as e:
            log.warning("worker %s: the stored calibrations could not be read: %s", self.worker_id, e)
            return []
        installed = installed_calibrations()
        keys: list[str] = []
        for record in records:
            current = installed.get(record.gpu_key)
            if current is None or current.data != record.data:
                try:
                    install_calibration(record.data)
                except CalibrationError as e:
                    log.warning(
                        "worker %s: the stored calibration of %r is ignored: %s", self.worker_id, record.gpu_key, e
                    )
                    continue
                log.info("worker %s: installed the stored calibration of GPU type %r", self.worker_id, record.gpu_key)
            keys.append(record.gpu_key)
        return keys

    def _local_gpu_type(self) -> str | None:
        if self._local_gpu_key is None:
            self._local_gpu_key = (self._local_gpu(),)
        return self._local_gpu_key[0]

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
        if local.origin not in ("user file", "none") or self._refusal(job) is not None:
            return None
        return local if self._local_gpu_type() == job.gpu_key else None

    def _calibrate_first(self, job: Job, lease: JobLease, watch: _Watch) -> tuple[Job, str | None]:
        """Calibrate the job's GPU type before its search when it has no calibration (NOTE [ Calibrations in the
        service ]); the job (at the new headroom when its own came from no calibration) and what happened, for its
        validation note (None when nothing was done). Never raises but _LeaseLost."""
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
        except _LeaseLost:
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
        self, job: Job, lease: JobLease, watch: _Watch, local: Calibration
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

    def _search_at(self, job: Job, lease: JobLease, watch: _Watch, headroom: float) -> Job:
        """Store ``headroom`` (from the database's calibration) as the job's; the job with it."""
        with self.db.session() as s:
            st = JobRepository(s).set_headroom(lease, headroom, "database")
        if st.lost:
            raise _LeaseLost
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

    def _pending_note(self, job: Job, lease: JobLease, watch: _Watch, text: str) -> None:
        """Show ``text`` as the job's validation note before its search (the events stream shows it)."""
        try:
            with self.db.session() as s:
                st = JobRepository(s).set_validation(lease, "pending", note=text)
            watch.note(st.lost, st.cancel)
        except Exception as e:  # like a missed heartbeat: the work goes on
            log.warning("job %s: note write failed: %s", job.id, e)

    # ---- one job -----------------------------------------------------------------------------------
    def _process(self, job: Job, lease: JobLease) -> None:
        watch = _Watch(self.db, lease, self.heartbeat_interval_s)
        watch.start()
        try:
            self.refresh_calibrations()
            job, calibrated = self._calibrate_first(job, lease, watch)
            profile, profile_id = self._profile_for(job, lease)
            profile = self._with_compiler_points(job, lease, watch, profile)
            result = self._tune(job, lease, profile, watch)
            if watch.lost:
                raise _LeaseLost
            rows = _simulated_rows(job, result)
            validation = None
            if job.validate_top_k > 0:
                validation = self._validate(job, lease, profile, profile_id, rows, watch)
                if watch.lost:
                    raise _LeaseLost
                if calibrated:
                    validation.note = f"{calibrated}; {validation.note}"[:8000]
            self._store(job, lease, result, profile_id, rows, validation, cancelled=watch.cancel)
        except _LeaseLost:
            log.warning("worker %s lost job %s to another worker; dropping it", self.worker_id, job.id)
        except _NoCompilerPoints as e:
            log.warning("job %s failed: %s", job.id, e)
            with self.db.session() as s:
                JobRepository(s).finish(lease, "failed", error=str(e)[:4000])
        except Exception as e:
            log.exception("job %s failed", job.id)
            with self.db.session() as s:
                JobRepository(s).finish(lease, "failed", error=f"{type(e).__name__}: {e}"[:4000])
        finally:
            watch.stop()

    def _profile_for(self, job: Job, lease: JobLease) -> tuple[Profile, int]:
        with self.db.session() as s:
            model = ModelRepository(s).get(job.model_id)
            stored = ProfileRepository(s).find(model.id, job.gpu_key, job.batch, job.dtype)
        if stored is not None:
            profile = stored.profile()
            profile_id = stored.id
        else:
            if model.kind == "exported":
                with self.db.session() as s:
                    archive = ModelRepository(s).program(model.id)
                profile = _exported_profile(model, job, archive)
            else:
                profile = _committed_profile(model, job) or _modeled_profile(model, job)
            with self.db.session() as s:
                profile_id = ProfileRepository(s).store(model.id, profile).id
        with self.db.session() as s:
            if JobRepository(s).set_profile(lease, profile_id).lost:
                raise _LeaseLost
        return profile, profile_id

    # ---- compiler points (NOTE [ Compiler points in the service ]) ------------------------------------------
    def _with_compiler_points(self, job: Job, lease: JobLease, watch: _Watch, profile: Profile) -> Profile:
        """The profile the job is searched on, as its ``compile`` asks: without compiler points (``off``), with the
        stored ones, or with those measured here and stored with it. Raises _NoCompilerPoints (``on``, nothing to
        measure on) and _LeaseLost; a failed measurement is noted and the plans are eager."""
        points = profile.compiler_points
        if job.compile == "off":
            if points:
                self._compile_note(
                    job, lease, watch, f"compile off: the profile's {len(points)} compiler point(s) are left out"
                )
            return profile.model_copy(update={"compiler_points": ()})
        if points:
            self._compile_note(
                job, lease, watch, f"the profile's compiler points are candidates: {_points_text(points)}"
            )
            return profile
        local = self._local_gpu_type()
        if local != job.gpu_key:
            where = "no CUDA GPU" if local is None else f"a GPU of type {local!r}"
            if job.compile == "on":
                raise _NoCompilerPoints(
                    f"compile 'on' needs compiler points (the whole model compiled by torch.compile, measured on a GPU "
                    f"of type {job.gpu_key!r}), and the stored profile of this model (batch {job.batch}, {job.dtype}) "
                    f"has none, while this worker has {where} to measure them on: run a worker on a {job.gpu_key} GPU "
                    f"(memtune worker --gpu {job.gpu_key}), which measures them and keeps them for later jobs, or "
                    "submit with compile 'auto' (eager plans where there are no points) or 'off'"
                )
            self._compile_note(
                job, lease, watch,
                f"no compiler points: the profile has none and this worker has {where}, not one of type "
                f"{job.gpu_key!r} to measure them on, so the plans are eager",
            )  # fmt: skip
            return profile
        return self._measure_compiler_points(job, lease, watch, profile)

    def _measure_compiler_points(self, job: Job, lease: JobLease, watch: _Watch, profile: Profile) -> Profile:
        """``profile`` with the model compiled whole measured here at ``COMPILE_BUDGETS``, stored with it; ``profile``
        as it was, with the reason in the note, where nothing compiled."""
        from memtune.tuner.runtime.whole import with_compiler_points

        budgets = ", ".join(f"{b:g}" for b in COMPILE_BUDGETS)
        self._compile_note(
            job, lease, watch, f"compiling the whole model at activation budgets {budgets} on this worker's GPU"
        )
        try:
            model = self._model(job)
            archive = None
            if model.kind == "exported":
                with self.db.session() as s:
                    archive = ModelRepository(s).program(model.id)
            points, errors = self.compiler_points_fn(
                model,
                archive,
                profile,
                job.optimizer,
                lambda what: self._compile_note(job, lease, watch, f"compiling the whole model: {what}"),
            )
        except _LeaseLost:
            raise
        except Exception as e:
            log.warning("job %s: compiling the whole model failed: %s", job.id, e, exc_info=True)
            text = f"compiling the whole model failed, so the plans are eager: {type(e).__name__}: {e}"
            self._compile_note(job, lease, watch, text[:2000])
            return profile
        failed = "; ".join(f"activation budget {b:g} failed: {err}" for b, err in errors.items())
        if not points:
            log.warning("job %s: the whole model compiled at no activation budget: %s", job.id, failed)
            text = f"compiling the whole model failed at every activation budget, so the plans are eager: {failed}"
            self._compile_note(job, lease, watch, text[:2000])
            return profile
        profile = with_compiler_points(profile, points)
        with self.db.session() as s:
            ProfileRepository(s).store(job.model_id, profile)
        text = f"measured the whole model compiled on this worker's GPU: {_points_text(profile.compiler_points)}"
        text += "; kept with the profile" + (f"; {failed}" if failed else "")
        log.info("job %s: %s", job.id, text)
        self._compile_note(job, lease, watch, text[:2000])
        return profile

    def _compile_note(self, job: Job, lease: JobLease, watch: _Watch, text: str) -> None:
        """Show ``text`` as the job's compile note (the events stream shows it); a lost lease raises _LeaseLost."""
        try:
            with self.db.session() as s:
                st = JobRepository(s).set_compile_note(lease, text)
        except Exception as e:  # like a missed heartbeat: the work goes on
            log.warning("job %s: compile note write failed: %s", job.id, e)
            return
        if st.lost:
            raise _LeaseLost
        watch.note(st.lost, st.cancel)

    def _tune(self, job: Job, lease: JobLease, profile: Profile, watch: _Watch) -> TuneResult:
        """Run (or resume) the job's Optuna study at the job's headroom (NOTE [ Headroom ] in ``memtune.tuner.search``).

        Candidates are feasible when their simulated peak fits ``job.search_budget_bytes`` (the budget less
        the headroom); the result, and every row stored from it, keeps ``job.budget_bytes``, the budget asked
        for, so results and the leaderboard are filed under the user's budget with ``feasible`` judged with
        the slack."""
        from memtune.tuner import tune

        last_write = [0.0]

        def progress(done: int, total: int, best: Candidate | None) -> None:
            now = time.monotonic()
            if done < total and now - last_write[0] < self.progress_interval_s:
                return
            last_write[0] = now
            with self.db.session() as s:
                st = JobRepository(s).progress(
                    lease,
                    trials_done=done,
                    best_name=best.name if best else None,
                    best_step_ms=best.step_ms if best else None,
                    best_peak_bytes=best.peak_bytes if best else None,
                )
            watch.note(st.lost, st.cancel)

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return tune(
            profile,
            job.budget_bytes,
            trials=job.trials,
            mode=job.mode,  # type: ignore[arg-type]
            seed=job_seed(job),
            storage=self._optuna_storage(),
            study_name=job.study_name,
            optimizer=job.optimizer,
            progress=progress,
            should_stop=watch.should_stop,
            headroom=job.headroom,
        )

    def _validate(
        self, job: Job, lease: JobLease, profile: Profile, profile_id: int, rows: list[ResultIn], watch: _Watch
    ) -> _Validation:
        """Measure the job's top plans on the GPU (NOTE [ Measured validation ]); never raises but _LeaseLost."""
        top = _top_plans(rows, job.validate_top_k)
        chosen = _with_no_choice(top, rows)
        if watch.cancel:
            return _Validation("cancelled", "the job was cancelled before its plans were validated")
        if not chosen:
            return self._skipped(job, "no plan fits the budget, so there is nothing to validate")
        refusal = self._refusal(job)
        if refusal is not None:
            return self._skipped(job, refusal)
        extra = " and the best plan without algorithm choice" if len(chosen) > len(top) else ""
        with self.db.session() as s:  # NOTE [ Measured validation ] step 1: the simulated results first
            st = JobRepository(s).set_validation(
                lease, "running", note=f"validating the top {len(top)} plan(s){extra} on the GPU"
            )
            if st.lost:
                raise _LeaseLost
            ResultRepository(s).add_for_job(job, rows, profile_id=profile_id)
        watch.note(st.lost, st.cancel)

        def progress(index: int, total: int, name: str, device: DeviceIdentity) -> None:
            if index == 0:
                text = f"measuring the unplanned step (reference) on {device.name}"
            else:
                text = f"validating plan {index}/{total} ({name}) on {device.name}"
            log.info("job %s: %s", job.id, text)
            try:
                with self.db.session() as s:
                    st = JobRepository(s).set_validation(lease, "running", device=device.name, note=text)
                watch.note(st.lost, st.cancel)
            except Exception as e:  # like a missed heartbeat: the measurement goes on
                log.warning("job %s: validation progress write failed: %s", job.id, e)

        def should_stop() -> bool:
            """Between two plans: ask the database (a heartbeat) whether the job was cancelled or reclaimed."""
            try:
                with self.db.session() as s:
                    st = JobRepository(s).heartbeat(lease)
                watch.note(st.lost, st.cancel)
            except Exception as e:  # the heartbeat thread keeps trying; measure on
                log.warning("job %s: lease check between plans failed: %s", job.id, e)
            return watch.should_stop()

        from memtune.tuner import Plan
        from memtune.tuner.runtime.validate import ValidationUnavailable, validate_plans

        validator: Validator = self.validator or validate_plans
        try:
            from memtune.api.model_refs import stored_chain_builder

            run = validator(
                stored_chain_builder(self._model(job)),
                profile,
                job.batch,
                job.dtype,
                job.budget_bytes,
                [(r.name, r.kind, Plan.model_validate(r.plan)) for r in chosen],
                gpu_key=job.gpu_key,
                iters=job.validate_iters,
                warmup=VALIDATION_WARMUP,
                progress=progress,
                should_stop=should_stop,
            )
        except ValidationUnavailable as e:
            out = self._skipped(job, str(e))
            out.simulated_stored = True
            return out
        except Exception as e:
            log.exception("job %s: validation failed; its simulated results stand", job.id)
            text = f"validation failed, the simulated results stand: {type(e).__name__}: {e}"
            return _Validation("failed", text[:4000], simulated_stored=True)
        return _measured(job, chosen, run, cancelled=watch.cancel)

    def _refusal(self, job: Job) -> str | None:
        """Why this job's plans cannot be measured whatever the GPU (its model, its optimizer), or None."""
        if self._model(job).kind == "exported":
            return (
                "measured validation builds the model in a fresh process per plan from a zoo name or JSON spec; "
                "exported programs are profiled and tuned, not yet measured under a plan"
            )
        if job.optimizer != "sgd":
            return (
                f"the measured step updates with SGD and momentum (memtune.tuner.runtime.bench), but this job was "
                f"tuned "
                f"for optimizer {job.optimizer!r}: its plans' memory would not match; submit with optimizer 'sgd'"
            )
        return None

    def _skipped(self, job: Job, reason: str) -> _Validation:
        log.warning("job %s: validation skipped: %s", job.id, reason)
        return _Validation("skipped", f"validation skipped: {reason}")

    def _model(self, job: Job) -> ModelRecord:
        with self.db.session() as s:
            return ModelRepository(s).get(job.model_id)

    def _store(
        self,
        job: Job,
        lease: JobLease,
        result: TuneResult,
        profile_id: int,
        rows: list[ResultIn],
        validation: _Validation | None,
        *,
        cancelled: bool,
    ) -> None:
        best = result.best
        v = validation
        with self.db.session() as s:
            ok = JobRepository(s).finish(
                lease,
                "cancelled" if cancelled else "succeeded",
                trials_done=min(result.n_trials, job.trials),
                best_name=best.name if best else None,
                best_step_ms=best.step_ms if best else None,
                best_peak_bytes=best.peak_bytes if best else None,
                unconstrained_step_ms=result.unconstrained.step_ms,
                unconstrained_peak_bytes=result.unconstrained.peak_bytes,
                error=None if best is not None else _no_plan_fits(job),
                validation_state=v.state if v else None,
                validation_device=v.device if v else None,
                validation_note=v.note if v else None,
                measured_unconstrained_step_ms=v.unconstrained_step_ms if v else None,
                measured_unconstrained_peak_bytes=v.unconstrained_peak_bytes if v else None,
            )
            if not ok:
                raise _LeaseLost
            results = ResultRepository(s)
            if v is None or not v.simulated_stored:
                results.add_for_job(job, rows, profile_id=profile_id)
            if v is not None and v.measured:
                results.add_measured(job, v.measured, profile_id=profile_id)


def _no_plan_fits(job: Job) -> str:
    """The error of a job whose search found no plan within its budget (less its headroom)."""
    within = "" if job.headroom == 0 else f" less its {job.headroom * 100:g}% headroom for the allocator"
    return f"no plan fits the budget{within}; try a larger budget or a smaller batch"


def _points_text(points: Sequence[CompilerPoint]) -> str:
    """Compiler points in a job's note: budget, step, peak."""
    from memtune.tuner import format_bytes

    return ", ".join(
        f"budget {p.activation_budget:g} {p.step_ms:.1f} ms at {format_bytes(p.peak_bytes)}" for p in points
    )


def _simulated_rows(job: Job, result: TuneResult) -> list[ResultIn]:
    """The search's results to store: every baseline, the Optuna best, and (pareto mode) the front."""
    rows = [_result_in(c, "baseline") for c in result.policies]
    if result.best is not None:
        rows.append(_result_in(result.best, "optuna", name="optuna"))
    if result.no_choice is not None:  # NOTE [ Measured selection ] in memtune.tuner.search
        rows.append(_result_in(result.no_choice, "optuna"))
    if job.mode == "pareto":
        baseline_names = {c.name for c in result.policies}
        rows.extend(_result_in(c, "pareto") for c in result.pareto if c.name not in baseline_names)
    return rows


_KIND_ORDER = {"optuna": 0, "pareto": 1, "baseline": 2}


def _with_no_choice(chosen: list[ResultIn], rows: Sequence[ResultIn]) -> list[ResultIn]:
    """``chosen``, and the search's best plan without algorithm choice after them when it is not among them
    (NOTE [ Measured selection ] in ``memtune.tuner.search``): the GPU settles whether choosing algorithms is faster."""
    from memtune.tuner.search import NO_CHOICE

    keys = {_plan_text(r) for r in chosen}
    extra = [r for r in rows if r.name == NO_CHOICE and r.feasible and _plan_text(r) not in keys]
    return chosen + extra[:1] if chosen else chosen


def _plan_text(r: ResultIn) -> str:
    """A plan's content as text, its label left out: two rows with equal text run the same plan."""
    return json.dumps({k: v for k, v in r.plan.items() if k != "label"}, sort_keys=True)


def _top_plans(rows: Sequence[ResultIn], k: int) -> list[ResultIn]:
    """The ``k`` fastest distinct plans that fit, by simulated step ms (ties: optuna, pareto, baseline).

    Plans are distinct by content: the label (which policy or search made the plan) is not compared."""
    fitting = sorted((r for r in rows if r.feasible), key=lambda r: (r.step_ms, _KIND_ORDER.get(r.kind, 3), r.name))
    seen: set[str] = set()
    out: list[ResultIn] = []
    for r in fitting:
        key = _plan_text(r)
        if key in seen:
            continue
        seen.add(key)
        out.append(r)
        if len(out) == k:
            break
    return out


def _measured(job: Job, chosen: list[ResultIn], run: ValidationRun, *, cancelled: bool) -> _Validation:
    """Measured results (the simulated numbers beside them) and the note, from a validation run."""
    measured: list[ResultIn] = []
    problems: list[str] = []
    for sim, row in zip(chosen, run.rows, strict=False):
        if row.step_ms is None or row.peak_bytes is None:
            problems.append(f"{sim.name!r} did not run: {row.error or 'no measurement'}")
            continue
        measured.append(
            ResultIn(
                name=sim.name,
                kind=sim.kind,
                plan=sim.plan,
                step_ms=float(row.step_ms),
                peak_bytes=int(row.peak_bytes),
                feasible=bool(row.fits),
                source="measured",
                predicted_step_ms=sim.step_ms,
                predicted_peak_bytes=sim.peak_bytes,
                reserved_peak_bytes=row.reserved_bytes,
                samples_per_s=row.samples_per_s,
                alloc_retries=row.alloc_retries,
            )
        )
    device = run.device.name
    parts = [
        f"measured {len(measured)} of {len(chosen)} plan(s) on {device} "
        f"({job.validate_iters} timed steps each after {VALIDATION_WARMUP} warm-up steps)"
    ]
    if run.unconstrained.step_ms is None:
        parts.append(f"the unplanned reference step did not run: {run.unconstrained.error}")
    parts.extend(problems)
    if run.stopped:
        parts.append(f"stopped after {len(run.rows)} plan(s): the job was cancelled or reclaimed")
    note = "; ".join(parts)
    if problems:
        log.warning("job %s: %s", job.id, note)
    return _Validation(
        "cancelled" if run.stopped and cancelled else "done",
        note[:8000],
        device=device,
        measured=measured,
        unconstrained_step_ms=run.unconstrained.step_ms,
        unconstrained_peak_bytes=run.unconstrained.peak_bytes,
        simulated_stored=True,
    )


def _result_in(c: Candidate, kind: Any, *, name: str | None = None) -> ResultIn:
    return ResultIn(
        name=name or c.name,
        kind=kind,
        plan=c.plan.model_dump(mode="json"),
        step_ms=float(c.step_ms),
        peak_bytes=int(c.peak_bytes),
        feasible=bool(c.feasible),
        source=c.source,
        alloc_retries=c.alloc_retries,
        allocator_ms=c.allocator_ms if c.alloc_retries is not None else None,
    )


def _committed_profile(model: ModelRecord, job: Job) -> Profile | None:
    """A committed measured profile for this zoo model, parameters, batch, dtype and GPU type, if one exists."""
    if model.kind != "zoo":
        return None
    from memtune.profiler import find_profile

    params = model.definition.get("params") or {}
    profile = find_profile(str(model.definition["zoo"]), job.batch, job.dtype, job.gpu_key, params=params)
    if profile is not None and profile.device.key != job.gpu_key:
        return None
    return profile


def job_seed(job: Job) -> int:
    """The seed a job is searched with: ``memtune.tuner.search.DEFAULT_SEED``, the default of ``memtune tune --seed``,
    so the same request gives the same plan from the command line and from the service (NOTE [ One objective ] in
    ``memtune.tuner.search``). A job request carries no seed; the study keeps the one it was searched with (its ``seed``
    attribute) and the job's public view shows it."""
    from memtune.tuner.search import DEFAULT_SEED

    del job  # one rule for every job: nothing of the request changes it
    return DEFAULT_SEED


def _exported_profile(model: ModelRecord, job: Job, archive: bytes) -> Profile:
    """An exported program's profile, stage by stage (``memtune.profiler.module_profile.profile_module``): measured on
    this worker's GPU when it is of the job's type, else computed on the CPU with the copies of the job's GPU type's
    roofline spec (``modeled``). The archive is checked again on loading (NOTE [ Safe exported programs ])."""
    import torch

    from memtune.profiler import profile_module
    from memtune.profiler.devices import gpu_key

    exported = model.definition["exported"]
    if job.batch != exported["batch"]:  # the API refuses such jobs; a job queued another way fails here
        raise ValueError(f"job batch {job.batch} is not the exported program's batch {exported['batch']}")
    device = torch.device("cpu")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        if gpu_key(props.name, props.total_memory) == job.gpu_key:
            device = torch.device("cuda", 0)
    module, inputs = _load_exported(model, archive, device)
    gpu = None if device.type == "cuda" else job.gpu_key
    return profile_module(module, inputs, dtype=job.dtype, gpu=gpu, name=model.name)


def _load_exported(model: ModelRecord, archive: bytes, device: Any) -> tuple[Any, Any]:
    """The stored exported program as a module and its example inputs on ``device``, checked again on loading (NOTE
    [ Safe exported programs ]); the inputs' seed is the model's, so every load gives the same batch."""
    from memtune.profiler.exported import load_exported

    return load_exported(
        archive,
        max_bytes=len(archive),
        int_high=model.definition["exported"].get("int_high"),
        device=device,
        seed=int(model.content_hash[:8], 16),
    )


def _modeled_profile(model: ModelRecord, job: Job) -> Profile:
    """A roofline profile of the model on the job's GPU type, built on the meta device."""
    import torch

    from memtune.profiler import build, from_spec, modeled_profile

    with torch.device("meta"):
        if model.kind == "zoo":
            chain = build(str(model.definition["zoo"]), model.definition.get("params"))
        else:
            chain = from_spec(model.definition["spec"])
    return modeled_profile(chain, job.batch, job.dtype, job.gpu_key)
