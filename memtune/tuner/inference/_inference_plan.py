"""The inference plan: per layer, how many output-channel partitions it runs in and where its weights live.

# NOTE [ Inference plans ]
mmCNN (Li et al.) runs a CNN's forward pass within a small device memory. The paper's rules, and ours:

* Partitions. "Since equation (2) shows that the channels in Y are independent from each other, we can make out the
  results in parts and collect all these parts to make a final result Y." A Conv2d (one group) or a Linear with
  ``channel_parts`` k runs as k calls, each with the weights (and bias) of a consecutive run of output channels and
  the whole input, each making those channels of the output. Runs are as ``torch.tensor_split`` makes them: the
  first ``units % k`` partitions have one channel more. Every other layer runs whole (k = 1). The math is the
  layer's: each output channel is computed from the same input and weights.
* Weights. ``resident``: on the device for the whole run, as a plain model's are. ``host_prefetch``: kept in (pinned)
  host memory and copied to the device one partition at a time. The paper prefetches "the data which will be used
  in the very future as early as possible and, at the same time, release[s] the current computed temporary data as
  soon as possible", as far ahead as free memory allows. Ours looks exactly one partition ahead: all host-prefetched
  partitions of the run form one sequence, and the copy of partition q+1 is issued once partition q starts
  computing (partition q-1's weights, done, are freed). So at most two weight partitions are on the device: the one
  in use and the one arriving, which may be the next layer's first.
* Outputs. ``output="device"``: the layer's whole output is on the device when it ends; a split layer computes each
  partition into a fresh tensor and copies it into its slice of the output. ``output="host"`` (a split layer only):
  mmCNN "stores the first few parts of the calculated data to host-side memory in order to make place for next
  partitioned data": each finished partition is copied to host memory on the compute stream, so the device holds
  one output partition at a time, and the next layer's input comes back whole from the host once this layer's input
  is freed.
* Working set of layer i (``memtune.tuner.inference._memory``), the device bytes while it runs, at its worst partition:
  the resident weights of every layer + the model's input (its caller holds it for the whole call) + its input +
  its current weight partition (host-prefetched) + the output it
  holds (the whole output and, when split, the partition being made; under ``output="host"`` only that partition;
  nothing when the output is the input's storage) + the weight partition arriving + what the layer's kernel
  allocates besides its output (a max pool's indices on CUDA). A plan fits a budget when every
  layer's working set does. The paper's schedule sizes prefetches and partitions from the free memory of each
  "conv seg"; ours sizes every layer by the same rule. Tensors only: the scratch memory a library takes during a
  call is not counted. A cuDNN convolution's workspace depends on the algorithm cuDNN picks for each partition's
  shape (tens of MiB for VGG-16's 512-channel convolutions on a 2x2 input, measured on an H100), so on CUDA a plan
  with ``conv_workspace="none"`` runs its convolutions with cuDNN's IMPLICIT_GEMM forward, which takes no workspace
  (``memtune.tuner.runtime.conv``): then the working set is what a call allocates. ``"framework"`` leaves the algorithm
  to PyTorch, faster where it picks a better one; ``benchmarks.inference_budget`` measures both.
* Planner (``memtune.tuner.inference._planner``): everything resident and whole when that fits (the paper's "normal
mode").
  Otherwise every layer with weights is host-prefetched and takes the fewest partitions that fit, keeping its output
  on the device where some partition count allows it and the estimate of that layer's time is not worse; then
  layers turn resident one at a time while the simulated latency falls.
* Latency (``memtune.tuner.inference._inference_simulator``): a compute engine and a host->device copy engine in the
order above. A
  partition of a layer split k ways costs its share of the layer's forward time, but no less than
  ``InferenceFacts.partition_floor_ms``: each partition is one more operation to issue and wait for, and the paper
  measures that "more iterations lead to longer overhead time". Measured facts time that floor on the runner itself
  (``memtune.tuner.measure.inference_measure.partition_ms``) and each layer's one-channel partition, and price a
  partition of c channels on the line from that to the whole layer (``memtune.tuner.inference._facts.part_ms``): a
  one-channel convolution is far less efficient than 1/C of the whole (3.7 ms against 37 ms for VGG-16's 256-channel
  convolutions at 56x56 on one CPU thread). Facts from a profile take the layer's share and the cheapest layer's forward
  as the floor. Output copies to the host and input copies back run in line with compute; where copies do not overlap
  compute at all (the CPU), every copy does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.inference._facts import ConvWorkspace

if TYPE_CHECKING:
    from memtune.tuner.inference._facts import InferenceFacts

__all__ = ["INFERENCE_PLAN_SCHEMA_VERSION", "InferencePlan", "LayerFitError", "LayerPlan", "OutputAt", "WeightsAt"]

INFERENCE_PLAN_SCHEMA_VERSION = 1

WeightsAt = Literal["resident", "host_prefetch"]
OutputAt = Literal["device", "host"]


class LayerFitError(PlanError):
    """A layer's working set exceeds the budget however it is split (NOTE [ Inference plans ]).

    Attributes:
        layer: the layer's name.
        need_bytes: the least working set the layer can have, bytes.
        budget_bytes: the budget, bytes.
    """

    def __init__(self, message: str, *, layer: str, need_bytes: int, budget_bytes: int) -> None:
        super().__init__(message)
        self.layer = layer
        self.need_bytes = need_bytes
        self.budget_bytes = budget_bytes


class LayerPlan(BaseModel):
    """How one layer runs (NOTE [ Inference plans ])."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, description="the layer's qualified name in the model")
    channel_parts: int = Field(default=1, description="output-channel partitions, >= 1")
    weights: WeightsAt = "resident"
    output: OutputAt = "device"

    @model_validator(mode="after")
    def _check(self) -> LayerPlan:
        if self.channel_parts < 1:
            raise ValueError(f"layer {self.name!r}: channel_parts {self.channel_parts} must be >= 1")
        if self.output == "host" and self.channel_parts == 1:
            raise ValueError(
                f"layer {self.name!r}: output 'host' needs channel_parts > 1 (a layer run whole holds its whole "
                "output on the device anyway); use output 'device'"
            )
        return self


