"""Measured finalists on a job (NOTE [ Finalists in the service ] in ``memtune.api.service.worker``): the plans of an
exported program's job predicted nearest the fastest, each run on this worker's GPU under the job's budget, and the
fastest that ran served.

``job_finalists`` chooses them (``memtune.tuner.finalists.finalists``) and has ``measure`` run them
(``measure_job_finalists`` by default, the worker's ``FinalistsFn``); it gives the result to store and a line for the
job's compile note. Step times are in milliseconds, budgets in bytes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from memtune.api.service._job_compile import compile_note
from memtune.api.service._job_lease import LeaseLost, LeaseWatch
from memtune.api.service._job_profiles import load_stored_program, stored_model
from memtune.storage import Database
from memtune.storage.records import Job, ModelRecord, ResultIn
from memtune.storage.repositories import JobLease, JobRepository, ModelRepository

if TYPE_CHECKING:
    from memtune.tuner import Candidate, TuneResult
    from memtune.tuner.finalists import Finalist

__all__ = ["FINALIST_LIMIT", "FinalistsFn", "job_finalists", "measure_job_finalists"]

log = logging.getLogger("memtune.worker")

FINALIST_LIMIT = 3
"""At most this many finalists a job, as ``memtune.tune`` measures."""

FinalistsFn = Callable[
    [ModelRecord, bytes, str, "Sequence[tuple[str, Candidate]]", int, str, Callable[[str], None]],
    "Sequence[Finalist]",
]
"""Runs an exported program's finalists on this worker's GPU, called with the stored model, its archive, the job's
dtype, the finalists (each a name and its candidate, fastest predicted first), the job's budget in bytes, its optimizer
and a function it calls with progress text; gives one ``Finalist`` per finalist, in order, an error its own.
``measure_job_finalists`` by default."""


def measure_job_finalists(
    model: ModelRecord,
    archive: bytes,
    dtype: str,
    chosen: Sequence[tuple[str, Candidate]],
    budget_bytes: int,
    optimizer: str,
    progress: Callable[[str], None],
) -> list[Finalist]:
    """Each of ``chosen`` run as ``memtune.tune`` runs a finalist (``run_finalist``: a step outside the cap, then timed
    steps under ``budget_guard`` at ``budget_bytes``) on the exported program ``model`` loaded onto this process's CUDA
    device, with the loss its profile was measured with (the default loss), the output held through the backward as
    profiled; the program is left as found.

    Raises:
        RuntimeError: no CUDA device.
    """
    import torch

    from memtune.profiler.module_profile import default_loss, left_as_found
    from memtune.tuner.measure.finalists import run_finalist

    device = torch.device("cuda", 0)
    module, inputs = load_stored_program(model, archive, device)
    ran = []
    with left_as_found(module, device):
        for k, (name, candidate) in enumerate(chosen):
            progress(f"{k + 1}/{len(chosen)}: {name}")
            ran.append(run_finalist(module, inputs, name, candidate, budget_bytes, default_loss, optimizer=optimizer,
                                    output_held=True, dtype=dtype))  # fmt: skip
    return ran


def job_finalists(
    db: Database,
    job: Job,
    lease: JobLease,
    watch: LeaseWatch,
    result: TuneResult,
    searched: Sequence[tuple[TuneResult, str | None]],
    rows: list[ResultIn],
    *,
    measure: FinalistsFn,
) -> tuple[TuneResult, list[ResultIn]]:
    """``result`` (the job's, its best the fastest predicted of ``searched``) and ``rows`` (the rows to store) after
    the finalists ran (NOTE [ Finalists in the service ]): the fastest measured finalist as the best, and a
    ``measured`` row added per finalist that ran; where none ran, the fallbacks of NOTE [ Measured finalists ] in
    turn until one runs, and where none of those runs either, no best (the job's error says why) and every row of a
    plan that ran out of memory under the budget stored as not fitting. ``result`` and ``rows`` as given where one plan
    alone is a finalist, the job is cancelled or the measurement failed (the compile note says which). ``searched``:
    every search of the job, its own first, each with the name its best is stored under (None: the job's own, stored
    as ``optuna``). Raises LeaseLost."""
    from memtune.tuner.finalists import fallback_pool, fastest_measured, finalists, measured_in_turn

    chosen = finalists([r for r, _ in searched], FINALIST_LIMIT)
    if len(chosen) < 2 or watch.should_stop():
        return result, rows
    model = stored_model(db, job)
    with db.session() as s:
        archive = ModelRepository(s).program(model.id)
        before = JobRepository(s).get(job.id).compile_note
    lead = f"{before}; " if before else ""

    def note(text: str) -> None:
        compile_note(db, job, lease, watch, f"{lead}{text}"[:2000])

    def run(plans: Sequence[tuple[str, TuneResult, Candidate]], _total: int) -> Sequence[Finalist]:
        what = "finalists" if plans is chosen else "fallbacks"
        return measure(model, archive, job.dtype, [(name, c) for name, _, c in plans], job.budget_bytes,
                       job.optimizer, lambda done: note(f"measuring {what}: {done}"))  # fmt: skip

    try:  # NOTE [ Measured finalists ], step 5: fallbacks in turn until one runs
        ran = measured_in_turn(chosen, fallback_pool([r for r, _ in searched]), run, FINALIST_LIMIT)
    except LeaseLost:
        raise
    except Exception as e:
        log.warning("job %s: measuring finalists failed: %s", job.id, e, exc_info=True)
        note(f"measuring finalists failed: {type(e).__name__}: {e}; the fastest prediction is served")
        return result, rows
    won = fastest_measured(ran)
    if won is None:
        return _none_served(result, rows, chosen, ran, note)
    ran[won] = dataclasses.replace(ran[won], served=True)
    note(f"finalists measured on this worker's GPU: {'; '.join(f.line() for f in ran)}")
    own = searched[0][0]
    names = {id(r): name or "optuna" for r, name in searched[1:]}  # region searches' row names; the job's own: optuna
    stored = [_stored(job, c, (names.get(id(source), "optuna") if source.best is c else None), f)
              for (_, source, c), f in zip(chosen, ran, strict=True)]  # fmt: skip
    _, source, best = chosen[won]
    if source is not own and source.best is best:  # a region search's best, under its row's name
        best = dataclasses.replace(best, name=names[id(source)])
    served = dataclasses.replace(result, best=best)
    return served, rows + [r for r in stored if r is not None]


def _none_served(
    result: TuneResult,
    rows: list[ResultIn],
    chosen: Sequence[tuple[str, TuneResult, Candidate]],
    ran: Sequence[Finalist],
    note: Callable[[str], None],
) -> tuple[TuneResult, list[ResultIn]]:
    """No finalist nor fallback ran (NOTE [ Measured finalists ], step 5): ``result`` with no best, its ``extra``'s
    ``no_plan`` the job's error, and each row whose plan ran out of memory under the budget marked as not fitting."""
    said = "; ".join(f.line() for f in ran)
    note(f"finalists and fallbacks measured, none ran under the budget ({said}); none is served")
    short = [c.plan.model_dump(mode="json") for (_, _, c), f in zip(chosen, ran, strict=True) if f.out_of_memory]
    why = (f"no plan ran under the budget on this worker's GPU ({said}); the simulator's plans fit it, so give the "
           "budget more room")  # fmt: skip
    none = dataclasses.replace(result, best=None, no_choice=None, extra={**result.extra, "no_plan": why[:4000]})
    return none, [dataclasses.replace(r, feasible=False) if r.plan in short else r for r in rows]


def _stored(job: Job, c: Candidate, row: str | None, ran: Finalist) -> ResultIn | None:
    """The ``measured`` row of a finalist that ran, under the name and kind of its simulated row (``row``; None: a
    compiler point the search did not serve, named for itself, a baseline); None where it did not run."""
    if ran.step_ms is None or ran.peak_bytes is None:
        return None
    return ResultIn(
        name=row or c.name,
        kind="optuna" if row is not None else "baseline",
        plan=c.plan.model_dump(mode="json"),
        step_ms=float(ran.step_ms),
        peak_bytes=int(ran.peak_bytes),
        feasible=ran.peak_bytes <= job.budget_bytes,
        source="measured",
        predicted_step_ms=c.step_ms,
        predicted_peak_bytes=c.peak_bytes,
        reserved_peak_bytes=ran.reserved_bytes,
    )
