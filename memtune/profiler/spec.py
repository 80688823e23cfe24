"""JSON model specs: networks outside the zoo, described as plain data and checked before anything is built.

A spec is a JSON object::

    {"name": "small-cnn",                       # optional label, not part of the architecture
     "input_shape": [3, 32, 32],                # [C, H, W] (images) or [seq_len, width] (sequences)
     "layers": [{"type": "conv2d", "out_channels": 16, "kernel_size": 3, "padding": 1},
                {"type": "relu", "inplace": true},
                {"type": "maxpool2d", "kernel_size": 2},
                {"type": "flatten"},
                {"type": "linear", "out_features": 10}]}

Layer types and their fields (sizes are positive integers; ``kernel_size``/``stride``/``padding``/
``output_size`` take an integer or ``[h, w]``; every layer may carry a ``name`` label):

=====================  ==========================================================================
``conv2d``             ``out_channels``, ``kernel_size``, ``stride`` = 1, ``padding`` = 0, ``bias`` = true
``batchnorm2d``        (none)
``relu``               ``inplace`` = false
``maxpool2d``          ``kernel_size``, ``stride`` = ``kernel_size``, ``padding`` = 0
``avgpool2d``          ``kernel_size``, ``stride`` = ``kernel_size``, ``padding`` = 0
``adaptive_avgpool2d`` ``output_size``
``flatten``            (none)
``linear``             ``out_features``, ``bias`` = true (on a 1-D input, or on the last dim of a 2-D one)
``dropout``            ``p`` = 0.5
``residual``           ``kind`` (``basic`` | ``bottleneck``), ``channels``, ``stride`` = 1
                       (a bottleneck outputs 4 x ``channels``; see ``memtune.profiler._layers``)
``transformer``        ``heads``, ``mlp_ratio`` = 4, ``causal`` = false (input ``[seq_len, width]``)
=====================  ==========================================================================

``validate_spec`` parses the spec with pydantic (``extra="forbid"``, a union discriminated on
``"type"``), then walks the layers *analytically*: it infers every layer's input and output shape, its
parameter count and the activation bytes it allocates, and checks ``SpecLimits``, all with integer
arithmetic, so that an oversized or malformed spec is refused before any module or tensor is allocated.
``from_spec`` then builds the ``ModelChain``. Nothing from a spec is executed, imported or unpickled: it
is plain data. The schema (field types, layer models, ``ModelSpec``) is in ``memtune.profiler._spec_layers``; its
names are re-exported here.

Every error is a ``memtune.profiler.profiler_errors.SpecError`` naming the layer index, the field and the limit, e.g.
``layer 3, field 'kernel_size': 9 is larger than the input 7x7 at this layer``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from memtune.profiler._spec_layers import (
    _LAYER_CLASSES,
    LAYER_TYPES,
    AdaptiveAvgPool2dLayer,
    AvgPool2dLayer,
    BatchNorm2dLayer,
    Conv2dLayer,
    DropoutLayer,
    FlattenLayer,
    LayerSpec,
    LinearLayer,
    MaxPool2dLayer,
    ModelSpec,
    ReLULayer,
    ResidualLayer,
    TransformerLayer,
    _is_int,
    _Layer,
)
from memtune.profiler.profiler_errors import SpecError

if (
    TYPE_CHECKING
):  # the modules are built with torch, imported there (NOTE [ Zoo names without torch ] in memtune.profiler.zoo)
    from torch import nn

    from memtune.profiler.chain import ModelChain, Stage

__all__ = [
    "LAYER_TYPES",
    "SPEC_VERSION",
    "AdaptiveAvgPool2dLayer",
    "AvgPool2dLayer",
    "BatchNorm2dLayer",
    "Conv2dLayer",
    "DropoutLayer",
    "FlattenLayer",
    "LayerInfo",
    "LayerSpec",
    "LinearLayer",
    "MaxPool2dLayer",
    "ModelSpec",
    "ReLULayer",
    "ResidualLayer",
    "SpecLimits",
    "TransformerLayer",
    "ValidatedSpec",
    "from_spec",
    "spec_hash",
    "to_chain",
    "validate_spec",
]

SPEC_VERSION = 1
"""Version of the canonical form that ``spec_hash`` digests; bumped if the meaning of a field changes."""

FLOAT_BYTES = 4
"""Activation bytes are estimated in float32."""

_INDEX_BYTES = 8  # max-pool keeps int64 argmax indices for backward
_MASK_BYTES = 1  # dropout keeps a bool mask


@dataclass(frozen=True)
class SpecLimits:
    """Upper bounds a spec must respect; checked analytically before anything is allocated.

    The defaults admit every zoo-sized network (VGG-16: 40 stages, 138 M parameters, ~0.1 GiB of
    activations per sample) with a wide margin, and refuse specs that could only exhaust the host while
    being built (a 10^12-parameter linear, a 10^6-layer list). Override by passing your own instance.

    Attributes:
        max_layers: most entries in ``layers`` (a residual or transformer block counts as one).
        max_params: most trainable parameters (elements, not bytes) in the whole model.
        max_activation_bytes: most bytes of activations one sample (batch 1) may allocate in a forward
            pass, float32, summed over layers (see ``LayerInfo.activation_bytes``).
        max_dim: largest value of any single size: an input dimension, channels, features, kernel,
            stride, padding, heads.
    """

    max_layers: int = 512
    max_params: int = 2_000_000_000
    max_activation_bytes: int = 64 * 2**30
    max_dim: int = 1 << 20


# ---------------------------------------------------------------------------------------------------
# Analytic shape, parameter and activation inference.


@dataclass(frozen=True)
class LayerInfo:
    """What one spec layer does, computed without building it.

    Attributes:
        index: position in ``layers``.
        type: the layer type.
        name: the stage's display name (the layer's ``name`` or its index).
        input_shape: one sample's input shape.
        output_shape: one sample's output shape.
        param_count: trainable parameters (elements).
        activation_bytes: bytes of new tensors the layer allocates in forward for one sample, float32:
            outputs, plus a block's intermediate tensors, max-pool indices (int64), dropout masks (bool),
            attention scores (heads x seq_len^2, the non-fused path, an upper bound). In-place ops and
            views (``relu`` with ``inplace``, ``flatten``) allocate nothing. An estimate for limits; the
            measured profile has the real saved bytes.
    """

    index: int
    type: str
    name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    param_count: int
    activation_bytes: int


def _describe(shape: tuple[int, ...]) -> str:
    if len(shape) == 3:
        return f"(C, H, W) = {shape}"
    if len(shape) == 2:
        return f"(seq_len, width) = {shape}"
    return f"({shape[0]} features)"


def _pair_text(p: tuple[int, int]) -> str:
    return str(p[0]) if p[0] == p[1] else f"{p[0]}x{p[1]}"


def _need_image(i: int, layer_type: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) != 3:
        raise SpecError(
            f"a {layer_type} layer needs a (C, H, W) image input, but the input here is {_describe(shape)}; "
            "move it before any flatten, or give the spec an input_shape of [C, H, W]",
            layer=i,
            field="type",
        )
    return shape[0], shape[1], shape[2]


def _window(
    i: int, layer_type: str, hw: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int], pad: tuple[int, int]
) -> tuple[int, int]:
    """Output (H, W) of a sliding window; refuses a kernel larger than the padded input."""
    if any(kernel[d] > hw[d] + 2 * pad[d] for d in (0, 1)):
        padded = f" (padding {_pair_text(pad)})" if any(pad) else ""
        raise SpecError(
            f"{_pair_text(kernel)} is larger than the input {hw[0]}x{hw[1]}{padded} at this layer; "
            f"use a smaller kernel_size or more padding, or remove a downsampling layer before it",
            layer=i,
            field="kernel_size",
        )
    return tuple((hw[d] + 2 * pad[d] - kernel[d]) // stride[d] + 1 for d in (0, 1))  # type: ignore[return-value]


def _infer_layer(i: int, layer: _Layer, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int, int]:
    """One layer's output shape, parameter count and activation elements-as-bytes (see ``LayerInfo``)."""
    f = FLOAT_BYTES
    if isinstance(layer, Conv2dLayer):
        c, h, w = _need_image(i, "conv2d", shape)
        oh, ow = _window(i, "conv2d", (h, w), layer.kernel_size, layer.stride, layer.padding)
        k = layer.kernel_size[0] * layer.kernel_size[1]
        params = layer.out_channels * c * k + (layer.out_channels if layer.bias else 0)
        out = (layer.out_channels, oh, ow)
        return out, params, math.prod(out) * f
    if isinstance(layer, BatchNorm2dLayer):
        c, _, _ = _need_image(i, "batchnorm2d", shape)
        return shape, 2 * c, math.prod(shape) * f
    if isinstance(layer, ReLULayer):
        return shape, 0, 0 if layer.inplace else math.prod(shape) * f
    if isinstance(layer, MaxPool2dLayer | AvgPool2dLayer):
        kind = layer.type
        c, h, w = _need_image(i, kind, shape)
        for d in (0, 1):
            if layer.padding[d] > layer.kernel_size[d] // 2:
                raise SpecError(
                    f"{_pair_text(layer.padding)} is more than half the kernel {_pair_text(layer.kernel_size)}; "
                    "pooling padding may be at most kernel_size // 2",
                    layer=i,
                    field="padding",
                )
        oh, ow = _window(i, kind, (h, w), layer.kernel_size, layer.stride, layer.padding)
        out = (c, oh, ow)
        per = f + (_INDEX_BYTES if isinstance(layer, MaxPool2dLayer) else 0)
        return out, 0, math.prod(out) * per
    if isinstance(layer, AdaptiveAvgPool2dLayer):
        c, _, _ = _need_image(i, "adaptive_avgpool2d", shape)
        out = (c, *layer.output_size)
        return out, 0, math.prod(out) * f
    if isinstance(layer, FlattenLayer):
        return (math.prod(shape),), 0, 0
    if isinstance(layer, LinearLayer):
        if len(shape) == 3:
            raise SpecError(
                f"a linear layer needs a flat input, but the input here is 3-D {_describe(shape)}; "
                'add {"type": "flatten"} (or an adaptive_avgpool2d and a flatten) before it',
                layer=i,
                field="type",
            )
        params = shape[-1] * layer.out_features + (layer.out_features if layer.bias else 0)
        flat = (*shape[:-1], layer.out_features)
        return flat, params, math.prod(flat) * f
    if isinstance(layer, DropoutLayer):
        return shape, 0, math.prod(shape) * (f + _MASK_BYTES)
    if isinstance(layer, ResidualLayer):
        c, h, w = _need_image(i, "residual", shape)
        s = layer.stride
        oh, ow = (h - 1) // s + 1, (w - 1) // s + 1  # 3x3, padding 1, stride s
        width = layer.channels
        if layer.kind == "basic":
            out_c = width
            params = c * width * 9 + width * width * 9 + 4 * width
            tensors = 4 * width * oh * ow  # conv1, bn1, conv2, bn2 (relu and += in place)
        else:
            from memtune.profiler._layers import BOTTLENECK_EXPANSION

            out_c = width * BOTTLENECK_EXPANSION
            params = c * width + width * width * 9 + width * out_c + 4 * width + 2 * out_c
            tensors = 2 * width * h * w + 2 * width * oh * ow + 2 * out_c * oh * ow
        if s != 1 or c != out_c:
            params += c * out_c + 2 * out_c  # 1x1 projection + batch norm
            tensors += 2 * out_c * oh * ow
        return (out_c, oh, ow), params, tensors * f
    if isinstance(layer, TransformerLayer):
        if len(shape) != 2:
            raise SpecError(
                f"a transformer layer needs a (seq_len, width) input, but the input here is {_describe(shape)}; "
                "give the spec an input_shape of [seq_len, width] and put transformer layers first",
                layer=i,
                field="type",
            )
        seq, width = shape
        if width % layer.heads != 0:
            raise SpecError(
                f"{layer.heads} heads do not divide the width {width} at this layer; pick heads that divide it",
                layer=i,
                field="heads",
            )
        hidden = layer.mlp_ratio * width
        params = 4 * width + (3 * width * width + 3 * width) + (width * width + width)
        params += width * hidden + hidden + hidden * width + width
        # ln1, qkv (3), attention out, merged heads, proj, residual, ln2, fc2, residual = 11 x seq*width;
        # fc1 and gelu = 2 x seq*hidden; attention scores heads x seq^2.
        tensors = 11 * seq * width + 2 * seq * hidden + layer.heads * seq * seq
        return shape, params, tensors * f
    raise SpecError(f"unknown layer type {getattr(layer, 'type', '?')!r}; allowed types: {', '.join(LAYER_TYPES)}")


