"""Turning a request's model (zoo name + params, JSON spec, exported program, or stored id) into a stored model.

Zoo parameters are resolved against the zoo's defaults and ranges and specs are validated analytically
(``memtune.profiler.spec.validate_spec``), so nothing is built or allocated in a request; errors are
``SpecError``s naming the layer and field. The content hash covers the canonical form, so
``{"zoo": "VGG-16"}`` and ``{"zoo": "vgg16", "params": {"num_classes": 1000}}`` are one model. An exported
program is checked by ``memtune.profiler.exported.check_exported`` (nothing from it runs) and keyed by its structural
digest, so the same model exported twice, with other weights, is one model.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from memtune.api.service._problems import ProblemError
from memtune.profiler import SpecError
from memtune.profiler.spec import validate_spec
from memtune.profiler.zoo import ZOO, normalize_name, zoo_params
from memtune.storage.records import ModelRecord
from memtune.storage.repositories import ModelRepository, content_hash

if TYPE_CHECKING:
    from memtune.profiler import ModelChain
    from memtune.profiler.exported import CheckedProgram

__all__ = [
    "build_stored_chain",
    "check_batch",
    "check_tensor_sizes",
    "store_exported_model",
    "store_spec_model",
    "store_zoo_model",
    "stored_chain_builder",
]


def store_zoo_model(session: Session, name: str, params: Mapping[str, Any] | None) -> tuple[ModelRecord, bool]:
    """Store (or find) a zoo model; ``(model, created)``. Raises ``SpecError`` for a bad name or parameter."""
    zoo_params(name)  # raises SpecError(field="model") naming the known models
    entry = ZOO[normalize_name(name)]
    resolved = entry.resolve(params)
    definition = {"zoo": entry.name, "params": dict(sorted(resolved.items()))}
    return ModelRepository(session).get_or_create(
        name=entry.name, kind="zoo", digest=content_hash(definition), definition=definition, n_stages=None
    )


def check_not_zoo_name(name: str | None, field: str) -> None:
    """Refuse a spec's or an upload's name that reads as a zoo model's (``vgg16``, ``VGG-16``): lookups by name
    (``/v1/gpus/{gpu}/best?model=…``, the leaderboard's filter) would mix another structure with the zoo model.

    Raises:
        SpecError: naming ``field``.
    """
    if name is not None and normalize_name(name) in ZOO:
        raise SpecError(
            f"{name!r} is the name of the zoo model {ZOO[normalize_name(name)].name!r}, reserved for it: a model "
            "is found by its name, so another structure may not take it. Name yours otherwise, or send "
            '{"zoo": "…"} for the zoo model itself',
            field=field,
        )


def check_name_free(session: Session, name: str, digest: str, field: str) -> None:
    """Refuse ``name`` for a new spec or upload where a stored model of another structure (another content hash)
    holds it: a model is found by its name (``/v1/gpus/{gpu}/best?model=…``, the leaderboard's filter), so one name
    stands for one structure, whoever sent it first. The same structure sent again is the same model and passes.

    Raises:
        SpecError: naming ``field`` and the model that holds the name.
    """
    held = [m for m in ModelRepository(session).find(name) if m.name == name and m.content_hash != digest]
    if held:
        raise SpecError(
            f"{name!r} is the name of the stored model {held[0].id} ({held[0].kind}), a different structure: a model "
            "is found by its name, so another structure may not take it. Name yours otherwise (a version suffix), "
            "or leave the name out to be named by your model's digest",
            field=field,
        )


def store_spec_model(session: Session, spec: Mapping[str, Any]) -> tuple[ModelRecord, bool]:
    """Store (or find) a JSON-spec model; ``(model, created)``. Raises ``SpecError`` naming the layer, or the name
    when it is a zoo model's (``check_not_zoo_name``) or another stored structure's (``check_name_free``)."""
    label = spec.get("name")
    check_not_zoo_name(label if isinstance(label, str) else None, "spec.name")
    validated = validate_spec(spec)
    digest = validated.hash()
    name = label if isinstance(label, str) and label else f"spec:{digest[:12]}"
    check_name_free(session, name[:200], digest, "spec.name")
    definition = {"spec": dict(spec)}
    return ModelRepository(session).get_or_create(
        name=name[:200], kind="spec", digest=digest, definition=definition, n_stages=len(validated.layers)
    )


def store_exported_model(
    session: Session, checked: CheckedProgram, *, name: str | None, int_high: int | None
) -> tuple[ModelRecord, bool]:
    """Store (or find, by structural digest) an exported program checked by
    ``memtune.profiler.exported.check_exported``; ``(model, created)``. The canonical archive is stored beside the
    model; an existing model keeps its own. Raises
    ``SpecError`` when ``name`` is a zoo model's (``check_not_zoo_name``) or another stored structure's
    (``check_name_free``)."""
    check_not_zoo_name(name, "name")
    label = (name or f"exported:{checked.digest[:12]}")[:200]
    check_name_free(session, label, checked.digest, "name")
    definition = {"exported": {**checked.summary(), "int_high": int_high}}
    return ModelRepository(session).get_or_create(
        name=label,
        kind="exported",
        digest=checked.digest,
        definition=definition,
        n_stages=None,
        program=checked.archive,
    )


def check_batch(model: ModelRecord, batch: int) -> None:
    """An exported program runs at the batch it was exported at (its shapes are static): refuse any other.

    Raises:
        ProblemError: 422 ``batch_mismatch``, naming the program's batch and what to do.
    """
    if model.kind != "exported":
        return
    exported = int(model.definition["exported"]["batch"])
    if batch != exported:
        raise ProblemError(
            422,
            "batch_mismatch",
            "Batch does not match the exported program",
            f"model {model.id} is an exported program with static shapes, traced at batch {exported}: submit the job "
            f"with batch {exported}, or export the model again with a batch-{batch} input",
            field="batch",
            model_batch=exported,
        )


def check_tensor_sizes(model: ModelRecord, gpu_key: str, memory_bytes: int) -> None:
    """An exported program whose largest tensor (a parameter, buffer, constant, node output or factory call's
    tensor; NOTE [ Upload limits ] in ``memtune.profiler._exported_checks``) is over the GPU type's memory fits no plan:
    refuse a job of it on that GPU type. The upload was checked against the GPU type it named, else the largest.

    Raises:
        ProblemError: 422 ``tensor_too_large``, naming the tensor, its bytes and the GPU's memory.
    """
    if model.kind != "exported":
        return
    summary = model.definition["exported"]
    nbytes = int(summary.get("max_tensor_bytes") or 0)
    if nbytes <= memory_bytes:
        return
    name = summary.get("largest_tensor_name")
    what = summary.get("largest_tensor") or f"a tensor of {nbytes} bytes"
    raise ProblemError(
        422,
        "tensor_too_large",
        "Tensor larger than the GPU's memory",
        f"model {model.id}: {what}, over the {memory_bytes} bytes of the {gpu_key}'s memory: no memory plan can fit "
        "a tensor larger than the GPU; submit the job for a GPU type with more memory, or export the model smaller",
        field="model",
        tensor=name,
        tensor_bytes=nbytes,
        limit_bytes=memory_bytes,
    )


def build_stored_chain(kind: str, definition_json: str) -> ModelChain:
    """Build a stored model's chain with real (CPU) parameters from its ``kind`` and JSON ``definition``.

    The definition is the JSON text of ``ModelRecord.definition`` (what ``store_zoo_model`` or
    ``store_spec_model`` stored: validated data, never code); it is parsed here, so a builder that crosses
    a process boundary carries only text.
    """
    definition = json.loads(definition_json)
    if kind == "zoo":
        from memtune.profiler import build

        return build(str(definition["zoo"]), definition.get("params"))
    if kind == "spec":
        from memtune.profiler import from_spec

        return from_spec(definition["spec"])
    raise ValueError(f"unknown stored model kind {kind!r} (expected 'zoo' or 'spec')")


def stored_chain_builder(model: ModelRecord) -> Callable[[], ModelChain]:
    """A picklable function building ``model``'s chain, for measuring it in a fresh process (NOTE [ Bench
    isolation ] in ``memtune.tuner.measure.bench``): ``build_stored_chain`` bound to the model's kind and definition."""
    return functools.partial(build_stored_chain, model.kind, json.dumps(model.definition, sort_keys=True))
