"""Jobs: create (idempotently), claim atomically, heartbeat, report progress, finish, cancel.

# NOTE [ Job claims ]
A worker claims the oldest job it can serve that is ``queued``, or ``running`` with a heartbeat older
than ``stale_after_s`` (its worker died). The claim is atomic:

* PostgreSQL: ``SELECT … FOR UPDATE SKIP LOCKED`` picks and locks one candidate row; concurrent
  claimers skip it and take the next one.
* SQLite: one ``UPDATE … WHERE id = (SELECT … LIMIT 1) AND <claimable> RETURNING`` statement; SQLite
  runs it under its single writer lock, so two claimers can never both match the same row.

Either way ``attempts`` is incremented and a ``mt_job_claims`` row ``(job_id, attempt)`` is written in
the same transaction; that pair is unique, so an attempt can never be claimed twice. Every later write
of the worker (heartbeat, progress, finish) is conditional on ``worker_id`` and ``attempts`` still being
its own: a worker whose job was reclaimed learns it (``JobLease.lost``) and stops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from memtune.storage._storage_errors import ConflictError, IdempotencyConflictError, NotFoundError
from memtune.storage.orm import JobClaimRow, JobRow, utcnow
from memtune.storage.records import (
    COMPILE_CHOICES,
    HEADROOM_SOURCES,
    TERMINAL_STATES,
    VALIDATION_STATES,
    Claim,
    CompileChoice,
    HeadroomSource,
    Job,
    ValidationState,
)
from memtune.storage.repositories._convert import to_claim, to_job

__all__ = ["JobLease", "JobRepository", "LeaseStatus", "OwnerUsage"]


@dataclass(frozen=True)
class JobLease:
    """A worker's hold on one attempt of a job."""

    job_id: str
    worker_id: str
    attempt: int


@dataclass(frozen=True)
class LeaseStatus:
    """Answer to a heartbeat or progress write: ``lost`` (reclaimed by another worker) or ``cancel``."""

    lost: bool
    cancel: bool


@dataclass(frozen=True)
class OwnerUsage:
    """One API key's jobs, for its limits: ``active`` (queued or running), and those created since a time
    (``recent``, the oldest of them created at ``oldest_recent``; None when there are none)."""

    active: int
    recent: int
    oldest_recent: datetime | None


def _check_headroom_source(source: str | None) -> None:
    if source is not None and source not in HEADROOM_SOURCES:
        raise ValueError(f"unknown headroom source {source!r}; one of {sorted(HEADROOM_SOURCES)}")


