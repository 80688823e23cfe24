"""``/v1/gpus``: GPU types, and the best stored plan for one (with the documented fallback)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import DbDep, ReadAccess
from api.gpu_types import known_gpus, resolve_gpu, same_architecture
from api.problems import ProblemError
from api.schemas import BestPlanPublic, GpusPublic
from api.views import gpu_public
from profiler.errors import UnknownGPUError
from storage.repositories import ModelRepository, ResultRepository
from tuner.budget import format_bytes, parse_budget

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
    """GPU types: every roofline spec (jobs for them run on any worker) and every stored identity."""
    with db.session() as s:
        gpus = known_gpus(s)
    data = [gpu_public(g.gpu, modeled=g.modeled, stored=g.stored) for g in gpus]
    return GpusPublic(data=data, count=len(data))


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
