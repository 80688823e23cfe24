"""Plan results: store a job's plans (Pareto flags computed), best-plan lookup with fallback, leaderboard.

# NOTE [ Best-plan fallback ]
``best`` answers "the fastest feasible plan for this model and batch on this GPU type within this
budget" in three steps, and says which one answered:

1. ``exact``: results stored for exactly this budget on this GPU type;
2. ``smaller_budget``: else, results of the largest stored budget *not above* the one asked on this
   GPU type (a plan that fits a smaller budget fits the larger one);
3. ``same_architecture``: else, the same two steps on the other GPU types of the same architecture
   (compute capability), in key order; only plans whose peak fits the asked budget are used.

Among the candidates of the step that answers, a ``measured`` plan that fitted on the GPU (its measured
peak within the asked budget) wins over every ``simulated`` one, the fastest measured first; only when
none was measured does the fastest simulated plan answer. The measurement is what the plan does; the
simulation is what it is predicted to do. The fallback order comes first: a simulated plan tuned for
exactly this budget still answers before a measured one tuned for a smaller budget. The result's
``source`` tells the caller which kind answered.

# NOTE [ Measured results ]
A job that asked for validation stores, beside its simulated plans, one ``measured`` row per plan that
ran on the GPU: ``step_ms`` is the measured median step, ``peak_bytes`` the measured peak allocated bytes,
``feasible`` whether that peak fitted the budget, and ``predicted_step_ms`` / ``predicted_peak_bytes``
the simulator's numbers for the same plan. The leaderboard ranks measured and simulated rows together by
the asked order (each labeled by ``source``; ``source=`` filters to one kind). Pareto flags are
computed within one job and one source: measured and simulated numbers are not compared.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import case, func, or_, select
from sqlalchemy.orm import Session

from memtune.storage.orm import ResultRow
from memtune.storage.records import Job, Result, ResultIn
from memtune.storage.repositories._convert import to_result

__all__ = ["BestAnswer", "LeaderboardPage", "ResultRepository", "pareto_flags"]

OrderBy = Literal["step_ms", "peak_bytes", "created_at"]
Source = Literal["simulated", "measured"]


def pareto_flags(points: Sequence[tuple[float, int, bool]]) -> list[bool]:
    """For ``(step_ms, peak_bytes, feasible)`` points: True where the point is feasible and no other
    feasible point is at least as good in both and better in one."""
    out = []
    for i, (t, m, ok) in enumerate(points):
        if not ok:
            out.append(False)
            continue
        dominated = any(
            ok2 and t2 <= t and m2 <= m and (t2 < t or m2 < m) for j, (t2, m2, ok2) in enumerate(points) if j != i
        )
        out.append(not dominated)
    return out


@dataclass(frozen=True)
class BestAnswer:
    """The best plan found and how: ``fallback`` is ``exact``, ``smaller_budget`` or ``same_architecture``."""

    result: Result
    fallback: Literal["exact", "smaller_budget", "same_architecture"]


@dataclass(frozen=True)
class LeaderboardPage:
    """One page of ranked results; ``ranks`` are 1-based positions in the whole ordering."""

    results: list[Result]
    ranks: list[int]
    count: int
    next_page_token: str | None


def _encode_token(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")


#: the largest integer a token may carry (ids, offsets, bytes): within a signed 64-bit column
_TOKEN_INT_MAX = (1 << 62) - 1
#: the largest step, ms, a token may carry
_TOKEN_MS_MAX = 1e12
_BAD_TOKEN = "page_token is not valid; pass the next_page_token of a previous page"


def _token_int(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _TOKEN_INT_MAX


def decode_page_token(token: str) -> dict[str, Any]:
    """Parse a page token; raises ``ValueError`` when it was not made by ``leaderboard``.

    NOTE [ Page tokens ]: a token is the client's to hold and so to edit; every field is checked for its type and
    range before it reaches a query: ``o`` one of the orderings, ``id`` and ``n`` integers in [0, 2^62), ``v`` what
    the ordering's column holds (a finite step in [0, 1e12] ms for ``step_ms``, an integer in [0, 2^62) for the
    others). An edited token within those bounds is a valid position in the ordering (its ranks may then be off
    for the client that edited it); anything else is this error, a 400 at the API, never a query.
    """
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(_BAD_TOKEN) from e
    if not isinstance(data, dict) or set(data) != {"v", "id", "n", "o"}:
        raise ValueError(_BAD_TOKEN)
    order, value = data["o"], data["v"]
    if order not in ("step_ms", "peak_bytes", "created_at") or not (_token_int(data["id"]) and _token_int(data["n"])):
        raise ValueError(_BAD_TOKEN)
    if order == "step_ms":
        number = type(value) in (int, float) and math.isfinite(value) and 0 <= value <= _TOKEN_MS_MAX
        if not number:
            raise ValueError(_BAD_TOKEN)
    elif not _token_int(value):
        raise ValueError(_BAD_TOKEN)
    return data


class ResultRepository:
    """Results in ``mt_results``."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def add_for_job(self, job: Job, results: Sequence[ResultIn], *, profile_id: int | None) -> list[Result]:
        """Store a job's results (replacing earlier ones of the job) with Pareto flags per source."""
        for old in self.s.scalars(select(ResultRow).where(ResultRow.job_id == job.id)):
            self.s.delete(old)
        return self._add(job, results, profile_id)

    def add_measured(self, job: Job, results: Sequence[ResultIn], *, profile_id: int | None) -> list[Result]:
        """Store a job's ``measured`` results (replacing earlier measured ones of the job), keeping its
        simulated results. See NOTE [ Measured results ].

        Raises:
            ValueError: a result is not labeled ``measured``.
        """
        bad = [r.name for r in results if r.source != "measured"]
        if bad:
            raise ValueError(f"add_measured stores measured results only; {bad} are labeled otherwise")
        q = select(ResultRow).where(ResultRow.job_id == job.id, ResultRow.source == "measured")
        for old in self.s.scalars(q):
            self.s.delete(old)
        return self._add(job, results, profile_id)

    def _add(self, job: Job, results: Sequence[ResultIn], profile_id: int | None) -> list[Result]:
        flags = [False] * len(results)
        for source in {r.source for r in results}:
            idx = [i for i, r in enumerate(results) if r.source == source]
            points = [(results[i].step_ms, results[i].peak_bytes, results[i].feasible) for i in idx]
            for i, flag in zip(idx, pareto_flags(points), strict=True):
                flags[i] = flag
        rows = [
            ResultRow(
                job_id=job.id,
                model_id=job.model_id,
                gpu_key=job.gpu_key,
                batch=job.batch,
                dtype=job.dtype,
                budget_bytes=job.budget_bytes,
                name=r.name,
                kind=r.kind,
                plan=r.plan,
                step_ms=r.step_ms,
                peak_bytes=r.peak_bytes,
                feasible=r.feasible,
                pareto_optimal=flag,
                source=r.source,
                profile_id=profile_id,
                predicted_step_ms=r.predicted_step_ms,
                predicted_peak_bytes=r.predicted_peak_bytes,
                reserved_peak_bytes=r.reserved_peak_bytes,
                samples_per_s=r.samples_per_s,
                alloc_retries=r.alloc_retries,
                allocator_ms=r.allocator_ms,
            )
            for r, flag in zip(results, flags, strict=True)
        ]
        self.s.add_all(rows)
        self.s.flush()
        return [to_result(r) for r in rows]

    def for_job(self, job_id: str, *, source: Source | None = None) -> list[Result]:
        """A job's results, fastest first (measured and simulated together unless ``source`` is given)."""
        q = select(ResultRow).where(ResultRow.job_id == job_id)
        if source is not None:
            q = q.where(ResultRow.source == source)
        return [to_result(r) for r in self.s.scalars(q.order_by(ResultRow.step_ms, ResultRow.id))]

    # ---- best --------------------------------------------------------------------------------------
    def _fastest(
        self,
        gpu_key: str,
        model_ids: Sequence[str],
        batch: int,
        budget: int,
        dtype: str | None,
        *,
        exact: bool,
    ) -> Result | None:
        base = [
            ResultRow.gpu_key == gpu_key,
            ResultRow.model_id.in_(list(model_ids)),
            ResultRow.batch == batch,
            ResultRow.feasible.is_(True),
            ResultRow.peak_bytes <= budget,
        ]
        if dtype is not None:
            base.append(ResultRow.dtype == dtype)
        if exact:
            target: Any = budget
        else:
            target = self.s.scalar(
                select(func.max(ResultRow.budget_bytes)).where(*base, ResultRow.budget_bytes < budget)
            )
            if target is None:
                return None
        measured_first = case((ResultRow.source == "measured", 0), else_=1)  # NOTE [ Best-plan fallback ]
        q = (
            select(ResultRow)
            .where(*base, ResultRow.budget_bytes == target)
            .order_by(measured_first, ResultRow.step_ms, ResultRow.id)
        )
        row = self.s.scalars(q.limit(1)).first()
        return None if row is None else to_result(row)

    def best(
        self,
        *,
        gpu_key: str,
        model_ids: Sequence[str],
        batch: int,
        budget_bytes: int,
        dtype: str | None = None,
        same_architecture: Sequence[str] = (),
    ) -> BestAnswer | None:
        """The best plan by NOTE [ Best-plan fallback ] (a measured fit before any simulated plan of the
        same step); None when no step finds one.

        Args:
            same_architecture: other GPU type keys of the same architecture, tried in this order.
        """
        hit = self._fastest(gpu_key, model_ids, batch, budget_bytes, dtype, exact=True)
        if hit is not None:
            return BestAnswer(hit, "exact")
        hit = self._fastest(gpu_key, model_ids, batch, budget_bytes, dtype, exact=False)
        if hit is not None:
            return BestAnswer(hit, "smaller_budget")
        for other in same_architecture:
            if other == gpu_key:
                continue
            hit = self._fastest(other, model_ids, batch, budget_bytes, dtype, exact=True) or self._fastest(
                other, model_ids, batch, budget_bytes, dtype, exact=False
            )
            if hit is not None:
                return BestAnswer(hit, "same_architecture")
        return None

    # ---- leaderboard -------------------------------------------------------------------------------
    def leaderboard(
        self,
        *,
        model_ids: Sequence[str] | None = None,
        gpu_key: str | None = None,
        batch: int | None = None,
        budget_bytes: int | None = None,
        order_by: OrderBy = "step_ms",
        page_size: int = 50,
        page_token: str | None = None,
        include_infeasible: bool = False,
        source: Source | None = None,
    ) -> LeaderboardPage:
        """Ranked results, keyset-paginated: ``next_page_token`` continues after the last row.

        Plans over their budget are left out unless ``include_infeasible``. Measured and simulated results
        are ranked together, each labeled by its ``source``; ``source`` keeps one kind only (NOTE
        [ Measured results ]).

        Raises:
            ValueError: ``page_token`` is malformed or was made for another ``order_by``.
        """
        col: Any = {
            "step_ms": ResultRow.step_ms,
            "peak_bytes": ResultRow.peak_bytes,
            "created_at": ResultRow.id,
        }[order_by]
        filters: list[Any] = []
        if model_ids is not None:
            filters.append(ResultRow.model_id.in_(list(model_ids)))
        if gpu_key is not None:
            filters.append(ResultRow.gpu_key == gpu_key)
        if batch is not None:
            filters.append(ResultRow.batch == batch)
        if budget_bytes is not None:
            filters.append(ResultRow.budget_bytes == budget_bytes)
        if not include_infeasible:
            filters.append(ResultRow.feasible.is_(True))
        if source is not None:
            filters.append(ResultRow.source == source)
        count = self.s.scalar(select(func.count()).select_from(ResultRow).where(*filters)) or 0
        q = select(ResultRow).where(*filters)
        offset = 0
        if page_token is not None:
            tok = decode_page_token(page_token)
            if tok["o"] != order_by:
                raise ValueError(f"page_token was made for order_by={tok['o']!r}, not {order_by!r}")
            v, last_id, offset = tok["v"], tok["id"], tok["n"]
            q = q.where(or_(col > v, (col == v) & (ResultRow.id > last_id)))
        rows = list(self.s.scalars(q.order_by(col, ResultRow.id).limit(page_size + 1)))
        more = len(rows) > page_size
        rows = rows[:page_size]
        token = None
        if more and rows:
            last = rows[-1]
            value = {
                "step_ms": last.step_ms,
                "peak_bytes": last.peak_bytes,
                "created_at": last.id,
            }[order_by]
            token = _encode_token({"o": order_by, "v": value, "id": last.id, "n": offset + len(rows)})
        return LeaderboardPage(
            results=[to_result(r) for r in rows],
            ranks=list(range(offset + 1, offset + len(rows) + 1)),
            count=count,
            next_page_token=token,
        )
