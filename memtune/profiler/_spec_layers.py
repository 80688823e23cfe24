"""The JSON model spec's schema (``memtune.profiler.spec``): its field types (strict JSON integers, sizes as ``n`` or
``[h, w]`` in elements, probabilities, labels), one pydantic model per layer type, the union ``LayerSpec``
discriminated on ``"type"``, and ``ModelSpec``, the parsed spec."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

__all__ = [
    "LAYER_TYPES",
    "AdaptiveAvgPool2dLayer",
    "AvgPool2dLayer",
    "BatchNorm2dLayer",
    "Conv2dLayer",
    "DropoutLayer",
    "FlattenLayer",
    "LayerSpec",
    "LinearLayer",
    "MaxPool2dLayer",
    "ModelSpec",
    "ReLULayer",
    "ResidualLayer",
    "TransformerLayer",
]


# ---------------------------------------------------------------------------------------------------
# Field types. Integers must be JSON integers (not 3.0, not "3", not true); sizes accept n or [h, w].
# The checks raise ValueError even for a wrong type: pydantic turns ValueError (not TypeError) into a
# validation error that names the field.


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_check(minimum: int) -> Any:
    def check(v: object) -> int:
        if not _is_int(v):
            raise ValueError(f"must be an integer, got {v!r}")
        assert isinstance(v, int)
        if v < minimum:
            raise ValueError(f"must be at least {minimum}, got {v}")
        return v

    return BeforeValidator(check)


def _pair_check(minimum: int) -> Any:
    def check(v: object) -> tuple[int, int]:
        items: object = [v, v] if _is_int(v) else v
        if not isinstance(items, list | tuple) or len(items) != 2 or not all(_is_int(x) for x in items):
            raise ValueError(f"must be an integer or a list of two integers [h, w], got {v!r}")
        h, w = int(items[0]), int(items[1])
        if min(h, w) < minimum:
            raise ValueError(f"must be at least {minimum}, got {v!r}")
        return (h, w)

    return BeforeValidator(check)


def _bool_check(v: object) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, got {v!r}")
    return v


def _probability_check(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"must be a number, got {v!r}")
    if not 0.0 <= v < 1.0:
        raise ValueError(f"must be in [0, 1), got {v!r}")
    return float(v)


def _name_check(v: object) -> str:
    if not isinstance(v, str) or not 1 <= len(v) <= 64 or not all(c.isalnum() or c in "._-" for c in v):
        raise ValueError(f"must be 1 to 64 characters of letters, digits, '.', '_' or '-', got {v!r}")
    return v


def _label_check(v: object) -> str:
    if not isinstance(v, str) or not 1 <= len(v) <= 200 or not v.isprintable():
        raise ValueError(f"must be 1 to 200 printable characters, got {v!r}")
    return v


PositiveInt = Annotated[int, _int_check(1)]
Pair = Annotated[tuple[int, int], _pair_check(1)]
NonNegativePair = Annotated[tuple[int, int], _pair_check(0)]
StrictBool = Annotated[bool, BeforeValidator(_bool_check)]
Probability = Annotated[float, BeforeValidator(_probability_check)]
Label = Annotated[str, BeforeValidator(_name_check)]


class _Layer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Label | None = Field(default=None, description="display label of the stage; not architecture")


class Conv2dLayer(_Layer):
    """2-D convolution; ``in_channels`` comes from the running shape."""

    type: Literal["conv2d"]
    out_channels: PositiveInt
    kernel_size: Pair
    stride: Pair = (1, 1)
    padding: NonNegativePair = (0, 0)
    bias: StrictBool = True


class BatchNorm2dLayer(_Layer):
    """Batch normalisation over the channels of a ``(C, H, W)`` input."""

    type: Literal["batchnorm2d"]


class ReLULayer(_Layer):
    """ReLU; ``inplace`` overwrites its input (allocates nothing)."""

    type: Literal["relu"]
    inplace: StrictBool = False


def _stride_defaults_to_kernel(data: object) -> object:
    if isinstance(data, dict) and data.get("stride") is None and "kernel_size" in data:
        return {**data, "stride": data["kernel_size"]}
    return data


class _Pool2dLayer(_Layer):
    """Pooling window: ``stride`` defaults to ``kernel_size``; ``padding`` at most half the kernel."""

    kernel_size: Pair
    stride: Pair
    padding: NonNegativePair = (0, 0)

    @model_validator(mode="before")
    @classmethod
    def default_stride(cls, data: Any) -> Any:
        """``stride`` defaults to ``kernel_size``."""
        return _stride_defaults_to_kernel(data)


class MaxPool2dLayer(_Pool2dLayer):
    """Max pooling; ``stride`` defaults to ``kernel_size``; ``padding`` at most half the kernel."""

    type: Literal["maxpool2d"]


class AvgPool2dLayer(_Pool2dLayer):
    """Average pooling; ``stride`` defaults to ``kernel_size``; ``padding`` at most half the kernel."""

    type: Literal["avgpool2d"]


class AdaptiveAvgPool2dLayer(_Layer):
    """Adaptive average pooling to a fixed ``output_size`` whatever the input's height and width."""

    type: Literal["adaptive_avgpool2d"]
    output_size: Pair


