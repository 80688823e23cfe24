"""Compiled regions on a job (NOTE [ Compiled regions in the service ] in ``memtune.api.service.worker``): an exported
program's candidate partitions into regions, measured compiled on this worker's GPU, each searched beside the job's
own search, and the fastest plan of them all served.

``job_regions`` measures them where the job's ``compile`` and this worker allow it (``measure_job_regions`` by default,
the worker's ``RegionsFn``); ``weigh_job_regions`` searches each and gives the result to store, the rows to add and a
line per partition for the job's compile note. Step times are in milliseconds, peaks in bytes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from memtune.api.service._job_compile import COMPILE_BUDGETS, compile_note
from memtune.api.service._job_lease import LeaseLost, LeaseWatch
from memtune.api.service._job_profiles import load_stored_program, stored_model
from memtune.api.service._job_results import result_in
from memtune.storage import Database
from memtune.storage.records import Job, ModelRecord, ResultIn
from memtune.storage.repositories import JobLease, JobRepository, ModelRepository

if TYPE_CHECKING:
    from memtune.profiler import Profile
    from memtune.profiler.region_profile import RegionProfile
    from memtune.tuner import TuneResult

__all__ = ["RegionsFn", "job_regions", "measure_job_regions", "weigh_job_regions"]

log = logging.getLogger("memtune.worker")

RegionsFn = Callable[[ModelRecord, bytes, str, Callable[[str], None]], "Sequence[RegionProfile]"]
"""Measures an exported program's candidate region partitions compiled at ``COMPILE_BUDGETS`` and under memtune's
save rules on this worker's GPU, called with the stored model, its archive, the job's dtype and a function it calls
with progress text; a partition that fails is returned with its error. ``measure_job_regions`` by default."""


def measure_job_regions(
    model: ModelRecord, archive: bytes, dtype: str, progress: Callable[[str], None]
) -> list[RegionProfile]:
    """The candidate region partitions of the exported program ``model`` (NOTE [ Candidate depths ] in
    ``memtune.profiler.region_tree``), each compiled at ``COMPILE_BUDGETS`` and under every save rule, measured on
    this process's CUDA device with the loss the job's profile was measured with (the default loss).

    Raises:
        RuntimeError: no CUDA device.
    """
    import torch

    from memtune.profiler.region_profile import profile_regions
    from memtune.tuner.measure.host_price import host_priced

    module, inputs = load_stored_program(model, archive, torch.device("cuda", 0))
    runs = profile_regions(
        module,
        inputs,
        COMPILE_BUDGETS,
        dtype=dtype,
        progress=lambda done, total, what: progress(f"{done}/{total}: {what}"),
    )
    # NOTE [ Host prices ] in memtune.tuner.measure.host_price
    return host_priced(module, inputs, runs, progress=lambda done, total, what: progress(
        f"pricing the host {done}/{total}: {what}"))  # fmt: skip


def job_regions(
    db: Database,
    job: Job,
    lease: JobLease,
    watch: LeaseWatch,
    *,
    local_gpu: Callable[[], str | None],
    measure: RegionsFn,
) -> list[RegionProfile]:
    """The job's compiled-region profiles: none where ``compile`` is ``off``, the job is cancelled, the model is not
    an exported program (a zoo model or spec is a chain of layers, planned whole or eager), or this worker has no GPU
    of the job's type (the compile note already says so); else those ``measure`` gives, the failed ones named in the
    note. A measurement that fails altogether is noted and the plans stand without regions. Raises LeaseLost."""
    if job.compile == "off" or watch.should_stop() or local_gpu() != job.gpu_key:
        return []
    model = stored_model(db, job)
    if model.kind != "exported":
        return []
    with db.session() as s:
        archive = ModelRepository(s).program(model.id)
        before = JobRepository(s).get(job.id).compile_note  # how the whole model compiled: kept in front
    lead = f"{before}; " if before else ""
    compile_note(db, job, lease, watch, f"{lead}compiling the model's candidate regions on this worker's GPU"[:2000])
    try:
        runs = list(
            measure(
                model,
                archive,
                job.dtype,
                lambda what: compile_note(db, job, lease, watch, f"{lead}compiling regions: {what}"[:2000]),
            )
        )
    except LeaseLost:
        raise
    except Exception as e:
        log.warning("job %s: compiling regions failed: %s", job.id, e, exc_info=True)
        compile_note(db, job, lease, watch, f"{lead}compiling regions failed: {type(e).__name__}: {e}"[:2000])
        return []
    failed = [f"{r.partition.label} at {r.policy}: {r.error}" for r in runs if r.error is not None]
    if failed:
        log.warning("job %s: %d region profile(s) failed: %s", job.id, len(failed), "; ".join(failed))
    compile_note(db, job, lease, watch, f"{lead}measured {len(runs)} compiled-region profile(s)"[:2000])
    return runs


def weigh_job_regions(
    result: TuneResult, regions: Sequence[RegionProfile], search: Callable[[Profile], TuneResult]
) -> tuple[TuneResult, list[ResultIn], list[str], list[tuple[TuneResult, str | None]]]:
    """Each measured region profile of ``regions`` searched by ``search`` (NOTE [ Compiled-region candidates ] in
    ``memtune.tuner.region_plans``), beside ``result``, the job's own search.

    Returns:
        ``result`` with the fastest best plan of them all as its best, named as its row (its unconstrained step and
        baselines stay the job's profile's); a row per region profile whose search found a plan that fits
        (``optuna``, named for its partition and policy), to store beside the job's rows; a line per region
        profile for the compile note; and every search, the job's own first, each with the name its best is stored
        under (None: its own), for the finalists (``memtune.api.service._job_finalists``).
    """
    from memtune.tuner.region_plans import weigh_regions

    found: dict[int, TuneResult] = {}

    def searched(run: RegionProfile, profile: Profile) -> TuneResult:
        found[id(run)] = search(profile)
        return found[id(run)]

    fastest, trials = weigh_regions(result, regions, searched)
    rows, served = [], result
    searches: list[tuple[TuneResult, str | None]] = [(result, None)]
    for run in regions:
        searched_here = found.get(id(run))
        best = searched_here.best if searched_here is not None else None
        if searched_here is None or best is None or not best.feasible:
            continue
        named = dataclasses.replace(best, name=f"compiled regions {run.partition.label.split(':')[0]} at {run.policy}")
        rows.append(result_in(named, "optuna"))
        searches.append((searched_here, named.name))
        if searched_here is fastest:
            served = dataclasses.replace(result, best=named)
    return served, rows, [t.line() for t in trials], searches
