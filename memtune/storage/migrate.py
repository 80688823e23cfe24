"""Run memtune's Alembic migrations programmatically (the app and the worker do it on start).

Several processes may start at once (API, workers): on PostgreSQL an advisory lock and on SQLite a file
lock next to the database serialise the upgrade. Optuna's tables are created in the same step, under
the same lock, so that concurrent first ``RDBStorage`` uses never race on ``CREATE TABLE``.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url

from memtune.storage._storage_errors import StorageError
from memtune.storage.database import Database, engine_kwargs

__all__ = [
    "MIGRATIONS_DIR",
    "alembic_config",
    "current_revision",
    "head_revision",
    "upgrade",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "mt_alembic_version"
_PG_LOCK_ID = 0x6D74756E65  # "mtune"


def alembic_config(url: str) -> Config:
    """An Alembic ``Config`` for memtune's migrations against ``url`` (usable with ``alembic.command``)."""
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    """The newest revision id shipped with this memtune."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    if head is None:
        raise StorageError(f"no Alembic revisions found under {MIGRATIONS_DIR}")
    return head


def current_revision(db: Database) -> str | None:
    """The revision the database is at, or None when memtune's tables were never created."""
    with db.engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


@contextmanager
def _migration_lock(db: Database, conn: Connection) -> Iterator[None]:
    if db.dialect == "postgresql":
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_ID})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_ID})
            conn.commit()
        return
    database = make_url(db.url).database
    if not database or database == ":memory:":
        yield
        return
    lock_path = Path(database).with_name(Path(database).name + ".migrate.lock")
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def upgrade(db: Database, revision: str = "head", *, optuna_tables: bool = True) -> str:
    """Upgrade the schema to ``revision`` and (by default) create Optuna's tables; returns the revision.

    Raises:
        StorageError: the migration failed (the message carries the database error).
    """
    try:
        with db.engine.connect() as lock_conn, _migration_lock(db, lock_conn):
            with db.engine.begin() as conn:
                cfg = alembic_config(db.url)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
            if optuna_tables:
                _create_optuna_tables(db.url)
    except StorageError:
        raise
    except Exception as e:  # alembic / driver errors: one boundary, one error type
        raise StorageError(f"database migration to {revision!r} failed on {db.dialect}: {e}") from e
    rev = current_revision(db)
    return rev or ""


def _create_optuna_tables(url: str) -> None:
    import optuna

    storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))
    storage.engine.dispose()
