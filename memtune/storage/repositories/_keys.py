"""API keys: random 32-byte tokens, stored as SHA-256 digests, revocable by name."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from memtune.storage._storage_errors import ConflictError, NotFoundError
from memtune.storage.orm import ApiKeyRow, utcnow
from memtune.storage.records import ApiKey
from memtune.storage.repositories._convert import to_api_key

__all__ = ["KEY_PREFIX", "KeyRepository", "hash_key"]

KEY_PREFIX = "mtk_"


def hash_key(secret: str) -> str:
    """SHA-256 hex digest of a key (enough for random 256-bit tokens: no salt or stretching needed)."""
    return hashlib.sha256(secret.encode()).hexdigest()


class KeyRepository:
    """API keys in ``mt_api_keys``."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def create(self, name: str) -> tuple[ApiKey, str]:
        """Create a key named ``name``; returns ``(key, secret)``. The secret is not stored: show it once."""
        if not name or len(name) > 100:
            raise ConflictError("key name must be 1..100 characters")
        if self.s.scalar(select(ApiKeyRow).where(ApiKeyRow.name == name)) is not None:
            raise ConflictError(f"an API key named {name!r} exists; revoke it or choose another name")
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        row = ApiKeyRow(name=name, key_hash=hash_key(secret), prefix=secret[: len(KEY_PREFIX) + 4])
        self.s.add(row)
        self.s.flush()
        return to_api_key(row), secret

    def authenticate(self, secret: str) -> ApiKey | None:
        """The active key with this secret, or None (unknown or revoked)."""
        row = self.s.scalar(select(ApiKeyRow).where(ApiKeyRow.key_hash == hash_key(secret)))
        if row is None or row.revoked_at is not None:
            return None
        return to_api_key(row)

    def lock(self, key_id: int) -> None:
        """Hold the key's row for the rest of the transaction, so that two writes of one key (two job submissions
        checked against its limits) run one after the other: a no-op ``UPDATE`` of the row, which PostgreSQL
        locks and SQLite serializes (its write lock; issued first in a transaction, nothing read before it can
        be stale)."""
        self.s.execute(
            update(ApiKeyRow)
            .where(ApiKeyRow.id == key_id)
            .values(id=ApiKeyRow.id)
            .execution_options(synchronize_session=False)
        )

    def list_all(self) -> list[ApiKey]:
        return [to_api_key(r) for r in self.s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id))]

    def revoke(self, name: str) -> ApiKey:
        """Revoke the key named ``name`` (idempotent). Raises ``NotFoundError`` for an unknown name."""
        row = self.s.scalar(select(ApiKeyRow).where(ApiKeyRow.name == name))
        if row is None:
            raise NotFoundError(f"no API key named {name!r}; `memtune keys list` shows them")
        if row.revoked_at is None:
            row.revoked_at = utcnow()
            self.s.flush()
        return to_api_key(row)
