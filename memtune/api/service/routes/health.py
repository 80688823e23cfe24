"""``/healthz``: 200 once migrations ran, the worker ``memtune serve`` runs (a thread or a supervised process, NOTE
[ Supervised worker ]), if any, is up, and every GPU type with a queued job has a live worker (NOTE [ Worker
heartbeats ] in ``memtune.storage.repositories._workers``); 503 otherwise."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from memtune.api.service._deps import DbDep
from memtune.api.service.schemas import HealthPublic
from memtune.storage import Database, StorageError
from memtune.storage.migrate import current_revision, head_revision
from memtune.storage.repositories import WorkerRepository

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
    alive, unserved = _workers(db, request.app.state.settings.stale_after_s) if ready else (None, [])
    if ready and worker_state in ("up", "external") and not unserved:
        status_text, code = "ok", 200
    else:
        status_text, code = ("starting" if not request.app.state.migrated else "degraded"), 503
    body = HealthPublic(
        status=status_text,  # type: ignore[arg-type]
        database=db_state,
        revision=revision,
        worker=worker_state,
        workers_alive=alive,
        unserved_gpu_types=unserved,
    )
    return JSONResponse(body.model_dump(), status_code=code)


def _workers(db: Database, stale_after_s: float) -> tuple[int | None, list[str]]:
    """Live workers and the queued GPU types none of them serves (NOTE [ Worker heartbeats ]); ``(None, [])`` where
    the database cannot say."""
    try:
        with db.session() as s:
            repo = WorkerRepository(s)
            return len(repo.alive(stale_after_s)), repo.unserved(stale_after_s)
    except Exception:  # the database's state is reported above
        return None, []
