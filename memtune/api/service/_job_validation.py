"""A job's measured validation: its best plans measured on this worker's GPU after the search, and the record of how
it went (NOTE [ Measured validation ] in ``memtune.api.service.worker``).

``validate_job`` stores the simulated results first, measures the chosen plans
(``memtune.api.service._job_results.top_plans``) with the worker's ``Validator`` and returns a ``JobValidation``, which
the worker writes with the job's finish. Step times are in milliseconds, peaks in bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from memtune.api.service._job_lease import LeaseLost, LeaseWatch
from memtune.api.service._job_profiles import stored_model
from memtune.api.service._job_results import top_plans, with_no_choice
from memtune.storage import Database
from memtune.storage.records import Job, ModelRecord, ResultIn
from memtune.storage.repositories import JobLease, JobRepository, ResultRepository

if TYPE_CHECKING:
    from memtune.profiler import DeviceIdentity, Profile
    from memtune.tuner.measure.validate import ValidationRun

__all__ = [
    "VALIDATION_WARMUP",
    "JobValidation",
    "Validator",
    "measured_validation",
    "skipped_validation",
    "validate_job",
    "validation_refusal",
]

VALIDATION_WARMUP = 3
"""Untimed steps before each configuration's timed ones (NOTE [ Measured validation ])."""

log = logging.getLogger("memtune.worker")


Validator = Callable[..., "ValidationRun"]
"""Measures plans on the GPU, called like ``memtune.tuner.measure.validate.validate_plans`` (the default). It must raise
``memtune.tuner.measure.validate.ValidationUnavailable`` when it cannot measure here (no CUDA device, another GPU type);
the worker then records the validation as skipped, with the reason."""


@dataclass
class JobValidation:
    """How one job's measured validation went, to be written with the job's finish."""

    state: Literal["done", "skipped", "failed", "cancelled"]
    note: str
    device: str | None = None
    measured: list[ResultIn] = field(default_factory=list)
    unconstrained_step_ms: float | None = None
    unconstrained_peak_bytes: int | None = None
    simulated_stored: bool = False


def validate_job(
    db: Database,
    job: Job,
    lease: JobLease,
    profile: Profile,
    profile_id: int,
    rows: list[ResultIn],
    watch: LeaseWatch,
    *,
    validator: Validator | None,
) -> JobValidation:
    """Measure the job's top plans on the GPU (NOTE [ Measured validation ]); never raises but LeaseLost."""
    top = top_plans(rows, job.validate_top_k)
    chosen = with_no_choice(top, rows)
    if watch.cancel:
        return JobValidation("cancelled", "the job was cancelled before its plans were validated")
    if not chosen:
        return skipped_validation(job, "no plan fits the budget, so there is nothing to validate")
    refusal = validation_refusal(stored_model(db, job), job)
    if refusal is not None:
        return skipped_validation(job, refusal)
    extra = " and the best plan without algorithm choice" if len(chosen) > len(top) else ""
    with db.session() as s:  # NOTE [ Measured validation ] step 1: the simulated results first
        st = JobRepository(s).set_validation(
            lease, "running", note=f"validating the top {len(top)} plan(s){extra} on the GPU"
        )
        if st.lost:
            raise LeaseLost
        ResultRepository(s).add_for_job(job, rows, profile_id=profile_id)
    watch.note(st.lost, st.cancel)

    def progress(index: int, total: int, name: str, device: DeviceIdentity) -> None:
        if index == 0:
            text = f"measuring the unplanned step (reference) on {device.name}"
        else:
            text = f"validating plan {index}/{total} ({name}) on {device.name}"
        log.info("job %s: %s", job.id, text)
        try:
            with db.session() as s:
                st = JobRepository(s).set_validation(lease, "running", device=device.name, note=text)
            watch.note(st.lost, st.cancel)
        except Exception as e:  # like a missed heartbeat: the measurement goes on
            log.warning("job %s: validation progress write failed: %s", job.id, e)

    def should_stop() -> bool:
        """Between two plans: ask the database (a heartbeat) whether the job was cancelled or reclaimed."""
        try:
            with db.session() as s:
                st = JobRepository(s).heartbeat(lease)
            watch.note(st.lost, st.cancel)
        except Exception as e:  # the heartbeat thread keeps trying; measure on
            log.warning("job %s: lease check between plans failed: %s", job.id, e)
        return watch.should_stop()

    from memtune.tuner import Plan
    from memtune.tuner.measure.validate import ValidationUnavailable, validate_plans

    measure: Validator = validator or validate_plans
    try:
        from memtune.api.service.model_refs import stored_chain_builder

        run = measure(
            stored_chain_builder(stored_model(db, job)),
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
        out = skipped_validation(job, str(e))
        out.simulated_stored = True
        return out
    except Exception as e:
        log.exception("job %s: validation failed; its simulated results stand", job.id)
        text = f"validation failed, the simulated results stand: {type(e).__name__}: {e}"
        return JobValidation("failed", text[:4000], simulated_stored=True)
    return measured_validation(job, chosen, run, cancelled=watch.cancel)


def validation_refusal(model: ModelRecord, job: Job) -> str | None:
    """Why this job's plans cannot be measured whatever the GPU (its model, its optimizer), or None."""
    if model.kind == "exported":
        return (
            "measured validation builds the model in a fresh process per plan from a zoo name or JSON spec; "
            "exported programs' plans are measured as finalists instead, where their compiled regions are (compile "
            "auto or on, on a worker with a GPU of the job's type: the compile note says what they measured)"
        )
    if job.optimizer != "sgd":
        return (
            f"the measured step updates with SGD and momentum (memtune.tuner.measure.bench), but this job was "
            f"tuned "
            f"for optimizer {job.optimizer!r}: its plans' memory would not match; submit with optimizer 'sgd'"
        )
    return None


def skipped_validation(job: Job, reason: str) -> JobValidation:
    """A skipped validation with ``reason`` in its note, logged as a warning."""
    log.warning("job %s: validation skipped: %s", job.id, reason)
    return JobValidation("skipped", f"validation skipped: {reason}")


def measured_validation(job: Job, chosen: list[ResultIn], run: ValidationRun, *, cancelled: bool) -> JobValidation:
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
    return JobValidation(
        "cancelled" if run.stopped and cancelled else "done",
        note[:8000],
        device=device,
        measured=measured,
        unconstrained_step_ms=run.unconstrained.step_ms,
        unconstrained_peak_bytes=run.unconstrained.peak_bytes,
        simulated_stored=True,
    )
