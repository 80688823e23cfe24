"""``/v1/models``: store a zoo model, a JSON spec or an exported program (deduplicated by content hash); read one."""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Query, Request, Response, status

from memtune.api.service._deps import DbDep, JsonBody, ReadAccess, SettingsDep, WriteKey
from memtune.api.service._exported_upload import check_upload
from memtune.api.service._gpu_types import known_gpus, resolve_gpu
from memtune.api.service._problems import ProblemError
from memtune.api.service._views import model_public
from memtune.api.service.model_refs import check_not_zoo_name, store_exported_model, store_spec_model, store_zoo_model
from memtune.api.service.schemas import ModelCreate, ModelPublic
from memtune.profiler.exported import CheckedProgram
from memtune.storage import ConflictError, Database
from memtune.storage.records import ModelRecord
from memtune.storage.repositories import ModelRepository

__all__ = ["EXPORTED_PATH", "router"]

router = APIRouter(prefix="/v1/models", tags=["models"])

EXPORTED_PATH = "/v1/models/exported"
"""Where exported programs are uploaded (its body limit is ``MEMTUNE_MAX_EXPORTED_BYTES``)."""

_ARCHIVE_MEDIA_TYPES = ("application/octet-stream", "application/zip", "application/x-zip-compressed")
_CURL = "curl --data-binary @model.pt2 -H 'Content-Type: application/octet-stream'"


def _created(response: Response, model: ModelRecord, created: bool) -> ModelPublic:
    response.headers["Location"] = f"/v1/models/{model.id}"
    if not created:
        response.status_code = status.HTTP_200_OK
    return model_public(model)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelPublic,
    responses={
        200: {"description": "an identical model was stored before", "model": ModelPublic},
        415: {"description": "the body is not sent as application/json"},
    },
)
def create_model(body: ModelCreate, db: DbDep, _key: WriteKey, _json: JsonBody, response: Response) -> ModelPublic:
    """Store a model: ``{"zoo": "vgg16", "params": {...}}`` or ``{"spec": {...}}``.

    201 with the new model; 200 with the stored one when an identical definition exists (same id).
    """
    for attempt in (0, 1):  # a concurrent identical create wins the unique key: read its row
        try:
            with db.session() as s:
                if body.zoo is not None:
                    model, created = store_zoo_model(s, body.zoo, body.params)
                else:
                    assert body.spec is not None
                    model, created = store_spec_model(s, body.spec)
            break
        except ConflictError:
            if attempt:
                raise
    return _created(response, model, created)


def _store_exported(
    db: Database, checked: CheckedProgram, name: str | None, int_high: int | None
) -> tuple[ModelRecord, bool]:
    for attempt in (0, 1):  # as in create_model: a concurrent identical upload wins the unique key
        try:
            with db.session() as s:
                return store_exported_model(s, checked, name=name, int_high=int_high)
        except ConflictError:
            if attempt:
                raise
    raise AssertionError("unreachable")


def _tensor_limit(db: Database, gpu: str | None) -> tuple[int, str]:
    """The most bytes one tensor of an upload may take, and whose memory that is: the named GPU type's, else the
    largest known GPU type's (a job names its GPU type and is checked again against it)."""
    with db.session() as s:
        if gpu is not None:
            known = resolve_gpu(s, gpu).gpu
            return known.memory_bytes, f"the {known.key}'s memory"
        largest = max((k.gpu for k in known_gpus(s)), key=lambda g: g.memory_bytes)
        return largest.memory_bytes, f"the largest GPU type's memory ({largest.key}; name a gpu to check for it)"


@router.post(
    "/exported",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelPublic,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
    responses={
        200: {"description": "a model with the same structure was stored before", "model": ModelPublic},
        413: {"description": "the archive, or what it unpacks to, is over MEMTUNE_MAX_EXPORTED_BYTES"},
        415: {"description": "the body is not sent as application/octet-stream"},
        422: {
            "description": "the archive is refused (invalid_exported_program: names the member, field and why), a "
            "tensor it holds or makes is larger than the GPU's memory (tensor_too_large: names the tensor, its "
            "bytes and the limit), its check took over MEMTUNE_MAX_EXPORTED_CHECK_S (exported_check_timeout), or "
            "the gpu is unknown"
        },
    },
)
async def create_exported_model(
    request: Request,
    db: DbDep,
    settings: SettingsDep,
    _key: WriteKey,
    response: Response,
    name: Annotated[str | None, Query(min_length=1, max_length=200, description="a name to find it by")] = None,
    int_high: Annotated[
        int | None,
        Query(
            ge=1,
            le=1 << 40,
            description="for integer inputs that index no embedding: the exclusive upper bound of their values "
            "(e.g. the vocabulary size); an embedding's rows bound the inputs that index it",
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            description="the GPU type the model is for: no tensor may be larger than its memory (default: the "
            "largest known GPU type's; a job is checked against its own GPU type)",
        ),
    ] = None,
) -> ModelPublic:
    """Store a model exported with ``torch.export`` (the ``.pt2`` file from ``torch.export.save``, as the body).

    The archive is checked without running anything from it (NOTE [ Safe exported programs ] in
    ``memtune.profiler.exported``): pickles, extra files, compiled code, guards, dynamic shapes and anything but ATen
    operators are refused with a problem naming the archive member and field. What is stored is its canonical
    form, without the parameters' values. Export in training mode with static shapes: the first input's first
    dimension is the batch jobs must use. The id is derived from the program's structure, so the same model
    exported again (other weights, another machine) is 200 with the stored model.

    The check runs in a child process within ``MEMTUNE_MAX_EXPORTED_CHECK_S`` seconds, and every tensor the program
    holds or makes must fit the GPU's memory (NOTE [ Upload limits ] in ``memtune.profiler._exported_checks``).
    """
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media not in _ARCHIVE_MEDIA_TYPES:
        raise ProblemError(
            415,
            "unsupported_media_type",
            "Unsupported media type",
            f"send the .pt2 archive's bytes as the request body with Content-Type: application/octet-stream (got "
            f"{media or 'no content type'}), e.g. {_CURL}",
        )
    check_not_zoo_name(name, "name")  # before the archive is read or checked
    limit_bytes, memory_of = await anyio.to_thread.run_sync(_tensor_limit, db, gpu)
    data = await request.body()
    checked = await check_upload(
        data,
        max_bytes=settings.max_exported_bytes,
        int_high=int_high,
        max_tensor_bytes=limit_bytes,
        memory_of=memory_of,
        time_limit_s=settings.max_exported_check_s,
    )
    model, created = await anyio.to_thread.run_sync(_store_exported, db, checked, name, int_high)
    return _created(response, model, created)


@router.get("/{model_id}", response_model=ModelPublic)
def get_model(model_id: str, db: DbDep, _read: ReadAccess) -> ModelPublic:
    """A stored model by id."""
    with db.session() as s:
        return model_public(ModelRepository(s).get(model_id))
