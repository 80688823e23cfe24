"""SQLAlchemy 2 typed ORM rows. Table names carry the ``mt_`` prefix: Optuna's tables share the database.

Rows never leave the storage package: repositories turn them into the frozen records of
``memtune.storage.records``. Schema changes go through Alembic (``memtune/storage/migrations``); a unit test checks that
these rows and the migrated schema agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "ApiKeyRow",
    "Base",
    "CalibrationRow",
    "GpuTypeRow",
    "JobClaimRow",
    "JobRow",
    "LookupVersionRow",
    "ModelProgramRow",
    "ModelRow",
    "ProfileRow",
    "ResultRow",
    "UTCDateTime",
    "utcnow",
]


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware timestamp that always reads back as UTC (SQLite stores it without a zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTCDateTime column; use memtune.storage.orm.utcnow()")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """The declarative base of memtune's own tables."""


class GpuTypeRow(Base):
    """A GPU type: structured identity (never only a product string) and a stable short key."""

    __tablename__ = "mt_gpu_types"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    compute_capability: Mapped[str | None] = mapped_column(String(16))
    sm_count: Mapped[int | None] = mapped_column(Integer)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    pcie_gen: Mapped[int | None] = mapped_column(Integer)
    pcie_width: Mapped[int | None] = mapped_column(Integer)
    driver: Mapped[str | None] = mapped_column(String(64))
    cudnn_version: Mapped[str | None] = mapped_column(String(64))
    identity_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ModelRow(Base):
    """A network to tune: a zoo name with parameters, a JSON spec or an exported program, deduplicated by content
    hash (an exported program's archive lives in ``mt_model_programs``)."""

    __tablename__ = "mt_models"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    content_hash: Mapped[str] = mapped_column(String(64), unique=True)
    definition: Mapped[dict[str, Any]] = mapped_column(JSON)
    n_stages: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ModelProgramRow(Base):
    """The canonical ``.pt2`` archive of an exported model (``memtune.profiler.exported``: checked, parameters' values
    dropped),
    one per model, apart from ``mt_models`` so that listing models never reads archives."""

    __tablename__ = "mt_model_programs"

    model_id: Mapped[str] = mapped_column(ForeignKey("mt_models.id", ondelete="CASCADE"), primary_key=True)
    archive: Mapped[bytes] = mapped_column(LargeBinary)
    archive_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ProfileRow(Base):
    """A stored profile (``memtune.profiler._profile.Profile`` JSON) of one model on one GPU type."""

    __tablename__ = "mt_profiles"
    __table_args__ = (
        UniqueConstraint(
            "model_id",
            "gpu_key",
            "batch",
            "dtype",
            "source",
            name="uq_mt_profiles_lookup",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("mt_models.id", ondelete="CASCADE"))
    gpu_key: Mapped[str] = mapped_column(ForeignKey("mt_gpu_types.key", ondelete="RESTRICT"))
    batch: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(16))
    profile_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class JobRow(Base):
    """A tuning job: queued -> running -> succeeded | failed | cancelled, with progress and ownership.

    ``budget_bytes`` is the budget asked for; ``headroom`` the fraction of it kept free for the caching
    allocator, so the plans are searched against ``budget_bytes * (1 - headroom)`` (NOTE [ Headroom ] in
    ``memtune.tuner.search``), and ``headroom_source`` where it came from (``memtune.storage.records.HeadroomSource``).
    ``validate_top_k`` / ``validate_iters`` ask the worker to measure the top plans on the GPU; the
    ``validation_*`` columns say how that went and ``measured_unconstrained_*`` hold the unplanned step
    measured beside them (ms, bytes). ``compile`` (``auto``, ``on``, ``off``: ``memtune.storage.records.CompileChoice``)
    says whether plans may compile the whole model, ``compile_note`` what the worker did about it.
    """

    __tablename__ = "mt_jobs"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_mt_jobs_idempotency"),
        Index("ix_mt_jobs_claim", "state", "gpu_key", "created_at"),
        Index("ix_mt_jobs_owner_created", "owner", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("mt_models.id", ondelete="CASCADE"))
    gpu_key: Mapped[str] = mapped_column(String(64))
    batch: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    budget_text: Mapped[str] = mapped_column(String(64))
    budget_bytes: Mapped[int] = mapped_column(BigInteger)
    trials: Mapped[int] = mapped_column(Integer)
    mode: Mapped[str] = mapped_column(String(16))
    optimizer: Mapped[str] = mapped_column(String(16))
    headroom: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    headroom_source: Mapped[str | None] = mapped_column(String(16))
    compile: Mapped[str] = mapped_column(String(8), default="auto", server_default="auto")
    compile_note: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    best_name: Mapped[str | None] = mapped_column(String(100))
    best_step_ms: Mapped[float | None] = mapped_column(Float)
    best_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    unconstrained_step_ms: Mapped[float | None] = mapped_column(Float)
    unconstrained_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    validate_top_k: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    validate_iters: Mapped[int] = mapped_column(Integer, default=6, server_default="6")
    validation_state: Mapped[str | None] = mapped_column(String(16))
    validation_device: Mapped[str | None] = mapped_column(String(200))
    validation_note: Mapped[str | None] = mapped_column(Text)
    measured_unconstrained_step_ms: Mapped[float | None] = mapped_column(Float)
    measured_unconstrained_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    owner: Mapped[str] = mapped_column(String(100))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64))
    study_name: Mapped[str] = mapped_column(String(100))
    profile_id: Mapped[int | None] = mapped_column(ForeignKey("mt_profiles.id", ondelete="SET NULL"))
    worker_id: Mapped[str | None] = mapped_column(String(100))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class JobClaimRow(Base):
    """One claim of a job by a worker. ``(job_id, attempt)`` is unique: no attempt is claimed twice."""

    __tablename__ = "mt_job_claims"
    __table_args__ = (UniqueConstraint("job_id", "attempt", name="uq_mt_job_claims_attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("mt_jobs.id", ondelete="CASCADE"), index=True)
    worker_id: Mapped[str] = mapped_column(String(100))
    attempt: Mapped[int] = mapped_column(Integer)
    reclaimed_from: Mapped[str | None] = mapped_column(String(100))
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ResultRow(Base):
    """One plan found for a job: a baseline policy, the Optuna best, or a Pareto point.

    ``source`` is ``simulated`` or ``measured``. A measured row holds the GPU's numbers in ``step_ms`` /
    ``peak_bytes`` (``max_memory_allocated``) and the simulator's for the same plan in ``predicted_*``;
    ``reserved_peak_bytes`` and ``samples_per_s`` are measured only. ``alloc_retries`` is the allocator's retries
    per step under the budget's cap: predicted by the placement model for simulated rows (where
    ``allocator_ms``, their price, is part of ``step_ms``), counted on the GPU for measured ones.
    """

    __tablename__ = "mt_results"
    __table_args__ = (Index("ix_mt_results_lookup", "gpu_key", "model_id", "batch", "budget_bytes"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("mt_jobs.id", ondelete="CASCADE"), index=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("mt_models.id", ondelete="CASCADE"))
    gpu_key: Mapped[str] = mapped_column(String(64))
    batch: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    budget_bytes: Mapped[int] = mapped_column(BigInteger)
    name: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(String(16))
    plan: Mapped[dict[str, Any]] = mapped_column(JSON)
    step_ms: Mapped[float] = mapped_column(Float)
    peak_bytes: Mapped[int] = mapped_column(BigInteger)
    feasible: Mapped[bool] = mapped_column(Boolean)
    pareto_optimal: Mapped[bool] = mapped_column(Boolean, default=False)
    source: Mapped[str] = mapped_column(String(16))
    profile_id: Mapped[int | None] = mapped_column(ForeignKey("mt_profiles.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    predicted_step_ms: Mapped[float | None] = mapped_column(Float)
    predicted_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    reserved_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    samples_per_s: Mapped[float | None] = mapped_column(Float)
    alloc_retries: Mapped[float | None] = mapped_column(Float)
    allocator_ms: Mapped[float | None] = mapped_column(Float)


class ApiKeyRow(Base):
    """An API key for write requests. Only the SHA-256 of the key is stored; revocation is a timestamp."""

    __tablename__ = "mt_api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class CalibrationRow(Base):
    """A GPU type's calibration (``memtune.tuner.calibration``, its JSON object in ``data``), one per GPU type key, with
    who
    measured or sent it (NOTE [ Calibrations in the service ] in ``memtune.api.service.worker``)."""

    __tablename__ = "mt_calibrations"

    gpu_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    source: Mapped[str] = mapped_column(Text)
    measured_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WorkerRow(Base):
    """A worker process's heartbeat (NOTE [ Worker heartbeats ] in ``memtune.storage.repositories._workers``): which GPU
    types
    it serves (null: every one) and when it last said it is alive."""

    __tablename__ = "mt_workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    gpu_keys: Mapped[list[str] | None] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)


class LookupVersionRow(Base):
    """One row (``id`` 1): a counter raised in the same transaction as every write to the tables the service's
    lookups read (NOTE [ Lookup version ] in ``memtune.storage._lookup_version``)."""

    __tablename__ = "mt_lookup_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger, default=0)
