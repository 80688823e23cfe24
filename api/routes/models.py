"""``/v1/models``: store a zoo model or a JSON spec (deduplicated by content hash); read one back."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from api.deps import DbDep, ReadAccess, WriteKey
from api.model_refs import store_spec_model, store_zoo_model
from api.schemas import ModelCreate, ModelPublic
from api.views import model_public
from storage.errors import ConflictError
from storage.repositories import ModelRepository

__all__ = ["router"]

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelPublic,
    responses={200: {"description": "an identical model was stored before", "model": ModelPublic}},
)
def create_model(body: ModelCreate, db: DbDep, _key: WriteKey, response: Response) -> ModelPublic:
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
    response.headers["Location"] = f"/v1/models/{model.id}"
    if not created:
        response.status_code = status.HTTP_200_OK
    return model_public(model)


@router.get("/{model_id}", response_model=ModelPublic)
def get_model(model_id: str, db: DbDep, _read: ReadAccess) -> ModelPublic:
    """A stored model by id."""
    with db.session() as s:
        return model_public(ModelRepository(s).get(model_id))
