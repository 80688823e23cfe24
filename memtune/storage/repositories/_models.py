"""Models: zoo names with parameters, JSON specs or exported programs, deduplicated by content hash."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from memtune.storage._storage_errors import NotFoundError
from memtune.storage.orm import ModelProgramRow, ModelRow
from memtune.storage.records import ModelKind, ModelRecord
from memtune.storage.repositories._convert import to_model

__all__ = ["ModelRepository", "content_hash"]


def content_hash(definition: dict[str, Any]) -> str:
    """SHA-256 (hex) of a canonical JSON form of a model definition (key order does not matter)."""
    return hashlib.sha256(json.dumps(definition, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class ModelRepository:
    """Models in ``mt_models``. The id is ``m_`` plus the first 24 hex digits of the content hash."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def get_or_create(
        self,
        *,
        name: str,
        kind: ModelKind,
        digest: str,
        definition: dict[str, Any],
        n_stages: int | None,
        program: bytes | None = None,
    ) -> tuple[ModelRecord, bool]:
        """Return the model with this content hash, creating it when new; ``(model, created)``.

        ``program`` (exported models) is the canonical archive, stored beside the new model; an existing model
        keeps the archive it was created with. Two racing creators: the loser's commit raises ``ConflictError``;
        calling again returns the row.
        """
        if (kind == "exported") != (program is not None):
            raise ValueError("an exported model is stored with its program archive, and only an exported one")
        row = self.s.scalar(select(ModelRow).where(ModelRow.content_hash == digest))
        if row is not None:
            return to_model(row), False
        row = ModelRow(
            id="m_" + digest[:24],
            name=name,
            kind=kind,
            content_hash=digest,
            definition=definition,
            n_stages=n_stages,
        )
        self.s.add(row)
        self.s.flush()  # the model row first: the program row's foreign key points at it
        if program is not None:
            self.s.add(
                ModelProgramRow(
                    model_id=row.id,
                    archive=program,
                    archive_bytes=len(program),
                    sha256=hashlib.sha256(program).hexdigest(),
                )
            )
        self.s.flush()
        return to_model(row), True

    def program(self, model_id: str) -> bytes:
        """The canonical ``.pt2`` archive of an exported model (``memtune.profiler.exported.load_exported`` reads
        it)."""
        row = self.s.get(ModelProgramRow, model_id)
        if row is None:
            raise NotFoundError(
                f"model {model_id!r} has no stored program; exported models are created with POST /v1/models/exported"
            )
        return bytes(row.archive)

    def get(self, model_id: str) -> ModelRecord:
        row = self.s.get(ModelRow, model_id)
        if row is None:
            raise NotFoundError(f"model {model_id!r} does not exist; create it with POST /v1/models")
        return to_model(row)

    def find(self, id_or_name: str) -> list[ModelRecord]:
        """Models whose id is ``id_or_name`` or whose name is (newest first)."""
        row = self.s.get(ModelRow, id_or_name)
        if row is not None:
            return [to_model(row)]
        q = select(ModelRow).where(ModelRow.name == id_or_name).order_by(ModelRow.created_at.desc())
        return [to_model(r) for r in self.s.scalars(q)]
