"""Frozen records the storage package hands out (ORM rows never leave it). Times are UTC, sizes bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from memtune.profiler import DeviceIdentity, Profile
from memtune.tuner.budget import search_budget

__all__ = [
    "COMPILE_CHOICES",
    "GPU_IDENTITY_FIELDS",
    "HEADROOM_SOURCES",
    "TERMINAL_STATES",
    "VALIDATION_STATES",
    "ApiKey",
    "CalibrationRecord",
    "Claim",
    "CompileChoice",
    "GpuType",
    "HeadroomSource",
    "Job",
    "JobState",
    "ModelKind",
    "ModelRecord",
    "ProfileRecord",
    "Result",
    "ResultIn",
    "ValidationState",
    "identity_hash",
]

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})

ValidationState = Literal["pending", "running", "done", "skipped", "failed", "cancelled"]
"""How a job's measured validation went (NOTE [ Measured validation ] in ``memtune.api.service.worker``):
``pending`` (asked, not started), ``running``, ``done`` (every chosen plan was run; some may have run
out of memory, the note says), ``skipped`` (not run: no CUDA device, another GPU type, nothing fits …),
``failed`` (an unexpected error; the simulated results stand), ``cancelled`` (the job was cancelled)."""
VALIDATION_STATES: frozenset[str] = frozenset({"pending", "running", "done", "skipped", "failed", "cancelled"})

HeadroomSource = Literal["request", "database", "user file", "committed", "none"]
"""Where a job's headroom came from: the request, or the GPU type's calibration found first (NOTE [ Calibrations in
the service ] in ``memtune.api.service.worker``): the service's ``database``, the API host's ``user file`` or
the ``committed`` one; ``none`` when the GPU type had no calibration (headroom 0)."""
HEADROOM_SOURCES: frozenset[str] = frozenset({"request", "database", "user file", "committed", "none"})

CompileChoice = Literal["auto", "on", "off"]
"""Whether a job's plans may compile the whole model (NOTE [ Whole-model compile ] in ``memtune.tuner._whole``; NOTE
[ Compiler points in the service ] in ``memtune.api.service.worker``): ``auto`` (the profile's compiler points are
candidates, measured first on a worker with a GPU of the job's type), ``on`` (as ``auto``, and the job fails where no
point can be
had), ``off`` (never: the points are left out)."""
COMPILE_CHOICES: frozenset[str] = frozenset({"auto", "on", "off"})


# NOTE [ GPU identity ]
# The fields that identify a GPU type are defined once, here: ``GpuType``'s fields before ``identity_hash`` (key, name,
# compute capability, SM count, memory bytes, PCIe generation and width, and for a measured type driver and cuDNN
# version), listed by ``GPU_IDENTITY_FIELDS``. The layers reuse them:
# * profiler: a profile's ``DeviceIdentity`` carries them among its measured facts; ``GpuType.from_identity`` is the one
#   conversion from it, and ``identity_hash`` hashes them but the key;
# * storage: ``GpuRepository.upsert`` writes a row from ``from_identity``'s record and ``to_gpu`` reads one back by the
#   record's fields; the columns of ``GpuTypeRow`` (``memtune.storage.orm``) are the migrated schema, written out there;
# * api: a roofline spec's type is ``GpuType.from_identity(spec_identity(spec))`` (``memtune.api.service._gpu_types``),
#   and ``memtune.api.service._views.gpu_public`` builds ``GpuPublic`` from ``identity_fields()``; ``GpuPublic``'s
# fields   are the published OpenAPI schema, written out in ``memtune.api.service.schemas``.
# tests/unit/service/test_gpu_identity.py holds those columns and that schema to this list. The GPU type of the CUDA
# device a process runs on is the key of ``memtune.tuner.measure.first_use.present_gpu``, for the command line and the
# service's worker alike.


@dataclass(frozen=True)
class GpuType:
    """A GPU type's structured identity (NOTE [ GPU identity ]); ``key`` is its stable short name (``h200``),
    ``memory_bytes`` in bytes, ``identity_hash`` the ``identity_hash`` of the fields before it."""

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

    @classmethod
    def from_identity(cls, identity: DeviceIdentity) -> GpuType:
        """The GPU type a profile's device identity describes (its bandwidths and torch version are not kept)."""
        return cls(**{f: getattr(identity, f) for f in GPU_IDENTITY_FIELDS}, identity_hash=identity_hash(identity))

    def identity_fields(self) -> dict[str, Any]:
        """``{field: value}`` of ``GPU_IDENTITY_FIELDS``: the identity without its hash."""
        return {f: getattr(self, f) for f in GPU_IDENTITY_FIELDS}


