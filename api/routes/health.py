"""``/healthz``: 200 once migrations ran and the worker ``memtune serve`` runs (a thread or a supervised process, NOTE
[ Supervised worker ]), if any, is up; 503 otherwise."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.deps import DbDep
from api.schemas import HealthPublic
from storage import StorageError
from storage.migrate import current_revision, head_revision

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthPublic, responses={503: {"model": HealthPublic}})
def healthz(request: Request, db: DbDep) -> JSONResponse:
    """Liveness and readiness: database reachable, schema at head, worker thread alive."""
    worker = getattr(request.app.state, "worker", None)
    supervisor = getattr(request.app.state, "worker_supervisor", None)
    if supervisor is not None:
        worker_state = supervisor.state
    else:
        worker_state = "external" if worker is None else ("up" if worker.alive else "down")
    try:
        revision = current_revision(db)
        db_state = "ok"
    except StorageError as e:
        revision, db_state = None, f"unavailable: {e}"
    except Exception as e:  # driver errors surface here before any session exists
        revision, db_state = None, f"unavailable: {type(e).__name__}"
    ready = db_state == "ok" and revision == head_revision() and request.app.state.migrated
    if ready and worker_state in ("up", "external"):
        status_text, code = "ok", 200
    else:
        status_text, code = ("starting" if not request.app.state.migrated else "degraded"), 503
    body = HealthPublic(status=status_text, database=db_state, revision=revision, worker=worker_state)  # type: ignore[arg-type]
    return JSONResponse(body.model_dump(), status_code=code)
