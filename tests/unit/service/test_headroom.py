"""Budget headroom on service jobs (NOTE [ Headroom ] in ``memtune.tuner.search``), on SQLite: the request field and
its default (the GPU type's calibration), what the job stores and shows, the worker searching at the job's
headroom while results stay filed under the budget asked for, the idempotency hash of requests without it,
and migration 0003."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from alembic import command
from fastapi.testclient import TestClient
from service_fixtures import SMALL_SPEC, insert_old_job, schema_diff
from sqlalchemy import MetaData, Table, inspect

from memtune.api.client import MemtuneClient
from memtune.api.service.routes.jobs import _request_hash
from memtune.api.service.schemas import JobCreate, JobPublic
from memtune.api.service.worker import Worker
from memtune.storage.database import Database
from memtune.storage.migrate import alembic_config, current_revision, head_revision, upgrade
from memtune.storage.repositories import JobRepository, ResultRepository
from memtune.tuner.calibration import calibration_for

JOB: dict[str, Any] = {"model": {"zoo": "vgg16"}, "batch": 32, "gpu": "h200", "budget": "12GiB", "trials": 10}


def _run(db: Database) -> str | None:
    return Worker(db, worker_id="unit-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0).run_once()


def _submit(client: MemtuneClient, **kw: Any) -> JobPublic:
    args: dict[str, Any] = {"batch": 8, "gpu": "h200", "budget": "64MiB", "trials": 25, **kw}
    return client.submit_job({"spec": SMALL_SPEC}, **args)


def _stored_headroom(db: Database, job_id: str) -> float:
    with db.session() as s:
        return JobRepository(s).get(job_id).headroom


def test_default_headroom_is_the_gpu_types_calibration(client: MemtuneClient, db: Database) -> None:
    assert calibration_for("h200").headroom == 0.05 and calibration_for("a100-80gb").headroom == 0.0
    h200 = _submit(client)
    assert h200.headroom == 0.05 and _stored_headroom(db, h200.id) == 0.05
    a100 = _submit(client, gpu="a100-80gb")  # no calibration file for this GPU type
    assert a100.headroom == 0.0 and _stored_headroom(db, a100.id) == 0.0
    by_name = _submit(client, gpu="NVIDIA H200")  # resolved through the GPU type's key
    assert by_name.gpu == "h200" and by_name.headroom == 0.05
    assert client.get_job(h200.id).headroom == 0.05
    assert {j.id: j.headroom for j in client.list_jobs().data} == {h200.id: 0.05, a100.id: 0.0, by_name.id: 0.05}
    h100 = _submit(client, gpu="h100")  # memtune calibrate's, committed
    assert h100.headroom == calibration_for("h100").headroom > 0


@pytest.mark.parametrize("headroom", [0.0, 0.2, 0.499])
def test_an_explicit_headroom_is_stored_and_shown(client: MemtuneClient, db: Database, headroom: float) -> None:
    job = _submit(client, headroom=headroom)  # 0.0 overrides the H200's calibration
    assert job.headroom == headroom and _stored_headroom(db, job.id) == headroom
    assert client.get_job(job.id).headroom == headroom


@pytest.mark.parametrize(
    ("value", "limit"),
    [(-0.01, "greater than or equal to 0"), (0.5, "less than 0.5"), (0.9, "less than 0.5"), ("lots", "number")],
)
def test_out_of_range_headroom_is_422_naming_the_field(
    http: TestClient, api_key: str, db: Database, value: object, limit: str
) -> None:
    r = http.post("/v1/jobs", json=dict(JOB, headroom=value), headers={"Authorization": f"Bearer {api_key}"})
    p = r.json()
    assert (r.status_code, p["code"]) == (422, "validation_error")
    assert p["detail"].startswith("headroom: ") and limit in p["detail"]
    assert p["errors"][0]["loc"] == ["body", "headroom"]
    with db.session() as s:
        assert JobRepository(s).list_all() == []


def test_a_nan_headroom_is_422(http: TestClient, api_key: str) -> None:
    body = '{"model": {"zoo": "vgg16"}, "batch": 8, "gpu": "h200", "budget": "1GiB", "headroom": NaN}'
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    r = http.post("/v1/jobs", content=body, headers=headers)
    assert r.status_code in (400, 422) and r.json()["code"] in ("validation_error", "malformed_json")


def test_requests_without_headroom_hash_and_dedupe_as_before(http: TestClient, api_key: str, db: Database) -> None:
    body = JobCreate.model_validate(JOB)
    before = body.model_dump(mode="json")
    del before["validate_top_k"], before["validate_iters"], before["headroom"]  # not in the first release
    del before["compile"]
    old = hashlib.sha256(json.dumps(before, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert _request_hash(body) == old
    assert _request_hash(JobCreate.model_validate(dict(JOB, headroom=0.05))) != old  # explicit: another request

    headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": "same"}
    first = http.post("/v1/jobs", json=JOB, headers=headers)
    again = http.post("/v1/jobs", json=JOB, headers=headers)
    assert (first.status_code, again.status_code) == (202, 202) and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] and again.json()["headroom"] == 0.05
    other = http.post("/v1/jobs", json=dict(JOB, headroom=0.1), headers=headers)
    assert other.status_code == 409 and other.json()["code"] == "idempotency_key_reused"
    with db.session() as s:
        assert len(JobRepository(s).list_all()) == 1


@pytest.mark.slow
def test_the_worker_searches_within_the_budget_less_the_jobs_headroom(
    client: MemtuneClient, db: Database, http: TestClient
) -> None:
    probe = _submit(client, headroom=0.0, trials=5)
    assert _run(db) == probe.id
    unplanned = client.get_job(probe.id).unconstrained
    assert unplanned is not None
    budget = int(unplanned.peak_bytes * 1.02)  # the unplanned step fits, but not with 10% kept free
    searched = int(budget * (1 - 0.1))

    loose = _submit(client, budget=budget, headroom=0.0)
    tight = _submit(client, budget=budget, headroom=0.1)
    assert _run(db) == loose.id and _run(db) == tight.id
    loose_done, tight_done = client.get_job(loose.id), client.get_job(tight.id)
    assert loose_done.state == tight_done.state == "succeeded", (loose_done.error, tight_done.error)
    assert loose_done.progress.best is not None and tight_done.progress.best is not None
    # without headroom the best plan uses more than the budget less 10%; with it, that plan is not chosen
    assert searched < loose_done.progress.best.peak_bytes <= budget
    assert tight_done.progress.best.peak_bytes <= searched
    assert tight_done.progress.best.step_ms > loose_done.progress.best.step_ms  # the slack costs time
    assert tight_done.budget_bytes == budget and tight_done.headroom == 0.1  # the budget asked for stays

    # stored results: filed under the user's budget, ``feasible`` judged at the budget less the headroom
    with db.session() as s:
        job = JobRepository(s).get(tight.id)
        rows = ResultRepository(s).for_job(tight.id)
    assert job.search_budget_bytes == searched
    assert rows and all(r.budget_bytes == budget for r in rows)
    # feasible: within the budget less the headroom, and placed by the allocator model (NOTE [ One objective ])
    assert all(r.peak_bytes <= searched for r in rows if r.feasible)
    assert all(r.feasible for r in rows if r.peak_bytes <= searched and r.alloc_retries is None)
    none = next(r for r in rows if r.name == "none")
    assert none.peak_bytes <= budget and not none.feasible  # fits the budget, not the budget less the headroom
    best_row = next(r for r in rows if r.kind == "optuna")
    assert best_row.feasible and best_row.peak_bytes == tight_done.progress.best.peak_bytes

    # the trials as the chart shows them agree with the search
    trials = http.get(f"/v1/jobs/{tight.id}/trials").json()["data"]
    study = optuna.load_study(study_name=tight_done.study_name, storage=db.url)
    verdict = {t.number: all(v <= 0 for v in (t.constraints or {}).values()) for t in study.trials}
    assert trials and all(t["feasible"] == verdict[t["number"]] for t in trials)
    assert all(t["peak_bytes"] <= searched for t in trials if t["feasible"])
    assert any(searched < t["peak_bytes"] <= budget and not t["feasible"] for t in trials)

    # the leaderboard lists the tight job's feasible plans under the budget asked for, none over its limit
    board = client.leaderboard(gpu="h200", budget=f"{budget}B", page_size=200)
    tight_rows = [r for r in board.data if r.job_id == tight.id]
    assert tight_rows and all(r.budget_bytes == budget and r.peak_bytes <= searched for r in tight_rows)
    assert all(r.name != "none" for r in tight_rows)


@pytest.mark.slow
def test_a_job_that_fits_only_without_its_headroom_says_so(client: MemtuneClient, db: Database) -> None:
    probe = _submit(client, headroom=0.0, trials=5)
    assert _run(db) == probe.id
    unplanned = client.get_job(probe.id).unconstrained
    assert unplanned is not None
    job = _submit(client, budget=int(unplanned.peak_bytes * 1.02), headroom=0.3, trials=10)
    assert _run(db) == job.id
    done = client.get_job(job.id)
    assert done.progress.best is None
    assert done.error is not None
    assert done.error.startswith("no plan fits the budget less its 30% headroom for the allocator; try a larger")


def test_migration_0003_adds_headroom_and_removes_it(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'headroom.db'}")
    try:
        assert upgrade(db, "0002", optuna_tables=False) == "0002"
        with db.engine.begin() as conn:
            insert_old_job(conn, MetaData(), validate_top_k=2, validate_iters=4)

        assert upgrade(db) == head_revision()
        assert schema_diff(db) == []
        with db.session() as s:
            old = JobRepository(s).get("j1")
            assert old.headroom == 0.0 and old.search_budget_bytes == 1 << 30  # tuned without headroom
            new, _ = JobRepository(s).create(
                model_id="m1", gpu_key="h200", batch=8, dtype="float32", budget_text="1GiB", budget_bytes=1 << 30,
                trials=5, mode="fastest", optimizer="sgd", owner="t", request_hash="h2", headroom=0.05,
            )  # fmt: skip
            assert new.headroom == 0.05 and new.search_budget_bytes == int((1 << 30) * 0.95)

        command.downgrade(alembic_config(db.url), "0002")
        assert current_revision(db) == "0002"
        columns = {c["name"] for c in inspect(db.engine).get_columns("mt_jobs")}
        assert "headroom" not in columns and {"validate_top_k", "validate_iters"} <= columns
        with db.engine.connect() as conn:
            jobs = Table("mt_jobs", MetaData(), autoload_with=conn)
            kept = {r.id: r.validate_top_k for r in conn.execute(jobs.select())}
        assert kept["j1"] == 2 and len(kept) == 2  # the rows, and 0002's columns, survive the downgrade

        assert upgrade(db) == head_revision()
        assert schema_diff(db) == []
        with db.session() as s:
            assert {j.id: j.headroom for j in JobRepository(s).list_all()}.get("j1") == 0.0
    finally:
        db.dispose()