class InferencePlan(BaseModel):
    """An inference plan for one chain: one ``LayerPlan`` per layer, in run order. Versioned JSON."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = INFERENCE_PLAN_SCHEMA_VERSION
    model: str | None = Field(default=None, description="the model it was made for")
    budget_bytes: int | None = Field(default=None, ge=1, description="the working-set budget it was made for")
    layers: tuple[LayerPlan, ...] = Field(min_length=1)
    label: str | None = Field(default=None, description="what made it")
    conv_workspace: ConvWorkspace = Field(
        default="framework",
        description="convolutions with the framework's algorithms, or (CUDA) cuDNN's workspace-free IMPLICIT_GEMM",
    )

    @model_validator(mode="after")
    def _check(self) -> InferencePlan:
        if self.schema_version != INFERENCE_PLAN_SCHEMA_VERSION:
            raise ValueError(
                f"inference plan schema_version {self.schema_version} is not supported "
                f"(expected {INFERENCE_PLAN_SCHEMA_VERSION})"
            )
        seen: set[str] = set()
        for layer in self.layers:
            if layer.name in seen:
                raise ValueError(f"layer {layer.name!r} appears twice; a plan names each layer once")
            seen.add(layer.name)
        return self

    @classmethod
    def resident(cls, names: Sequence[str], **fields: object) -> InferencePlan:
        """Every layer whole with resident weights: the plain model."""
        return cls(layers=tuple(LayerPlan(name=n) for n in names), **fields)  # type: ignore[arg-type]

    def check(self, facts: InferenceFacts) -> None:
        """Raise ``PlanError`` naming the layer if this plan does not fit the chain of ``facts``: the layers differ,
        a layer is split into more partitions than it has output channels or is split though it cannot be, a layer
        without weights prefetches them, or a layer whose output is its input sends it to the host."""
        if self.conv_workspace != facts.conv_workspace:
            raise PlanError(
                f"the plan runs convolutions with conv_workspace {self.conv_workspace!r} but the facts timed them with "
                f"{facts.conv_workspace!r}; price a plan with facts measured as it runs"
            )
        if len(self.layers) != len(facts.layers):
            raise PlanError(
                f"the plan has {len(self.layers)} layers but {facts.model!r} has {len(facts.layers)}; "
                "a plan is made for one chain"
            )
        for k, (lp, f) in enumerate(zip(self.layers, facts.layers, strict=True)):
            if lp.name != f.name:
                raise PlanError(f"plan layer {k} is {lp.name!r} but the model's is {f.name!r}")
            if lp.channel_parts > f.units:
                can = f"{f.units} output channels" if f.units > 1 else "no output channels to split (it runs whole)"
                raise PlanError(f"layer {f.name!r} ({f.kind}): channel_parts {lp.channel_parts} but it has {can}")
            if lp.weights == "host_prefetch" and not f.has_weights:
                raise PlanError(f"layer {f.name!r} ({f.kind}) has no weights to prefetch; make it 'resident'")
            if lp.output == "host" and f.aliases_input:
                raise PlanError(f"layer {f.name!r} ({f.kind}) returns its input's storage; its output stays 'device'")

    def compact(self) -> str:
        """Split and prefetched layers in short: ``features.2:4p classifier.0:512ph`` (``p`` prefetched, ``h`` output
        to host); ``resident`` when every layer is whole and resident."""
        shown = [
            f"{lp.name}:{lp.channel_parts}{'p' if lp.weights == 'host_prefetch' else ''}"
            f"{'h' if lp.output == 'host' else ''}"
            for lp in self.layers
            if lp.channel_parts > 1 or lp.weights != "resident"
        ]
        return " ".join(shown) or "resident"
