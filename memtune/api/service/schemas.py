"""Request and response bodies of the HTTP API (``…Create`` in, ``…Public`` out, ``…sPublic(data, count)``).

Request models reject unknown fields (``extra="forbid"``) and are strict (``strict=True``): a JSON value of the
wrong type is refused, never converted (``"batch": true`` or ``"batch": "8"`` is 422, not batch 1 or 8); an
integer is still accepted where a number is. Times are UTC ISO 8601, sizes bytes, durations milliseconds.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

__all__ = [
    "BestPlanPublic",
    "BestSoFar",
    "CalibrationPublic",
    "CalibrationPut",
    "CalibrationSummary",
    "GpuPublic",
    "GpusPublic",
    "HealthPublic",
    "JobCreate",
    "JobEvent",
    "JobProgress",
    "JobPublic",
    "JobsPublic",
    "LeaderboardPublic",
    "LeaderboardRow",
    "ModelCreate",
    "ModelPublic",
    "ModelRef",
    "ProfilePublic",
    "ResultPublic",
    "ResultsPublic",
    "TimelinePoint",
    "TimelinePublic",
    "TimelineSeries",
    "TrialPoint",
    "TrialsPublic",
    "Unconstrained",
    "ValidationPublic",
]

ParamValue = int | float | str | bool
JobStateName = Literal["queued", "running", "succeeded", "failed", "cancelled"]
ValidationStateName = Literal["pending", "running", "done", "skipped", "failed", "cancelled"]
HeadroomSourceName = Literal["request", "database", "user file", "committed", "none"]
CompileName = Literal["auto", "on", "off"]
CalibrationOriginName = Literal["database", "user file", "committed"]

_SPEC_EXAMPLE: dict[str, Any] = {
    "name": "small-cnn",
    "input_shape": [3, 32, 32],
    "layers": [
        {"type": "conv2d", "out_channels": 16, "kernel_size": 3, "padding": 1},
        {"type": "relu", "inplace": True},
        {"type": "maxpool2d", "kernel_size": 2},
        {"type": "flatten"},
        {"type": "linear", "out_features": 10},
    ],
}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _exactly_one(*keys: str) -> list[JsonValue]:
    """A JSON Schema ``oneOf``: exactly one of ``keys`` is present, and ``params`` only beside ``zoo`` (what the
    request models' validators enforce, stated in the OpenAPI document)."""
    branches: list[JsonValue] = []
    for key in keys:
        others = [k for k in keys if k != key] + ([] if key == "zoo" else ["params"])
        branches.append({"required": [key], "not": {"anyOf": [{"required": [k]} for k in others]}})
    return branches


def _no_nulls(data: Any, keys: tuple[str, ...]) -> Any:
    """Refuse an explicit JSON ``null`` for any of ``keys``: a member is given or left out, as the schema says."""
    if isinstance(data, dict):
        nulls = [k for k in keys if k in data and data[k] is None]
        if nulls:
            raise ValueError(f"{nulls[0]!r} is null: leave it out instead")
    return data


class ModelCreate(_Request):
    """A model to store: a zoo name with parameters, or a JSON spec (exactly one of ``zoo``, ``spec``)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"zoo": "vgg16", "params": {}}, {"spec": _SPEC_EXAMPLE}],
            "oneOf": _exactly_one("zoo", "spec"),
        },
    )

    zoo: str | SkipJsonSchema[None] = Field(default=None, max_length=100, description="a name from the model zoo")
    params: dict[str, ParamValue] | SkipJsonSchema[None] = Field(default=None, description="zoo parameters")
    spec: dict[str, Any] | SkipJsonSchema[None] = Field(
        default=None, description="a JSON model spec (memtune.profiler.spec)"
    )

    @model_validator(mode="before")
    @classmethod
    def _given(cls, data: Any) -> Any:
        return _no_nulls(data, ("zoo", "params", "spec"))

    @model_validator(mode="after")
    def _one(self) -> ModelCreate:
        if (self.zoo is None) == (self.spec is None):
            raise ValueError("give exactly one of 'zoo' (with optional 'params') or 'spec'")
        if self.spec is not None and self.params is not None:
            raise ValueError("'params' goes with 'zoo'; a spec carries its sizes in its layers")
        return self


class ModelRef(_Request):
    """The model of a job: ``{"zoo", "params"}``, ``{"spec"}`` or ``{"id"}`` of a stored model (exported programs are
    uploaded first, with ``POST /v1/models/exported``, then referred to by id)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": _exactly_one("zoo", "spec", "id")})

    zoo: str | SkipJsonSchema[None] = Field(default=None, max_length=100)
    params: dict[str, ParamValue] | SkipJsonSchema[None] = None
    spec: dict[str, Any] | SkipJsonSchema[None] = None
    id: str | SkipJsonSchema[None] = Field(default=None, max_length=64)

    @model_validator(mode="before")
    @classmethod
    def _given(cls, data: Any) -> Any:
        return _no_nulls(data, ("zoo", "params", "spec", "id"))

    @model_validator(mode="after")
    def _one(self) -> ModelRef:
        given = [k for k in ("zoo", "spec", "id") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of 'zoo' (with optional 'params'), 'spec' or 'id'")
        if self.params is not None and self.zoo is None:
            raise ValueError("'params' goes with 'zoo'")
        return self


class ModelPublic(BaseModel):
    """A stored model. ``id`` is derived from the content hash: identical definitions share it.

    An exported program's ``definition`` is ``{"exported": {...}}``: its batch, inputs (name, shape, dtype, and for
    integer inputs the bound ``high`` their values are drawn below), operator count, parameter count and bytes,
    the canonical archive's size and the torch that exported it."""

    id: str
    name: str
    kind: Literal["zoo", "spec", "exported"]
    content_hash: str
    definition: dict[str, Any]
    n_stages: int | None
    created_at: datetime


class JobCreate(_Request):
    """A tuning job: search plans for ``model`` at ``batch`` on GPU type ``gpu`` within ``budget``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": {"zoo": "vgg16", "params": {}},
                    "batch": 256,
                    "dtype": "float32",
                    "gpu": "h200",
                    "budget": "12GiB",
                    "trials": 300,
                    "mode": "fastest",
                }
            ]
        },
    )

    model: ModelRef
    batch: int = Field(ge=1, le=1 << 20, description="samples per training step")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    gpu: str = Field(min_length=1, max_length=100, description="GPU type key or name (GET /v1/gpus)")
    budget: Annotated[str, Field(max_length=64)] | int = Field(
        description="bytes with a unit ('12GiB', '800MB') or a fraction of the GPU's memory ('60% of gpu'); an "
        "integer is bytes, a string without a unit is refused (NOTE [ Budget grammar ])"
    )
    trials: int = Field(default=300, ge=1, le=100_000, description="Optuna trials, baselines included")
    mode: Literal["fastest", "pareto"] = "fastest"
    optimizer: Literal["sgd", "adam", "none"] = "sgd"
    validate_top_k: int = Field(
        default=0,
        ge=0,
        le=10,
        description="after the search, measure this many of the fastest distinct plans that fit on a GPU of "
        "this type and store them labeled 'measured' (0: off). Needs a worker with that GPU and optimizer "
        "'sgd'; otherwise the job succeeds with its simulated results and validation.state 'skipped'",
    )
    validate_iters: int = Field(
        default=6, ge=1, le=50, description="timed training steps per validated plan (after 3 warm-up steps)"
    )
    headroom: float | None = Field(
        default=None,
        ge=0.0,
        lt=0.5,
        description="fraction of the budget kept free for the CUDA caching allocator, in [0, 0.5): plans are "
        "searched against budget * (1 - headroom) and 'feasible' means fitting that; the job's budget stays "
        "the one asked for. null (default): the calibrated headroom of the GPU type (the service's calibration "
        "of it, GET /v1/gpus/{gpu}/calibration, else the committed one: 0.05 on the H200; 0 where none was "
        "measured). The job shows the headroom it was tuned at and where it came from",
    )
    compile: CompileName = Field(
        default="auto",
        description="whether plans may run the whole model compiled by torch.compile, priced by the profile's "
        "measured compiler points (a step at activation budgets 1, 0.5, 0.25); the best plan is then named "
        "'compiled whole <budget>' where such a point fits and beats every searched plan. 'auto' (default): the "
        "stored profile's points are candidates; a worker with a CUDA GPU of this type measures them first where "
        "the profile has none (kept with the profile for later jobs), and plans eager where compiling fails "
        "(compile_note says why). An exported program on such a worker also gets its candidate partitions into "
        "compiled regions measured and searched, and the fastest plan of all is served (rows named 'compiled "
        "regions depth <n> at <policy>'). 'on': as 'auto', but the job fails where no point can be had (no worker "
        "GPU of this type and none stored). 'off': plans compile nothing",
    )

    @field_validator("gpu", "budget")
    @classmethod
    def _as_sent(cls, value: str | int) -> str | int:
        """A GPU type or budget is taken as sent: spaces around it are refused, not trimmed."""
        if isinstance(value, str) and value != value.strip():
            raise ValueError(f"{value!r} has spaces around it; send {value.strip()!r}")
        return value


class BestSoFar(BaseModel):
    """The best feasible plan found so far (ms, bytes)."""

    name: str | None
    step_ms: float
    peak_bytes: int


class JobProgress(BaseModel):
    """Trials finished out of the target, and the best so far."""

    trials_done: int
    trials_total: int
    fraction: float = Field(ge=0, le=1)
    best: BestSoFar | None


class Unconstrained(BaseModel):
    """The step with no plan (PyTorch default): ms and peak bytes."""

    step_ms: float
    peak_bytes: int


class ValidationPublic(BaseModel):
    """Where a job's measured validation stands (jobs with ``validate_top_k`` > 0).

    ``state``: ``pending`` (not started), ``running``, ``done`` (the chosen plans ran; ``note`` names any
    that ran out of memory), ``skipped`` (``note`` says why: no CUDA device on the worker, another GPU type,
    no plan fits, optimizer not ``sgd``), ``failed`` (an unexpected error; the simulated results stand) or
    ``cancelled``. While running, ``note`` says which plan is being measured on which device.
    """

    state: ValidationStateName
    device: str | None = Field(description="the GPU the measured numbers come from")
    note: str | None
    unconstrained: Unconstrained | None = Field(description="the unplanned step as measured on that GPU")


class JobPublic(BaseModel):
    """A job, its state and progress."""

    id: str
    state: JobStateName
    model_id: str
    gpu: str
    batch: int
    dtype: str
    budget: str
    budget_bytes: int
    trials: int
    mode: str
    optimizer: str
    headroom: float = Field(
        default=0.0,
        description="fraction of the budget the search kept free: plans were searched against "
        "budget_bytes * (1 - headroom); results' 'feasible' is judged there",
    )
    headroom_source: HeadroomSourceName | None = Field(
        default=None,
        description="where the headroom came from: 'request', or the GPU type's calibration: 'database' (the "
        "service's, GET /v1/gpus/{gpu}/calibration), 'user file' or 'committed' (the API host's files), 'none' (no "
        "calibration: 0); null for jobs stored before it was recorded",
    )
    compile: CompileName = Field(
        default="auto",
        description="whether plans may compile the whole model or regions of it (as asked: 'auto', 'on' or "
        "'off'); a best plan named 'compiled whole <budget>' compiles the whole model, one named 'compiled regions "
        "…' its regions",
    )
    compile_note: str | None = Field(
        default=None,
        description="what the worker did about compiling: the compiler points it measured (or while measuring, "
        "which), or why none were used, then for an exported program each compiled-region profile's unplanned step "
        "and best plan and which plan was served; null before the worker got there",
    )
    validate_top_k: int = 0
    validate_iters: int = 6
    seed: int = Field(
        default=0,
        description="the search's random seed: that of `memtune tune` (--seed 0), so the same request gives the same "
        "plan from the command line and from a job",
    )
    waiting: str | None = Field(
        default=None,
        description="why a queued job does not start: no live worker serves its GPU type (NOTE [ Worker heartbeats ]); "
        "null otherwise",
    )
    progress: JobProgress
    unconstrained: Unconstrained | None = Field(description="the unplanned step as simulated")
    validation: ValidationPublic | None = Field(default=None, description="null when validate_top_k is 0")
    error: str | None
    owner: str
    attempts: int
    cancel_requested: bool
    profile_id: int | None
    study_name: str
    created_at: datetime
    started_at: datetime | None
    heartbeat_at: datetime | None
    finished_at: datetime | None


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class JobEvent(BaseModel):
    """One server-sent event of ``GET /v1/jobs/{id}/events`` (``event: progress`` or ``event: end``)."""

    event: Literal["progress", "end"]
    job: JobPublic


class ResultPublic(BaseModel):
    """One plan found by a job: a baseline policy, the Optuna best, or a Pareto point.

    ``source`` says where ``step_ms`` and ``peak_bytes`` come from: ``simulated`` (the cost model) or
    ``measured`` (median step and peak allocated bytes on a GPU of this type). A measured row carries the
    simulator's numbers for the same plan in ``predicted_*`` and the relative error of the prediction.
    """

    id: int
    job_id: str
    model_id: str
    gpu: str
    batch: int
    dtype: str
    budget_bytes: int
    name: str
    kind: Literal["baseline", "optuna", "pareto"]
    baseline: bool
    pareto_optimal: bool
    step_ms: float
    peak_bytes: int
    feasible: bool = Field(
        description="simulated rows: peak within the job's budget less its headroom (what the search required); "
        "measured rows: measured peak within the budget"
    )
    source: Literal["simulated", "measured"]
    profile_id: int | None
    created_at: datetime
    plan: dict[str, Any] | None = None
    predicted_step_ms: float | None = Field(default=None, description="measured rows: the simulated step ms")
    predicted_peak_bytes: int | None = Field(default=None, description="measured rows: the simulated peak bytes")
    step_error: float | None = Field(default=None, description="measured rows: (predicted - measured) / measured")
    peak_error: float | None = Field(default=None, description="measured rows: (predicted - measured) / measured")
    reserved_peak_bytes: int | None = Field(
        default=None, description="measured rows: peak bytes the caching allocator reserved"
    )
    samples_per_s: float | None = Field(default=None, description="measured rows: training throughput")
    alloc_retries: float | None = Field(
        default=None,
        description="allocator retries per step under the budget's cap: predicted by the placement model "
        "(simulated rows the search ranked by it) or counted on the GPU (measured rows)",
    )
    allocator_ms: float | None = Field(
        default=None, description="simulated rows: the predicted retries' price, ms, included in step_ms"
    )


class ResultsPublic(BaseModel):
    data: list[ResultPublic]
    count: int


class LeaderboardRow(ResultPublic):
    """A ranked result (rank 1 is the first in the requested order)."""

    rank: int


class LeaderboardPublic(BaseModel):
    data: list[LeaderboardRow]
    count: int = Field(description="rows matching the filters, over all pages")
    next_page_token: str | None = Field(description="pass as page_token for the next page; null on the last")


class CalibrationSummary(BaseModel):
    """A GPU type's calibration in short: the headroom new jobs get, where it was found, where its numbers came from."""

    headroom: float = Field(description="fraction of the budget new jobs keep free for the caching allocator")
    origin: CalibrationOriginName = Field(
        description="'database' (the service's), 'user file' or 'committed' (the API host's files)"
    )
    source: str = Field(description="where its numbers came from (command, GPU, date)")


class GpuPublic(BaseModel):
    """A GPU type: structured identity; ``sources`` says whether a roofline spec and/or stored profiles exist."""

    key: str
    name: str
    compute_capability: str | None
    sm_count: int | None
    memory_bytes: int
    pcie_gen: int | None
    pcie_width: int | None
    driver: str | None
    cudnn_version: str | None
    modeled: bool = Field(description="a roofline spec exists: jobs for it run on any worker")
    stored: bool = Field(description="profiles for it are stored")
    calibration: CalibrationSummary | None = Field(
        default=None, description="its calibration (GET /v1/gpus/{gpu}/calibration); null when it has none"
    )


class GpusPublic(BaseModel):
    data: list[GpuPublic]
    count: int


_Positive = Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)]
#: a measured over simulated step: a calibration outside [0.01, 100] is not a measurement of this simulator
_Scale = Annotated[float, Field(ge=0.01, le=100.0, strict=True, allow_inf_nan=False)]
#: a pinned copy rate, GB/s: from 0.01 (10 MB/s, slower than any host link) to 2,000 (no host link moves more)
_CopyRate = Annotated[float, Field(ge=0.01, le=2000.0, strict=True, allow_inf_nan=False)]
#: NCCL's bus rate of an all-reduce, GB/s: above 0.01 and at most 10,000 (more than any link of one host moves)
_BusRate = Annotated[float, Field(ge=0.01, le=10_000.0, strict=True, allow_inf_nan=False)]
#: a count of GPUs or ranks, as a calibration file's table keys it ("1", "2", … "1024")
_Count = Annotated[str, Field(pattern=r"^[1-9][0-9]{0,3}$")]
_Note = Annotated[str | None, Field(default=None, min_length=1, max_length=8000)]