_SIZE_FIELD = {"conv2d": "out_channels", "linear": "out_features", "residual": "channels"}


def _check_dims(i: int, layer: _Layer, limits: SpecLimits) -> None:
    for name in type(layer).model_fields:
        value = getattr(layer, name)
        values = value if isinstance(value, tuple) else (value,)
        if any(_is_int(v) and v > limits.max_dim for v in values):
            raise SpecError(
                f"{value!r} is above the largest allowed size {limits.max_dim} (SpecLimits.max_dim)",
                layer=i,
                field=name,
            )


def _infer(spec: ModelSpec, limits: SpecLimits) -> tuple[LayerInfo, ...]:
    if max(spec.input_shape) > limits.max_dim:
        raise SpecError(
            f"{list(spec.input_shape)} has a dimension above the largest allowed size {limits.max_dim} "
            "(SpecLimits.max_dim)",
            field="input_shape",
        )
    shape = spec.input_shape
    infos: list[LayerInfo] = []
    total_params = 0
    total_bytes = 0
    seen: dict[str, int] = {}
    for i, layer in enumerate(spec.layers):
        _check_dims(i, layer, limits)
        name = layer.name if layer.name is not None else str(i)
        if name in seen:
            raise SpecError(
                f"{name!r} is already the name of layer {seen[name]}; stage names must be unique", layer=i, field="name"
            )
        seen[name] = i
        out, params, act = _infer_layer(i, layer, shape)
        total_params += params
        total_bytes += act
        if total_params > limits.max_params:
            raise SpecError(
                f"the model reaches {total_params:,} parameters at this layer, above the limit of "
                f"{limits.max_params:,} (SpecLimits.max_params); make the layer smaller or pass larger limits",
                layer=i,
                field=_SIZE_FIELD.get(layer.type),
            )
        if total_bytes > limits.max_activation_bytes:
            raise SpecError(
                f"activations reach {total_bytes:,} bytes per sample at this layer, above the limit of "
                f"{limits.max_activation_bytes:,} (SpecLimits.max_activation_bytes); reduce input_shape or "
                "downsample earlier, or pass larger limits",
                layer=i,
                field=_SIZE_FIELD.get(layer.type),
            )
        infos.append(
            LayerInfo(
                index=i,
                type=layer.type,
                name=name,
                input_shape=shape,
                output_shape=out,
                param_count=params,
                activation_bytes=act,
            )
        )
        shape = out
    return tuple(infos)


