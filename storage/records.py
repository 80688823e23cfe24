"""Frozen records the storage package hands out (ORM rows never leave it). Times are UTC, sizes bytes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from profiler.profile import Profile

__all__ = [
    "TERMINAL_STATES",
    "ApiKey",
    "Claim",
    "GpuType",
    "Job",
    "JobState",
    "ModelRecord",
    "ProfileRecord",
    "Result",
    "ResultIn",
]

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(frozen=True)
class GpuType:
    """A GPU type's structured identity; ``key`` is its stable short name (``h200``)."""

    key: str
    name: str
    compute_capability: str | None
    sm_count: int | None
    memory_bytes: int
    pcie_gen: int | None
    pcie_width: int | None
    driver: str | None
    cudnn_version: str | None
    identity_hash: str


@dataclass(frozen=True)
class ModelRecord:
    """A stored model: ``definition`` is ``{"zoo": name, "params": {...}}`` or ``{"spec": {...}}``."""

    id: str
    name: str
    kind: Literal["zoo", "spec"]
    content_hash: str
    definition: dict[str, Any]
    n_stages: int | None
    created_at: datetime


@dataclass(frozen=True)
class ProfileRecord:
    """A stored profile; ``profile()`` parses its JSON."""

    id: int
    model_id: str
    gpu_key: str
    batch: int
    dtype: str
    source: str
    profile_json: str
    created_at: datetime

    def profile(self) -> Profile:
        return Profile.from_json(self.profile_json)


@dataclass(frozen=True)
class Job:
    """A tuning job and its progress. ``budget_bytes`` is the resolved budget; ``trials`` the target count."""

    id: str
    model_id: str
    gpu_key: str
    batch: int
    dtype: str
    budget_text: str
    budget_bytes: int
    trials: int
    mode: str
    optimizer: str
    state: JobState
    trials_done: int
    best_name: str | None
    best_step_ms: float | None
    best_peak_bytes: int | None
    unconstrained_step_ms: float | None
    unconstrained_peak_bytes: int | None
    error: str | None
    owner: str
    idempotency_key: str | None
    request_hash: str
    study_name: str
    profile_id: int | None
    worker_id: str | None
    attempts: int
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    heartbeat_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class Claim:
    """One claim of a job by a worker (attempt numbers start at 1)."""

    job_id: str
    worker_id: str
    attempt: int
    reclaimed_from: str | None
    claimed_at: datetime


@dataclass(frozen=True)
class ResultIn:
    """A plan to store for a job. ``kind``: ``baseline`` (a policy), ``optuna`` (the best) or ``pareto``."""

    name: str
    kind: Literal["baseline", "optuna", "pareto"]
    plan: dict[str, Any]
    step_ms: float
    peak_bytes: int
    feasible: bool
    source: Literal["simulated", "measured"] = "simulated"


@dataclass(frozen=True)
class Result:
    """A stored plan result with its numbers (ms, bytes) and where they came from."""

    id: int
    job_id: str
    model_id: str
    gpu_key: str
    batch: int
    dtype: str
    budget_bytes: int
    name: str
    kind: str
    plan: dict[str, Any]
    step_ms: float
    peak_bytes: int
    feasible: bool
    pareto_optimal: bool
    source: str
    profile_id: int | None
    created_at: datetime


@dataclass(frozen=True)
class ApiKey:
    """An API key's public facts (the secret itself is shown once, at creation, and never stored)."""

    id: int
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None
