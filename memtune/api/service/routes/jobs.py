"""``/v1/jobs``: submit a tuning job (idempotently), follow it (JSON or server-sent events), cancel it.

# NOTE [ Job limits and ownership ]
A job belongs to the API key that submitted it (``owner``, the key's name). Only that key, or a key named in
``MEMTUNE_ADMIN_KEYS``, may cancel it; any other key gets 403 ``not_job_owner``. Reads stay open to every reader.

Each key is held to three limits (``memtune.api.service.settings.Settings``), checked at submission after the request
itself was found valid, each refused with a 429 problem naming the limit (``limit``) and the setting that sets it:

* ``max_active_jobs_per_key`` (10) queued plus running jobs: ``too_many_active_jobs``, ``Retry-After: 30``
  (when a job of the key finishes is not known; 30 s is a poll interval, not a promise).
* ``max_jobs_per_hour_per_key`` (60) jobs submitted in any 3600 s, whatever became of them: ``hourly_job_limit``,
  with ``Retry-After`` the seconds until the oldest of them leaves the window (one submission is free then).
* ``max_trials_per_job`` (10,000): ``trials_limit``. 429 like the others, so that a client finds every per-key
  limit under one status, but without ``Retry-After``: the same request is refused however long it waits (a
  ``Retry-After`` would send retrying clients into a loop); ``limit`` says how many trials to ask for instead.

A submission takes its key's row lock first (``KeyRepository.lock``), so two concurrent submissions of one key
are counted one after the other and cannot both slip under a limit. An idempotent retry of a stored job
(same ``Idempotency-Key``) is not a new submission: it is answered with the job, whatever the limits say now.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Annotated, Literal

import anyio.to_thread
from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import StreamingResponse

from memtune.api.service._calibration_lookup import job_headroom
from memtune.api.service._deps import DbDep, JsonBody, ReadAccess, SettingsDep, WriteKey, is_admin
from memtune.api.service._gpu_types import resolve_gpu
from memtune.api.service._problems import ProblemError
from memtune.api.service._views import job_public, result_public
from memtune.api.service.model_refs import check_batch, check_tensor_sizes, store_spec_model, store_zoo_model
from memtune.api.service.schemas import JobCreate, JobEvent, JobPublic, JobsPublic, ResultsPublic
from memtune.api.service.settings import Settings
from memtune.profiler.spec import FLOAT_BYTES, SpecLimits, validate_spec
from memtune.profiler.zoo import ZOO, ZOO_LIMITS, gpt_param_count, image_spec
from memtune.storage import ConflictError, Database, IdempotencyConflictError
from memtune.storage.orm import utcnow
from memtune.storage.records import Job, ModelRecord
from memtune.storage.repositories import (
    JobRepository,
    KeyRepository,
    ModelRepository,
    ResultRepository,
    WorkerRepository,
)
from memtune.tuner import format_bytes, parse_budget
from memtune.tuner.budget import search_budget
from memtune.tuner.simulator import OPTIMIZERS

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
    # and one that leaves compiling the whole model at its default
    if data["compile"] == JobCreate.model_fields["compile"].default:
        del data["compile"]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


#: seconds a client over its active-job limit is asked to wait (NOTE [ Job limits and ownership ])
ACTIVE_RETRY_AFTER_S = 30
#: the window of the hourly limit, seconds
HOUR_S = 3600
_UNBOUNDED_IMAGE = SpecLimits(max_layers=ZOO_LIMITS.max_layers, max_params=2**62, max_activation_bytes=2**62)


def parameter_bytes(model: ModelRecord) -> int:
    """Bytes of a stored model's trainable parameters, computed from its definition without building it.

    Zoo and spec models keep their parameters in float32 under every ``dtype`` (autocast); their counts come from
    the analytic spec validation (``memtune.profiler.spec``) or ``gpt_param_count``, the numbers the built chain has. An
    exported program's are its stored ``parameter_bytes``.
    """
    definition = model.definition
    if model.kind == "exported":
        return int(definition["exported"]["parameter_bytes"])
    if model.kind == "zoo":
        name, params = str(definition["zoo"]), definition.get("params") or {}
        if name == "gpt":
            return FLOAT_BYTES * gpt_param_count(ZOO["gpt"].resolve(params))
        return FLOAT_BYTES * validate_spec(image_spec(name, params), _UNBOUNDED_IMAGE).param_count
    return FLOAT_BYTES * validate_spec(definition["spec"]).param_count


def budget_floor(model: ModelRecord, optimizer: str) -> int:
    """The fewest bytes any plan of ``model`` can peak at: its parameters, their gradients and the optimizer's
    state, resident at the end of every backward whatever the plan (NOTE [ Simulator memory accounting ] in
    ``memtune.tuner.simulator``). Activations and the input come on top, so a budget at the floor is still too small;
    below it no plan can fit, and a search would only spend its trials finding that out."""
    return int(parameter_bytes(model) * (2.0 + OPTIMIZERS[optimizer]))


def _check_floor(model: ModelRecord, body: JobCreate, budget_bytes: int, headroom: float) -> None:
    floor = budget_floor(model, body.optimizer)
    searched = search_budget(budget_bytes, headroom)
    if searched >= floor:
        return
    kept = f" less the headroom {headroom:g} ({searched} B)" if headroom else ""
    raise ProblemError(
        422,
        "budget_below_floor",
        "Budget below the model's floor",
        f"budget {body.budget!r} ({budget_bytes} B){kept} is below the {floor} bytes ({format_bytes(floor)}) that "
        f"model {model.id}'s parameters, their gradients and the {body.optimizer!r} optimizer's state take whatever "
        "the plan: no plan can fit; ask for more memory",
        field="budget",
        floor_bytes=floor,
        budget_bytes=budget_bytes,
        search_budget_bytes=searched,
    )


def rate_limit_headers(settings: Settings, active: int, recent: int, oldest_recent: datetime | None) -> dict[str, str]:
    """The IETF RateLimit header fields of a key's two job limits (NOTE [ RateLimit fields ]): with ``active`` jobs
    queued or running and ``recent`` submitted in the last hour, the oldest of them at ``oldest_recent``.

    # NOTE [ RateLimit fields ]
    Job submissions carry the RateLimit fields of the IETF draft (draft-ietf-httpapi-ratelimit-headers), on every
    202 and on the 429s of the two per-key limits: ``RateLimit-Policy: "active";q=10, "hourly";q=60;w=3600``
    (each limit's quota, and the hourly one's window in seconds) and ``RateLimit: "active";r=…, "hourly";r=…;t=…``
    (what is left of each now; ``t``, the seconds until the oldest submission of the hour leaves the window, where
    one does). The trials limit is per request, not a quota, and carries none.
    """
    quota, hour = settings.max_active_jobs_per_key, settings.max_jobs_per_hour_per_key
    policy = f'"active";q={quota}, "hourly";q={hour};w={HOUR_S}'
    hourly = f'"hourly";r={max(0, settings.max_jobs_per_hour_per_key - recent)}'
    if oldest_recent is not None:
        left = (oldest_recent + timedelta(seconds=HOUR_S) - utcnow()).total_seconds()
        hourly += f";t={max(0, math.ceil(left))}"
    active_left = max(0, settings.max_active_jobs_per_key - active)
    return {"RateLimit-Policy": policy, "RateLimit": f'"active";r={active_left}, {hourly}'}


def _check_limits(jobs: JobRepository, owner: str, trials: int, settings: Settings) -> None:
    """Refuse a new job of ``owner`` over its key's limits (NOTE [ Job limits and ownership ])."""
    if trials > settings.max_trials_per_job:
        # no Retry-After: waiting never makes this request acceptable (see the NOTE)
        raise ProblemError(
            429,
            "trials_limit",
            "Too many trials for one job",
            f"a job may ask for at most {settings.max_trials_per_job} trials (MEMTUNE_MAX_TRIALS_PER_JOB), not "
            f"{trials}; submit it with trials <= {settings.max_trials_per_job}",
            limit=settings.max_trials_per_job,
            setting="MEMTUNE_MAX_TRIALS_PER_JOB",
        )
    now = utcnow()
    usage = jobs.usage(owner, now - timedelta(seconds=HOUR_S))
    fields = rate_limit_headers(settings, usage.active, usage.recent, usage.oldest_recent)
    if usage.active >= settings.max_active_jobs_per_key:
        raise ProblemError(
            429,
            "too_many_active_jobs",
            "Too many active jobs",
            f"API key {owner!r} has {usage.active} jobs queued or running, its limit "
            f"(MEMTUNE_MAX_ACTIVE_JOBS_PER_KEY); submit again when one has finished, or cancel one",
            headers={"Retry-After": str(ACTIVE_RETRY_AFTER_S), **fields},
            limit=settings.max_active_jobs_per_key,
            setting="MEMTUNE_MAX_ACTIVE_JOBS_PER_KEY",
        )
    if usage.recent >= settings.max_jobs_per_hour_per_key:
        assert usage.oldest_recent is not None
        frees_at = usage.oldest_recent + timedelta(seconds=HOUR_S)
        wait = max(1, math.ceil((frees_at - now).total_seconds()))
        raise ProblemError(
            429,
            "hourly_job_limit",
            "Too many jobs this hour",
            f"API key {owner!r} submitted {usage.recent} jobs in the last hour, its limit "
            f"(MEMTUNE_MAX_JOBS_PER_HOUR_PER_KEY); the next one is accepted in {wait} s",
            headers={"Retry-After": str(wait), **fields},
            limit=settings.max_jobs_per_hour_per_key,
            setting="MEMTUNE_MAX_JOBS_PER_HOUR_PER_KEY",
        )


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobPublic,
    responses={
        404: {"description": "the model named by id does not exist"},
        409: {"description": "Idempotency-Key reused for a different request"},
        415: {"description": "the body is not sent as application/json"},
        422: {
            "description": "unknown GPU, bad budget, a budget below what the model's parameters, gradients and "
            "optimizer state alone take (budget_below_floor, names floor_bytes), bad model spec (names the layer "
            "and field), a batch other than an exported program's (batch_mismatch), an exported program with a "
            "tensor larger than the GPU's memory (tensor_too_large), a field of the wrong type or out of range"
        },
        429: {
            "description": "over a per-key limit: active jobs or jobs per hour (with Retry-After), trials per job "
            "(names the limit)"
        },
    },
)
def create_job(
    body: JobCreate,
    db: DbDep,
    settings: SettingsDep,
    key: WriteKey,
    _json: JsonBody,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic:
    """Queue a tuning job; 202 with ``Location: /v1/jobs/{id}``.

    With ``validate_top_k`` > 0 the worker then measures that many of the best plans on a GPU of the job's
    type and stores them labeled ``measured`` beside the simulated ones (``validation`` on the job says
    how it went: done, or skipped and why).

    ``headroom`` (default: the GPU type's calibration: the one stored in the service's database, else this host's
    file, else the committed one, else 0; ``memtune.api.service._calibration_lookup``) is resolved here and stored on
    the job with where it came from (``headroom_source``), which the job shows: the worker searches plans against
    ``budget_bytes * (1 - headroom)`` while the job's ``budget_bytes`` stays the budget asked for. A budget that
    leaves less than the model's parameters, gradients and optimizer state need is refused (``budget_floor``).

    ``compile`` (``auto``, ``on``, ``off``) says whether plans may compile the whole model (NOTE [ Compiler points in
    the service ] in ``memtune.api.service.worker``). Nothing is refused for it here: whether points can be had is the
    worker's to find out (a worker with a GPU of the type measures them), and ``compile_note`` on the job says what it
    found.

    The job belongs to the calling key, which is held to its limits (NOTE [ Job limits and ownership ]): 429.
    """
    request_hash = _request_hash(body)
    for attempt in (0, 1):  # a concurrent identical model create or idempotent retry: read the winner
        try:
            with db.session() as s:
                KeyRepository(s).lock(key.id)  # first: the key's submissions are counted one at a time
                jobs = JobRepository(s)
                replay = idempotency_key is not None and jobs.find_by_idempotency_key(key.name, idempotency_key)
                gpu = resolve_gpu(s, body.gpu)
                budget_bytes = parse_budget(body.budget, gpu.gpu.memory_bytes)
                headroom, headroom_source = job_headroom(s, gpu.gpu.key, body.headroom)
                ref = body.model
                if ref.id is not None:
                    model = ModelRepository(s).get(ref.id)
                    check_batch(model, body.batch)
                    check_tensor_sizes(model, gpu.gpu.key, gpu.gpu.memory_bytes)
                elif ref.zoo is not None:
                    model, _ = store_zoo_model(s, ref.zoo, ref.params)
                else:
                    assert ref.spec is not None
                    model, _ = store_spec_model(s, ref.spec)
                if not replay:  # a replay answers with its stored job (or 409 for another request) below
                    _check_floor(model, body, budget_bytes, headroom)
                    _check_limits(jobs, key.name, body.trials, settings)
                job, created = jobs.create(
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
                    compile=body.compile,
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
    with db.session() as s:  # NOTE [ RateLimit fields ]: what is left after this submission
        usage = JobRepository(s).usage(key.name, utcnow() - timedelta(seconds=HOUR_S))
    response.headers.update(rate_limit_headers(settings, usage.active, usage.recent, usage.oldest_recent))
    return job_public(job)


@router.get("", response_model=JobsPublic)
def list_jobs(
    db: DbDep,
    settings: SettingsDep,
    _read: ReadAccess,
    state: Annotated[str | None, Query(pattern="^(queued|running|succeeded|failed|cancelled)$")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> JobsPublic:
    """Recent jobs, newest first; a queued one that no live worker serves says so (``waiting``)."""
    with db.session() as s:
        jobs = JobRepository(s).list_all(state=state, limit=limit)
        unserved = WorkerRepository(s).unserved(settings.stale_after_s)
    return JobsPublic(data=[job_public(j, unserved) for j in jobs], count=len(jobs))


@router.get("/{job_id}", response_model=JobPublic)
def get_job(job_id: str, db: DbDep, settings: SettingsDep, _read: ReadAccess) -> JobPublic:
    """A job: state, progress (trials done / total, best so far), error, timestamps; a queued one that no live
    worker serves says so (``waiting``)."""
    with db.session() as s:
        job = JobRepository(s).get(job_id)
        return job_public(job, WorkerRepository(s).unserved(settings.stale_after_s) if job.state == "queued" else ())


@router.get("/{job_id}/results", response_model=ResultsPublic)
def job_results(job_id: str, db: DbDep, _read: ReadAccess, plans: Annotated[bool, Query()] = False) -> ResultsPublic:
    """The plans a job stored (baselines, the Optuna best, Pareto points), fastest first; measured rows (if the
    job validated plans on the GPU) are listed with the simulated ones, labeled by ``source``."""
    with db.session() as s:
        JobRepository(s).get(job_id)
        results = ResultRepository(s).for_job(job_id)
    return ResultsPublic(data=[result_public(r, with_plan=plans) for r in results], count=len(results))


@router.post(
    "/{job_id}/cancel",
    response_model=JobPublic,
    responses={
        403: {"description": "the job belongs to another API key, and this one is no admin key"},
        409: {"description": "job already finished"},
    },
)
def cancel_job(job_id: str, db: DbDep, settings: SettingsDep, key: WriteKey) -> JobPublic:
    """Cancel a queued job at once, or ask the worker of a running one to stop (it keeps what it found).

    Only the key that submitted the job (its ``owner``) or an admin key (``MEMTUNE_ADMIN_KEYS``) may: 403 for others.
    """
    with db.session() as s:
        jobs = JobRepository(s)
        job = jobs.get(job_id)
        if job.owner != key.name and not is_admin(settings, key):
            raise ProblemError(
                403,
                "not_job_owner",
                "Not the job's owner",
                f"job {job_id} was submitted with API key {job.owner!r}; only that key or an admin key "
                f"(MEMTUNE_ADMIN_KEYS) may cancel it, not {key.name!r}",
                owner=job.owner,
            )
        return job_public(jobs.request_cancel(job_id))


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