class FlattenLayer(_Layer):
    """Flattens one sample to 1-D (``nn.Flatten``: all dims after the batch)."""

    type: Literal["flatten"]


class LinearLayer(_Layer):
    """Fully connected layer; ``in_features`` is the last dim of the running shape."""

    type: Literal["linear"]
    out_features: PositiveInt
    bias: StrictBool = True


class DropoutLayer(_Layer):
    """Dropout with drop probability ``p``."""

    type: Literal["dropout"]
    p: Probability = 0.5


class ResidualLayer(_Layer):
    """A ResNet block (``memtune.profiler._layers.BasicBlock`` / ``Bottleneck``), one stage."""

    type: Literal["residual"]
    kind: Literal["basic", "bottleneck"]
    channels: PositiveInt
    stride: PositiveInt = 1


class TransformerLayer(_Layer):
    """A pre-norm transformer block (``memtune.profiler._layers.TransformerBlock``) on ``[seq_len, width]``, one
    stage."""

    type: Literal["transformer"]
    heads: PositiveInt
    mlp_ratio: PositiveInt = 4
    causal: StrictBool = False


LayerSpec = Annotated[
    Conv2dLayer
    | BatchNorm2dLayer
    | ReLULayer
    | MaxPool2dLayer
    | AvgPool2dLayer
    | AdaptiveAvgPool2dLayer
    | FlattenLayer
    | LinearLayer
    | DropoutLayer
    | ResidualLayer
    | TransformerLayer,
    Field(discriminator="type"),
]

_LAYER_CLASSES: dict[str, type[_Layer]] = {
    "conv2d": Conv2dLayer,
    "batchnorm2d": BatchNorm2dLayer,
    "relu": ReLULayer,
    "maxpool2d": MaxPool2dLayer,
    "avgpool2d": AvgPool2dLayer,
    "adaptive_avgpool2d": AdaptiveAvgPool2dLayer,
    "flatten": FlattenLayer,
    "linear": LinearLayer,
    "dropout": DropoutLayer,
    "residual": ResidualLayer,
    "transformer": TransformerLayer,
}
LAYER_TYPES: tuple[str, ...] = tuple(_LAYER_CLASSES)
"""Every value ``"type"`` may take in a spec layer."""


def _shape_check(v: object) -> tuple[int, ...]:
    if not isinstance(v, list | tuple) or len(v) not in (2, 3) or not all(_is_int(x) for x in v):
        raise ValueError(f"must be [C, H, W] (images) or [seq_len, width] (sequences) of integers, got {v!r}")
    if min(v) < 1:
        raise ValueError(f"every dimension must be at least 1, got {list(v)}")
    return tuple(int(x) for x in v)


class ModelSpec(BaseModel):
    """The parsed spec (fields as in the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, BeforeValidator(_label_check)] | None = None
    input_shape: Annotated[tuple[int, ...], BeforeValidator(_shape_check)]
    layers: list[LayerSpec] = Field(min_length=1)
