"""``/v1/leaderboard``: ranked plans, simulated and measured (labeled), baselines marked, paginated."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from memtune.api.service._deps import DbDep, ReadAccess
from memtune.api.service._gpu_types import resolve_gpu
from memtune.api.service._problems import ProblemError
from memtune.api.service._views import row_public
from memtune.api.service.schemas import LeaderboardPublic
from memtune.storage.repositories import ModelRepository, ResultRepository
from memtune.tuner import parse_budget

__all__ = ["router"]

router = APIRouter(prefix="/v1/leaderboard", tags=["leaderboard"])


@router.get("", response_model=LeaderboardPublic)
def leaderboard(
    db: DbDep,
    _read: ReadAccess,
    model: Annotated[str | None, Query(max_length=200, description="model id or name")] = None,
    gpu: Annotated[str | None, Query(max_length=100)] = None,
    batch: Annotated[int | None, Query(ge=1, le=1 << 20)] = None,
    budget: Annotated[str | None, Query(max_length=64, description="exact budget the plans were tuned for")] = None,
    order_by: Annotated[Literal["step_ms", "peak_bytes", "created_at"], Query()] = "step_ms",
    page_size: Annotated[int, Query(ge=1, le=200)] = 50,
    page_token: Annotated[str | None, Query(max_length=500)] = None,
    plans: Annotated[bool, Query(description="include each plan's JSON")] = False,
    include_infeasible: Annotated[bool, Query(description="also rank plans over their budget")] = False,
    source: Annotated[
        Literal["simulated", "measured"] | None, Query(description="only simulated, or only measured, results")
    ] = None,
) -> LeaderboardPublic:
    """Feasible stored plans ranked by ``order_by`` (ascending); pass ``next_page_token`` back for the next page.

    Measured and simulated results are ranked together, each labeled by ``source``; a measured row carries
    the simulator's prediction for the same plan (``predicted_step_ms``, ``predicted_peak_bytes``,
    ``step_error``). ``source=measured`` lists only what was measured on a GPU.
    """
    with db.session() as s:
        gpu_key = None
        budget_bytes = None
        if gpu is not None:
            known = resolve_gpu(s, gpu)
            gpu_key = known.gpu.key
            if budget is not None:
                budget_bytes = parse_budget(budget, known.gpu.memory_bytes)
        elif budget is not None:
            budget_bytes = parse_budget(budget, None)
        model_ids = None
        if model is not None:
            model_ids = [m.id for m in ModelRepository(s).find(model)]
        try:
            page = ResultRepository(s).leaderboard(
                model_ids=model_ids,
                gpu_key=gpu_key,
                batch=batch,
                budget_bytes=budget_bytes,
                order_by=order_by,
                page_size=page_size,
                page_token=page_token,
                include_infeasible=include_infeasible,
                source=source,
            )
        except ValueError as e:
            raise ProblemError(400, "invalid_page_token", "Invalid page token", str(e)) from e
    rows = [row_public(r, rank, with_plan=plans) for r, rank in zip(page.results, page.ranks, strict=True)]
    return LeaderboardPublic(data=rows, count=page.count, next_page_token=page.next_page_token)
