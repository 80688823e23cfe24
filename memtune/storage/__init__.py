"""memtune storage: SQLAlchemy 2 rows, sessions, repositories and Alembic migrations.

Layers above get frozen records (``memtune.storage.records``), never ORM rows, and ``StorageError``s, never
SQLAlchemy errors. Optuna's tables live in the same database (``RDBStorage`` on the same URL).
"""

from __future__ import annotations

from memtune.storage._storage_errors import (
    ConflictError,
    IdempotencyConflictError,
    NotFoundError,
    StorageError,
    UnavailableError,
)
from memtune.storage.database import Database, default_url, normalize_url
from memtune.storage.migrate import upgrade

__all__ = [
    "ConflictError",
    "Database",
    "IdempotencyConflictError",
    "NotFoundError",
    "StorageError",
    "UnavailableError",
    "default_url",
    "normalize_url",
    "upgrade",
]