# ---------------------------------------------------------------------------------------------------
# Validation errors -> SpecError.


def _translate(err: ValidationError) -> SpecError:
    errors = err.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    kind = first["type"]
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    msg = str(first["msg"]).removeprefix("Value error, ")
    value = first.get("input")

    layer: int | None = None
    layer_type: str | None = None
    rest: tuple[Any, ...] = loc
    if loc[:1] == ("layers",) and len(loc) >= 2 and isinstance(loc[1], int):
        layer = loc[1]
        rest = loc[2:]
        if rest and rest[0] in _LAYER_CLASSES:
            layer_type = rest[0]
            rest = rest[1:]
    field = next((p for p in rest if isinstance(p, str)), None)
    if field is None and layer is None and loc:
        field = str(loc[0])

    if kind == "union_tag_invalid":
        tag = value.get("type") if isinstance(value, Mapping) else value
        return SpecError(
            f"unknown layer type {tag!r}{more}; allowed types: {', '.join(LAYER_TYPES)}", layer=layer, field="type"
        )
    if kind == "union_tag_not_found":
        return SpecError(
            f"every layer needs a 'type'{more}; allowed types: {', '.join(LAYER_TYPES)}", layer=layer, field="type"
        )
    if kind in ("model_attributes_type", "model_type", "dict_type") and layer is not None and field is None:
        return SpecError(f'each layer must be a JSON object like {{"type": "relu"}}, got {value!r}{more}', layer=layer)
    if kind == "extra_forbidden":
        if layer_type is not None:
            allowed = ", ".join(n for n in _LAYER_CLASSES[layer_type].model_fields if n != "type")
            return SpecError(
                f"{layer_type} layers have no such field{more}; allowed fields: {allowed}", layer=layer, field=field
            )
        return SpecError(f"a spec has no such field{more}; allowed fields: name, input_shape, layers", field=field)
    if kind == "missing":
        what = f"{layer_type} layers" if layer_type else "a spec"
        return SpecError(f"is required for {what}{more}", layer=layer, field=field)
    if kind == "too_short" and field == "layers":
        return SpecError(f"a spec needs at least one layer{more}", field=field)
    if kind == "model_type" and not loc:
        return SpecError("a model spec must be a JSON object with 'input_shape' and 'layers'")
    if "got" not in msg and kind != "missing":
        msg = f"{msg}, got {value!r}"
    return SpecError(f"{msg}{more}", layer=layer, field=field)


