"""``/v1/jobs``: submit a tuning job (idempotently), follow it (JSON or server-sent events), cancel it."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Literal

import anyio.to_thread
from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import StreamingResponse

from api.calibrations import job_headroom
from api.deps import DbDep, ReadAccess, SettingsDep, WriteKey
from api.gpu_types import resolve_gpu
from api.model_refs import check_batch, store_spec_model, store_zoo_model
from api.problems import ProblemError
from api.schemas import JobCreate, JobEvent, JobPublic, JobsPublic, ResultsPublic
from api.views import job_public, result_public
from storage.database import Database
from storage.errors import ConflictError, IdempotencyConflictError
from storage.records import Job
from storage.repositories import JobRepository, ModelRepository, ResultRepository
from tuner.budget import parse_budget

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=200,
        description="retrying a POST with the same key returns the job made the first time",
    ),
]


def _request_hash(body: JobCreate) -> str:
    data = body.model_dump(mode="json")
    # a request that asks for no validation hashes as it did before the validation fields existed, so an
    # idempotent retry across the upgrade still finds its job
    if data["validate_top_k"] == 0 and data["validate_iters"] == JobCreate.model_fields["validate_iters"].default:
        del data["validate_top_k"], data["validate_iters"]
    # likewise a request that leaves the headroom to the GPU type's calibration
    if data["headroom"] is None:
        del data["headroom"]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobPublic,
    responses={
        409: {"description": "Idempotency-Key reused for a different request"},
        422: {
            "description": "unknown GPU, bad budget, bad model spec (names the layer and field), a batch other than "
            "an exported program's (batch_mismatch), bad field"
        },
    },
)
def create_job(
    body: JobCreate, db: DbDep, key: WriteKey, response: Response, idempotency_key: IdempotencyKey = None
) -> JobPublic:
    """Queue a tuning job; 202 with ``Location: /v1/jobs/{id}``.

    With ``validate_top_k`` > 0 the worker then measures that many of the best plans on a GPU of the job's
    type and stores them labeled ``measured`` beside the simulated ones (``validation`` on the job says
    how it went: done, or skipped and why).

    ``headroom`` (default: the GPU type's calibration: the one stored in the service's database, else this host's
    file, else the committed one, else 0; ``api.calibrations``) is resolved here and stored on the job with
    where it came from (``headroom_source``), which the job shows: the worker searches plans against
    ``budget_bytes * (1 - headroom)`` while the job's ``budget_bytes`` stays the budget asked for.
    """
    request_hash = _request_hash(body)
    for attempt in (0, 1):  # a concurrent identical model create or idempotent retry: read the winner
        try:
            with db.session() as s:
                gpu = resolve_gpu(s, body.gpu)
                budget_bytes = parse_budget(body.budget, gpu.gpu.memory_bytes)
                headroom, headroom_source = job_headroom(s, gpu.gpu.key, body.headroom)
                ref = body.model
                if ref.id is not None:
                    model = ModelRepository(s).get(ref.id)
                    check_batch(model, body.batch)
                elif ref.zoo is not None:
                    model, _ = store_zoo_model(s, ref.zoo, ref.params)
                else:
                    assert ref.spec is not None
                    model, _ = store_spec_model(s, ref.spec)
                job, created = JobRepository(s).create(
                    model_id=model.id,
                    gpu_key=gpu.gpu.key,
                    batch=body.batch,
                    dtype=body.dtype,
                    budget_text=str(body.budget),
                    budget_bytes=budget_bytes,
                    trials=body.trials,
                    mode=body.mode,
                    optimizer=body.optimizer,
                    validate_top_k=body.validate_top_k,
                    validate_iters=body.validate_iters,
                    headroom=headroom,
                    headroom_source=headroom_source,
                    owner=key.name,
                    request_hash=request_hash,
                    idempotency_key=idempotency_key,
                )
            break
        except IdempotencyConflictError as e:
            raise ProblemError(409, "idempotency_key_reused", "Idempotency-Key reused", str(e)) from e
        except ConflictError:
            if attempt:
                raise
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return job_public(job)


@router.get("", response_model=JobsPublic)
def list_jobs(
    db: DbDep,
    _read: ReadAccess,
    state: Annotated[str | None, Query(pattern="^(queued|running|succeeded|failed|cancelled)$")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> JobsPublic:
    """Recent jobs, newest first."""
    with db.session() as s:
        jobs = JobRepository(s).list_all(state=state, limit=limit)
    return JobsPublic(data=[job_public(j) for j in jobs], count=len(jobs))


@router.get("/{job_id}", response_model=JobPublic)
def get_job(job_id: str, db: DbDep, _read: ReadAccess) -> JobPublic:
    """A job: state, progress (trials done / total, best so far), error, timestamps."""
    with db.session() as s:
        return job_public(JobRepository(s).get(job_id))


@router.get("/{job_id}/results", response_model=ResultsPublic)
def job_results(job_id: str, db: DbDep, _read: ReadAccess, plans: Annotated[bool, Query()] = False) -> ResultsPublic:
    """The plans a job stored (baselines, the Optuna best, Pareto points), fastest first; measured rows (if the
    job validated plans on the GPU) are listed with the simulated ones, labeled by ``source``."""
    with db.session() as s:
        JobRepository(s).get(job_id)
        results = ResultRepository(s).for_job(job_id)
    return ResultsPublic(data=[result_public(r, with_plan=plans) for r in results], count=len(results))


@router.post("/{job_id}/cancel", response_model=JobPublic, responses={409: {"description": "job already finished"}})
def cancel_job(job_id: str, db: DbDep, _key: WriteKey) -> JobPublic:
    """Cancel a queued job at once, or ask the worker of a running one to stop (it keeps what it found)."""
    with db.session() as s:
        return job_public(JobRepository(s).request_cancel(job_id))


def _load(db: Database, job_id: str) -> Job:
    with db.session() as s:
        return JobRepository(s).get(job_id)


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "progress events until the job ends"}},
)
async def job_events(
    job_id: str, request: Request, db: DbDep, settings: SettingsDep, _read: ReadAccess
) -> StreamingResponse:
    """Server-sent events: ``event: progress`` whenever the job changes, then ``event: end`` (data: JobEvent)."""
    first = await anyio.to_thread.run_sync(_load, db, job_id)  # 404 before the stream starts

    async def stream() -> AsyncIterator[bytes]:
        job, last, seq, idle = first, "", 0, 0.0
        yield b"retry: 1000\n\n"
        while True:
            event: Literal["progress", "end"] = "end" if job.terminal else "progress"
            payload = JobEvent(event=event, job=job_public(job)).model_dump_json()
            if payload != last:
                seq += 1
                last, idle = payload, 0.0
                yield f"id: {seq}\nevent: {event}\ndata: {payload}\n\n".encode()
            if job.terminal or await request.is_disconnected():
                return
            await asyncio.sleep(settings.sse_interval_s)
            idle += settings.sse_interval_s
            if idle >= 15.0:
                idle = 0.0
                yield b": keep-alive\n\n"
            job = await anyio.to_thread.run_sync(_load, db, job_id)

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
