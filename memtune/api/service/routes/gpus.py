"""``/v1/gpus``: GPU types, the best stored plan for one (with the documented fallback), and its calibration."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from memtune.api.service._calibration_lookup import ServiceCalibration, effective_calibration
from memtune.api.service._deps import AdminKey, DbDep, JsonBody, ReadAccess
from memtune.api.service._gpu_types import KnownGpu, known_gpus, resolve_gpu, same_architecture
from memtune.api.service._problems import ProblemError
from memtune.api.service._views import calibration_public, calibration_summary, gpu_public
from memtune.api.service.schemas import BestPlanPublic, CalibrationPublic, CalibrationPut, GpusPublic
from memtune.profiler import UnknownGPUError
from memtune.storage.repositories import CalibrationRepository, ModelRepository, ResultRepository
from memtune.tuner import format_bytes, parse_budget
from memtune.tuner.calibration import Calibration

__all__ = ["router"]

router = APIRouter(prefix="/v1/gpus", tags=["gpus"])

_NOTES = {
    "exact": "tuned for this GPU type and budget",
    "smaller_budget": "no result for this budget; this plan was tuned for the largest smaller budget stored "
    "on this GPU type, and it fits the budget asked",
    "same_architecture": "no result on this GPU type; this plan was tuned on another GPU type of the same "
    "architecture (compute capability) and its peak fits the budget asked",
}
_MEASURED_NOTE = (
    "; its step time and peak were measured on the GPU (the simulator's numbers are in predicted_*), "
    "and a measured plan is preferred to simulated ones"
)


@router.get("", response_model=GpusPublic)
def list_gpus(db: DbDep, _read: ReadAccess) -> GpusPublic:
    """GPU types: every roofline spec (jobs for them run on any worker) and every stored identity, each with its
    calibration in short (null when it has none)."""
    with db.session() as s:
        gpus = known_gpus(s)
        stored = {r.gpu_key: r for r in CalibrationRepository(s).list_all()}
        found = {g.gpu.key: effective_calibration(s, g.gpu.key, stored=stored) for g in gpus}
    data = [
        gpu_public(g.gpu, modeled=g.modeled, stored=g.stored, calibration=calibration_summary(found[g.gpu.key]))
        for g in gpus
    ]
    return GpusPublic(data=data, count=len(data))


def _known(session: Session, gpu: str) -> KnownGpu:
    """The GPU type named in a path; 404 ``unknown_gpu`` listing the known ones."""
    try:
        return resolve_gpu(session, gpu)
    except UnknownGPUError as e:
        raise ProblemError(404, "unknown_gpu", "Unknown GPU type", str(e)) from e


@router.get(
    "/{gpu}/calibration",
    response_model=CalibrationPublic,
    responses={404: {"description": "unknown GPU type (unknown_gpu), or no calibration of it (no_calibration)"}},
)
def get_calibration(gpu: str, db: DbDep, _read: ReadAccess) -> CalibrationPublic:
    """The calibration new jobs of this GPU type get their headroom from, and where it was found (``origin``): the
    one stored in the service's ``database`` (measured by a worker, or sent with PUT), else the API host's ``user
    file``, else the ``committed`` one. 404 ``no_calibration`` when there is none (jobs then get headroom 0)."""
    with db.session() as s:
        key = _known(s, gpu).gpu.key
        found = effective_calibration(s, key)
    if found.origin == "none":
        raise ProblemError(
            404,
            "no_calibration",
            "No calibration",
            f"GPU type {key!r} has no calibration, so its jobs are searched without headroom; measure one on such a "
            f"GPU with `memtune calibrate` and send the file with PUT /v1/gpus/{key}/calibration, or let a worker on "
            f"one (`memtune worker --gpu {key}`) measure it before the first job it validates",
            hint=f"PUT /v1/gpus/{key}/calibration",
        )
    return calibration_public(found)


@router.put(
    "/{gpu}/calibration",
    response_model=CalibrationPublic,
    responses={
        403: {"description": "this API key is no admin key (admin_only): calibrations serve every key's jobs"},
        404: {"description": "unknown GPU type (unknown_gpu)"},
        422: {
            "description": "a field out of range (validation_error, naming it), the body's 'gpu' not the path's "
            "(gpu_mismatch), or data that is not a calibration (invalid_calibration, naming the field)"
        },
    },
)
def put_calibration(gpu: str, key: AdminKey, _json: JsonBody, body: CalibrationPut, db: DbDep) -> CalibrationPublic:
    """Store this GPU type's calibration in the service's database, replacing a stored one.

    From then on new jobs of this GPU type get its headroom, and workers use it from their next job on (NOTE
    [ Calibrations in the service ] in ``memtune.api.service.worker``). The body is a ``memtune calibrate`` file: its
    fields each within physical bounds, and no other field (422 naming it). Every key's jobs read it, so only an admin
    key (``MEMTUNE_ADMIN_KEYS``) may store one: 403 ``admin_only`` for others. 200 with the calibration stored
    (``origin`` ``database``).
    """
    with db.session() as s:
        gpu_key = _known(s, gpu).gpu.key
        _check_body_gpu(s, body.gpu, gpu_key)
        cal = Calibration.from_data(_calibration_data(body, gpu_key, key.name), gpu=gpu_key)
        row = CalibrationRepository(s).put(gpu_key, cal.to_data(), source=cal.source, measured_by=f"API key {key.name}")
    return calibration_public(ServiceCalibration(cal, "database", row))


def _calibration_data(body: CalibrationPut, gpu_key: str, key_name: str) -> dict[str, Any]:
    """The body as the calibration's JSON object: the path's GPU key, a ``source`` naming the sender when it gave
    none, and no nulls for the optional fields."""
    data = body.model_dump(exclude_none=True)
    data["gpu"] = gpu_key
    data["source"] = body.source or f"sent with PUT /v1/gpus/{gpu_key}/calibration by API key {key_name!r}"
    return data


def _check_body_gpu(session: Session, named: str, gpu_key: str) -> None:
    """422 ``gpu_mismatch`` (field ``gpu``) unless the body's ``gpu`` names the path's GPU type."""
    if named == gpu_key:
        return
    try:
        same = resolve_gpu(session, named).gpu.key == gpu_key
    except UnknownGPUError:
        same = False
    if not same:
        raise ProblemError(
            422,
            "gpu_mismatch",
            "Calibration of another GPU type",
            f"gpu: the body is a calibration of {named!r} but the path names GPU type {gpu_key!r}; send it to "
            f"PUT /v1/gpus/{named}/calibration, or fix its 'gpu'",
            field="gpu",
        )


@router.get(
    "/{gpu}/best",
    response_model=BestPlanPublic,
    responses={404: {"description": "unknown GPU type, unknown model, or no stored plan (with a hint)"}},
)
def best_plan(
    gpu: str,
    db: DbDep,
    _read: ReadAccess,
    model: Annotated[str, Query(min_length=1, max_length=200, description="model id or name (vgg16)")],
    batch: Annotated[int, Query(ge=1, le=1 << 20)],
    budget: Annotated[str, Query(min_length=1, max_length=64, description="'12GiB', bytes, or a fraction")],
    dtype: Annotated[str | None, Query(pattern="^(float32|bfloat16|float16)$")] = None,
) -> BestPlanPublic:
    """The fastest stored plan for ``model`` at ``batch`` on ``gpu`` within ``budget``.

    Fallback, stated in ``fallback`` and ``note``: the exact budget; else the largest stored budget not
    above it; else another GPU type of the same architecture (compute capability). 404 otherwise.
    Within the step that answers, a plan measured to fit on the GPU (``source: measured``) is preferred to
    every simulated one, the fastest measured first; ``predicted_*`` then hold the simulator's numbers.
    """
    with db.session() as s:
        try:
            known = resolve_gpu(s, gpu)
        except UnknownGPUError as e:
            raise ProblemError(404, "unknown_gpu", "Unknown GPU type", str(e)) from e
        budget_bytes = parse_budget(budget, known.gpu.memory_bytes)
        models = ModelRepository(s).find(model)
        if not models:
            raise ProblemError(
                404,
                "unknown_model",
                "Unknown model",
                f"no stored model has id or name {model!r}; submit it with POST /v1/models or POST /v1/jobs",
            )
        results = ResultRepository(s)
        ids = [m.id for m in models]
        answer = results.best(gpu_key=known.gpu.key, model_ids=ids, batch=batch, budget_bytes=budget_bytes, dtype=dtype)
        if answer is None:  # the architecture fallback lists every GPU type: only when this one has no answer
            answer = results.best(
                gpu_key=known.gpu.key,
                model_ids=ids,
                batch=batch,
                budget_bytes=budget_bytes,
                dtype=dtype,
                same_architecture=same_architecture(s, known.gpu),
            )
    if answer is None:
        raise ProblemError(
            404,
            "no_plan",
            "No plan stored",
            f"no plan for {model!r} batch {batch} on {known.gpu.key} fits {format_bytes(budget_bytes)}, here or "
            "on a GPU type of the same architecture; tune one: POST /v1/jobs "
            f'{{"model": {{"zoo": "{model}"}}, "batch": {batch}, "gpu": "{known.gpu.key}", "budget": "{budget}"}}',
            hint="POST /v1/jobs",
        )
    r = answer.result
    return BestPlanPublic(
        gpu=known.gpu.key,
        answered_by_gpu=r.gpu_key,
        model_id=r.model_id,
        batch=r.batch,
        dtype=r.dtype,
        budget_bytes=budget_bytes,
        plan_budget_bytes=r.budget_bytes,
        fallback=answer.fallback,
        note=_NOTES[answer.fallback] + (_MEASURED_NOTE if r.source == "measured" else ""),
        name=r.name,
        kind=r.kind,
        step_ms=r.step_ms,
        peak_bytes=r.peak_bytes,
        source=r.source,  # type: ignore[arg-type]
        predicted_step_ms=r.predicted_step_ms,
        predicted_peak_bytes=r.predicted_peak_bytes,
        job_id=r.job_id,
        profile_id=r.profile_id,
        plan=r.plan,
    )
