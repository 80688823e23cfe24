"""Records (``memtune.storage.records``) to response bodies (``memtune.api.service.schemas``)."""

from __future__ import annotations

import json
from collections.abc import Collection

from memtune.api.service._calibration_lookup import ServiceCalibration
from memtune.api.service.schemas import (
    BestSoFar,
    CalibrationPublic,
    CalibrationSummary,
    GpuPublic,
    JobProgress,
    JobPublic,
    LeaderboardRow,
    MemoryCheckPublic,
    ModelPublic,
    ProfilePublic,
    ResultPublic,
    Unconstrained,
    ValidationPublic,
)
from memtune.storage.records import GpuType, Job, ModelRecord, ProfileRecord, Result
from memtune.tuner import peak_check

__all__ = [
    "calibration_public",
    "calibration_summary",
    "gpu_public",
    "job_public",
    "model_public",
    "profile_public",
    "result_public",
    "row_public",
]


def model_public(m: ModelRecord) -> ModelPublic:
    return ModelPublic(
        id=m.id,
        name=m.name,
        kind=m.kind,
        content_hash=m.content_hash,
        definition=m.definition,
        n_stages=m.n_stages,
        created_at=m.created_at,
    )


def job_public(j: Job, unserved: Collection[str] = ()) -> JobPublic:
    """The job's public view; ``unserved``: the queued GPU types no live worker serves (NOTE [ Worker heartbeats ]),
    which a queued job of one of them is said to wait for."""
    best = None
    if j.best_step_ms is not None and j.best_peak_bytes is not None:
        best = BestSoFar(name=j.best_name, step_ms=j.best_step_ms, peak_bytes=j.best_peak_bytes)
    unconstrained = None
    if j.unconstrained_step_ms is not None and j.unconstrained_peak_bytes is not None:
        unconstrained = Unconstrained(step_ms=j.unconstrained_step_ms, peak_bytes=j.unconstrained_peak_bytes)
    validation = None
    if j.validate_top_k > 0:
        measured = None
        if j.measured_unconstrained_step_ms is not None and j.measured_unconstrained_peak_bytes is not None:
            measured = Unconstrained(
                step_ms=j.measured_unconstrained_step_ms, peak_bytes=j.measured_unconstrained_peak_bytes
            )
        validation = ValidationPublic(
            state=j.validation_state or "pending",
            device=j.validation_device,
            note=j.validation_note,
            unconstrained=measured,
        )
    return JobPublic(
        id=j.id,
        state=j.state,
        model_id=j.model_id,
        gpu=j.gpu_key,
        batch=j.batch,
        dtype=j.dtype,
        budget=j.budget_text,
        budget_bytes=j.budget_bytes,
        trials=j.trials,
        mode=j.mode,
        optimizer=j.optimizer,
        headroom=j.headroom,
        headroom_source=j.headroom_source,
        compile=j.compile,
        compile_note=j.compile_note,
        validate_top_k=j.validate_top_k,
        validate_iters=j.validate_iters,
        waiting=f"no live worker serves GPU type {j.gpu_key}: the job starts when one does"
        if j.state == "queued" and j.gpu_key in unserved
        else None,
        progress=JobProgress(
            trials_done=j.trials_done,
            trials_total=j.trials,
            fraction=min(1.0, j.trials_done / j.trials) if j.trials else 0.0,
            best=best,
        ),
        unconstrained=unconstrained,
        validation=validation,
        error=j.error,
        owner=j.owner,
        attempts=j.attempts,
        cancel_requested=j.cancel_requested,
        profile_id=j.profile_id,
        study_name=j.study_name,
        created_at=j.created_at,
        started_at=j.started_at,
        heartbeat_at=j.heartbeat_at,
        finished_at=j.finished_at,
    )


def result_public(r: Result, *, with_plan: bool = False) -> ResultPublic:
    return ResultPublic(
        id=r.id,
        job_id=r.job_id,
        model_id=r.model_id,
        gpu=r.gpu_key,
        batch=r.batch,
        dtype=r.dtype,
        budget_bytes=r.budget_bytes,
        name=r.name,
        kind=r.kind,  # type: ignore[arg-type]
        baseline=r.kind == "baseline",
        pareto_optimal=r.pareto_optimal,
        step_ms=r.step_ms,
        peak_bytes=r.peak_bytes,
        feasible=r.feasible,
        source=r.source,  # type: ignore[arg-type]
        profile_id=r.profile_id,
        created_at=r.created_at,
        plan=r.plan if with_plan else None,
        predicted_step_ms=r.predicted_step_ms,
        predicted_peak_bytes=r.predicted_peak_bytes,
        step_error=_relative_error(r.predicted_step_ms, r.step_ms) if r.source == "measured" else None,
        peak_error=_relative_error(r.predicted_peak_bytes, r.peak_bytes) if r.source == "measured" else None,
        reserved_peak_bytes=r.reserved_peak_bytes,
        samples_per_s=r.samples_per_s,
        alloc_retries=r.alloc_retries,
        allocator_ms=r.allocator_ms,
    )


def _relative_error(predicted: float | None, measured: float) -> float | None:
    """(predicted − measured) / measured, as ``memtune.tuner.measure.bench.BenchRow`` reports it."""
    if predicted is None or measured <= 0:
        return None
    return (predicted - measured) / measured


def row_public(r: Result, rank: int, *, with_plan: bool = False) -> LeaderboardRow:
    return LeaderboardRow(rank=rank, **result_public(r, with_plan=with_plan).model_dump())


def gpu_public(g: GpuType, *, modeled: bool, stored: bool, calibration: CalibrationSummary | None = None) -> GpuPublic:
    """A GPU type's public view: its identity (NOTE [ GPU identity ] in ``memtune.storage.records``) and sources."""
    return GpuPublic(**g.identity_fields(), modeled=modeled, stored=stored, calibration=calibration)


def calibration_summary(found: ServiceCalibration) -> CalibrationSummary | None:
    """A GPU type's calibration in short, or None when it has none."""
    if found.origin == "none":
        return None
    cal = found.calibration
    return CalibrationSummary(headroom=cal.headroom, origin=found.origin, source=cal.source)


def calibration_public(found: ServiceCalibration) -> CalibrationPublic:
    """A GPU type's calibration in effect; ValueError for ``none`` (the caller answers 404 then)."""
    if found.origin == "none":
        raise ValueError(f"GPU type {found.calibration.gpu!r} has no calibration")
    cal, row = found.calibration, found.record
    return CalibrationPublic(
        gpu=cal.gpu,
        origin=found.origin,
        headroom=cal.headroom,
        remap_ms_per_gib=cal.remap_ms_per_gib,
        compute_scale=cal.compute_scale,
        source=cal.source,
        measured_by=row.measured_by if row else None,
        created_at=row.created_at if row else None,
        updated_at=row.updated_at if row else None,
        data=cal.to_data(),
    )


def profile_public(p: ProfileRecord) -> ProfilePublic:
    check = peak_check(p.profile())
    return ProfilePublic(
        id=p.id,
        model_id=p.model_id,
        gpu=p.gpu_key,
        batch=p.batch,
        dtype=p.dtype,
        source=p.source,
        created_at=p.created_at,
        profile=json.loads(p.profile_json),
        memory_check=None
        if check is None
        else MemoryCheckPublic(
            measured_bytes=check.measured_bytes,
            reserved_bytes=check.reserved_bytes,
            predicted_bytes=check.predicted_bytes,
            gap=check.gap,
            reported=check.reported,
            text=str(check),
        ),
    )
