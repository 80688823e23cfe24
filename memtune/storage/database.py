"""Engines and sessions: SQLite (a WAL file in a data directory) or PostgreSQL (psycopg 3) by URL.

``Database.session()`` is the one place where SQLAlchemy and driver errors become ``StorageError``s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    DBAPIError,
    IntegrityError,
    NoResultFound,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session, sessionmaker

from memtune.storage._lookup_version import read_lookup_version, watch_lookup_writes
from memtune.storage._storage_errors import ConflictError, NotFoundError, StorageError, UnavailableError

__all__ = ["Database", "default_url", "is_postgres", "is_sqlite", "normalize_url"]

SQLITE_BUSY_TIMEOUT_S = 30.0


def default_url(data_dir: str | Path) -> str:
    """The default database: ``<data_dir>/memtune.db`` (SQLite). Creates the directory."""
    path = Path(data_dir).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path / 'memtune.db'}"


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs (SQLAlchemy would pick psycopg2)."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def is_postgres(url: str) -> bool:
    return make_url(url).get_backend_name() == "postgresql"


def engine_kwargs(url: str) -> dict[str, Any]:
    """Engine options for ``url``; also handed to Optuna's ``RDBStorage`` so both behave alike."""
    if is_sqlite(url):
        return {
            "connect_args": {
                "timeout": SQLITE_BUSY_TIMEOUT_S,
                "check_same_thread": False,
            }
        }
    return {"pool_pre_ping": True, "pool_size": 10, "max_overflow": 20}


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


class Database:
    """One database: an engine and a session factory.

    Thread safety: the object is shared between threads; each ``session()`` call gives a new session.

    Args:
        url: SQLAlchemy URL (``sqlite:///path`` or ``postgresql://user@host/db``).
    """

    def __init__(self, url: str) -> None:
        self.url = normalize_url(url)
        if is_sqlite(self.url):
            db_path = make_url(self.url).database
            if db_path and db_path != ":memory:":
                Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = create_engine(self.url, **engine_kwargs(self.url))
        if is_sqlite(self.url):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)
        watch_lookup_writes(self._factory)  # NOTE [ Lookup version ]

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work: commits on success, rolls back on error, translates database errors.

        Raises:
            NotFoundError, ConflictError, UnavailableError, StorageError.
        """
        s = self._factory()
        try:
            yield s
            s.commit()
        except StorageError:
            s.rollback()
            raise
        except IntegrityError as e:
            s.rollback()
            raise ConflictError(f"write conflicts with stored data: {e.orig}") from e
        except NoResultFound as e:
            s.rollback()
            raise NotFoundError(str(e)) from e
        except OperationalError as e:
            s.rollback()
            raise UnavailableError(f"database unavailable ({self.dialect}): {e.orig}; retry later") from e
        except (DBAPIError, SQLAlchemyError) as e:
            s.rollback()
            raise StorageError(f"database error ({self.dialect}): {e}") from e
        finally:
            s.close()

    def ping(self) -> None:
        """Run ``SELECT 1``; raises ``UnavailableError`` when the database cannot be reached."""
        from sqlalchemy import text

        with self.session() as s:
            s.execute(text("SELECT 1"))

    def lookup_version(self) -> int:
        """The counter every write to results, models or GPU types raises (NOTE [ Lookup version ] in
        ``memtune.storage._lookup_version``): answers computed from those tables at an older version may be out of date.

        Raises:
            UnavailableError, StorageError: the database cannot be read.
        """
        with self.session() as s:
            return read_lookup_version(s)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