GPU_IDENTITY_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(GpuType) if f.name != "identity_hash")
"""The fields that identify a GPU type, in ``GpuType``'s order (NOTE [ GPU identity ])."""


def identity_hash(identity: DeviceIdentity) -> str:
    """SHA-256 (hex) of the identity fields but the key, in a canonical JSON form: stable across runs."""
    data = {f: getattr(identity, f) for f in GPU_IDENTITY_FIELDS if f != "key"}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


ModelKind = Literal["zoo", "spec", "exported"]


@dataclass(frozen=True)
class ModelRecord:
    """A stored model: ``definition`` is ``{"zoo": name, "params": {...}}``, ``{"spec": {...}}``, or for an exported
    program ``{"exported": {...}}`` (its inputs and sizes, ``memtune.profiler.exported.CheckedProgram.summary``, and the
    request's ``int_high``; the archive itself is read with ``ModelRepository.program``)."""

    id: str
    name: str
    kind: ModelKind
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
    """A tuning job and its progress. ``budget_bytes`` is the resolved budget; ``trials`` the target count.

    ``headroom`` is the fraction of the budget the search kept free for the caching allocator: plans are
    feasible when their simulated peak is at most ``search_budget_bytes`` = ``budget_bytes * (1 - headroom)``
    (NOTE [ Headroom ] in ``memtune.tuner.search``); ``budget_bytes`` stays the budget asked for (what results are
    stored and looked up under, and the cap that measured validation runs at). ``headroom_source`` says where
    the headroom came from (None for jobs stored before that was recorded).

    ``validate_top_k`` (0 = off) plans are to be measured on the GPU with ``validate_iters`` timed steps
    each; ``validation_state`` is None until the worker gets there (see ``ValidationState``).

    ``compile`` says whether the plans may compile the whole model (``CompileChoice``); ``compile_note`` what the
    worker did about it (measured the compiler points, or why none were used), None before it got there.
    """

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
    headroom: float
    headroom_source: HeadroomSource | None
    compile: CompileChoice
    compile_note: str | None
    state: JobState
    trials_done: int
    best_name: str | None
    best_step_ms: float | None
    best_peak_bytes: int | None
    unconstrained_step_ms: float | None
    unconstrained_peak_bytes: int | None
    validate_top_k: int
    validate_iters: int
    validation_state: ValidationState | None
    validation_device: str | None
    validation_note: str | None
    measured_unconstrained_step_ms: float | None
    measured_unconstrained_peak_bytes: int | None
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

    @property
    def search_budget_bytes(self) -> int:
        """The budget the plans were searched against: ``budget_bytes * (1 - headroom)``, as ``tune`` computes it."""
        return search_budget(self.budget_bytes, self.headroom)


@dataclass(frozen=True)
class CalibrationRecord:
    """A GPU type's stored calibration: ``data`` is its JSON object (``memtune.tuner.calibration.Calibration.from_data``
    reads it), ``source`` where its numbers came from, ``measured_by`` the worker (``host:pid:id``) that measured
    it or the API key that sent it."""

    gpu_key: str
    data: dict[str, Any]
    source: str
    measured_by: str | None
    created_at: datetime
    updated_at: datetime


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
    """A plan to store for a job. ``kind``: ``baseline`` (a policy), ``optuna`` (the best) or ``pareto``.

    A ``measured`` result carries the GPU's step ms and peak allocated bytes in ``step_ms``/``peak_bytes``
    and the simulator's numbers for the same plan in ``predicted_step_ms``/``predicted_peak_bytes``.
    """

    name: str
    kind: Literal["baseline", "optuna", "pareto"]
    plan: dict[str, Any]
    step_ms: float
    peak_bytes: int
    feasible: bool
    source: Literal["simulated", "measured"] = "simulated"
    predicted_step_ms: float | None = None
    predicted_peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    samples_per_s: float | None = None
    alloc_retries: float | None = None
    allocator_ms: float | None = None


@dataclass(frozen=True)
class Result:
    """A stored plan result with its numbers (ms, bytes) and where they came from (``source``).

    For ``measured`` results ``predicted_*`` hold the simulator's numbers for the same plan, and
    ``reserved_peak_bytes`` the caching allocator's peak (bytes) and ``samples_per_s`` the throughput.
    """

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
    predicted_step_ms: float | None = None
    predicted_peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    samples_per_s: float | None = None
    alloc_retries: float | None = None
    allocator_ms: float | None = None


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
