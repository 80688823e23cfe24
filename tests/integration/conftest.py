"""Integration fixtures: a real uvicorn server on loopback over SQLite or PostgreSQL, worker processes.

PostgreSQL is expected at 127.0.0.1:5432 (user ``postgres``, trust auth; override with
``MEMTUNE_TEST_PG``); each test creates its own database and drops it afterwards, and PostgreSQL tests
skip with the reason when the server cannot be reached.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import httpx
import pytest

from storage.database import Database
from storage.migrate import upgrade
from storage.repositories import KeyRepository

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN = os.environ.get("MEMTUNE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_admin_connect() -> object:
    import psycopg

    return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)


def pg_unreachable() -> str | None:
    """Why PostgreSQL cannot be used, or None when it can."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'memtune[postgres]')"
    try:
        conn = _pg_admin_connect()
    except Exception as e:
        return f"PostgreSQL at {PG_ADMIN} is unreachable: {e}"
    conn.close()  # type: ignore[attr-defined]
    return None


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for one test, dropped afterwards."""
    reason = pg_unreachable()
    if reason:
        pytest.skip(reason)
    name = f"memtune_it_{uuid4().hex[:12]}"
    conn = _pg_admin_connect()
    conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[attr-defined]
    base = PG_ADMIN.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[attr-defined]
        conn.close()  # type: ignore[attr-defined]


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'memtune.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


FAST_ENV = {
    "MEMTUNE_POLL_INTERVAL_S": "0.1",
    "MEMTUNE_PROGRESS_INTERVAL_S": "0.1",
    "MEMTUNE_SSE_INTERVAL_S": "0.1",
}


def spawn(args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    """Run ``python -m api.cli_service ARGS`` from the repository root, output to ``log``."""
    full_env = {**os.environ, **FAST_ENV, **env, "PYTHONPATH": str(ROOT)}
    fh = open(log, "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "api.cli_service", *args], cwd=ROOT, env=full_env, stdout=fh, stderr=subprocess.STDOUT
    )


def create_key(url: str, name: str = "it") -> str:
    db = Database(url)
    upgrade(db)
    with db.session() as s:
        _, secret = KeyRepository(s).create(name)
    db.dispose()
    return secret


@pytest.fixture
def serve_args() -> list[str]:
    """Extra ``memtune serve`` options (a module may override this fixture, e.g. ``--no-worker``)."""
    return []


@pytest.fixture
def server(database_url: str, serve_args: list[str], tmp_path: Path) -> Iterator[str]:
    """``memtune serve`` (API + one in-process worker) on a free loopback port; yields the base URL."""
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
