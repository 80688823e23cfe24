"""Compiled regions on service jobs (NOTE [ Compiled regions in the service ] in ``memtune.api.service.worker``), on
SQLite: a job of an exported program on a worker that has a GPU of the job's type gets its candidate partitions into
compiled regions measured and searched beside its own search, and the fastest plan of all served.

This machine has no GPU: the worker is told it has one of the job's type (``local_gpu``), the whole-model compiler
points are a stand-in that compiles nothing, and the regions are measured on the CPU with CPU inductor for the job's
GPU type (``profile_regions(..., gpu="h200")``, a modeled profile), as the GPU measurement would be on CUDA."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from exported_fixtures import TinyNet, export_archive

from memtune.api.client import MemtuneClient
from memtune.api.service._job_finalists import FINALIST_LIMIT, FinalistsFn
from memtune.api.service.schemas import JobPublic
from memtune.api.service.worker import COMPILE_BUDGETS, Worker
from memtune.profiler.exported import load_exported
from memtune.profiler.region_profile import RegionProfile, profile_regions
from memtune.storage.database import Database
from memtune.storage.records import ModelRecord
from memtune.storage.repositories import ResultRepository
from memtune.tuner import Candidate
from memtune.tuner.finalists import Finalist

pytestmark = pytest.mark.slow  # CPU inductor compiles every region


@pytest.fixture(scope="module")
def tiny() -> bytes:
    torch.manual_seed(0)
    return export_archive(TinyNet(width=64), torch.randn(4, 64))


@pytest.fixture(scope="module")
def measured(tiny: bytes) -> list[RegionProfile]:
    """The program's regions compiled at activation budget 1 on the CPU, for the H200 (measured once per module)."""
    module, inputs = load_exported(tiny, max_bytes=len(tiny), int_high=None, device=torch.device("cpu"), seed=1)
    return profile_regions(module, inputs, (1.0,), gpu="h200", rules=())


def _no_points(*_args: Any) -> tuple[tuple[()], dict[float, str]]:
    return (), {b: "test: compiles nothing" for b in COMPILE_BUDGETS}


def _worker(
    db: Database, regions: Callable[..., Sequence[RegionProfile]], finalists: FinalistsFn | None = None
) -> Worker:
    return Worker(
        db,
        worker_id="unit-worker",
        heartbeat_interval_s=0.5,
        progress_interval_s=0.0,
        local_gpu=lambda: "h200",
        compiler_points_fn=_no_points,
        regions_fn=regions,
        finalists_fn=finalists or _measured_at(),
    )


def _tuned(
    client: MemtuneClient,
    db: Database,
    tiny: bytes,
    name: str,
    regions: Callable[..., Sequence[RegionProfile]],
    finalists: FinalistsFn | None = None,
) -> tuple[str, JobPublic]:
    """The program uploaded as ``name``, one job of it run by a worker measuring regions with ``regions`` and
    finalists with ``finalists``: the model's id and the job, succeeded."""
    model = client.upload_exported(tiny, name=name)
    job = client.submit_job(model.id, batch=4, gpu="h200", budget="100MiB", trials=12)
    assert _worker(db, regions, finalists).run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded", done.error
    return model.id, done


def _rows(db: Database, job_id: str) -> dict[str, Any]:
    with db.session() as s:
        return {r.name: r for r in ResultRepository(s).for_job(job_id)}


def test_a_job_searches_its_measured_regions_beside_its_own_search(
    client: MemtuneClient, db: Database, tiny: bytes, measured: list[RegionProfile]
) -> None:
    asked: list[tuple[str, str]] = []

    def regions(model: ModelRecord, archive: bytes, dtype: str, progress: Callable[[str], None]) -> list[RegionProfile]:
        asked.append((model.kind, dtype))
        assert archive.startswith(b"PK")  # the stored canonical archive (a zip)
        progress("1/1: depth 1")
        return measured

    _, done = _tuned(client, db, tiny, "tiny-regions", regions)
    assert asked == [("exported", "float32")]
    note = done.compile_note or ""
    assert "compiled regions searched: depth 1: 3 regions (blocks.0, blocks.1, head) at activation budget 1: " in note
    rows = _rows(db, done.id)
    region_row = rows["compiled regions depth 1 at activation budget 1"]
    assert region_row.plan["stages"] == ["blocks.0", "blocks.1", "head"] and region_row.plan["compile_budget"] == 1.0
    assert {"optuna", "none"} <= set(rows)  # the job's own search is stored as before (``none``: keep all)
    own = rows["optuna"]
    regions_won = (region_row.step_ms, region_row.peak_bytes) < (own.step_ms, own.peak_bytes)  # a tie: the job's own
    assert done.progress.best is not None
    assert done.progress.best.step_ms == pytest.approx(min(region_row.step_ms, own.step_ms))
    assert note.startswith("compiling the whole model failed at every activation budget, so no plan compiles it whole")
    served = "a plan of compiled regions" if regions_won else "the job's own search's best plan"
    assert f"; served: {served}" in note


