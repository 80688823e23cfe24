"""What an inference plan is made from: each layer's bytes and forward time, and the host link.

Torch-free value types. ``memtune.tuner.runtime.inference_facts`` reads the shapes off a live ``nn.Sequential`` and
``memtune.tuner.measure.inference_measure`` times the layers on a device; ``facts_from_profile`` takes the times and the
link from a memtune ``Profile`` of the same chain instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from memtune.tuner._tuner_errors import PlanError

ConvWorkspace = Literal["framework", "none"]
"""How convolutions run: the framework's algorithms, or cuDNN's workspace-free one (NOTE [ Inference plans ])."""

if TYPE_CHECKING:
    from memtune.profiler import Profile

__all__ = [
    "COPY_LATENCY_MS",
    "ConvWorkspace",
    "InferenceFacts",
    "LayerFacts",
    "LayerShape",
    "facts_from_profile",
    "floor_ms",
    "part_ms",
]

# NOTE [ Copy latency ]
# A pinned copy costs a fixed latency besides its bytes. The H200's measured rates (docs/concepts.md: 38 GB/s for 1 MiB,
# 55 GB/s from 16 MiB on) fit ``bytes / 55 GB/s + 8.5 us``: 1 MiB x (1/38 - 1/55) GB/s^-1 = 8.5 us. Profiles carry
# the bandwidth alone, so facts taken from a profile use this latency; measured facts measure their own.
COPY_LATENCY_MS = 0.0085
"""Fixed cost of one host<->device copy, ms (NOTE [ Copy latency ])."""


@dataclass(frozen=True)
class LayerShape:
    """What one layer of a chain holds and makes during one inference of the batch, bytes.

    Attributes:
        name: the layer's qualified name in the model (``features.3``), as profiles name stages.
        kind: the module's class in lower case (``conv2d``, ``linear``, ``relu``).
        units: the output channels a plan may split the layer into (NOTE [ Inference plans ] in
            ``memtune.tuner.inference._inference_plan``): a Conv2d's ``out_channels`` (one group), a Linear's
            ``out_features``; 1 for every other layer, which runs whole.
        weight_bytes: its parameters (weight and bias), bytes; 0 for a layer without parameters. Each unit owns an
            equal share.
        input_bytes: the tensor it reads, bytes.
        output_bytes: the tensor it makes, bytes (also when it is the input's storage).
        aliases_input: its output is its input's storage (in-place ReLU, Flatten's view, Dropout in eval).
        scratch_bytes: what its own kernel allocates besides its output while it runs, bytes (a max pool's int64
            indices, which CUDA's kernel makes even when they are not returned); 0 for most layers.
    """

    name: str
    kind: str
    units: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    aliases_input: bool
    scratch_bytes: int

    def __post_init__(self) -> None:
        if self.units < 1:
            raise PlanError(f"layer {self.name!r}: units {self.units} must be >= 1")
        if min(self.weight_bytes, self.input_bytes, self.output_bytes, self.scratch_bytes) < 0:
            raise PlanError(f"layer {self.name!r}: byte counts must not be negative")

    @property
    def has_weights(self) -> bool:
        """Whether the layer has parameters a plan may keep in host memory."""
        return self.weight_bytes > 0


@dataclass(frozen=True)
class LayerFacts(LayerShape):
    """A layer's shape and its forward time at the facts' batch, ms (the whole layer, one call).

    ``one_channel_ms``: the forward of one output channel's partition, ms, where measured (None: not measured);
    partitions of ``c`` channels are priced between it and ``forward_ms`` (``part_ms``).
    """

    forward_ms: float
    one_channel_ms: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.forward_ms >= 0:
            raise PlanError(f"layer {self.name!r}: forward_ms {self.forward_ms} must be >= 0")
        if self.one_channel_ms is not None and not self.one_channel_ms >= 0:
            raise PlanError(f"layer {self.name!r}: one_channel_ms {self.one_channel_ms} must be >= 0")


@dataclass(frozen=True)
class InferenceFacts:
    """Per-layer facts of one chain at one batch on one device, plus the host link.

    Attributes:
        model: the model's name.
        batch: samples per inference.
        dtype: the data type of weights and activations.
        device: where the times come from (a GPU's name, ``cpu``).
        source: ``measured`` on that device or ``modeled`` from a roofline (as profiles say).
        layers: the chain's layers in run order.
        h2d_gbps, d2h_gbps: host->device and device->host copy rates, GB/s (1e6 bytes per ms).
        copy_latency_ms: the fixed cost of one copy, ms (NOTE [ Copy latency ]).
        copies_overlap: copies run on a copy engine beside compute (a GPU's side stream); False where the copy is
            work of the computing thread itself (the CPU, whose "device" memory is host memory).
        partition_floor_ms: the least one partition of a split layer costs, ms: the cost of issuing and waiting for
            an operation that has almost no work (NOTE [ Inference plans ]): timed on the runner for measured facts,
            the cheapest layer that makes a tensor for facts from a profile.
        conv_workspace: how the convolutions were timed (``InferencePlan.conv_workspace``): with the framework's
            algorithms, or with cuDNN's workspace-free one.
    """

    model: str
    batch: int
    dtype: str
    device: str
    source: Literal["measured", "modeled"]
    layers: tuple[LayerFacts, ...]
    h2d_gbps: float
    d2h_gbps: float
    copy_latency_ms: float
    copies_overlap: bool
    partition_floor_ms: float
    conv_workspace: ConvWorkspace = "framework"

    def __post_init__(self) -> None:
        if not self.layers:
            raise PlanError(f"facts of {self.model!r} have no layers")
        if not (self.h2d_gbps > 0 and self.d2h_gbps > 0):
            raise PlanError(f"facts of {self.model!r}: copy rates must be positive (h2d {self.h2d_gbps}, "
                            f"d2h {self.d2h_gbps} GB/s)")  # fmt: skip
        names = [f.name for f in self.layers]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise PlanError(f"facts of {self.model!r}: layer name {dup!r} appears twice")

    def h2d_ms(self, nbytes: int) -> float:
        """One host->device copy of ``nbytes``, ms (0 for nothing)."""
        return nbytes / (self.h2d_gbps * 1e6) + self.copy_latency_ms if nbytes > 0 else 0.0

    def d2h_ms(self, nbytes: int) -> float:
        """One device->host copy of ``nbytes``, ms (0 for nothing)."""
        return nbytes / (self.d2h_gbps * 1e6) + self.copy_latency_ms if nbytes > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def part_ms(facts: InferenceFacts, f: LayerFacts, parts: int, units_p: int) -> float:
    """One partition of ``units_p`` channels of layer ``f`` split ``parts`` ways, ms (NOTE [ Inference plans ]): the
    whole forward when run whole; else, where one channel's partition was measured, the line from it to the whole
    layer (a partition costs a fixed part, its call, and a part that grows with its channels); else the layer's
    share; never less than ``facts.partition_floor_ms``."""
    if parts == 1:
        return f.forward_ms
    if f.one_channel_ms is not None and f.units > 1:
        ms = f.one_channel_ms + (f.forward_ms - f.one_channel_ms) * (units_p - 1) / (f.units - 1)
    else:
        ms = f.forward_ms * units_p / f.units
    return max(ms, facts.partition_floor_ms)


def floor_ms(layers: Sequence[LayerFacts]) -> float:
    """The cheapest forward among layers that make a tensor (NOTE [ Inference plans ]), ms; 0 if none does."""
    made = [f.forward_ms for f in layers if not f.aliases_input and f.forward_ms > 0]
    return min(made, default=0.0)


def facts_from_profile(profile: Profile, shapes: Sequence[LayerShape]) -> InferenceFacts:
    """Facts of a chain whose shapes are ``shapes`` with the forward times and host link of ``profile``.

    The profile must be of the same chain (stage ``k`` is layer ``k``, by name) at the batch the shapes were read
    at; bytes come from the shapes (eval semantics: Dropout passes its input through), times from the profile's
    forward, which inference runs. A profile carries copy bandwidths, not latencies: ``COPY_LATENCY_MS`` stands in.

    Raises:
        PlanError: the profile is of module stages, or its stages are not the layers (count or a name differs).
    """
    if profile.modules:
        raise PlanError(f"the profile of {profile.model!r} is of module stages; an inference plan needs a chain")
    if profile.n_stages != len(shapes):
        raise PlanError(
            f"the model has {len(shapes)} layers but the profile of {profile.model!r} has {profile.n_stages} stages; "
            "price a plan with the profile of this model"
        )
    layers = []
    for k, (shape, stage) in enumerate(zip(shapes, profile.stages, strict=True)):
        if shape.name != stage.name:
            raise PlanError(
                f"layer {k} of the model is {shape.name!r} but stage {k} of the profile is {stage.name!r}; "
                "price a plan with the profile of this model"
            )
        layers.append(LayerFacts(**{**asdict(shape), "forward_ms": stage.forward_ms}))
    return InferenceFacts(
        model=profile.model,
        batch=profile.batch,
        dtype=profile.dtype,
        device=profile.device.name,
        source=profile.source,
        layers=tuple(layers),
        h2d_gbps=profile.device.h2d_gbps,
        d2h_gbps=profile.device.d2h_gbps,
        copy_latency_ms=COPY_LATENCY_MS,
        copies_overlap=True,
        partition_floor_ms=floor_ms(layers),
    )
