"""Turning a request's model (zoo name + params, JSON spec, or stored id) into a stored model.

Zoo parameters are resolved against the zoo's defaults and ranges and specs are validated analytically
(``profiler.spec.validate_spec``), so nothing is built or allocated in a request; errors are
``SpecError``s naming the layer and field. The content hash covers the canonical form, so
``{"zoo": "VGG-16"}`` and ``{"zoo": "vgg16", "params": {"num_classes": 1000}}`` are one model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from profiler.spec import validate_spec
from profiler.zoo import ZOO, normalize_name, zoo_params
from storage.records import ModelRecord
from storage.repositories import ModelRepository, content_hash

__all__ = ["store_spec_model", "store_zoo_model"]


def store_zoo_model(session: Session, name: str, params: Mapping[str, Any] | None) -> tuple[ModelRecord, bool]:
    """Store (or find) a zoo model; ``(model, created)``. Raises ``SpecError`` for a bad name or parameter."""
    zoo_params(name)  # raises SpecError(field="model") naming the known models
    entry = ZOO[normalize_name(name)]
    resolved = entry.resolve(params)
    definition = {"zoo": entry.name, "params": dict(sorted(resolved.items()))}
    return ModelRepository(session).get_or_create(
        name=entry.name, kind="zoo", digest=content_hash(definition), definition=definition, n_stages=None
    )


def store_spec_model(session: Session, spec: Mapping[str, Any]) -> tuple[ModelRecord, bool]:
    """Store (or find) a JSON-spec model; ``(model, created)``. Raises ``SpecError`` naming the layer."""
    validated = validate_spec(spec)
    digest = validated.hash()
    label = spec.get("name")
    name = label if isinstance(label, str) and label else f"spec:{digest[:12]}"
    definition = {"spec": dict(spec)}
    return ModelRepository(session).get_or_create(
        name=name[:200], kind="spec", digest=digest, definition=definition, n_stages=len(validated.layers)
    )
