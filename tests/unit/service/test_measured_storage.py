"""Measured results in storage (SQLite): the 0002 migration up and down, measured rows beside simulated ones,
the best plan preferring a measured fit (NOTE [ Best-plan fallback ]), the leaderboard's source filter, and
the job's validation fields."""

from __future__ import annotations

from pathlib import Path

import pytest
from service_fixtures import migration_round_trip

from memtune.storage.database import Database
from memtune.storage.records import Job, ResultIn
from memtune.storage.repositories import JobRepository, ModelRepository, ResultRepository, content_hash

GiB = 1 << 30


def test_migration_0002_up_down_up_on_sqlite(tmp_path: Path) -> None:
    migration_round_trip(f"sqlite:///{tmp_path / 'round-trip.db'}")


def _job(db: Database, budget: int, *, top_k: int = 0) -> Job:
    definition = {"zoo": "vgg16", "params": {}}
    with db.session() as s:
        m, _ = ModelRepository(s).get_or_create(
            name="vgg16", kind="zoo", digest=content_hash(definition), definition=definition, n_stages=None
        )
        job, _ = JobRepository(s).create(
            model_id=m.id, gpu_key="h200", batch=32, dtype="float32", budget_text=str(budget), budget_bytes=budget,
            trials=10, mode="fastest", optimizer="sgd", owner="t", request_hash=f"h{budget}", validate_top_k=top_k,
        )  # fmt: skip
    return job


def _sim(name: str, step: float, peak: int) -> ResultIn:
    return ResultIn(name, "baseline" if name != "optuna" else "optuna", {"actions": [name]}, step, peak, True)


def _meas(name: str, step: float, peak: int, *, predicted: float, fits: bool = True) -> ResultIn:
    plan = {"actions": [name]}
    return ResultIn(name, "optuna", plan, step, peak, fits, "measured", predicted, peak + 1, peak + 2, 100.0)


def test_measured_rows_are_added_beside_simulated_ones_with_their_own_pareto_flags(db: Database) -> None:
    job = _job(db, 10 * GiB)
    with db.session() as s:
        repo = ResultRepository(s)
        repo.add_for_job(job, [_sim("optuna", 100.0, 8 * GiB), _sim("layup", 120.0, 7 * GiB)], profile_id=None)
        first = repo.add_measured(job, [_meas("optuna", 150.0, 9 * GiB, predicted=100.0)], profile_id=None)
        again = repo.add_measured(job, [_meas("optuna", 140.0, 9 * GiB, predicted=100.0)], profile_id=None)
        rows = repo.for_job(job.id)
        with pytest.raises(ValueError, match="measured results only"):
            repo.add_measured(job, [_sim("x", 1.0, 1)], profile_id=None)
    assert first[0].id != again[0].id
    assert [(r.source, r.step_ms) for r in rows] == [("simulated", 100.0), ("simulated", 120.0), ("measured", 140.0)]
    # the measured row, alone of its source, is Pareto-optimal although a simulated row dominates it
    assert [r.pareto_optimal for r in rows] == [True, True, True]
    m = rows[-1]
    assert (m.predicted_step_ms, m.predicted_peak_bytes, m.reserved_peak_bytes, m.samples_per_s) == (
        100.0,
        9 * GiB + 1,
        9 * GiB + 2,
        100.0,
    )
    with db.session() as s:
        assert [r.source for r in ResultRepository(s).for_job(job.id, source="measured")] == ["measured"]
        ResultRepository(s).add_for_job(job, [_sim("optuna", 90.0, 8 * GiB)], profile_id=None)
        assert [r.source for r in ResultRepository(s).for_job(job.id)] == ["simulated"]  # a re-store replaces all


