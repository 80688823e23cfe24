"""The job worker: claims queued jobs, gets a profile, runs the Optuna search, stores plans and progress.

A worker claims jobs atomically (NOTE [ Job claims ] in ``storage.repositories.jobs``) for the GPU types
it serves, heartbeats while it works, and writes progress (trials done / total, best so far) at most every
``progress_interval_s``. A job whose worker died (no heartbeat for ``stale_after_s``) is claimed again by
another worker; its Optuna study lives in the same database (``RDBStorage``) under the job's
``study_name``, so ``tuner.search.tune`` resumes it with every finished trial kept and fails the dead
worker's stale RUNNING trial (Optuna heartbeat, ``grace_period`` shorter than ``stale_after_s``).

Headroom: the search runs at the job's ``headroom`` (resolved when the job was submitted: the GPU type's
calibration unless the request gave one), like ``memtune tune``: a plan is feasible when its simulated
peak fits ``budget_bytes * (1 - headroom)`` (NOTE [ Headroom ] in ``tuner.search``), which leaves the
caching allocator slack under the real cap. The job's ``budget_bytes`` and the stored results' stay the
budget asked for; their ``feasible`` flag is the search's, judged with the headroom.

Profiles: a stored profile for (model, GPU type, batch, dtype) is reused; else a committed measured
profile from ``profiler.library`` (zoo models at their default parameters); else a roofline profile
(``profiler.modeled``), built on the ``meta`` device so no memory is allocated. An exported program
(``profiler.exported``) is profiled by its module stages (``profile_module``): on this worker's GPU when it is of
the job's type, else its compute on the CPU and its copies from the job's GPU type's roofline spec. The search's
results are labeled ``simulated`` (the numbers come from the simulator, whatever the profile's source); the plans
validated on the GPU are stored again, labeled ``measured`` (NOTE [ Measured validation ]).

# NOTE [ Measured validation ]
A job with ``validate_top_k`` > 0 asks the worker to measure its best plans on the GPU after the search:

1. The simulated results are stored first (they are served while the plans are measured) and the job's
   ``validation_state`` becomes ``running``.
2. The top ``validate_top_k`` distinct plans that fit the budget less the job's headroom (feasible in
   the search), by simulated step ms (a tie goes to the Optuna best, then Pareto points, then baselines),
   and after them the search's best plan without algorithm choice when the best plan chooses cuDNN
   algorithms and it is not among them (stored as ``optuna (no algorithm choice)``; NOTE [ Measured
   selection ] in ``tuner.search``: the plan served is the fastest measured, so algorithm choice is
   served only where the GPU measured it faster),
   are measured by ``tuner.runtime.validate.validate_plans``, each configuration in a fresh process that
   builds the model from its stored definition (NOTE [ Bench isolation ] in ``tuner.runtime.bench``: in one
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
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from uuid import uuid4

import optuna

from storage.database import Database, engine_kwargs
from storage.records import Job, ModelRecord, ResultIn
from storage.repositories import JobLease, JobRepository, ModelRepository, ProfileRepository, ResultRepository

if TYPE_CHECKING:
    from api.settings import Settings
    from profiler.profile import DeviceIdentity, Profile
    from tuner.runtime.validate import ValidationRun
    from tuner.search import Candidate, TuneResult

__all__ = ["VALIDATION_WARMUP", "Validator", "Worker", "default_worker_id"]

VALIDATION_WARMUP = 3
"""Untimed steps before each configuration's timed ones (NOTE [ Measured validation ])."""

log = logging.getLogger("memtune.worker")