def test_faster_regions_are_served_as_the_jobs_best(
    client: MemtuneClient, db: Database, tiny: bytes, measured: list[RegionProfile]
) -> None:
    # test values, not measurements: the measured region profile with every stage ten times faster
    def faster(*_args: Any) -> list[RegionProfile]:
        out = []
        for run in measured:
            assert run.profile is not None
            stages = tuple(
                s.model_copy(update={"forward_ms": s.forward_ms / 10, "backward_ms": s.backward_ms / 10})
                for s in run.profile.stages
            )
            out.append(RegionProfile(run.partition, run.budget, run.profile.model_copy(update={"stages": stages}),
                                     None, run.seconds))  # fmt: skip
        return out

    model_id, done = _tuned(client, db, tiny, "tiny-faster-regions", faster)
    assert (
        done.progress.best is not None and done.progress.best.name == "compiled regions depth 1 at activation budget 1"
    )
    assert (done.compile_note or "").endswith("served: a plan of compiled regions")
    best = client.best("h200", model=model_id, batch=4, budget="100MiB")
    assert best.plan["compile_budget"] == 1.0 and best.plan["stages"] == ["blocks.0", "blocks.1", "head"]


def test_regions_that_fail_leave_the_plans_and_say_why(client: MemtuneClient, db: Database, tiny: bytes) -> None:
    def broken(*_args: Any) -> list[RegionProfile]:
        raise RuntimeError("inductor: no C++ compiler")

    _, done = _tuned(client, db, tiny, "tiny-broken-regions", broken)
    assert (done.compile_note or "").endswith("; compiling regions failed: RuntimeError: inductor: no C++ compiler")
    assert not any(name.startswith("compiled regions") for name in _rows(db, done.id))


def test_no_regions_under_compile_off_or_for_a_zoo_model(client: MemtuneClient, db: Database, tiny: bytes) -> None:
    def never(*_args: Any) -> list[RegionProfile]:
        raise AssertionError("regions measured")

    model = client.upload_exported(tiny, name="tiny-off")
    off = client.submit_job(model.id, batch=4, gpu="h200", budget="100MiB", trials=12, compile="off")
    zoo = client.submit_job({"zoo": "alexnet"}, batch=256, gpu="h200", budget="1800MB", trials=10)
    worker = _worker(db, never)
    assert worker.run_once() == off.id and worker.run_once() == zoo.id
    for job in (off, zoo):
        done = client.get_job(job.id)
        assert done.state == "succeeded", done.error
        assert "regions" not in (done.compile_note or "")


def _scaled(measured: list[RegionProfile], share: float) -> list[RegionProfile]:
    """Test values, not measurements: the measured region profiles with every stage's times scaled by ``share``."""
    out = []
    for run in measured:
        assert run.profile is not None
        stages = tuple(
            s.model_copy(update={"forward_ms": s.forward_ms * share, "backward_ms": s.backward_ms * share})
            for s in run.profile.stages
        )
        out.append(RegionProfile(run.partition, run.budget, run.profile.model_copy(update={"stages": stages}),
                                 None, run.seconds))  # fmt: skip
    return out


def _measured_at(
    steps: dict[str, float] | None = None, seen: list[list[str]] | None = None, rest: float | None = None
) -> FinalistsFn:
    """Test values, not measurements: each finalist measured at ``steps[name]`` where given, else at ``rest`` where
    given, else at its prediction (``inf``: it ran out of memory); ``seen`` gets each call's finalists' names."""

    def measure(
        model: ModelRecord, archive: bytes, dtype: str, chosen: Sequence[tuple[str, Candidate]], budget: int,
        optimizer: str, progress: Callable[[str], None],
    ) -> list[Finalist]:  # fmt: skip
        assert model.kind == "exported" and archive.startswith(b"PK") and (dtype, optimizer) == ("float32", "sgd")
        if seen is not None:
            seen.append([name for name, _ in chosen])
        out = []
        for k, (name, c) in enumerate(chosen):
            progress(f"{k + 1}/{len(chosen)}: {name}")
            ms = (steps or {}).get(name, c.step_ms if rest is None else rest)
            head = Finalist(name, c.step_ms, c.peak_bytes)
            ran = dict(step_ms=ms, reserved_bytes=c.peak_bytes, peak_bytes=c.peak_bytes)
            short = {"error": "OutOfMemoryError: under the cap", "out_of_memory": True}
            out.append(dataclasses.replace(head, **(short if math.isinf(ms) else ran)))
        return out

    return measure