def test_best_prefers_a_measured_fit_within_the_step_that_answers(db: Database) -> None:
    tight, roomy = _job(db, 10 * GiB), _job(db, 12 * GiB)
    with db.session() as s:
        repo = ResultRepository(s)
        repo.add_for_job(tight, [_sim("optuna", 100.0, 9 * GiB)], profile_id=None)
        repo.add_measured(
            tight,
            [_meas("optuna", 130.0, 9 * GiB, predicted=100.0), _meas("layup", 125.0, 11 * GiB, predicted=110.0)],
            profile_id=None,
        )
        repo.add_for_job(roomy, [_sim("optuna", 80.0, 11 * GiB)], profile_id=None)
    with db.session() as s:
        repo = ResultRepository(s)
        ids = [tight.model_id]
        exact = repo.best(gpu_key="h200", model_ids=ids, batch=32, budget_bytes=10 * GiB)
        # the 125 ms measurement peaked at 11 GiB: over the 10 GiB asked, so the 130 ms one answers
        assert exact is not None and exact.fallback == "exact"
        assert (exact.result.source, exact.result.step_ms, exact.result.predicted_step_ms) == ("measured", 130.0, 100.0)
        # the exact budget's simulated plan answers before a smaller budget's measured one
        roomy_best = repo.best(gpu_key="h200", model_ids=ids, batch=32, budget_bytes=12 * GiB)
        assert roomy_best is not None and roomy_best.fallback == "exact"
        assert (roomy_best.result.source, roomy_best.result.step_ms) == ("simulated", 80.0)
        smaller = repo.best(gpu_key="h200", model_ids=ids, batch=32, budget_bytes=11 * GiB)
        assert smaller is not None and smaller.fallback == "smaller_budget"
        assert (smaller.result.source, smaller.result.step_ms) == ("measured", 125.0)


def test_leaderboard_ranks_both_sources_and_filters_one(db: Database) -> None:
    job = _job(db, 10 * GiB)
    with db.session() as s:
        repo = ResultRepository(s)
        repo.add_for_job(job, [_sim("optuna", 100.0, 8 * GiB), _sim("layup", 120.0, 7 * GiB)], profile_id=None)
        repo.add_measured(
            job,
            [_meas("optuna", 110.0, 8 * GiB, predicted=100.0), _meas("vdnn", 5.0, 12 * GiB, predicted=4.0, fits=False)],
            profile_id=None,
        )
    with db.session() as s:
        repo = ResultRepository(s)
        both = repo.leaderboard(model_ids=[job.model_id])
        measured = repo.leaderboard(model_ids=[job.model_id], source="measured", include_infeasible=True)
        page = repo.leaderboard(model_ids=[job.model_id], source="simulated", page_size=1)
        rest = repo.leaderboard(model_ids=[job.model_id], source="simulated", page_token=page.next_page_token)
    assert [(r.source, r.step_ms) for r in both.results] == [
        ("simulated", 100.0),
        ("measured", 110.0),
        ("simulated", 120.0),
    ]
    assert both.count == 3 and both.ranks == [1, 2, 3]
    assert [r.step_ms for r in measured.results] == [5.0, 110.0] and measured.count == 2
    assert [r.step_ms for r in page.results + rest.results] == [100.0, 120.0] and rest.ranks == [2]


def test_job_validation_fields_follow_the_lease(db: Database) -> None:
    job = _job(db, 10 * GiB, top_k=3)
    assert (job.validate_top_k, job.validate_iters, job.validation_state) == (3, 6, None)
    with db.session() as s:
        claimed = JobRepository(s).claim("w1")
    assert claimed is not None
    _, lease = claimed
    with db.session() as s:
        repo = JobRepository(s)
        assert not repo.set_validation(lease, "running", device="NVIDIA H200", note="validating plan 1/3").lost
        with pytest.raises(ValueError, match="unknown validation state"):
            repo.set_validation(lease, "guessing", note="?")  # type: ignore[arg-type]
    with db.session() as s:
        running = JobRepository(s).get(job.id)
        assert (running.validation_state, running.validation_device, running.validation_note) == (
            "running",
            "NVIDIA H200",
            "validating plan 1/3",
        )
        assert JobRepository(s).finish(
            lease,
            "succeeded",
            validation_state="done",
            validation_note="measured 3 of 3",
            measured_unconstrained_step_ms=12.5,
            measured_unconstrained_peak_bytes=3 * GiB,
        )
        done = JobRepository(s).get(job.id)
    assert (done.validation_state, done.validation_device, done.validation_note) == (
        "done",
        "NVIDIA H200",
        "measured 3 of 3",
    )
    assert (done.measured_unconstrained_step_ms, done.measured_unconstrained_peak_bytes) == (12.5, 3 * GiB)
    with db.session() as s:
        assert JobRepository(s).set_validation(lease, "done").lost  # a finished job's lease is gone
