"""Whole-model compile on service jobs (NOTE [ Compiler points in the service ] in ``memtune.api.service.worker``), on
SQLite: the request field (422 naming it), what the job stores and shows, the idempotency hash, the worker under
``off``, ``auto`` and ``on`` (on this CPU machine: stored test points, a stand-in for the GPU measurement, a worker
without a GPU), and migration 0009.

The compiler points below are test values added to a committed profile, not measurements."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from fastapi.testclient import TestClient
from service_fixtures import insert_old_job, schema_diff
from sqlalchemy import MetaData, Table, inspect

from memtune.api.client import MemtuneClient
from memtune.api.service.routes.jobs import _request_hash
from memtune.api.service.schemas import JobCreate, JobPublic
from memtune.api.service.worker import COMPILE_BUDGETS, Worker
from memtune.profiler import CompilerPoint, Profile, find_profile
from memtune.storage.database import Database
from memtune.storage.migrate import alembic_config, current_revision, head_revision, upgrade
from memtune.storage.records import ModelRecord
from memtune.storage.repositories import JobRepository, ProfileRepository, ResultRepository
from memtune.tuner.measure.compiler_points import with_compiler_points

JOB: dict[str, Any] = {"model": {"zoo": "alexnet"}, "batch": 256, "gpu": "h100", "budget": "1800MB", "trials": 10}

#: test values, not measured: a compiled step far faster than any eager plan of AlexNet, within the budget
TEST_FAST_POINT = CompilerPoint(activation_budget=0.5, step_ms=5.0, peak_bytes=900_000_000)
#: test values, not measured: a compiled step that fits but is slower than the searched plans
TEST_SLOW_POINT = CompilerPoint(activation_budget=1.0, step_ms=500.0, peak_bytes=800_000_000)


def _committed() -> Profile:
    profile = find_profile("alexnet", 256, "float32", "h100")
    assert profile is not None and profile.compiler_points == ()
    return profile


def _worker(db: Database, **kw: Any) -> Worker:
    kw.setdefault("local_gpu", lambda: None)  # a CPU worker unless the test says otherwise
    return Worker(db, worker_id="unit-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0, **kw)


def _submit(client: MemtuneClient, **kw: Any) -> JobPublic:
    args: dict[str, Any] = {k: v for k, v in JOB.items() if k != "model"}
    return client.submit_job(JOB["model"], **{**args, **kw})


def _store_profile(db: Database, model_id: str, points: Sequence[CompilerPoint]) -> None:
    with db.session() as s:
        ProfileRepository(s).store(model_id, with_compiler_points(_committed(), points))


def _stored_points(db: Database, model_id: str) -> tuple[CompilerPoint, ...]:
    with db.session() as s:
        found = ProfileRepository(s).find(model_id, "h100", 256, "float32")
    assert found is not None
    return found.profile().compiler_points


def _plans(db: Database, job_id: str) -> list[Any]:
    with db.session() as s:
        return [r.plan.get("whole_compile") for r in ResultRepository(s).for_job(job_id)]


# ---- the request --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["yes", "ON", True, 1, None, ""])
def test_a_bad_compile_is_422_naming_the_field(http: TestClient, api_key: str, db: Database, value: object) -> None:
    r = http.post("/v1/jobs", json=dict(JOB, compile=value), headers={"Authorization": f"Bearer {api_key}"})
    p = r.json()
    assert (r.status_code, p["code"]) == (422, "validation_error"), p
    assert p["detail"].startswith("compile: ") and p["errors"][0]["loc"] == ["body", "compile"]
    with db.session() as s:
        assert JobRepository(s).list_all() == []


@pytest.mark.parametrize("value", ["auto", "on", "off"])
def test_compile_round_trips_in_the_job_view(client: MemtuneClient, db: Database, value: str) -> None:
    job = _submit(client, compile=value)
    assert job.compile == value and job.compile_note is None
    assert client.get_job(job.id).compile == value
    assert [j.compile for j in client.list_jobs().data] == [value]
    with db.session() as s:
        assert JobRepository(s).get(job.id).compile == value


def test_compile_defaults_to_auto(client: MemtuneClient, http: TestClient, api_key: str) -> None:
    assert _submit(client).compile == "auto"
    r = http.post("/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {api_key}"})
    assert r.status_code == 202 and r.json()["compile"] == "auto"
    assert "compile" in http.get("/openapi.json").json()["components"]["schemas"]["JobCreate"]["properties"]


def test_the_request_hash_holds_compile_and_requests_without_it_hash_as_before(
    http: TestClient, api_key: str, db: Database
) -> None:
    body = JobCreate.model_validate(JOB)
    before = body.model_dump(mode="json")
    del before["validate_top_k"], before["validate_iters"], before["headroom"], before["compile"]  # fields added since
    old = hashlib.sha256(json.dumps(before, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert _request_hash(body) == old == _request_hash(JobCreate.model_validate(dict(JOB, compile="auto")))
    hashes = {_request_hash(JobCreate.model_validate(dict(JOB, compile=c))) for c in ("on", "off")}
    assert len(hashes) == 2 and old not in hashes

    headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": "same"}
    first = http.post("/v1/jobs", json=dict(JOB, compile="off"), headers=headers)
    again = http.post("/v1/jobs", json=dict(JOB, compile="off"), headers=headers)
    assert (first.status_code, again.status_code) == (202, 202) and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] and again.json()["compile"] == "off"
    other = http.post("/v1/jobs", json=dict(JOB, compile="on"), headers=headers)
    assert other.status_code == 409 and other.json()["code"] == "idempotency_key_reused"
    with db.session() as s:
        assert len(JobRepository(s).list_all()) == 1


# ---- the worker ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_auto_serves_a_faster_compiled_point_and_off_strips_it(client: MemtuneClient, db: Database) -> None:
    auto = _submit(client)
    _store_profile(db, auto.model_id, [TEST_SLOW_POINT, TEST_FAST_POINT])
    off = _submit(client, compile="off")
    worker = _worker(db)
    assert worker.run_once() == auto.id and worker.run_once() == off.id

    done = client.get_job(auto.id)
    assert done.state == "succeeded", done.error
    assert done.progress.best is not None and done.progress.best.name == "compiled whole 0.5"
    assert (done.progress.best.step_ms, done.progress.best.peak_bytes) == (5.0, 900_000_000)
    assert (done.compile_note or "").startswith("the profile's compiler points are candidates: budget 0.5 5.0 ms")
    assert 0.5 in _plans(db, auto.id)  # the stored best compiles the whole model at 0.5

    eager = client.get_job(off.id)
    assert eager.state == "succeeded", eager.error
    assert eager.progress.best is not None and "compiled whole" not in (eager.progress.best.name or "")
    assert eager.progress.best.step_ms > 5.0 and eager.progress.best.peak_bytes <= 1_800_000_000
    assert eager.compile_note == "compile off: the profile's 2 compiler point(s) are left out"
    assert set(_plans(db, off.id)) == {None}  # no stored plan compiles the whole model
    assert _stored_points(db, off.model_id) == (TEST_FAST_POINT, TEST_SLOW_POINT)  # the profile keeps them


@pytest.mark.slow
def test_auto_keeps_the_searched_plan_where_it_beats_the_points(client: MemtuneClient, db: Database) -> None:
    job = _submit(client)
    _store_profile(db, job.model_id, [TEST_SLOW_POINT])
    assert _worker(db).run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded" and done.progress.best is not None
    assert "compiled whole" not in (done.progress.best.name or "") and done.progress.best.step_ms < 500.0


class _FakePoints:
    """A stand-in for ``measure_job_compiler_points`` (the GPU measurement) in CPU tests: test values, and an error
    at the budgets in ``fail``; ``raises`` makes the whole measurement fail."""

    def __init__(self, fail: Mapping[float, str] | None = None, raises: Exception | None = None) -> None:
        self.fail = dict(fail or {})
        self.raises = raises
        self.calls: list[str] = []

    def __call__(
        self, model: ModelRecord, archive: bytes | None, profile: Profile, optimizer: str, progress: Any
    ) -> tuple[tuple[CompilerPoint, ...], dict[float, str]]:
        self.calls.append(model.name)
        assert archive is None and optimizer == "sgd" and profile.compiler_points == ()
        if self.raises is not None:
            raise self.raises
        points = []
        for b in COMPILE_BUDGETS:
            progress(f"activation budget {b:g}")
            if b not in self.fail:  # test values: faster the lower the budget, all within the budget
                points.append(CompilerPoint(activation_budget=b, step_ms=4.0 + b, peak_bytes=int(1e9 * (0.5 + b / 4))))
        return tuple(points), self.fail


@pytest.mark.slow
def test_auto_measures_points_on_a_gpu_of_the_type_and_keeps_them(client: MemtuneClient, db: Database) -> None:
    fake = _FakePoints(fail={0.25: "BackendCompilerFailed: test failure"})
    worker = _worker(db, local_gpu=lambda: "h100", compiler_points_fn=fake)
    job = _submit(client, compile="on")
    _store_profile(db, job.model_id, [])
    assert worker.run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded", done.error
    assert fake.calls == ["alexnet"]
    assert done.progress.best is not None and done.progress.best.name == "compiled whole 0.5"
    note = done.compile_note or ""
    assert note.startswith("measured the whole model compiled on this worker's GPU: budget 0.5 4.5 ms")
    assert "kept with the profile" in note and "activation budget 0.25 failed: BackendCompilerFailed" in note
    assert [p.activation_budget for p in _stored_points(db, job.model_id)] == [0.5, 1.0]

    later = _submit(client)  # reuses the stored points: nothing measured again
    assert worker.run_once() == later.id
    again = client.get_job(later.id).progress.best
    assert fake.calls == ["alexnet"] and again is not None and again.name == "compiled whole 0.5"


@pytest.mark.slow
def test_a_failed_compile_is_noted_and_the_plans_are_eager(client: MemtuneClient, db: Database) -> None:
    worker = _worker(db, local_gpu=lambda: "h100", compiler_points_fn=_FakePoints(raises=RuntimeError("test: no")))
    job = _submit(client, compile="on")
    assert worker.run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded", done.error
    assert done.compile_note == "compiling the whole model failed, so no plan compiles it whole: RuntimeError: test: no"
    assert done.progress.best is not None and "compiled whole" not in (done.progress.best.name or "")
    assert _stored_points(db, job.model_id) == ()


@pytest.mark.slow
def test_auto_on_a_cpu_worker_plans_eager_and_says_why(client: MemtuneClient, db: Database) -> None:
    job = _submit(client)
    assert _worker(db).run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded", done.error
    assert done.compile_note == (
        "no compiler points: the profile has none and this worker has no CUDA GPU, not one of type 'h100' to measure "
        "them on, so the plans are eager"
    )


def test_on_without_points_on_a_cpu_worker_fails_saying_so(client: MemtuneClient, db: Database) -> None:
    job = _submit(client, compile="on")
    assert _worker(db).run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "failed" and done.error is not None
    assert done.error.startswith(
        "compile 'on' needs compiler points (the whole model compiled by torch.compile, measured on a GPU of type "
        "'h100'), and the stored profile of this model (batch 256, float32) has none, while this worker has no CUDA "
        "GPU to measure them on: run a worker on a h100 GPU"
    )
    assert "compile 'auto'" in done.error
    other = _submit(client, compile="on")  # a GPU of another type cannot measure them either
    assert _worker(db, local_gpu=lambda: "h200").run_once() == other.id
    assert "this worker has a GPU of type 'h200' to measure them on" in (client.get_job(other.id).error or "")


# ---- migration 0009 -----------------------------------------------------------------------------------------------
def test_migration_0009_adds_compile_and_removes_it(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'compile.db'}")
    try:
        assert upgrade(db, "0008", optuna_tables=False) == "0008"
        with db.engine.begin() as conn:
            insert_old_job(conn, MetaData(), headroom=0.05)

        assert upgrade(db, "0009", optuna_tables=False) == "0009"
        assert {"compile", "compile_note"} <= {c["name"] for c in inspect(db.engine).get_columns("mt_jobs")}
        assert upgrade(db, optuna_tables=False) == head_revision()  # and every migration after it
        assert schema_diff(db) == []
        with db.session() as s:
            old = JobRepository(s).get("j1")
            assert (old.compile, old.compile_note) == ("auto", None)  # tuned on its profile as stored
            new, _ = JobRepository(s).create(
                model_id="m1", gpu_key="h200", batch=8, dtype="float32", budget_text="1GiB", budget_bytes=1 << 30,
                trials=5, mode="fastest", optimizer="sgd", owner="t", request_hash="h2", compile="off",
            )  # fmt: skip
            assert new.compile == "off"
            with pytest.raises(ValueError, match="unknown compile choice"):
                JobRepository(s).create(
                    model_id="m1", gpu_key="h200", batch=8, dtype="float32", budget_text="1GiB",
                    budget_bytes=1 << 30, trials=5, mode="fastest", optimizer="sgd", owner="t", request_hash="h3",
                    compile="always",  # type: ignore[arg-type]
                )  # fmt: skip

        command.downgrade(alembic_config(db.url), "0008")
        assert current_revision(db) == "0008"
        columns = {c["name"] for c in inspect(db.engine).get_columns("mt_jobs")}
        assert not {"compile", "compile_note"} & columns and "headroom" in columns
        with db.engine.connect() as conn:
            jobs = Table("mt_jobs", MetaData(), autoload_with=conn)
            kept = {r.id: r.headroom for r in conn.execute(jobs.select())}
        assert kept["j1"] == 0.05 and len(kept) == 2  # the rows, and 0008's columns, survive the downgrade

        assert upgrade(db, optuna_tables=False) == head_revision()
        assert schema_diff(db) == []
        with db.session() as s:
            assert {j.id: j.compile for j in JobRepository(s).list_all()}.get("j1") == "auto"
    finally:
        db.dispose()
