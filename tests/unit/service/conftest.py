"""Fixtures for the service unit tests: a migrated SQLite database per test, an in-process app, keys; calibrations
installed in this process (by a test: the service installs none, NOTE [ Calibrations in the service ]) are forgotten
after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from memtune.api.client import MemtuneClient
from memtune.api.service.main import create_app
from memtune.api.service.settings import Settings
from memtune.storage.database import Database
from memtune.storage.migrate import upgrade
from memtune.storage.repositories import KeyRepository
from memtune.tuner.calibration import uninstall_calibrations


@pytest.fixture(autouse=True)
def _no_installed_calibrations() -> Iterator[None]:
    uninstall_calibrations()
    yield
    uninstall_calibrations()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'memtune.db'}")
    upgrade(database)
    yield database
    database.dispose()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, progress_interval_s=0.0, sse_interval_s=0.05)


@pytest.fixture
def api_key(db: Database) -> str:
    with db.session() as s:
        _, secret = KeyRepository(s).create("tester")
    return secret


@pytest.fixture
def http(db: Database, settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, db=db), raise_server_exceptions=False) as tc:
        yield tc


@pytest.fixture
def client(http: TestClient, api_key: str) -> MemtuneClient:
    return MemtuneClient(api_key=api_key, http=http)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty SQLite file, or a fresh PostgreSQL database dropped afterwards (skipped when no server answers)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'memtune-url.db'}"
        return
    from tests.integration.live_server import fresh_pg_database, pg_unreachable

    reason = pg_unreachable()
    if reason:
        pytest.skip(f"PostgreSQL tests need a server: {reason}")
    with fresh_pg_database("memtune_unit") as url:
        yield url
