"""NOTE [ Worker heartbeats ]: workers say they are alive in the database, and ``/healthz`` is 503 ``degraded`` while
a queued job's GPU type has no live worker (before, a killed worker left it at 200 and jobs queued for ever)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from fastapi.testclient import TestClient
from service_fixtures import SMALL_SPEC
from sqlalchemy import update

from memtune.api.service.worker import Worker
from memtune.storage.database import Database
from memtune.storage.orm import WorkerRow, utcnow
from memtune.storage.repositories import WorkerRepository

JOB = {"model": {"spec": SMALL_SPEC}, "batch": 8, "gpu": "h200", "budget": "64MiB", "trials": 5}


def _health(http: TestClient) -> tuple[int, dict[str, object]]:
    r = http.get("/healthz")
    return r.status_code, r.json()


def test_healthz_names_a_queued_gpu_type_no_live_worker_serves(http: TestClient, api_key: str, db: Database) -> None:
    assert _health(http)[0] == 200  # nothing queued: nothing to serve
    r = http.post("/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {api_key}"})
    assert r.status_code == 202, r.text
    code, body = _health(http)
    assert (code, body["status"], body["unserved_gpu_types"], body["workers_alive"]) == (503, "degraded", ["h200"], 0)
    with db.session() as s:
        WorkerRepository(s).beat("w-h100", ["h100"])  # alive, but for another GPU type
    assert _health(http)[1]["unserved_gpu_types"] == ["h200"]
    with db.session() as s:
        WorkerRepository(s).beat("w-any", None)  # serves every GPU type
    code, body = _health(http)
    assert (code, body["status"], body["unserved_gpu_types"], body["workers_alive"]) == (200, "ok", [], 2)
    with db.session() as s:  # its heartbeat goes stale, as a killed worker's does
        s.execute(update(WorkerRow).values(last_seen=utcnow() - timedelta(seconds=31)))
    code, body = _health(http)
    assert (code, body["unserved_gpu_types"], body["workers_alive"]) == (503, ["h200"], 0)


def test_a_running_worker_beats_and_leaves_when_stopped(db: Database) -> None:
    worker = Worker(db, worker_id="beating", heartbeat_interval_s=0.05, stale_after_s=1.0, poll_interval_s=0.01)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            with db.session() as s:
                seen = [w.last_seen for w in WorkerRepository(s).alive(1.0) if w.id == "beating"]
            if seen and utcnow() - seen[0] < timedelta(seconds=0.5):
                break
            assert time.monotonic() < deadline, "no heartbeat within 10 s"
            time.sleep(0.02)
        first = seen[0]
        time.sleep(0.2)
        with db.session() as s:
            assert next(w.last_seen for w in WorkerRepository(s).all() if w.id == "beating") > first  # refreshed
    finally:
        worker.stop()
    assert not worker.alive and not any(t.name.startswith("memtune-heartbeat") for t in threading.enumerate())
    with db.session() as s:
        assert WorkerRepository(s).all() == []  # a clean stop deletes its row


def test_rows_of_workers_gone_for_a_day_are_pruned(db: Database) -> None:
    with db.session() as s:
        repo = WorkerRepository(s)
        repo.beat("old", None)
        repo.beat("new", ["h100"])
        s.execute(update(WorkerRow).where(WorkerRow.id == "old").values(last_seen=utcnow() - timedelta(days=2)))
        assert repo.prune() == 1
        assert [(w.id, w.gpu_keys) for w in repo.all()] == [("new", ("h100",))]


def test_a_queued_job_no_live_worker_serves_says_why_it_waits(http: TestClient, api_key: str, db: Database) -> None:
    r = http.post("/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {api_key}"})
    job_id = r.json()["id"]
    waiting = http.get(f"/v1/jobs/{job_id}").json()["waiting"]
    assert waiting is not None and "no live worker serves GPU type h200" in waiting
    assert http.get("/v1/jobs").json()["data"][0]["waiting"] == waiting
    with db.session() as s:
        WorkerRepository(s).beat("w", ["h200"])
    assert http.get(f"/v1/jobs/{job_id}").json()["waiting"] is None
    assert http.get("/v1/jobs").json()["data"][0]["waiting"] is None