def test_finalists_run_on_the_gpu_and_the_fastest_measured_is_served(
    client: MemtuneClient, db: Database, tiny: bytes, measured: list[RegionProfile]
) -> None:
    regions, eager = "optuna (3 compiled regions, budget 1)", "optuna (eager stages)"
    seen: list[list[str]] = []
    # the regions predicted faster (their stages at 80% of the measured times), the eager plan measured faster
    model_id, done = _tuned(client, db, tiny, "tiny-finalists", lambda *_a: _scaled(measured, 0.8),
                            _measured_at({regions: 5.0, eager: 2.0}, seen))  # fmt: skip
    assert seen == [[regions, eager]]
    assert done.progress.best is not None and done.progress.best.name == "optuna"  # the eager plan, as stored
    note = done.compile_note or ""
    assert f"; finalists measured on this worker's GPU: {regions}: predicted " in note
    assert "measured 5.00 ms" in note and "measured 2.00 ms" in note and note.endswith("  <- served")
    with db.session() as s:
        measured_rows = {r.name: r for r in ResultRepository(s).for_job(done.id) if r.source == "measured"}
    assert set(measured_rows) == {"optuna", "compiled regions depth 1 at activation budget 1"}
    assert measured_rows["optuna"].step_ms == 2.0 and measured_rows["optuna"].predicted_step_ms is not None
    best = client.best("h200", model=model_id, batch=4, budget="100MiB")  # a measured plan answers first
    assert best.source == "measured" and best.step_ms == 2.0 and best.plan.get("compile_budget") is None


def test_where_the_measurement_fails_the_fastest_prediction_stands_and_where_no_plan_runs_none_is_served(
    client: MemtuneClient, db: Database, tiny: bytes, measured: list[RegionProfile]
) -> None:
    regions, eager = "optuna (3 compiled regions, budget 1)", "optuna (eager stages)"

    def broken(*_args: Any) -> list[Finalist]:
        raise RuntimeError("CUDA error: device-side assert")

    _, failed = _tuned(client, db, tiny, "tiny-finalists-broken", lambda *_a: _scaled(measured, 0.8), broken)
    assert (failed.compile_note or "").endswith(
        "; measuring finalists failed: RuntimeError: CUDA error: device-side assert; the fastest prediction is served"
    )
    assert failed.progress.best is not None
    assert failed.progress.best.name == "compiled regions depth 1 at activation budget 1"
    seen: list[list[str]] = []
    short = {regions: math.inf, eager: math.inf}
    model_id, none = _tuned(client, db, tiny, "tiny-finalists-none", lambda *_a: _scaled(measured, 0.8),
                            _measured_at(short, seen, rest=math.inf))  # fmt: skip
    # everything fits this tiny model's budget: each search's front is its best alone, so no fallback is left
    assert seen == [[regions, eager]]
    assert (none.compile_note or "").endswith("none is served")
    assert "finalists and fallbacks measured, none ran under the budget (" in (none.compile_note or "")
    # NOTE [ Measured finalists ], step 5: no plan served, the error says why, the plans measured short never answer
    assert none.progress.best is None
    assert (none.error or "").startswith("no plan ran under the budget on this worker's GPU (" + regions)
    rows = _rows(db, none.id)
    assert not rows["optuna"].feasible and not rows["compiled regions depth 1 at activation budget 1"].feasible
    assert not any(r.source == "measured" and r.predicted_step_ms is not None for r in rows.values())
    answer = client.best("h200", model=model_id, batch=4, budget="100MiB")  # the same program: other jobs' rows too
    short = (rows["optuna"].plan, rows["compiled regions depth 1 at activation budget 1"].plan)
    assert answer.job_id != none.id or answer.plan not in short


def test_where_no_finalist_runs_fallbacks_run_one_at_a_time_and_the_first_that_runs_is_served(
    client: MemtuneClient, db: Database, tiny: bytes, measured: list[RegionProfile], monkeypatch: pytest.MonkeyPatch
) -> None:
    import memtune.tuner.finalists

    regions, eager = "optuna (3 compiled regions, budget 1)", "optuna (eager stages)"
    given: list[list[str]] = []

    def stand_in(pool: Sequence[Any], tried: Sequence[Any], limit: int = 3) -> list[tuple[str, Any, Candidate]]:
        # test values: the finalists again under other names, as the fallbacks (NOTE [ Measured finalists ], step 5)
        given.append([f.name for _, f in tried])
        assert limit == FINALIST_LIMIT
        assert len(pool) >= 2, "each search's best is on its front"
        return [(f"fallback {k}", r, c) for k, (_, r, c) in enumerate(pool)]

    monkeypatch.setattr(memtune.tuner.finalists, "fallbacks", stand_in)
    seen: list[list[str]] = []
    steps = {regions: math.inf, eager: math.inf, "fallback 0": math.inf, "fallback 1": 3.0}
    _, done = _tuned(client, db, tiny, "tiny-fallbacks", lambda *_a: _scaled(measured, 0.8), _measured_at(steps, seen))
    assert given == [[regions, eager]]
    assert seen == [[regions, eager], ["fallback 0"], ["fallback 1"]]  # one at a time, stopping at the first that ran
    note = done.compile_note or ""
    assert "fallback 1: predicted " in note and "measured 3.00 ms" in note and note.endswith("  <- served")
    assert done.progress.best is not None
