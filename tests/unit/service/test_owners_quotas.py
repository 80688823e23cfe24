"""Jobs belong to the API key that submitted them, and each key is held to limits (NOTE [ Job limits and
ownership ] in ``memtune.api.service.routes.jobs``): only the owner or an admin key cancels a job (403 for others);
active jobs, jobs per hour and trials per job over their limits are 429, with ``Retry-After`` where waiting helps."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_fixtures import SMALL_SPEC, schema_diff
from sqlalchemy import inspect, update

from memtune.api.service._deps import ID_MAX
from memtune.api.service.main import create_app
from memtune.api.service.settings import Settings
from memtune.storage.database import Database
from memtune.storage.migrate import upgrade
from memtune.storage.orm import JobRow
from memtune.storage.repositories import KeyRepository

PROBLEM = "application/problem+json"
JOB: dict[str, Any] = {"model": {"spec": SMALL_SPEC}, "batch": 8, "gpu": "h200", "budget": "64MiB", "trials": 5}


@pytest.fixture
def keys(db: Database) -> dict[str, str]:
    out = {}
    with db.session() as s:
        for name in ("alice", "bob", "ops"):
            out[name] = KeyRepository(s).create(name)[1]
    return out


def _app(db: Database, tmp_path: Path, **limits: Any) -> TestClient:
    settings = Settings(data_dir=tmp_path, admin_keys=["ops"], **limits)
    return TestClient(create_app(settings, db=db), raise_server_exceptions=False)


@pytest.fixture
def limited(db: Database, tmp_path: Path) -> Iterator[TestClient]:
    with _app(db, tmp_path, max_active_jobs_per_key=2, max_jobs_per_hour_per_key=5, max_trials_per_job=100) as tc:
        yield tc


def _submit(http: TestClient, key: str, **extra: Any) -> Any:
    headers = {"Authorization": f"Bearer {key}"}
    if "idempotency_key" in extra:
        headers["Idempotency-Key"] = extra.pop("idempotency_key")
    return http.post("/v1/jobs", json=dict(JOB, **extra), headers=headers)


def _cancel(http: TestClient, key: str, job_id: str) -> Any:
    return http.post(f"/v1/jobs/{job_id}/cancel", headers={"Authorization": f"Bearer {key}"})


def _problem(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    return body


def test_only_the_owner_or_an_admin_key_cancels_a_job(limited: TestClient, keys: dict[str, str]) -> None:
    first = _submit(limited, keys["alice"]).json()
    second = _submit(limited, keys["alice"]).json()
    assert first["owner"] == "alice"

    body = _problem(_cancel(limited, keys["bob"], first["id"]), 403, "not_job_owner")
    assert body["owner"] == "alice" and "'alice'" in body["detail"] and "MEMTUNE_ADMIN_KEYS" in body["detail"]
    assert limited.get(f"/v1/jobs/{first['id']}").json()["state"] == "queued"  # untouched

    mine = _cancel(limited, keys["alice"], first["id"])
    assert mine.status_code == 200 and mine.json()["state"] == "cancelled"
    admin = _cancel(limited, keys["ops"], second["id"])
    assert admin.status_code == 200 and admin.json()["state"] == "cancelled"
    _problem(_cancel(limited, keys["bob"], "no-such-job"), 404, "not_found")


def test_active_jobs_per_key_are_limited_with_retry_after(limited: TestClient, keys: dict[str, str]) -> None:
    jobs = [_submit(limited, keys["alice"]) for _ in range(2)]
    assert [r.status_code for r in jobs] == [202, 202]
    # NOTE [ RateLimit fields ]: every accepted submission says what is left of each quota
    assert jobs[0].headers["RateLimit"].startswith('"active";r=1, "hourly";r=')
    assert jobs[1].headers["RateLimit"].startswith('"active";r=0, ')
    assert jobs[1].headers["RateLimit-Policy"].startswith('"active";q=2, "hourly";q=')
    over = _submit(limited, keys["alice"])
    body = _problem(over, 429, "too_many_active_jobs")
    assert over.headers["Retry-After"] == "30" and over.headers["RateLimit"].startswith('"active";r=0, ')
    assert body["limit"] == 2 and body["setting"] == "MEMTUNE_MAX_ACTIVE_JOBS_PER_KEY" and "'alice'" in body["detail"]
    assert _submit(limited, keys["bob"]).status_code == 202  # another key's limit is its own
    assert limited.get("/v1/jobs").json()["count"] == 3

    assert _cancel(limited, keys["alice"], jobs[0].json()["id"]).status_code == 200
    assert _submit(limited, keys["alice"]).status_code == 202  # a finished job frees its place


def test_jobs_per_hour_are_limited_until_the_oldest_leaves_the_window(
    db: Database, tmp_path: Path, keys: dict[str, str]
) -> None:
    with _app(db, tmp_path, max_active_jobs_per_key=100, max_jobs_per_hour_per_key=3) as http:
        ids = [_submit(http, keys["alice"]).json()["id"] for _ in range(3)]
        for job_id in ids:  # cancelled jobs still count: the limit is on submissions
            assert _cancel(http, keys["alice"], job_id).status_code == 200
        over = _submit(http, keys["alice"])
        body = _problem(over, 429, "hourly_job_limit")
        assert body["limit"] == 3 and body["setting"] == "MEMTUNE_MAX_JOBS_PER_HOUR_PER_KEY"
        assert 3590 <= int(over.headers["Retry-After"]) <= 3600
        assert over.headers["RateLimit-Policy"] == '"active";q=100, "hourly";q=3;w=3600'
        left = over.headers["RateLimit"].split('"hourly";')[1]
        assert left.startswith("r=0;t=") and 3590 <= int(left.split("t=")[1]) <= 3600

        def age(job_id: str, seconds: float) -> None:
            with db.session() as s:
                row = s.get(JobRow, job_id)
                assert row is not None
                s.execute(
                    update(JobRow)
                    .where(JobRow.id == job_id)
                    .values(created_at=row.created_at - timedelta(seconds=seconds))
                )

        age(ids[0], 3600 - 42)  # the oldest leaves the window in 42 s
        over = _submit(http, keys["alice"])
        _problem(over, 429, "hourly_job_limit")
        assert 40 <= int(over.headers["Retry-After"]) <= 42
        age(ids[0], 60)  # now it has left
        assert _submit(http, keys["alice"]).status_code == 202
        _problem(_submit(http, keys["alice"]), 429, "hourly_job_limit")


def test_trials_per_job_over_the_limit_is_429_without_retry_after(limited: TestClient, keys: dict[str, str]) -> None:
    over = _submit(limited, keys["alice"], trials=101)
    body = _problem(over, 429, "trials_limit")
    assert "Retry-After" not in over.headers  # no wait makes this request acceptable
    assert body["limit"] == 100 and "trials <= 100" in body["detail"]
    assert _submit(limited, keys["alice"], trials=100).status_code == 202


def test_the_defaults_refuse_what_was_accepted_unchecked(http: TestClient, api_key: str) -> None:
    defaults = Settings()
    headers = {"Authorization": f"Bearer {api_key}"}
    big = http.post("/v1/jobs", json=dict(JOB, trials=100_000), headers=headers)
    assert _problem(big, 429, "trials_limit")["limit"] == defaults.max_trials_per_job == 10_000
    accepted = [http.post("/v1/jobs", json=JOB, headers=headers).status_code for _ in range(30)]
    assert accepted == [202] * defaults.max_active_jobs_per_key + [429] * (30 - defaults.max_active_jobs_per_key)


def test_an_idempotent_retry_is_not_a_new_submission(limited: TestClient, keys: dict[str, str]) -> None:
    first = _submit(limited, keys["alice"], idempotency_key="k1")
    _submit(limited, keys["alice"])
    assert first.status_code == 202
    again = _submit(limited, keys["alice"], idempotency_key="k1")  # at the limit now, but this job exists
    assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    _problem(_submit(limited, keys["alice"], idempotency_key="k2"), 429, "too_many_active_jobs")


def test_concurrent_submissions_of_one_key_cannot_slip_past_its_limit(database_url: str, tmp_path: Path) -> None:
    db = Database(database_url)
    try:
        upgrade(db)
        with db.session() as s:
            _, key = KeyRepository(s).create("alice")
        with _app(db, tmp_path, max_active_jobs_per_key=3) as http:
            assert _submit(http, key, model={"zoo": "vgg16"}, budget="8GiB").status_code == 202
            with ThreadPoolExecutor(12) as pool:
                codes = sorted(
                    pool.map(lambda _: _submit(http, key, model={"zoo": "vgg16"}, budget="8GiB").status_code, range(12))
                )
            assert codes == [202, 202] + [429] * 10
            assert http.get("/v1/jobs", params={"state": "queued"}).json()["count"] == 3
            # ids up to the largest the database holds are looked up, on either database
            assert http.get(f"/v1/profiles/{ID_MAX}").status_code == 404
            assert http.get(f"/v1/profiles/{ID_MAX + 1}").status_code == 422
    finally:
        db.dispose()


def test_a_keys_second_submission_waits_for_the_first_to_commit(database_url: str) -> None:
    """What keeps two concurrent submissions of one key from both counting the same jobs: the key's row lock,
    taken first in the submission's transaction, is held until it commits."""
    db = Database(database_url)
    try:
        upgrade(db, optuna_tables=False)
        with db.session() as s:
            key, _ = KeyRepository(s).create("alice")
        order: list[str] = []

        def second() -> None:
            with db.session() as s:
                KeyRepository(s).lock(key.id)
                order.append("second")

        with db.session() as s:
            KeyRepository(s).lock(key.id)
            thread = threading.Thread(target=second)
            thread.start()
            thread.join(0.5)
            order.append("first")
        thread.join(10)
        assert order == ["first", "second"]
    finally:
        db.dispose()


def test_migration_0007_adds_the_owner_index(database_url: str) -> None:
    db = Database(database_url)
    try:
        assert upgrade(db, "0006", optuna_tables=False) == "0006"
        assert "ix_mt_jobs_owner_created" not in {i["name"] for i in inspect(db.engine).get_indexes("mt_jobs")}
        upgrade(db, optuna_tables=False)
        assert "ix_mt_jobs_owner_created" in {i["name"] for i in inspect(db.engine).get_indexes("mt_jobs")}
        assert schema_diff(db) == []
    finally:
        db.dispose()
