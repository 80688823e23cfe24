"""Errors raised by the storage package.

SQLAlchemy and driver errors never leave this package: ``memtune.storage.database.Database.session`` is the one
boundary that translates them.

Hierarchy::

    StorageError
    ├── NotFoundError      a row asked for by id or key does not exist
    ├── ConflictError      a write broke a uniqueness rule or a state rule (e.g. cancelling a finished job)
    │   └── IdempotencyConflictError  an Idempotency-Key was reused for a different request
    └── UnavailableError   the database could not be reached or answered with an operational error
"""

from __future__ import annotations

__all__ = ["ConflictError", "IdempotencyConflictError", "NotFoundError", "StorageError", "UnavailableError"]


class StorageError(Exception):
    """Base class of every error the storage package raises."""


class NotFoundError(StorageError, LookupError):
    """A row asked for does not exist. The message names the table and the id."""


class ConflictError(StorageError):
    """A write conflicts with stored state (unique key taken, job already finished …)."""


class IdempotencyConflictError(ConflictError):
    """An idempotency key was used before for a different request."""


class UnavailableError(StorageError):
    """The database is unreachable or failed operationally (locked, connection lost); retry later."""
