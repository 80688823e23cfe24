"""Alembic environment for memtune's own tables (``mt_*``).

The version table is ``mt_alembic_version``: Optuna keeps its own ``alembic_version`` in the same
database. Only ``mt_`` tables are compared by autogenerate. A connection handed in through
``config.attributes["connection"]`` is used as is (``memtune.storage.migrate.upgrade`` does that).
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine, pool

from memtune.storage.database import normalize_url
from memtune.storage.orm import Base

VERSION_TABLE = "mt_alembic_version"

config = context.config
target_metadata = Base.metadata


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    if type_ == "table":
        return bool(name and name.startswith("mt_")) and name != VERSION_TABLE
    return True


def _configure(connection: Any) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("no database URL: pass -x url=<sqlalchemy url> or use memtune.storage.migrate.upgrade(url)")
    return normalize_url(url)


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _configure(conn)
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
