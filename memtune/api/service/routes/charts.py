"""``/v1/jobs/{id}/timeline`` and ``/v1/jobs/{id}/trials``: read-only data behind the job page's charts.

The timeline is recomputed by the simulator from the job's stored profile and its best stored plan (it is
not stored: a few milliseconds to simulate, hundreds of points to keep), priced with the calibration of the job's GPU
type as a worker would price it now (the database's, else this host's files: NOTE [ Calibrations in the service ] in
``memtune.api.service.worker``). The trials are read from the job's
Optuna study, which lives in the same database (``RDBStorage``); Optuna's public storage API is used, not
its tables.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Annotated

import optuna
from fastapi import APIRouter, Query, Request
from optuna.trial import TrialState

from memtune.api.service._calibration_lookup import effective_calibration
from memtune.api.service._deps import DbDep, ReadAccess
from memtune.api.service.schemas import TimelinePoint, TimelinePublic, TimelineSeries, TrialPoint, TrialsPublic
from memtune.storage import Database
from memtune.storage.database import engine_kwargs
from memtune.storage.records import Result
from memtune.storage.repositories import JobRepository, ProfileRepository, ResultRepository
from memtune.tuner import Action, Plan, SimResult, Simulator
from memtune.tuner.search import trial_fits

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

_storage_lock = threading.Lock()


def best_result(results: list[Result], name: str | None = None) -> Result | None:
    """The job's best plan as simulated: the feasible simulated result named ``name`` (the job's best, as its
    summary names it), else the fastest feasible simulated one (``results`` come fastest first; a policy can tie
    with the search's best). The timeline is a simulation, so a measured row of the same plan does not stand in."""
    feasible = [r for r in results if r.feasible and r.source == "simulated"]
    return next((r for r in feasible if r.name == name), feasible[0] if feasible else None)


def _series(name: str, sim: SimResult) -> TimelineSeries:
    return TimelineSeries(
        name=name,
        step_ms=sim.step_ms,
        peak_bytes=sim.peak_bytes,
        forward_ms=sim.forward_ms,
        base_bytes=sim.base_bytes,
        points=[TimelinePoint(t_ms=t, live_bytes=b, label=label) for t, b, label in sim.timeline],
    )


@router.get(
    "/{job_id}/timeline",
    response_model=TimelinePublic,
    responses={404: {"description": "unknown job"}},
)
def job_timeline(job_id: str, db: DbDep, _read: ReadAccess) -> TimelinePublic:
    """The simulated memory timeline (live bytes over ms) of the job's best plan and of the unplanned step; a job
    that exists but has no profile or no feasible plan yet answers with the series it has and why the rest is
    missing (not 404: the job is there)."""
    with db.session() as s:
        job = JobRepository(s).get(job_id)
        answer = functools.partial(TimelinePublic, job_id=job_id, state=job.state, budget_bytes=job.budget_bytes)
        if job.profile_id is None:
            return answer(
                best=None,
                unplanned=None,
                detail=f"job {job_id} is {job.state} and has no profile yet; the timeline follows once a worker "
                f"runs it (GET /v1/jobs/{job_id})",
            )
        record = ProfileRepository(s).get(job.profile_id)
        best = best_result(ResultRepository(s).for_job(job_id), job.best_name)
        calibration = effective_calibration(s, job.gpu_key).calibration
    profile = record.profile()
    sim = Simulator(profile, job.optimizer, calibration=calibration)
    unplanned = _series("none", sim.run(Plan.uniform(profile.n_stages, Action.KEEP), timeline=True))
    if best is None:
        return answer(
            best=None,
            unplanned=unplanned,
            detail=f"job {job_id} is {job.state} and has stored no plan within its budget of {job.budget_bytes} "
            "bytes yet; wait for it to finish, or submit a job with a larger budget",
        )
    plan = Plan.model_validate(best.plan)
    return answer(best=_series(best.name, sim.run(plan, timeline=True)), unplanned=unplanned)


def _optuna_storage(request: Request, db: Database) -> optuna.storages.RDBStorage:
    """One ``RDBStorage`` per app (its constructor checks the schema: too slow to repeat per request)."""
    with _storage_lock:
        storage: optuna.storages.RDBStorage | None = getattr(request.app.state, "optuna_storage", None)
        if storage is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(db.url, engine_kwargs=engine_kwargs(db.url))
            request.app.state.optuna_storage = storage
        return storage


@router.get(
    "/{job_id}/trials",
    response_model=TrialsPublic,
    responses={404: {"description": "unknown job"}},
)
def job_trials(
    job_id: str,
    request: Request,
    db: DbDep,
    _read: ReadAccess,
    limit: Annotated[int, Query(ge=1, le=100_000, description="at most this many trials, the first ones")] = 20_000,
) -> TrialsPublic:
    """The finished trials of the job's Optuna study (step ms, peak bytes, feasible); empty before it starts."""
    with db.session() as s:
        job = JobRepository(s).get(job_id)
    storage = _optuna_storage(request, db)
    try:
        study_id = storage.get_study_id_from_name(job.study_name)
    except KeyError:
        return TrialsPublic(data=[], count=0)
    trials = storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE,))
    data = []
    for t in trials:
        attrs = t.user_attrs
        if "step_ms" not in attrs or "peak_bytes" not in attrs:
            continue
        peak = int(attrs["peak_bytes"])
        policy = attrs.get("policy")
        data.append(
            TrialPoint(
                number=t.number,
                step_ms=float(attrs["step_ms"]),
                peak_bytes=peak,
                feasible=trial_fits(attrs, job.search_budget_bytes),  # as the search judged it (NOTE [ One objective ])
                policy=str(policy) if policy is not None else None,
            )
        )
        if len(data) >= limit:
            break
    return TrialsPublic(data=data, count=len(data))