class CalibrationPut(BaseModel):
    """A GPU type's calibration to store (``memtune calibrate``'s file, ``memtune.tuner.calibration``).

    Every field a calibration file has is listed, each within physical bounds; any other field is refused (a field
    the service stored unread would reach every worker as it came).
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "gpu": "h100",
                    "headroom": 0.17,
                    "compute_scale": {"resnet50-b64-float32": 0.7637},
                    "copy_gbps": {"d2h": 53.669, "h2d": 54.071},
                    "source": "memtune calibrate on an NVIDIA H100 80GB HBM3 (…)",
                }
            ]
        },
    )

    gpu: str = Field(min_length=1, max_length=64, description="the GPU type's key; must be the one in the path")
    headroom: float = Field(
        ge=0.0,
        le=0.5,
        strict=True,
        allow_inf_nan=False,
        description="fraction of the budget left free for the caching allocator, in [0, 0.5]",
    )
    remap_ms_per_gib: float | None = Field(
        default=None,
        ge=0.0,
        le=10_000.0,
        strict=True,
        allow_inf_nan=False,
        description="ms a capped step loses per GiB an allocator retry unmaps; null when not measured",
    )
    compute_scale: dict[Annotated[str, Field(max_length=200)], _Scale] = Field(
        default_factory=dict,
        max_length=1000,
        description="measured / simulated unconstrained step, in [0.01, 100], per measured profile, keyed "
        "model-bBATCH-dtype",
    )
    copy_gbps: dict[Literal["d2h", "h2d"], _CopyRate] | None = Field(
        default=None, description="pinned copy rates, GB/s in [0.01, 2000], by direction: {'d2h': …, 'h2d': …}"
    )
    source: str | None = Field(
        default=None,
        min_length=1,
        max_length=8000,
        description="where the numbers came from (command, GPU, date); default: the API key that sent it",
    )
    compute_source: _Note = Field(description="where compute_scale came from")
    remap_source: _Note = Field(description="where remap_ms_per_gib came from")
    shared_link_gbps: dict[_Count, dict[Literal["d2h", "h2d", "both_d2h", "both_h2d"], _CopyRate]] | None = Field(
        default=None,
        max_length=64,
        description="pinned copy rates per GPU, GB/s in [0.01, 2000], by GPUs copying at once ('1' required) and "
        "direction (NOTE [ Shared host link ] in memtune.tuner._ranks)",
    )
    allreduce_gbps: dict[_Count, _BusRate] | None = Field(
        default=None, max_length=64, description="NCCL all-reduce bus GB/s in [0.01, 10000] by ranks (>= 2)"
    )
    shared_link_source: _Note = Field(description="where shared_link_gbps and allreduce_gbps came from")


class CalibrationPublic(BaseModel):
    """A GPU type's calibration in effect, and where it was found (``origin``): the service's ``database`` (then
    ``measured_by`` and the times say who stored it and when), else the API host's ``user file``, else the
    ``committed`` one. ``data`` is its whole JSON object, fields the service does not read included."""

    gpu: str
    origin: CalibrationOriginName
    headroom: float = Field(description="fraction of the budget new jobs keep free for the caching allocator")
    remap_ms_per_gib: float | None
    compute_scale: dict[str, float]
    source: str
    measured_by: str | None = Field(
        default=None,
        description="database only: the worker (host:pid:id) that measured it, or the API key that sent it",
    )
    created_at: datetime | None = None
    updated_at: datetime | None = None
    data: dict[str, Any]


class BestPlanPublic(BaseModel):
    """The best stored plan for a GPU type, model, batch and budget, and how it was found.

    ``fallback``: ``exact`` (this budget on this GPU type), ``smaller_budget`` (the largest stored budget
    below the one asked), ``same_architecture`` (another GPU type with the same compute capability).
    Within the step that answers, a plan measured to fit on the GPU (``source`` ``measured``) is preferred
    to every simulated one; ``predicted_*`` then hold the simulator's numbers for it.
    """

    gpu: str = Field(description="the GPU type asked for")
    answered_by_gpu: str = Field(description="the GPU type whose result answers")
    model_id: str
    batch: int
    dtype: str
    budget_bytes: int = Field(description="the budget asked for")
    plan_budget_bytes: int = Field(description="the budget the plan was tuned for")
    fallback: Literal["exact", "smaller_budget", "same_architecture"]
    note: str
    name: str
    kind: str
    step_ms: float
    peak_bytes: int
    source: Literal["simulated", "measured"]
    predicted_step_ms: float | None = Field(default=None, description="measured plans: the simulated step ms")
    predicted_peak_bytes: int | None = Field(default=None, description="measured plans: the simulated peak bytes")
    job_id: str
    profile_id: int | None
    plan: dict[str, Any]


class MemoryCheckPublic(BaseModel):
    """The profile's unplanned step, measured against the simulator (NOTE [ Profile self-check ] in
    ``memtune.tuner._peak_check``); bytes above what was resident before the step."""

    measured_bytes: int
    reserved_bytes: int
    predicted_bytes: int
    gap: float = Field(description="(measured - predicted) / predicted: positive where the simulator under-predicts")
    reported: bool = Field(description="whether the gap is above 3%")
    text: str = Field(description="the check in words, as the command line prints it")


class ProfilePublic(BaseModel):
    """A stored profile (``profile`` is ``memtune.profiler._profile.Profile`` JSON)."""

    id: int
    model_id: str
    gpu: str
    batch: int
    dtype: str
    source: str
    created_at: datetime
    profile: dict[str, Any]
    memory_check: MemoryCheckPublic | None = Field(
        default=None, description="null where the profile measured no unplanned step (modeled profiles)"
    )


class HealthPublic(BaseModel):
    """Service health: 200 once migrations ran and the worker ``memtune serve`` runs (if any) is up.

    ``worker``: ``up``; ``restarting`` (its process exited and is started again after a back-off) or ``down`` (it
    stopped, or exited too often to be started again): 503 ``degraded``; ``external`` (workers run elsewhere).
    ``unserved_gpu_types``: GPU types with a queued job that no live worker serves (NOTE [ Worker heartbeats ]):
    503 ``degraded`` when any."""

    status: Literal["ok", "starting", "degraded"]
    database: str
    revision: str | None
    worker: Literal["up", "restarting", "down", "external"]
    workers_alive: int | None = Field(
        default=None, description="worker processes whose heartbeat is within the stale limit; null: not read"
    )
    unserved_gpu_types: list[str] = Field(
        default_factory=list, description="GPU types with a queued job that no live worker serves"
    )


class TimelinePoint(BaseModel):
    """Live GPU memory after one simulated event: time ms from the step's start, live bytes, what happened."""

    t_ms: float
    live_bytes: int
    label: str