# ---------------------------------------------------------------------------------------------------
# Public API.


@dataclass(frozen=True)
class ValidatedSpec:
    """A spec that passed validation, with every layer's shapes and costs (see ``LayerInfo``).

    Attributes:
        spec: the parsed spec (defaults filled in, sizes normalised to ``(h, w)`` pairs).
        layers: per-layer inference, in order.
        limits: the limits it was checked against.
    """

    spec: ModelSpec
    layers: tuple[LayerInfo, ...]
    limits: SpecLimits = field(default_factory=SpecLimits)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample's input shape."""
        return self.spec.input_shape

    @property
    def output_shape(self) -> tuple[int, ...]:
        """One sample's output shape."""
        return self.layers[-1].output_shape

    @property
    def param_count(self) -> int:
        """Trainable parameters of the whole model (elements)."""
        return sum(info.param_count for info in self.layers)

    @property
    def activation_bytes(self) -> int:
        """Estimated float32 activation bytes one sample allocates in forward (see ``LayerInfo``)."""
        return sum(info.activation_bytes for info in self.layers)

    def canonical(self) -> dict[str, Any]:
        """The architecture as canonical JSON-ready data: defaults filled, sizes as ``[h, w]``, no labels.

        Labels (the spec's and the layers' ``name``) are left out: two specs that differ only in labels
        describe the same network and share a hash (and so share stored profiles).
        """
        layers = [layer.model_dump(mode="json", exclude={"name"}) for layer in self.spec.layers]
        return {"spec_version": SPEC_VERSION, "input_shape": list(self.spec.input_shape), "layers": layers}

    def hash(self) -> str:
        """sha256 hex digest of ``canonical()`` as sorted-key, compact JSON."""
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode("ascii")).hexdigest()


