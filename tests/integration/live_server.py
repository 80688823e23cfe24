"""Helpers of the integration tests: PostgreSQL reachability, subprocesses of ``memtune.api.cli.cli_service``, keys.

PostgreSQL is expected at 127.0.0.1:5432 (user ``postgres``, trust auth); override the admin URL with
``MEMTUNE_TEST_PG``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

from memtune.storage.database import Database
from memtune.storage.migrate import upgrade
from memtune.storage.repositories import KeyRepository

__all__ = ["FAST_ENV", "PG_ADMIN", "ROOT", "create_key", "free_port", "pg_admin_connect", "pg_unreachable", "spawn"]

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN = os.environ.get("MEMTUNE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
FAST_ENV = {
    "MEMTUNE_POLL_INTERVAL_S": "0.1",
    "MEMTUNE_PROGRESS_INTERVAL_S": "0.1",
    "MEMTUNE_SSE_INTERVAL_S": "0.1",
}


def pg_admin_connect() -> Any:
    """An autocommit psycopg connection to the admin database."""
    import psycopg

    return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)


def pg_unreachable() -> str | None:
    """Why PostgreSQL cannot be used, or None when it can."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'memtune[postgres]')"
    try:
        conn = pg_admin_connect()
    except Exception as e:
        return f"PostgreSQL at {PG_ADMIN} is unreachable: {e}"
    conn.close()
    return None


@contextlib.contextmanager
def fresh_pg_database(prefix: str) -> Iterator[str]:
    """A new PostgreSQL database named ``<prefix>_<random>``, dropped on exit; yields its URL (the server must
    answer: check ``pg_unreachable`` first)."""
    name = f"{prefix}_{uuid4().hex[:12]}"
    conn = pg_admin_connect()
    conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    finally:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    """Run ``python -m memtune.api.cli.cli_service ARGS`` from the repository root, output to ``log``."""
    full_env = {**os.environ, **FAST_ENV, **env, "PYTHONPATH": str(ROOT)}
    fh = open(log, "wb")  # noqa: SIM115 - the child holds it for its lifetime
    return subprocess.Popen(
        [sys.executable, "-m", "memtune.api.cli.cli_service", *args],
        cwd=ROOT,
        env=full_env,
        stdout=fh,
        stderr=subprocess.STDOUT,
    )


def create_key(url: str, name: str = "it") -> str:
    """Migrate the database at ``url`` and create an API key there; returns the secret."""
    db = Database(url)
    upgrade(db)
    with db.session() as s:
        _, secret = KeyRepository(s).create(name)
    db.dispose()
    return secret
