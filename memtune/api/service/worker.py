"""The job worker: claims queued jobs, gets a profile, runs the Optuna search, stores plans and progress.

A worker claims jobs atomically (NOTE [ Job claims ] in ``memtune.storage.repositories._jobs``) for the GPU types
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

The worker's steps live beside it, each in a module of its own: the lease watch (``memtune.api.service._job_lease``),
the job's calibration and the first calibration of a GPU type (``memtune.api.service._job_calibration``), the job's
profile (``memtune.api.service._job_profiles``), its compiler points (``memtune.api.service._job_compile``), the rows it
stores (``memtune.api.service._job_results``) and its measured validation (``memtune.api.service._job_validation``). The
notes below describe them as one job's course and stay here, where the rest of the code cites them.

# NOTE [ Compiler points in the service ]
A plan may run the whole model compiled by ``torch.compile`` at one activation budget, priced by a compiler point of
the profile (NOTE [ Whole-model compile ] in ``memtune.tuner._whole``). A job's ``compile`` says what the worker does
about those points, after it has the job's profile and before the search:

* ``off``: the search runs on the profile without its compiler points, so no plan compiles the whole model.
* ``auto`` (the default): the profile's points are candidates. Where it has none and this worker's CUDA device is of
  the job's GPU type, the worker measures the model compiled whole at activation budgets ``COMPILE_BUDGETS`` (1, 0.5,
  0.25): a zoo model or spec by ``memtune.tuner.measure.compiler_points.measure_compiler_points``, each budget in a
  fresh process; an exported program by ``measure_module_points`` in this process, on the program loaded onto the GPU
  (NOTE [ Compiler points of a module ]). The points are stored with the profile, so later jobs of the model, batch and
  dtype reuse them. A budget that fails to compile is left out, named in the job's ``compile_note``; where none
  compiles, or the measurement fails, the note says why and no plan compiles the whole model (an exported program's
  plans may still compile regions, NOTE [ Compiled regions in the service ]). A worker without a GPU of the type
  plans eager, and the note says so.
* ``on``: as ``auto``, except that where the profile has no points and this worker cannot measure them (no CUDA GPU
  of the job's type) the job fails, its error naming the GPU type and how to get points. Compiling that fails on a
  GPU of the type still plans eager, as under ``auto``: the worker tried.

The job's ``compile_note`` says what is happening while it happens (the events stream shows it) and how it went. The
search serves a point where it fits and beats every searched plan; the job's best plan is then named ``compiled whole
<budget>``. The zoo and spec points are measured as ``memtune bench`` measures a step (SGD with momentum), like the
points ``memtune profile --compiler-sweep`` keeps.

# NOTE [ Compiled regions in the service ]
The plans that beat the compiler on users' models compile runs of the model's stages as regions, each kept,
recomputed or offloaded (NOTE [ Compiled-region candidates ] in ``memtune.tuner.region_plans``). A job of an exported
program with ``compile`` ``auto`` or ``on``, on a worker whose CUDA device is of the job's GPU type, gets them too:
after the compiler points, the worker loads the program onto the GPU and measures its candidate partitions into
regions (NOTE [ Candidate depths ] in ``memtune.profiler.region_tree``) compiled at ``COMPILE_BUDGETS`` and under
memtune's save rules, as ``memtune.tune(..., compile=True)`` does (``memtune.api.service._job_regions``). After the
job's own search each region profile is searched with the job's trials, seed, headroom and calibration, in memory
(a job resumed by another worker measures and searches them again); the fastest plan of all is the job's best, each
region profile's best that fits is stored beside the job's rows (named ``compiled regions depth N at …``), and the
compile note gains a line per region profile (its unplanned step, its best plan, or why it failed). A zoo model or
spec is a chain of layers: its plans compile whole or not at all. Without a GPU of the type there are no regions
(the compile note already says why the plans are eager); a measurement that fails is noted and the other plans
stand.

# NOTE [ Finalists in the service ]
The simulator prices the GPU's work, and a compiled region's step may wait for the host (NOTE [ Measured finalists ] in
``memtune.tuner.finalists``): between a compiler point and a plan of regions predicted a little faster it cannot
choose. So a job whose compiled regions were measured (above) then has its finalists run on the same GPU, as
``memtune.tune`` runs them: the best plan of the job's own search and of each region profile's, and every compiler
point that fits, those predicted within ``SPREAD`` of the fastest, at most ``FINALIST_LIMIT``, the fastest fitting
compiler point always among them; each runs on the program loaded onto the GPU, one step outside the cap and then
timed steps under ``budget_guard`` at the job's budget, with the job's optimizer at learning rate 0
(``memtune.api.service._job_finalists``). The fastest that ran is the job's best plan, under the name its row is
stored with; the compile note says what each finalist predicted and measured (the events stream shows each start).
Where only one plan is a finalist there is nothing to choose and nothing runs; where none runs under the budget, the
fallbacks of NOTE [ Measured finalists ] run one at a time until one runs; where none of those runs either, the job
serves no plan, as ``memtune.tune`` does: it has no best, its error says that no plan ran under the budget (each
plan's error named), and the rows of the plans that ran out of memory are stored as not fitting, so ``best`` never
answers with them. Where the measurement fails (not a plan: the worker's GPU, the program's loading), the note says
so and the fastest prediction stands. Exported programs are not validated under ``validate_top_k`` yet (NOTE
[ Measured validation ]): their finalists are what is measured of them.

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
   are measured by ``memtune.tuner.measure.validate.validate_plans``, each configuration in a fresh process that
   builds the model from its stored definition (NOTE [ Bench isolation ] in ``memtune.tuner.measure.bench``: in one
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
where it came from (``headroom_source``). The rest of the calibration (compute scales, allocator prices) is looked up
in the same order when a worker runs the job (``memtune.api.service._job_calibration.job_calibration``) and passed to
the job's search (``tune(..., calibration=)``, NOTE [ Calibration is an input ] in ``memtune.tuner.calibration``). A
worker installs nothing in its process: no job's prices depend on what another job ran with, and two jobs of one GPU
type under two calibrations (one stored between them) are each priced with their own.

First measurement: a GPU type with no calibration in the database nor a committed one is calibrated by the first
worker about to measure plans of it on its own GPU: a job of that type with ``validate_top_k`` > 0 that validation
would not skip, on a worker whose CUDA device is of that type. Before the job's search the worker takes this host's
``memtune calibrate`` file of the type when it has one, else measures one (``calibrate_fn``: by default
``memtune.tuner.measure.calibrate.calibrate`` into a temporary file, NOTE [ Calibrating a GPU type ], about a minute);
stores it unless another worker stored one first (the first stored is kept: a later one replaces it only through
``PUT``); prices the job's search with the one stored; and, when the job's headroom came from no calibration
(``none``), searches the job at the new headroom (stored on the job, ``headroom_source`` ``database``), so that the
first plan measured on a new GPU type runs within its budget. The job's validation note says what is happening while
it happens, and how it went at the end. Calibrating never fails a job: a failure is named in the note, with a warning
in the log, and the job goes on at the headroom it had, priced with the calibration it had.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from uuid import uuid4

import optuna

from memtune.api.service._job_calibration import (
    CalibrateFn,
    FirstCalibration,
    job_calibration,
    measure_calibration,
)
from memtune.api.service._job_compile import (
    COMPILE_BUDGETS,
    CompilerPointsFn,
    NoCompilerPoints,
    compile_note,
    cuda_gpu_key,
    measure_job_compiler_points,
    search_profile,
)
from memtune.api.service._job_finalists import FinalistsFn, job_finalists, measure_job_finalists
from memtune.api.service._job_lease import LeaseLost, LeaseWatch
from memtune.api.service._job_profiles import job_profile
from memtune.api.service._job_regions import RegionsFn, job_regions, measure_job_regions, weigh_job_regions
from memtune.api.service._job_results import no_plan_fits, simulated_rows
from memtune.api.service._job_validation import VALIDATION_WARMUP, JobValidation, Validator, validate_job
from memtune.storage import Database
from memtune.storage.database import engine_kwargs
from memtune.storage.records import Job, ResultIn
from memtune.storage.repositories import JobLease, JobRepository, ResultRepository, WorkerRepository

if TYPE_CHECKING:
    from memtune.api.service.settings import Settings
    from memtune.profiler import Profile
    from memtune.profiler.region_profile import RegionProfile
    from memtune.tuner import Candidate, TuneResult
    from memtune.tuner.calibration import Calibration

__all__ = [
    "COMPILE_BUDGETS",
    "VALIDATION_WARMUP",
    "CalibrateFn",
    "CompilerPointsFn",
    "RegionsFn",
    "Validator",
    "Worker",
    "cuda_gpu_key",
    "default_worker_id",
    "measure_calibration",
    "measure_job_compiler_points",
    "measure_job_regions",
]

log = logging.getLogger("memtune.worker")


def default_worker_id() -> str:
    """``host:pid:random``: unique per process, readable in the claims table."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:6]}"


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
            ``memtune.tuner.measure.validate.validate_plans``, which measures on this process's CUDA device.
        calibrate_fn: measures this GPU type's calibration where none exists (NOTE [ Calibrations in the
            service ]); None for ``measure_calibration``.
        local_gpu: the GPU type of this worker's CUDA device, or None without one; None for ``cuda_gpu_key``.
        compiler_points_fn: measures a job's model compiled whole where its profile has no compiler points (NOTE
            [ Compiler points in the service ]); None for ``measure_job_compiler_points``.
        regions_fn: measures an exported program's candidate partitions into compiled regions (NOTE [ Compiled
            regions in the service ]); None for ``measure_job_regions``.
        finalists_fn: runs an exported program's finalists on this worker's GPU (NOTE [ Finalists in the service ]);
            None for ``measure_job_finalists``.
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
        regions_fn: RegionsFn | None = None,
        finalists_fn: FinalistsFn | None = None,
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
        self.regions_fn: RegionsFn = regions_fn or measure_job_regions
        self.finalists_fn: FinalistsFn = finalists_fn or measure_job_finalists
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
        ``memtune.storage.repositories._workers``)."""
        log.info("worker %s serving %s", self.worker_id, self.gpu_keys or "every GPU type")
        beater = threading.Thread(target=self._beat, name=f"memtune-heartbeat-{self.worker_id}", daemon=True)
        beater.start()
        try:
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

    def _local_gpu_type(self) -> str | None:
        if self._local_gpu_key is None:
            self._local_gpu_key = (self._local_gpu(),)
        return self._local_gpu_key[0]

    # ---- one job -----------------------------------------------------------------------------------
    def _process(self, job: Job, lease: JobLease) -> None:
        watch = LeaseWatch(self.db, lease, self.heartbeat_interval_s)
        watch.start()
        try:
            first = FirstCalibration(self.db, self.worker_id, self.calibrate_fn, self._local_gpu_type)
            job, calibrated, stored = first.run(job, lease, watch)
            cal = stored if stored is not None else job_calibration(self.db, job)  # passed, never installed
            profile, profile_id = job_profile(self.db, job, lease)
            profile = search_profile(
                self.db, job, lease, watch, profile, local_gpu=self._local_gpu_type, measure=self.compiler_points_fn
            )
            regions = job_regions(self.db, job, lease, watch, local_gpu=self._local_gpu_type, measure=self.regions_fn)
            result = self._tune(job, lease, profile, watch, cal)
            if watch.lost:
                raise LeaseLost
            rows = simulated_rows(job, result)
            if regions and not watch.cancel:  # NOTE [ Compiled regions in the service ]
                result, region_rows, searched = self._weigh_regions(job, lease, watch, result, regions, cal)
                rows += region_rows
                # NOTE [ Finalists in the service ]
                result, rows = job_finalists(
                    self.db, job, lease, watch, result, searched, rows, measure=self.finalists_fn
                )
            validation = None
            if job.validate_top_k > 0:
                validation = validate_job(
                    self.db, job, lease, profile, profile_id, rows, watch, validator=self.validator
                )
                if watch.lost:
                    raise LeaseLost
                if calibrated:
                    validation.note = f"{calibrated}; {validation.note}"[:8000]
            self._store(job, lease, result, profile_id, rows, validation, cancelled=watch.cancel)
        except LeaseLost:
            log.warning("worker %s lost job %s to another worker; dropping it", self.worker_id, job.id)
        except NoCompilerPoints as e:
            log.warning("job %s failed: %s", job.id, e)
            with self.db.session() as s:
                JobRepository(s).finish(lease, "failed", error=str(e)[:4000])
        except Exception as e:
            log.exception("job %s failed", job.id)
            with self.db.session() as s:
                JobRepository(s).finish(lease, "failed", error=f"{type(e).__name__}: {e}"[:4000])
        finally:
            watch.stop()

    def _tune(
        self, job: Job, lease: JobLease, profile: Profile, watch: LeaseWatch, calibration: Calibration
    ) -> TuneResult:
        """Run (or resume) the job's Optuna study at the job's headroom (NOTE [ Headroom ] in ``memtune.tuner.search``),
        priced with ``calibration``, the job's (NOTE [ Calibrations in the service ]).

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
            calibration=calibration,
        )

    def _weigh_regions(
        self,
        job: Job,
        lease: JobLease,
        watch: LeaseWatch,
        result: TuneResult,
        regions: Sequence[RegionProfile],
        calibration: Calibration,
    ) -> tuple[TuneResult, list[ResultIn], list[tuple[TuneResult, str | None]]]:
        """Each compiled-region profile searched as the job's own search was (in memory: a resumed job searches
        them again), the fastest plan of all served, every region profile's line added to the compile note; with
        every search and the name its best is stored under (``weigh_job_regions``)."""
        from memtune.tuner import tune

        served, rows, lines, searched = weigh_job_regions(
            result,
            regions,
            lambda p: tune(
                p,
                job.budget_bytes,
                trials=job.trials,
                seed=job_seed(job),
                optimizer=job.optimizer,
                should_stop=watch.should_stop,
                headroom=job.headroom,
                calibration=calibration,
            ),
        )
        won = "a plan of compiled regions" if served.best is not result.best else "the job's own search's best plan"
        with self.db.session() as s:
            before = JobRepository(s).get(job.id).compile_note
        text = f"compiled regions searched: {'; '.join(lines)}; served: {won}"
        compile_note(self.db, job, lease, watch, (f"{before}; {text}" if before else text)[:2000])
        return served, rows, searched

    def _store(
        self,
        job: Job,
        lease: JobLease,
        result: TuneResult,
        profile_id: int,
        rows: list[ResultIn],
        validation: JobValidation | None,
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
                error=None if best is not None else result.extra.get("no_plan") or no_plan_fits(job),
                no_best=best is None and not cancelled,
                validation_state=v.state if v else None,
                validation_device=v.device if v else None,
                validation_note=v.note if v else None,
                measured_unconstrained_step_ms=v.unconstrained_step_ms if v else None,
                measured_unconstrained_peak_bytes=v.unconstrained_peak_bytes if v else None,
            )
            if not ok:
                raise LeaseLost
            results = ResultRepository(s)
            if v is None or not v.simulated_stored:
                results.add_for_job(job, rows, profile_id=profile_id)
            if v is not None and v.measured:
                results.add_measured(job, v.measured, profile_id=profile_id)


def job_seed(job: Job) -> int:
    """The seed a job is searched with: ``memtune.tuner.search.DEFAULT_SEED``, the default of ``memtune tune --seed``,
    so the same request gives the same plan from the command line and from the service (NOTE [ One objective ] in
    ``memtune.tuner.search``). A job request carries no seed; the study keeps the one it was searched with (its ``seed``
    attribute) and the job's public view shows it."""
    from memtune.tuner.search import DEFAULT_SEED

    del job  # one rule for every job: nothing of the request changes it
    return DEFAULT_SEED