def validate_spec(spec: Mapping[str, object] | ModelSpec, limits: SpecLimits | None = None) -> ValidatedSpec:
    """Parse and check a spec without allocating anything.

    Args:
        spec: the spec as plain JSON data (``json.load`` output) or an already parsed ``ModelSpec``.
        limits: bounds to enforce; ``SpecLimits()`` by default.

    Returns:
        The validated spec with per-layer shapes, parameter counts and activation bytes.

    Raises:
        SpecError: naming the layer index, the field and the limit or rule broken.
    """
    limits = limits or SpecLimits()
    if isinstance(spec, ModelSpec):
        parsed = spec
    else:
        if not isinstance(spec, Mapping):
            raise SpecError(
                f"a model spec must be a JSON object with 'input_shape' and 'layers', got {type(spec).__name__}"
            )
        layers = spec.get("layers")
        if isinstance(layers, Sequence) and not isinstance(layers, str) and len(layers) > limits.max_layers:
            raise SpecError(
                f"{len(layers)} layers is more than the limit of {limits.max_layers} (SpecLimits.max_layers); "
                "use residual/transformer blocks (one layer each) or pass larger limits",
                field="layers",
            )
        try:
            parsed = ModelSpec.model_validate(dict(spec))
        except ValidationError as err:
            raise _translate(err) from None
    if len(parsed.layers) > limits.max_layers:
        raise SpecError(
            f"{len(parsed.layers)} layers is more than the limit of {limits.max_layers} (SpecLimits.max_layers)",
            field="layers",
        )
    return ValidatedSpec(spec=parsed, layers=_infer(parsed, limits), limits=limits)