def default_worker_id() -> str:
    """``host:pid:random``: unique per process, readable in the claims table."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid4().hex[:6]}"


class _LeaseLost(Exception):
    """The job was reclaimed by another worker: stop without writing."""


Validator = Callable[..., "ValidationRun"]
"""Measures plans on the GPU, called like ``tuner.runtime.validate.validate_plans`` (the default). It must raise
``tuner.runtime.validate.ValidationUnavailable`` when it cannot measure here (no CUDA device, another GPU type);
the worker then records the validation as skipped, with the reason."""


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
            ``tuner.runtime.validate.validate_plans``, which measures on this process's CUDA device.
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
        """Claim and run jobs until ``stop``; waits ``poll_interval_s`` when there is none."""
        log.info("worker %s serving %s", self.worker_id, self.gpu_keys or "every GPU type")
        while not self._stop.is_set():
            try:
                job_id = self.run_once()
            except Exception:  # the database went away: keep the worker alive and retry
                log.exception("worker %s: claim failed", self.worker_id)
                job_id = None
            if job_id is None:
                self._stop.wait(self.poll_interval_s)

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

    # ---- one job -----------------------------------------------------------------------------------
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

    def _process(self, job: Job, lease: JobLease) -> None:
        watch = _Watch(self.db, lease, self.heartbeat_interval_s)
        watch.start()
        try:
            profile, profile_id = self._profile_for(job, lease)
            result = self._tune(job, lease, profile, watch)
            if watch.lost:
                raise _LeaseLost
            rows = _simulated_rows(job, result)
            validation = None
            if job.validate_top_k > 0:
                validation = self._validate(job, lease, profile, profile_id, rows, watch)
                if watch.lost:
                    raise _LeaseLost
            self._store(job, lease, result, profile_id, rows, validation, cancelled=watch.cancel)
        except _LeaseLost:
            log.warning("worker %s lost job %s to another worker; dropping it", self.worker_id, job.id)
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

    def _tune(self, job: Job, lease: JobLease, profile: Profile, watch: _Watch) -> TuneResult:
        """Run (or resume) the job's Optuna study at the job's headroom (NOTE [ Headroom ] in ``tuner.search``).

        Candidates are feasible when their simulated peak fits ``job.search_budget_bytes`` (the budget less
        the headroom); the result, and every row stored from it, keeps ``job.budget_bytes``, the budget asked
        for, so results and the leaderboard are filed under the user's budget with ``feasible`` judged with
        the slack."""
        from tuner.search import tune

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
            seed=int(job.id[:8], 16),
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
        if self._model(job).kind == "exported":
            return self._skipped(
                job,
                "measured validation builds the model in a fresh process per plan from a zoo name or JSON spec; "
                "exported programs are profiled and tuned, not yet measured under a plan",
            )
        if job.optimizer != "sgd":
            return self._skipped(
                job,
                f"the measured step updates with SGD and momentum (tuner.runtime.bench), but this job was tuned "
                f"for optimizer {job.optimizer!r}: its plans' memory would not match; submit with optimizer 'sgd'",
            )
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

        from tuner.plan import Plan
        from tuner.runtime.validate import ValidationUnavailable, validate_plans

        validator: Validator = self.validator or validate_plans
        try:
            from api.model_refs import stored_chain_builder

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


def _simulated_rows(job: Job, result: TuneResult) -> list[ResultIn]:
    """The search's results to store: every baseline, the Optuna best, and (pareto mode) the front."""
    rows = [_result_in(c, "baseline") for c in result.policies]
    if result.best is not None:
        rows.append(_result_in(result.best, "optuna", name="optuna"))
    if result.no_choice is not None:  # NOTE [ Measured selection ] in tuner.search
        rows.append(_result_in(result.no_choice, "optuna"))
    if job.mode == "pareto":
        baseline_names = {c.name for c in result.policies}
        rows.extend(_result_in(c, "pareto") for c in result.pareto if c.name not in baseline_names)
    return rows


_KIND_ORDER = {"optuna": 0, "pareto": 1, "baseline": 2}


def _with_no_choice(chosen: list[ResultIn], rows: Sequence[ResultIn]) -> list[ResultIn]:
    """``chosen``, and the search's best plan without algorithm choice after them when it is not among them
    (NOTE [ Measured selection ] in ``tuner.search``): the GPU settles whether choosing algorithms is faster."""
    from tuner.search import NO_CHOICE

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
    from profiler.library import find_profile

    params = model.definition.get("params") or {}
    profile = find_profile(str(model.definition["zoo"]), job.batch, job.dtype, job.gpu_key, params=params)
    if profile is not None and profile.device.key != job.gpu_key:
        return None
    return profile


def _exported_profile(model: ModelRecord, job: Job, archive: bytes) -> Profile:
    """An exported program's profile, stage by stage (``profiler.module_profile.profile_module``): measured on this
    worker's GPU when it is of the job's type, else computed on the CPU with the copies of the job's GPU type's
    roofline spec (``modeled``). The archive is checked again on loading (NOTE [ Safe exported programs ])."""
    import torch

    from profiler.devices import gpu_key
    from profiler.exported import load_exported
    from profiler.module_profile import profile_module

    exported = model.definition["exported"]
    if job.batch != exported["batch"]:  # the API refuses such jobs; a job queued another way fails here
        raise ValueError(f"job batch {job.batch} is not the exported program's batch {exported['batch']}")
    device = torch.device("cpu")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        if gpu_key(props.name, props.total_memory) == job.gpu_key:
            device = torch.device("cuda", 0)
    module, inputs = load_exported(
        archive,
        max_bytes=len(archive),
        int_high=exported.get("int_high"),
        device=device,
        seed=int(model.content_hash[:8], 16),
    )
    gpu = None if device.type == "cuda" else job.gpu_key
    return profile_module(module, inputs, dtype=job.dtype, gpu=gpu, name=model.name)


def _modeled_profile(model: ModelRecord, job: Job) -> Profile:
    """A roofline profile of the model on the job's GPU type, built on the meta device."""
    import torch

    from profiler.modeled import modeled_profile
    from profiler.spec import from_spec
    from profiler.zoo import build

    with torch.device("meta"):
        if model.kind == "zoo":
            chain = build(str(model.definition["zoo"]), model.definition.get("params"))
        else:
            chain = from_spec(model.definition["spec"])
    return modeled_profile(chain, job.batch, job.dtype, job.gpu_key)
