"""Profile value types: what one training step of a chain costs, stage by stage.

A profile is the input of the tuner. It is a frozen, versioned, JSON-serialisable record of, per stage,
forward and backward milliseconds, output and saved bytes, parameter bytes, and the time to copy the
saved bytes to pinned host memory and back; per convolution the cuDNN algorithms; plus the device
identity and where each number came from (``measured`` on that device or ``modeled`` from a roofline).

# NOTE [ Saved storages ]
Autograd keeps tensors for the backward pass. Several stages may hold the same storage: a conv's output
is saved by the in-place ReLU that follows it (as its output) and by the next conv (as its input). To
count every byte once and to give a plan one meaning in the simulator and in the runtime, a profile
lists each saved storage once (``SavedStorage``) with the stages whose saved set holds it
(``saved_by``). A stage's ``saved_bytes`` S_i is the total of the storages it is the *first* to save.
A storage stays on the GPU while any stage holding it keeps it (see ``memtune.tuner.plan`` for the rules).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memtune.profiler._spatial_rows import RowMap

__all__ = [
    "PROFILE_SCHEMA_VERSION",
    "CompilerPoint",
    "ConvAlgo",
    "ConvProfile",
    "DeviceIdentity",
    "HostPrices",
    "Profile",
    "SaveRule",
    "SavedStorage",
    "StageProfile",
    "StepPeak",
]

PROFILE_SCHEMA_VERSION = 1

Source = Literal["measured", "modeled"]

#: memtune's save rules inside a compiled region (NOTE [ Saved tensors chosen inside a compiled region ] in
#: ``memtune.profiler.saved_tags``)
SaveRule = Literal["compute"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DeviceIdentity(_Frozen):
    """Structured identity of the GPU a profile describes (never only a product string).

    Bandwidths are GB/s (1e9 bytes per second) of pinned host copies at 64 MiB.
    """

    name: str
    key: str = Field(description="stable short name, e.g. 'h200'")
    compute_capability: str | None = None
    sm_count: int | None = None
    memory_bytes: int
    pcie_gen: int | None = None
    pcie_width: int | None = None
    d2h_gbps: float
    h2d_gbps: float
    driver: str | None = None
    torch_version: str | None = None
    cudnn_version: str | None = None


class ConvAlgo(_Frozen):
    """One cuDNN algorithm for one convolution pass, as measured (or recorded as failed).

    ``split`` > 1 is the pass run as ``split`` calls on consecutive batch chunks (NOTE [ Batch split ] in
    ``memtune.profiler.conv_split``): ``ms`` is then the whole pass (every chunk, measured back to back) and
    ``workspace_bytes`` what one chunk's call needs.
    """

    pass_: Literal["fwd", "bwd_data", "bwd_filter"] = Field(alias="pass")
    algo: int
    name: str
    ms: float | None = Field(default=None, description="median run time of the whole pass, ms; None when it failed")
    workspace_bytes: int = 0
    split: int = Field(default=1, ge=1, description="batch chunks the pass runs as, one cuDNN call each")
    math_type: int = 0
    deterministic: bool = False
    status: Literal["ok", "failed", "unsupported"] = "ok"

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class ConvProfile(_Frozen):
    """The convolutions of a stage: name inside the stage, shapes, and the cuDNN algorithm table.

    ``algos`` lists every algorithm of every pass that cuDNN knows (working ones with their median ms,
    failed/unsupported ones with their status), filled by ``memtune.profiler.cudnn``; empty when not enumerated.
    ``default_ms``/``default_bwd_ms`` are PyTorch's own ``F.conv2d`` at the same shapes and dtype.
    """

    name: str
    in_channels: int
    out_channels: int
    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    input_hw: tuple[int, int]
    dilation: tuple[int, int] = (1, 1)
    groups: int = Field(default=1, ge=1)
    batch: int | None = Field(default=None, description="batch the algorithms were enumerated at")
    dtype: str | None = Field(default=None, description="data type the algorithms were enumerated for")
    default_ms: float | None = Field(default=None, description="forward ms with the framework's own choice")
    default_bwd_ms: float | None = Field(
        default=None, description="backward ms (input and weight gradients) with the framework's own choice"
    )
    algos: tuple[ConvAlgo, ...] = ()


class SavedStorage(_Frozen):
    """One storage autograd keeps for backward, or (module stages) that flows between stages, counted once.
    See NOTE [ Saved storages ] and NOTE [ Module stages ] in ``memtune.profiler.module_stages``."""

    bytes: int = Field(ge=0)
    saved_by: tuple[int, ...] = Field(description="stage indices whose saved set holds it")
    producer: int = Field(ge=-1, description="stage that allocated it; -1 for the model input")
    read_by: tuple[int, ...] = Field(
        default=(),
        description="module stages: the stages whose forward reads it, or after whose forward the model's own code "
        "still holds it (its forward lifetime as measured); empty for chains, where the next stage reads an output",
    )
    grad_bytes: int = Field(
        default=0, ge=0, description="module stages: bytes of the gradient that flows back into it (0: none)"
    )
    grad_storage_bytes: int | None = Field(
        default=None,
        ge=0,
        description="module stages: bytes of the storage that gradient is a view of, where it is larger than the "
        "gradient (a slice of the gradient of a concatenation; NOTE [ Gradient storages ] in "
        "memtune.profiler.module_profile); "
        "None: the gradient's own bytes",
    )
    outside: bool = Field(
        default=False,
        description="saved by the model's own code outside every stage: no plan reaches it, it stays on the GPU "
        "until the backward of saved_by",
    )


class StageProfile(_Frozen):
    """Costs of one stage of the chain for one training step. Times are milliseconds, sizes bytes."""

    index: int = Field(ge=0)
    name: str
    kind: str
    forward_ms: float = Field(ge=0)
    backward_ms: float = Field(ge=0)
    output_bytes: int = Field(ge=0)
    inplace: bool = Field(default=False, description="output shares the input's storage")
    output_storage: int | None = Field(default=None, description="index into Profile.storages, if saved")
    saved_bytes: int = Field(ge=0, description="S_i: bytes of the storages this stage is first to save")
    param_bytes: int = Field(ge=0)
    d2h_ms: float = Field(ge=0, description="copy of S_i to pinned host memory")
    h2d_ms: float = Field(ge=0, description="copy of S_i back from pinned host memory")
    forward_workspace_bytes: int = Field(default=0, ge=0, description="transient peak above in+out")
    backward_workspace_bytes: int = Field(
        default=0, ge=0, description="backward's peak above max(before, after) (NOTE [ Backward transient ])"
    )
    backward_inline_bytes: int | None = Field(
        default=None,
        ge=0,
        description="backward's peak above before + gradients made, every saved activation fetched from host memory "
        "at its first use and the output's gradient freed once used (NOTE [ Inline fetches ]); None where not "
        "measured",
    )
    chained_backward_bytes: int | None = Field(
        default=None,
        ge=0,
        description="backward's peak above before + gradients made, the output's gradient freed once used, as in a "
        "chain (memtune.profiler.measure.chained_backward_bytes; NOTE [ Backward transient ] in "
        "memtune.tuner.simulator); None where "
        "not measured",
    )
    lean_forward_workspace_bytes: int | None = Field(
        default=None,
        ge=0,
        description="forward_workspace_bytes with every convolution of the stage run by its memory-optimal cuDNN "
        "algorithms (NOTE [ Lean transients ] in memtune.tuner.simulator); None where not measured",
    )
    lean_backward_workspace_bytes: int | None = Field(
        default=None,
        ge=0,
        description="backward's peak above before + gradients made, the output's gradient freed once used "
        "(memtune.profiler.measure.chained_backward_bytes), with every convolution of the stage run by its "
        "memory-optimal "
        "cuDNN algorithms (NOTE [ Lean transients ] in memtune.tuner.simulator); None where not measured",
    )
    selective_saved_bytes: int | None = Field(
        default=None,
        ge=0,
        description="what the stage holds from its forward to its backward under the plan action ``selective`` "
        "besides its input: the outputs of its costly operations (NOTE [ Selective stages ] in "
        "memtune.profiler.selective); "
        "None where not measured",
    )
    selective_forward_ms: float | None = Field(
        default=None,
        ge=0,
        description="forward under ``selective`` (selective checkpointing's caching mode runs in Python on every "
        "operation); None where not measured",
    )
    selective_backward_ms: float | None = Field(
        default=None,
        ge=0,
        description="backward under ``selective``, the re-run of its cheap operations included; None where not "
        "measured",
    )
    selective_backward_bytes: int | None = Field(
        default=None,
        ge=0,
        description="backward's peak under ``selective`` above before + gradients made, as in a chain (as "
        "chained_backward_bytes); None where not measured",
    )
    recompute_backward_ms: float | None = Field(
        default=None,
        ge=0,
        description="backward under ``recompute`` (a non-reentrant checkpoint of the stage's call), its re-run "
        "forward included: what a recomputed stage really costs in backward, measured (NOTE [ Recompute priced as "
        "measured ] in memtune.tuner.simulator); None where not measured",
    )
    recompute_backward_bytes: int | None = Field(
        default=None,
        ge=0,
        description="backward's peak under ``recompute`` above before + gradients made, the re-made tensors "
        "included (as chained_backward_bytes); None where not measured",
    )
    flops: float = Field(default=0.0, ge=0, description="forward floating-point operations")
    convs: tuple[ConvProfile, ...] = ()
    rows: RowMap | None = Field(
        default=None,
        description="how its output rows (H) read its input rows, where the stage can run on strips of rows with "
        "the same math (NOTE [ Spatial splitting ] in memtune.tuner._spatial); None: it cannot, or the profile "
        "does not say",
    )
    input_storages: tuple[int, ...] | None = Field(
        default=None,
        description="module stages: indices into Profile.storages of the tensors its forward takes (arguments and "
        "keyword arguments); None for chains, whose stage reads the previous stage's output",
    )

    @property
    def selective_measured(self) -> bool:
        """Whether the stage was measured under selective checkpointing (it may take the plan action ``selective``)."""
        return self.selective_saved_bytes is not None and self.selective_backward_ms is not None

    @property
    def recompute_extra_ms(self) -> float | None:
        """What re-running the stage in backward adds to it under ``recompute``, ms, as measured; None where not
        measured (the simulator then prices the re-run as the stage's forward)."""
        if self.recompute_backward_ms is None:
            return None
        return max(0.0, self.recompute_backward_ms - self.backward_ms)

    @property
    def selective_extra_ms(self) -> tuple[float, float]:
        """What ``selective`` adds to the stage's forward and backward, ms, as measured (0 where not measured)."""
        fwd = 0.0 if self.selective_forward_ms is None else self.selective_forward_ms - self.forward_ms
        bwd = 0.0 if self.selective_backward_ms is None else self.selective_backward_ms - self.backward_ms
        return fwd, bwd


class CompilerPoint(_Frozen):
    """The whole model compiled by ``torch.compile`` under one activation budget, as measured on the profile's GPU
    (NOTE [ Whole-model compile ] in ``memtune.tuner._whole``): one training step of the profile's batch."""

    activation_budget: float = Field(
        ge=0.0, le=1.0, description="torch._functorch.config.activation_memory_budget while it compiled"
    )
    step_ms: float = Field(gt=0, description="median training step (forward, loss, backward, SGD update), ms")
    peak_bytes: int = Field(gt=0, description="max_memory_allocated over the timed steps, bytes")
    reserved_bytes: int | None = Field(
        default=None,
        gt=0,
        description="max_memory_reserved over the timed steps, bytes: what a memory cap sees; None: not measured",
    )
    optimizer: Literal["sgd", "adam", "none"] = Field(
        default="sgd",
        description="the optimizer of the measured steps: sgd (momentum), adam (AdamW) or none; a plan for another "
        "optimizer is priced with the difference in optimizer state (NOTE [ Whole-model compile ] in "
        "memtune.tuner._whole)",
    )
    update_ms: float | None = Field(
        default=None,
        ge=0,
        description="the optimizer's update within step_ms (median over the timed steps), ms; None: not measured",
    )

    @property
    def forward_backward_ms(self) -> float:
        """The step less the optimizer's update, ms: what the simulator's step counts (NOTE [ The optimizer's update ]
        in ``memtune.tuner._whole``); the whole step where the update was not measured."""
        return self.step_ms - (self.update_ms or 0.0)

    def fits(self, cap_bytes: int, search_budget_bytes: int) -> bool:
        """Whether the point runs under ``cap_bytes``: its measured reserved peak is within the cap (the caching
        allocator held no more than that), or, where that was not measured, its allocated peak is within the
        search budget (the cap less the GPU type's headroom)."""
        if self.reserved_bytes is not None:
            return self.reserved_bytes <= cap_bytes
        return self.peak_bytes <= search_budget_bytes


class StepPeak(_Frozen):
    """The unplanned training step's memory as the allocator saw it (NOTE [ Allocator meters ] in
    ``memtune.profiler.memory_meter``), above what was resident before it (parameters, buffers, the batch): the
    simulator's prediction of the same step is compared with it (NOTE [ Profile self-check ] in
    ``memtune.tuner._peak_check``).
    """

    allocated_bytes: int = Field(ge=0, description="the step's peak of allocated bytes above what was resident")
    reserved_bytes: int = Field(
        ge=0, description="the caching allocator's peak reservation above its reservation before (CPU: allocated)"
    )
    output_held: bool = Field(description="whether the measured step held the model's output until its backward ended")


class HostPrices(_Frozen):
    """What the host spends issuing one step of a profile's stages as memtune's runtime plans it (NOTE [ Host issue
    time ] in ``memtune.tuner._host_time``), measured on the GPU the profile was made on by
    ``memtune.tuner.measure.host_price``; times in ms.
    """

    keep_ms: float = Field(
        ge=0,
        description="the host's time to issue one step (forward, loss, backward; no update) with every stage kept, "
        "from the step's start until its Python returns, median ms",
    )
    recompute_ms: tuple[float, ...] | None = Field(
        default=None,
        description="per stage, what recomputing it adds to the host's time, ms: the step with every stage "
        "recomputed less keep_ms, shared among the stages by their forward ms; None: not measured (a stage refused "
        "a checkpoint)",
    )
    offload_ms: tuple[float, ...] | None = Field(
        default=None,
        description="per stage, what offloading it adds to the host's time, ms: the step with every stage offloaded "
        "less keep_ms, shared among the stages by the storages each saves first; None: not measured",
    )
    steps: int = Field(ge=1, description="timed steps per plan (after two warm-up steps)")


class Profile(_Frozen):
    """A whole chain's profile on one device. Serialises to versioned JSON (``to_json``/``from_json``)."""

    schema_version: int = PROFILE_SCHEMA_VERSION
    model: str
    model_params: dict[str, int | float | str | bool] = Field(default_factory=dict)
    batch: int = Field(ge=1)
    dtype: Literal["float32", "bfloat16", "float16"]
    input_shape: tuple[int, ...] = Field(description="one sample's shape, without the batch")
    input_bytes: int = Field(ge=0, description="the batch's input tensor")
    device: DeviceIdentity
    source: Source
    compute_source: str = Field(description="where forward/backward ms came from")
    transfer_source: str = Field(description="where D2H/H2D ms came from")
    created_at: str | None = None
    stages: tuple[StageProfile, ...] = Field(min_length=1)
    storages: tuple[SavedStorage, ...] = ()
    loss_ms: float | None = Field(
        default=None,
        ge=0,
        description=(
            "forward + backward of the step's loss over the output (memtune.profiler.loss), ms; None: not measured"
        ),
    )
    stages_from: Literal["chain", "modules"] = Field(
        default="chain",
        description="'chain': stages x_i = s_i(x_{i-1}); 'modules': stages are submodules of a model, named by "
        "their qualified names, run by the model's own forward "
        "(NOTE [ Module stages ] in memtune.profiler.module_stages)",
    )
    outside_param_bytes: int = Field(
        default=0, ge=0, description="module stages: parameters of the model that belong to no stage, bytes"
    )
    loss_saved_bytes: int | None = Field(
        default=None,
        ge=0,
        description="module stages: what the loss function keeps from its forward to its backward, bytes; None: "
        "the cross-entropy model of NOTE [ Loss memory ]",
    )
    compile_budget: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="every stage measured compiled by torch.compile under this activation-memory budget (NOTE "
        "[ Compiled stages ] in memtune.profiler.compiled; module stages are then regions, NOTE [ Regions ] in "
        "memtune.profiler.region_tree, except eager_stages); None: eager stages",
    )
    compile_saves: SaveRule | None = Field(
        default=None,
        description="with compile_budget: memtune's save rule inside every compiled stage, tags on the compiler's "
        "joint graph ('compute': keep matrix products', convolutions' and attention's outputs, recompute the rest; "
        "NOTE [ Saved tensors chosen inside a compiled region ] in memtune.profiler.saved_tags); None: the compiler's "
        "own choice under compile_budget",
    )
    eager_stages: tuple[int, ...] = Field(
        default=(),
        description="a compiled profile of module stages (regions): the stages measured eager, written in place at "
        "their edges (NOTE [ In-place writes at region edges ] in memtune.profiler.region_tree); empty: every stage "
        "compiled",
    )
    compile_seconds: float | None = Field(
        default=None, ge=0, description="a compiled profile: seconds its stages took to compile (first calls)"
    )
    compiler_points: tuple[CompilerPoint, ...] = Field(
        default=(),
        description="the whole model compiled at several activation budgets, measured (NOTE [ Whole-model compile ] "
        "in memtune.tuner._whole); a plan may run so (Plan.whole_compile). Empty: not measured",
    )
    loss_backward_bytes: int | None = Field(
        default=None,
        ge=0,
        description="module stages: the backward from the loss to the last stage's output (the loss function and the "
        "model's own code after its last stage) at its peak, above what was live before it and the output's gradient "
        "it leaves, bytes, read off the allocator (NOTE [ Allocator meters ] in memtune.profiler.memory_meter); None: "
        "not "
        "measured",
    )

    output_held_bytes: int | None = Field(
        default=None,
        ge=0,
        description="module stages: bytes the model returns that no stage saves and that the training loop holds "
        "until its backward ends (``out = model(x); loss(out).backward()`` holds the whole output; "
        "``model(x).loss.backward()`` only the loss), NOTE [ Held output ] in memtune.tuner.simulator; 0: the loop "
        "drops the output before its backward; None: not measured (chains)",
    )
    resident_bytes: int = Field(
        default=0,
        ge=0,
        description="module stages on CUDA: bytes the process holds on the device through every step besides the "
        "parameters, their gradients, the optimizer state and the batch: cuBLAS's workspaces, one per handle and "
        "stream (NOTE [ Memory held before the step ] in memtune.profiler._module_step); counted in every plan's "
        "peak; 0: none measured (the CPU, chains)",
    )

    step_peak: StepPeak | None = Field(
        default=None,
        description="module stages: the unplanned step's measured peak (NOTE [ Profile self-check ] in "
        "memtune.tuner._peak_check); None: not measured",
    )
    recompute_step_ms: float | None = Field(
        default=None,
        ge=0,
        description="module stages: one whole step (forward, loss, backward) with every stage recomputed, median "
        "ms, measured beside the plain step the stages add up to (NOTE [ Recompute priced as measured ] in "
        "memtune.tuner.simulator); None: not measured",
    )
    host: HostPrices | None = Field(
        default=None,
        description="the host's issue time of a step under each action, measured with memtune's runtime (NOTE [ Host "
        "issue time ] in memtune.tuner._host_time): a simulated step takes at least the host's time; None: not "
        "measured (the simulator prices the GPU alone)",
    )

    @property
    def recompute_rerun_scale(self) -> float:
        """What the stages' measured re-runs (``StageProfile.recompute_extra_ms``) are multiplied by so that, with
        every stage recomputed, they add up to the re-run the whole step measured (``recompute_step_ms`` less the
        plain step); 1.0 where the whole step was not measured (NOTE [ Recompute priced as measured ] in
        ``memtune.tuner.simulator``)."""
        measured = [s.recompute_extra_ms for s in self.stages if s.recompute_extra_ms is not None]
        if self.recompute_step_ms is None or not measured or sum(measured) <= 0:
            return 1.0
        plain = sum(s.forward_ms + s.backward_ms for s in self.stages) + (self.loss_ms or 0.0)
        unmeasured = sum(s.forward_ms for s in self.stages if s.recompute_extra_ms is None)
        return max(0.0, self.recompute_step_ms - plain - unmeasured) / sum(measured)

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if self.schema_version != PROFILE_SCHEMA_VERSION:
            raise ValueError(
                f"profile schema_version {self.schema_version} is not supported "
                f"(this memtune reads {PROFILE_SCHEMA_VERSION}); re-run `memtune profile`"
            )
        n = len(self.stages)
        for i, st in enumerate(self.stages):
            if st.index != i:
                raise ValueError(f"stages[{i}].index is {st.index}; stages must be numbered 0..{n - 1}")
            if self.compile_budget is not None and (st.convs and any(c.algos for c in st.convs)):
                raise ValueError(f"stages[{i}] has cuDNN algorithm tables, which a compiled profile cannot use")
            if st.output_storage is not None and not 0 <= st.output_storage < len(self.storages):
                raise ValueError(f"stages[{i}].output_storage {st.output_storage} is out of range")
        for k, s in enumerate(self.storages):
            if any(not 0 <= j < n for j in s.saved_by):
                raise ValueError(f"storages[{k}].saved_by {s.saved_by} names a stage outside 0..{n - 1}")
            if s.producer >= n:
                raise ValueError(f"storages[{k}].producer {s.producer} is outside -1..{n - 1}")
            if any(not 0 <= j < n for j in s.read_by):
                raise ValueError(f"storages[{k}].read_by {s.read_by} names a stage outside 0..{n - 1}")
        if self.host is not None:
            for name in ("recompute_ms", "offload_ms"):
                shares = getattr(self.host, name)
                if shares is not None and len(shares) != n:
                    raise ValueError(f"host.{name} has {len(shares)} entries; the profile has {n} stages")
        if self.compile_saves is not None and self.compile_budget is None:
            raise ValueError("compile_saves is a save rule of compiled stages: it needs compile_budget")
        if self.eager_stages and (self.compile_budget is None or not self.modules):
            raise ValueError("eager_stages belongs to a compiled profile of module stages (compile_budget set)")
        if any(not 0 <= k < n for k in self.eager_stages):
            raise ValueError(f"eager_stages {self.eager_stages} names a stage outside 0..{n - 1}")
        for i, st in enumerate(self.stages):
            if st.input_storages is not None and any(not 0 <= j < len(self.storages) for j in st.input_storages):
                raise ValueError(f"stages[{i}].input_storages {st.input_storages} is out of range")
        return self

    @property
    def modules(self) -> bool:
        """Whether the stages are submodules of a model run by its own forward (NOTE [ Module stages ])."""
        return self.stages_from == "modules"

    def stage_inputs(self, k: int) -> tuple[int, ...]:
        """The storages stage ``k``'s forward takes: its ``input_storages`` (module stages), else the previous
        stage's output where it is in the table (chains)."""
        st = self.stages[k]
        if st.input_storages is not None:
            return st.input_storages
        prev = self.stages[k - 1].output_storage if k > 0 else None
        return () if prev is None else (prev,)

    # ---- derived numbers -------------------------------------------------------------------------
    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def param_bytes(self) -> int:
        """Total parameter bytes of the model (each parameter once; those outside every stage included)."""
        return sum(s.param_bytes for s in self.stages) + self.outside_param_bytes

    @property
    def saved_bytes(self) -> int:
        """Total bytes autograd keeps for backward without a plan (each storage once)."""
        return sum(s.bytes for s in self.storages if s.saved_by)

    @property
    def forward_ms(self) -> float:
        return sum(s.forward_ms for s in self.stages)

    @property
    def backward_ms(self) -> float:
        return sum(s.backward_ms for s in self.stages)

    def prefix(self, m: int) -> Profile:
        """The profile of the chain's first ``m`` stages (a truncated network whose last stage feeds the loss)."""
        if not 1 <= m <= self.n_stages:
            raise ValueError(f"prefix length must be in 1..{self.n_stages}, not {m}")
        if self.modules:
            raise ValueError("a prefix of a model's module stages is not a model that runs; prefixes are for chains")
        keep = [
            s.model_copy(update={"saved_by": tuple(r for r in s.saved_by if r < m)})
            for s in self.storages
            if s.producer < m
        ]
        index = {old: new for new, old in enumerate(k for k, s in enumerate(self.storages) if s.producer < m)}
        stages = tuple(
            st.model_copy(
                update={"output_storage": index.get(st.output_storage) if st.output_storage is not None else None}
            )
            for st in self.stages[:m]
        )
        return self.model_copy(update={"stages": stages, "storages": tuple(keep), "model": f"{self.model}[:{m}]"})

    @property
    def has_conv_algos(self) -> bool:
        """Whether any convolution carries a cuDNN algorithm table (the search can then choose algorithms)."""
        return any(c.algos for s in self.stages for c in s.convs)

    @property
    def has_split_rows(self) -> bool:
        """Whether any algorithm table lists batch-split runs (NOTE [ Batch split ] in
        ``memtune.profiler.conv_split``)."""
        return any(a.split > 1 for s in self.stages for c in s.convs for a in c.algos)

    def without_splits(self) -> Profile:
        """The same profile with the batch-split rows of its algorithm tables removed (as profiles were before
        they were measured: ``fastest_within`` then means what it meant to runs of that time)."""
        return self.model_copy(
            update={
                "stages": tuple(
                    s.model_copy(
                        update={
                            "convs": tuple(
                                c.model_copy(update={"algos": tuple(a for a in c.algos if a.split == 1)})
                                for c in s.convs
                            )
                        }
                    )
                    for s in self.stages
                )
            }
        )

    def without_conv_algos(self) -> Profile:
        """The same profile with its convolution algorithm tables removed: convolutions keep the framework's
        algorithms and workspaces, so a search on it has no algorithm choice."""
        return self.model_copy(update={"stages": tuple(s.model_copy(update={"convs": ()}) for s in self.stages)})

    @property
    def has_selective(self) -> bool:
        """Whether any stage was measured under selective checkpointing (the plan action ``selective``)."""
        return any(s.selective_measured for s in self.stages)

    def without_selective(self) -> Profile:
        """The same profile with no stage measured under selective checkpointing: a search on it never offers the
        plan action ``selective`` (NOTE [ Selective stages ] in ``memtune.profiler.selective``)."""
        stages = tuple(s.model_copy(update={"selective_saved_bytes": None}) for s in self.stages)
        return self.model_copy(update={"stages": stages})

    # ---- serialisation ---------------------------------------------------------------------------
    def to_json(self, *, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent, by_alias=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Profile:
        return cls.model_validate_json(text)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_json(Path(path).read_bytes())

    def summary(self) -> dict[str, object]:
        """A short dict for tables and logs."""
        return {
            "model": self.model,
            "batch": self.batch,
            "dtype": self.dtype,
            "gpu": self.device.key,
            "source": self.source,
            "stages": self.n_stages,
            "forward_ms": round(self.forward_ms, 3),
            "backward_ms": round(self.backward_ms, 3),
            "saved_bytes": self.saved_bytes,
            "param_bytes": self.param_bytes,
        }