class JobRepository:
    """Jobs in ``mt_jobs`` and their claims in ``mt_job_claims``. See NOTE [ Job claims ]."""

    def __init__(self, session: Session) -> None:
        self.s = session

    # ---- create / read -----------------------------------------------------------------------------
    def create(
        self,
        *,
        model_id: str,
        gpu_key: str,
        batch: int,
        dtype: str,
        budget_text: str,
        budget_bytes: int,
        trials: int,
        mode: str,
        optimizer: str,
        owner: str,
        request_hash: str,
        idempotency_key: str | None = None,
        validate_top_k: int = 0,
        validate_iters: int = 6,
        headroom: float = 0.0,
        headroom_source: HeadroomSource | None = None,
        compile: CompileChoice = "auto",
    ) -> tuple[Job, bool]:
        """Queue a job; ``(job, created)``. With an ``idempotency_key`` already used by ``owner``, the
        earlier job is returned (``created`` False) when the request is the same, else ``ConflictError``.

        ``validate_top_k`` plans (0 = none) are to be measured on the GPU after the search, with
        ``validate_iters`` timed steps each. ``headroom`` is the fraction of ``budget_bytes`` the search keeps
        free (plans must fit ``budget_bytes * (1 - headroom)``), resolved by the caller: stored as given, with
        ``headroom_source``, where the caller found it. ``compile`` says whether plans may compile the whole model
        (``memtune.storage.records.CompileChoice``)."""
        _check_headroom_source(headroom_source)
        if compile not in COMPILE_CHOICES:
            raise ValueError(f"unknown compile choice {compile!r}; one of {sorted(COMPILE_CHOICES)}")
        if idempotency_key is not None:
            existing = self.find_by_idempotency_key(owner, idempotency_key)
            if existing is not None:
                if existing.request_hash != request_hash:
                    raise IdempotencyConflictError(
                        f"Idempotency-Key {idempotency_key!r} was used for a different request "
                        f"(job {existing.id}); use a new key for a new job"
                    )
                return existing, False
        job_id = uuid4().hex
        now = utcnow()
        row = JobRow(
            id=job_id,
            model_id=model_id,
            gpu_key=gpu_key,
            batch=batch,
            dtype=dtype,
            budget_text=budget_text,
            budget_bytes=budget_bytes,
            trials=trials,
            mode=mode,
            optimizer=optimizer,
            validate_top_k=validate_top_k,
            validate_iters=validate_iters,
            headroom=headroom,
            headroom_source=headroom_source,
            compile=compile,
            state="queued",
            trials_done=0,
            owner=owner,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            study_name=f"memtune-job-{job_id}",
            attempts=0,
            cancel_requested=False,
            created_at=now,
            updated_at=now,
        )
        self.s.add(row)
        self.s.flush()
        return to_job(row), True

    def find_by_idempotency_key(self, owner: str, key: str) -> Job | None:
        row = self.s.scalar(select(JobRow).where(JobRow.owner == owner, JobRow.idempotency_key == key))
        return None if row is None else to_job(row)

    def usage(self, owner: str, since: datetime) -> OwnerUsage:
        """How many jobs ``owner`` has queued or running, and has created at or after ``since`` (any state)."""
        active = self.s.scalar(
            select(func.count())
            .select_from(JobRow)
            .where(JobRow.owner == owner, JobRow.state.in_(("queued", "running")))
        )
        recent, oldest = self.s.execute(
            select(func.count(), func.min(JobRow.created_at)).where(JobRow.owner == owner, JobRow.created_at >= since)
        ).one()
        return OwnerUsage(active=int(active or 0), recent=int(recent or 0), oldest_recent=oldest)

    def get(self, job_id: str) -> Job:
        row = self.s.get(JobRow, job_id)
        if row is None:
            raise NotFoundError(f"job {job_id!r} does not exist")
        return to_job(row)

    def list_all(self, *, state: str | None = None, limit: int = 100) -> list[Job]:
        q = select(JobRow).order_by(JobRow.created_at.desc()).limit(limit)
        if state is not None:
            q = q.where(JobRow.state == state)
        return [to_job(r) for r in self.s.scalars(q)]

    def claims(self, job_id: str) -> list[Claim]:
        q = select(JobClaimRow).where(JobClaimRow.job_id == job_id).order_by(JobClaimRow.attempt)
        return [to_claim(r) for r in self.s.scalars(q)]

    # ---- claim -------------------------------------------------------------------------------------
    def claim(
        self,
        worker_id: str,
        *,
        gpu_keys: Sequence[str] | None = None,
        stale_after_s: float = 30.0,
    ) -> tuple[Job, JobLease] | None:
        """Atomically claim the oldest claimable job (see NOTE [ Job claims ]); None when there is none.

        Args:
            worker_id: the claiming worker's id (recorded on the job and in the claim row).
            gpu_keys: GPU types this worker serves; None for any.
            stale_after_s: seconds without a heartbeat after which a running job is reclaimed.
        """
        now = utcnow()
        cutoff = now - timedelta(seconds=stale_after_s)
        claimable = or_(
            JobRow.state == "queued",
            and_(JobRow.state == "running", JobRow.heartbeat_at < cutoff),
        )
        conds: list[Any] = [claimable]
        if gpu_keys is not None:
            conds.append(JobRow.gpu_key.in_(list(gpu_keys)))
        values: dict[str, Any] = {
            "state": "running",
            "worker_id": worker_id,
            "attempts": JobRow.attempts + 1,
            "heartbeat_at": now,
            "started_at": func.coalesce(JobRow.started_at, now),
            "updated_at": now,
        }
        if self.s.get_bind().dialect.name == "postgresql":
            q = (
                select(JobRow.id)
                .where(*conds)
                .order_by(JobRow.created_at, JobRow.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            )
            job_id = self.s.scalar(q)
            if job_id is None:
                return None
            self.s.execute(update(JobRow).where(JobRow.id == job_id).values(**values))
        else:
            pick = select(JobRow.id).where(*conds).order_by(JobRow.created_at, JobRow.id).limit(1)
            stmt = (
                update(JobRow)
                .where(JobRow.id == pick.scalar_subquery(), *conds)
                .values(**values)
                .returning(JobRow.id)
                .execution_options(synchronize_session=False)
            )
            job_id = self.s.scalar(stmt)
            if job_id is None:
                return None
        row = self.s.get(JobRow, job_id, populate_existing=True)
        assert row is not None
        previous = self.s.scalar(
            select(JobClaimRow.worker_id).where(JobClaimRow.job_id == job_id, JobClaimRow.attempt == row.attempts - 1)
        )
        self.s.add(
            JobClaimRow(
                job_id=job_id,
                worker_id=worker_id,
                attempt=row.attempts,
                reclaimed_from=previous,
            )
        )
        self.s.flush()
        return to_job(row), JobLease(job_id=job_id, worker_id=worker_id, attempt=row.attempts)

    # ---- worker writes (conditional on the lease) --------------------------------------------------
    def _held(self, lease: JobLease) -> Any:
        return and_(
            JobRow.id == lease.job_id,
            JobRow.worker_id == lease.worker_id,
            JobRow.attempts == lease.attempt,
            JobRow.state == "running",
        )

    def _lease_write(self, lease: JobLease, values: dict[str, Any]) -> LeaseStatus:
        values = {**values, "heartbeat_at": utcnow(), "updated_at": utcnow()}
        res = self.s.execute(
            update(JobRow).where(self._held(lease)).values(**values).execution_options(synchronize_session=False)
        )
        if res.rowcount != 1:  # type: ignore[attr-defined]
            return LeaseStatus(lost=True, cancel=False)
        cancel = self.s.scalar(select(JobRow.cancel_requested).where(JobRow.id == lease.job_id))
        return LeaseStatus(lost=False, cancel=bool(cancel))

    def heartbeat(self, lease: JobLease) -> LeaseStatus:
        """Record that the worker is alive; says whether the lease was lost or a cancel was asked."""
        return self._lease_write(lease, {})

    def progress(
        self,
        lease: JobLease,
        *,
        trials_done: int,
        best_name: str | None = None,
        best_step_ms: float | None = None,
        best_peak_bytes: int | None = None,
    ) -> LeaseStatus:
        """Record trials done and the best feasible plan so far (ms, bytes); also a heartbeat."""
        values: dict[str, Any] = {"trials_done": trials_done}
        if best_step_ms is not None:
            values.update(
                best_name=best_name,
                best_step_ms=best_step_ms,
                best_peak_bytes=best_peak_bytes,
            )
        return self._lease_write(lease, values)

    def set_profile(self, lease: JobLease, profile_id: int) -> LeaseStatus:
        return self._lease_write(lease, {"profile_id": profile_id})

    def set_headroom(self, lease: JobLease, headroom: float, source: HeadroomSource) -> LeaseStatus:
        """Record the headroom the job will be searched at (a worker that calibrated its GPU type before the search:
        NOTE [ Calibrations in the service ] in ``memtune.api.service.worker``); also a heartbeat."""
        _check_headroom_source(source)
        if not 0.0 <= headroom < 1.0:
            raise ValueError(f"headroom must be in [0, 1) (a share of the budget), got {headroom}")
        return self._lease_write(lease, {"headroom": headroom, "headroom_source": source})

    def set_compile_note(self, lease: JobLease, note: str) -> LeaseStatus:
        """Record what the worker does or did about the job's compiler points (measuring them, why none are used:
        NOTE [ Compiler points in the service ] in ``memtune.api.service.worker``); also a heartbeat."""
        return self._lease_write(lease, {"compile_note": note})

    def set_validation(
        self,
        lease: JobLease,
        state: ValidationState,
        *,
        device: str | None = None,
        note: str | None = None,
    ) -> LeaseStatus:
        """Record where the job's measured validation stands (``state``, the device's name, a note saying
        what is being measured or why it was skipped); also a heartbeat."""
        if state not in VALIDATION_STATES:
            raise ValueError(f"unknown validation state {state!r}; one of {sorted(VALIDATION_STATES)}")
        values: dict[str, Any] = {"validation_state": state, "validation_note": note}
        if device is not None:
            values["validation_device"] = device
        return self._lease_write(lease, values)

    def finish(
        self,
        lease: JobLease,
        state: str,
        *,
        error: str | None = None,
        trials_done: int | None = None,
        best_name: str | None = None,
        best_step_ms: float | None = None,
        best_peak_bytes: int | None = None,
        unconstrained_step_ms: float | None = None,
        unconstrained_peak_bytes: int | None = None,
        validation_state: ValidationState | None = None,
        validation_device: str | None = None,
        validation_note: str | None = None,
        measured_unconstrained_step_ms: float | None = None,
        measured_unconstrained_peak_bytes: int | None = None,
        no_best: bool = False,
    ) -> bool:
        """Move the job to a terminal ``state``; False when the lease was lost (nothing written).

        The ``validation_*`` and ``measured_unconstrained_*`` values (ms, bytes) are written when given. ``no_best``:
        the job serves no plan, so the best its search reported so far is cleared."""
        if state not in TERMINAL_STATES:
            raise ValueError(f"finish() needs a terminal state {sorted(TERMINAL_STATES)}, got {state!r}")
        now = utcnow()
        values: dict[str, Any] = {
            "state": state,
            "error": error,
            "finished_at": now,
            "updated_at": now,
        }
        if trials_done is not None:
            values["trials_done"] = trials_done
        if best_step_ms is not None or no_best:
            values.update(
                best_name=best_name,
                best_step_ms=best_step_ms,
                best_peak_bytes=best_peak_bytes,
            )
        if unconstrained_step_ms is not None:
            values.update(
                unconstrained_step_ms=unconstrained_step_ms,
                unconstrained_peak_bytes=unconstrained_peak_bytes,
            )
        if validation_state is not None:
            if validation_state not in VALIDATION_STATES:
                raise ValueError(f"unknown validation state {validation_state!r}; one of {sorted(VALIDATION_STATES)}")
            values.update(validation_state=validation_state, validation_note=validation_note)
            if validation_device is not None:
                values["validation_device"] = validation_device
        if measured_unconstrained_step_ms is not None:
            values.update(
                measured_unconstrained_step_ms=measured_unconstrained_step_ms,
                measured_unconstrained_peak_bytes=measured_unconstrained_peak_bytes,
            )
        res = self.s.execute(
            update(JobRow).where(self._held(lease)).values(**values).execution_options(synchronize_session=False)
        )
        return res.rowcount == 1  # type: ignore[attr-defined, no-any-return]

    # ---- cancel ------------------------------------------------------------------------------------
    def request_cancel(self, job_id: str) -> Job:
        """Cancel a queued job at once; ask a running job's worker to stop. Finished jobs: ``ConflictError``."""
        now = utcnow()
        res = self.s.execute(
            update(JobRow)
            .where(JobRow.id == job_id, JobRow.state == "queued")
            .values(
                state="cancelled",
                cancel_requested=True,
                finished_at=now,
                updated_at=now,
            )
            .execution_options(synchronize_session=False)
        )
        if res.rowcount != 1:  # type: ignore[attr-defined]
            res = self.s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.state == "running")
                .values(cancel_requested=True, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            if res.rowcount != 1:  # type: ignore[attr-defined]
                job = self.get(job_id)
                raise ConflictError(f"job {job_id} is already {job.state}; only queued or running jobs cancel")
        row = self.s.get(JobRow, job_id, populate_existing=True)
        assert row is not None
        return to_job(row)