def spec_hash(spec: Mapping[str, object] | ModelSpec | ValidatedSpec, limits: SpecLimits | None = None) -> str:
    """sha256 hex digest (64 characters) of the validated spec's canonical JSON.

    Stable across key order, defaults written or omitted, ``3`` vs ``[3, 3]`` and labels; any change to
    the architecture changes it. See ``ValidatedSpec.canonical``.
    """
    validated = spec if isinstance(spec, ValidatedSpec) else validate_spec(spec, limits)
    return validated.hash()


def _module(layer: _Layer, info: LayerInfo) -> nn.Module:
    from torch import nn

    from memtune.profiler._layers import BasicBlock, Bottleneck, TransformerBlock

    shape = info.input_shape
    if isinstance(layer, Conv2dLayer):
        return nn.Conv2d(shape[0], layer.out_channels, layer.kernel_size, layer.stride, layer.padding, bias=layer.bias)
    if isinstance(layer, BatchNorm2dLayer):
        return nn.BatchNorm2d(shape[0])
    if isinstance(layer, ReLULayer):
        return nn.ReLU(inplace=layer.inplace)
    if isinstance(layer, MaxPool2dLayer):
        return nn.MaxPool2d(layer.kernel_size, layer.stride, layer.padding)
    if isinstance(layer, AvgPool2dLayer):
        return nn.AvgPool2d(layer.kernel_size, layer.stride, layer.padding)
    if isinstance(layer, AdaptiveAvgPool2dLayer):
        return nn.AdaptiveAvgPool2d(layer.output_size)
    if isinstance(layer, FlattenLayer):
        return nn.Flatten()
    if isinstance(layer, LinearLayer):
        return nn.Linear(shape[-1], layer.out_features, bias=layer.bias)
    if isinstance(layer, DropoutLayer):
        return nn.Dropout(layer.p)
    if isinstance(layer, ResidualLayer):
        block = BasicBlock if layer.kind == "basic" else Bottleneck
        return block(shape[0], layer.channels, layer.stride)
    if isinstance(layer, TransformerLayer):
        return TransformerBlock(shape[-1], layer.heads, layer.mlp_ratio, causal=layer.causal)
    raise SpecError(f"unknown layer type {info.type!r}; allowed types: {', '.join(LAYER_TYPES)}", layer=info.index)


def to_chain(
    validated: ValidatedSpec,
    *,
    name: str | None = None,
    params: Mapping[str, int | float | str | bool] | None = None,
) -> ModelChain:
    """Build the modules of a validated spec as a ``ModelChain`` (one stage per layer).

    Args:
        validated: from ``validate_spec``.
        name: the chain's name; ``spec:<spec_hash>`` by default.
        params: the chain's ``params``; by default ``{"spec_hash": ..., "spec_name": ...}``.
    """
    from memtune.profiler.chain import ModelChain, flatten

    digest = validated.hash()
    stages: list[Stage] = []
    for layer, info in zip(validated.spec.layers, validated.layers, strict=True):
        stages.extend(flatten(_module(layer, info), prefix=f"{info.name}."))
    if params is None:
        params = {"spec_hash": digest}
        if validated.spec.name is not None:
            params["spec_name"] = validated.spec.name
    return ModelChain(
        name=name if name is not None else f"spec:{digest}",
        stages=stages,
        input_shape=validated.input_shape,
        input_kind="image",  # a float tensor: [C, H, W] images or [seq_len, width] sequences
        params=dict(params),
    )


def from_spec(spec: Mapping[str, object] | ModelSpec, limits: SpecLimits | None = None) -> ModelChain:
    """Validate a JSON model spec (see the module docstring) and build it as a ``ModelChain``.

    The chain is named ``spec:<spec_hash>``; its ``params`` hold ``spec_hash`` and the spec's ``name``.

    Raises:
        SpecError: the spec is invalid or exceeds ``limits``; nothing was allocated.

    Example::

        chain = from_spec({"input_shape": [3, 32, 32], "layers": [
            {"type": "conv2d", "out_channels": 8, "kernel_size": 3}, {"type": "relu"},
            {"type": "flatten"}, {"type": "linear", "out_features": 10}]})
    """
    return to_chain(validate_spec(spec, limits))
