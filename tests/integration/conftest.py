"""Integration fixtures: a real uvicorn server on loopback over SQLite or PostgreSQL.

Each PostgreSQL test creates its own database and drops it afterwards; PostgreSQL tests skip with the
reason when the server cannot be reached.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_server import free_port, fresh_pg_database, pg_unreachable, spawn


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for one test, dropped afterwards."""
    reason = pg_unreachable()
    if reason:
        pytest.skip(reason)
    with fresh_pg_database("memtune_it") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'memtune.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def serve_args() -> list[str]:
    """Extra ``memtune serve`` options (a module may override this fixture, e.g. ``--no-worker``)."""
    return []


@pytest.fixture
def server(database_url: str, serve_args: list[str], tmp_path: Path) -> Iterator[str]:
    """``memtune serve`` (the API, and its worker in a process of its own) on a free loopback port; yields the base
    URL."""
    port = free_port()
    log = tmp_path / "serve.log"
    args = ["serve", "--host", "127.0.0.1", "--port", str(port), "--database-url", database_url]
    proc = spawn([*args, "--log-level", "warning", *serve_args], log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after 90 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every integration test starts servers or a browser: all of them are ``slow`` (the README's fast set leaves
    them out; CI runs them)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)
