"""Measured validation on PostgreSQL: the 0002 migration up, down and up again with data in it, and a job
validated by the worker (GPU measurement stood in for by ``service_fixtures.FakeValidator``) read back
through the API: measured rows on the leaderboard, the best plan preferring a measured fit."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_fixtures import SMALL_SPEC, FakeValidator, migration_round_trip

from memtune.api.client import MemtuneClient
from memtune.api.service.main import create_app
from memtune.api.service.settings import Settings
from memtune.api.service.worker import Worker
from memtune.storage.database import Database
from memtune.storage.migrate import upgrade
from memtune.storage.repositories import KeyRepository

pytestmark = pytest.mark.integration


def test_migration_0002_up_down_up_on_postgres(postgres_url: str) -> None:
    migration_round_trip(postgres_url)


def test_validated_job_on_postgres(postgres_url: str, tmp_path: Path) -> None:
    db = Database(postgres_url)
    try:
        upgrade(db)
        with db.session() as s:
            _, secret = KeyRepository(s).create("pg-tester")
        settings = Settings(data_dir=tmp_path, database_url=postgres_url, progress_interval_s=0.0)
        with TestClient(create_app(settings, db=db), raise_server_exceptions=False) as http:
            client = MemtuneClient(api_key=secret, http=http)
            job = client.submit_job(
                {"spec": SMALL_SPEC}, batch=8, gpu="h200", budget="64MiB", trials=20, validate_top_k=2
            )
            fake = FakeValidator()
            worker = Worker(
                db, worker_id="pg-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0, validator=fake
            )
            assert worker.run_once() == job.id
            done = client.get_job(job.id)
            assert done.state == "succeeded" and done.validation is not None and done.validation.state == "done"
            measured = client.leaderboard(model=job.model_id, source="measured")
            assert measured.count == 2 and all(r.predicted_step_ms for r in measured.data)
            best = client.best("h200", model=job.model_id, batch=8, budget="64MiB")
            assert best.source == "measured" and best.step_ms == measured.data[0].step_ms
    finally:
        db.dispose()