class TimelineSeries(BaseModel):
    """The simulated memory timeline of one plan (``memtune.tuner.simulator.simulate(..., timeline=True)``)."""

    name: str = Field(description="the plan's result name, or 'none' for the unplanned step")
    step_ms: float
    peak_bytes: int
    forward_ms: float = Field(description="when the forward pass ends, ms")
    base_bytes: int = Field(description="resident all step: parameters, optimizer state, input")
    points: list[TimelinePoint]


class TimelinePublic(BaseModel):
    """The best plan's memory timeline for a job, with the unplanned step's for comparison. Bytes, ms.

    A job that has no profile yet (queued) has neither series; one with a profile but no feasible plan yet has only
    the unplanned one; ``detail`` then says what the job is waiting for."""

    job_id: str
    state: str = Field(description="the job's state when this was read")
    budget_bytes: int
    source: Literal["simulated"] = "simulated"
    best: TimelineSeries | None = Field(description="the best feasible plan's; null until the job stored one")
    unplanned: TimelineSeries | None = Field(
        description="every stage 'keep' (PyTorch default); null until the job has a profile"
    )
    detail: str | None = Field(default=None, description="why a series is missing")


class TrialPoint(BaseModel):
    """One finished Optuna trial of a job's study: its plan's step ms and peak bytes."""

    number: int
    step_ms: float
    peak_bytes: int
    feasible: bool = Field(
        description="peak within the job's budget less its headroom, budget_bytes * (1 - headroom), as the "
        "search required"
    )
    policy: str | None = Field(description="the baseline policy enqueued as this trial, if any")


class TrialsPublic(BaseModel):
    """A job's finished trials (all the plans the search evaluated), in trial order."""

    data: list[TrialPoint]
    count: int
