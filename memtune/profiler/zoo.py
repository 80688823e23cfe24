"""The model zoo: the networks memtune's papers study, built from ``torch.nn`` only, as ``ModelChain``s.

=================  ===========================================================================
``vgg16/19``       torchvision's VGG (Simonyan & Zisserman, 2015): features with in-place ReLU
                   and max pools, adaptive average pool to 7x7, flatten, classifier
``vgg116..vgg516`` vDNN's very deep VGGs (Rhu et al., 2016, section 4.3), see ``deep_vgg_groups``
``alexnet``        torchvision's AlexNet (Krizhevsky, 2014 "one weird trick" variant)
``overfeat``       the "fast" OverFeat model (Sermanet et al., 2014, table 1), 231x231 input
``resnet18/50``    torchvision's ResNet v1.5 (He et al., 2016): stem as four stages, one stage per
                   residual block, average pool, flatten, fc
``gpt``            a decoder-only, pre-norm transformer: embedding, ``layers`` blocks, LayerNorm, head
=================  ===========================================================================

Image models are written as JSON model specs (``memtune.profiler.spec``) and built through it, so their shapes
are checked analytically before any module is allocated; stage names follow torchvision's module names
(``features.0``, ``layer3.2``, ``classifier.6``). Parameter counts at 224x224 and 1000 classes equal
torchvision's (VGG-16 138,357,544; AlexNet 61,100,840; ResNet-18 11,689,512; ResNet-50 25,557,032).

Names are case-insensitive and ignore ``-``/``_``: ``build("VGG-16")``, ``build("resnet_50")``.

# NOTE [ Zoo names without torch ]
A zoo model's name and parameters alone find its committed profile (``resolve_zoo``, then ``find_profile``), and
``memtune tune vgg16 …`` on a machine without a GPU needs nothing else before its torch-free search. This module and
``memtune.profiler.spec`` therefore import torch only where modules are built (``build``, ``to_chain``): importing torch
and building VGG-16 on the meta device (whose weight initialisation loads ``torch._dynamo``) took about 5 s of that
command's 21 s on the 2-core machine.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from memtune.profiler.profiler_errors import SpecError
from memtune.profiler.spec import FLOAT_BYTES, SpecLimits, ValidatedSpec, to_chain, validate_spec

if TYPE_CHECKING:  # NOTE [ Zoo names without torch ]
    from torch import nn

    from memtune.profiler.chain import ModelChain, Stage

__all__ = [
    "IMAGE_SIZE_LIMIT",
    "ZOO",
    "ZOO_LIMITS",
    "ZOO_NAMES",
    "ParamSpec",
    "ZooEntry",
    "build",
    "deep_vgg_groups",
    "gpt_param_count",
    "image_spec",
    "normalize_name",
    "resolve_zoo",
    "zoo_params",
]

ZOO_LIMITS = SpecLimits(max_layers=4096, max_params=20_000_000_000, max_activation_bytes=256 * 2**30)
"""Limits zoo models are checked against: wider than ``SpecLimits()`` (VGG-516 has 1,045 stages), but
still refusing parameter choices that could only exhaust memory (more than 2e10 parameters, 256 GiB of
float32 activations per sample)."""

IMAGE_SIZE_LIMIT = 4096
"""Largest ``image_size`` (pixels, height = width) accepted by image models."""


@dataclass(frozen=True)
class ParamSpec:
    """One integer parameter of a zoo model: default and inclusive range."""

    name: str
    default: int
    minimum: int
    maximum: int
    doc: str

    def describe(self) -> str:
        """``name (minimum..maximum, default d)``."""
        return f"{self.name} ({self.minimum}..{self.maximum}, default {self.default})"


@dataclass(frozen=True)
class ZooEntry:
    """A zoo model: its name, what it is, its parameters and its builder.

    ``builder`` receives every parameter, resolved and range-checked, and returns the chain.
    """

    name: str
    summary: str
    params: tuple[ParamSpec, ...]
    builder: Callable[[dict[str, int]], ModelChain]

    def defaults(self) -> dict[str, int]:
        """The default value of every parameter."""
        return {p.name: p.default for p in self.params}

    def resolve(self, params: Mapping[str, object] | None) -> dict[str, int]:
        """Merge ``params`` over the defaults, checking names, types and ranges.

        Integers may be given as ints, integral floats (``32.0``) or decimal strings (``"32"``, as a CLI
        passes them).

        Raises:
            SpecError: with ``field`` set to the offending parameter, naming the allowed range.
        """
        known = {p.name: p for p in self.params}
        resolved = self.defaults()
        for key, value in (params or {}).items():
            spec = known.get(key)
            if spec is None:
                allowed = ", ".join(p.describe() for p in self.params)
                raise SpecError(f"{self.name} has no parameter {key!r}; its parameters are: {allowed}", field=key)
            number = _as_int(value)
            if number is None or not spec.minimum <= number <= spec.maximum:
                raise SpecError(
                    f"{value!r} is not valid for {self.name}: {key} must be an integer in "
                    f"{spec.minimum}..{spec.maximum} (default {spec.default})",
                    field=key,
                )
            resolved[key] = number
        return resolved


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value.strip())
    return None


def normalize_name(name: str) -> str:
    """Lower-case and drop ``-``, ``_`` and spaces: ``"VGG-16"`` -> ``"vgg16"``."""
    return "".join(c for c in name.lower() if c not in "-_ ")


# ---------------------------------------------------------------------------------------------------
# Image models as spec layers.

Layer = dict[str, Any]


def _conv(name: str, out: int, kernel: int, stride: int = 1, padding: int = 0, *, bias: bool = True) -> Layer:
    return {
        "type": "conv2d",
        "name": name,
        "out_channels": out,
        "kernel_size": kernel,
        "stride": stride,
        "padding": padding,
        "bias": bias,
    }


def _relu(name: str) -> Layer:
    return {"type": "relu", "name": name, "inplace": True}


def _maxpool(name: str, kernel: int, stride: int, padding: int = 0) -> Layer:
    return {"type": "maxpool2d", "name": name, "kernel_size": kernel, "stride": stride, "padding": padding}


def _linear(name: str, out: int) -> Layer:
    return {"type": "linear", "name": name, "out_features": out}


def _dropout(name: str) -> Layer:
    return {"type": "dropout", "name": name, "p": 0.5}


def _numbered(prefix: str, layers: list[Callable[[str], Layer]]) -> list[Layer]:
    return [make(f"{prefix}.{i}") for i, make in enumerate(layers)]


VGG_WIDTHS = (64, 128, 256, 512, 512)
_VGG_DEPTHS = {"vgg16": (2, 2, 3, 3, 3), "vgg19": (2, 2, 4, 4, 4)}
_DEEP_VGG = ("vgg116", "vgg216", "vgg316", "vgg416", "vgg516")


def deep_vgg_groups(hundreds: int) -> tuple[int, ...]:
    """Convolutions per group of the very deep VGG with ``16 + 100 * hundreds`` layers.

    Rhu et al., "vDNN: Virtualized Deep Neural Networks for Scalable, Memory-Efficient Neural Network
    Design", MICRO 2016, section 4.3: "We follow similar measures to deepen the layer depth of VGG by
    gradually adding 100 more CONV layers to VGG-16, resulting in VGG-116/216/316/416/516 network
    configurations. For each addition of 100 CONV layers, we add 20 more CONV layers to each of the five
    CONV layer groups. The added CONV layers have the same number of output feature maps that are
    employed for that layer group." So VGG-116 has (22, 22, 23, 23, 23) 3x3 convolutions, VGG-516
    (102, 102, 103, 103, 103); the pools and the classifier are VGG-16's.
    """
    return tuple(n + 20 * hundreds for n in _VGG_DEPTHS["vgg16"])


def _vgg_layers(groups: tuple[int, ...], num_classes: int) -> list[Layer]:
    features: list[Callable[[str], Layer]] = []
    for width, depth in zip(VGG_WIDTHS, groups, strict=True):
        for _ in range(depth):
            features += [partial(_conv, out=width, kernel=3, padding=1), _relu]
        features.append(lambda n: _maxpool(n, 2, 2))
    classifier: list[Callable[[str], Layer]] = [
        lambda n: _linear(n, 4096),
        _relu,
        _dropout,
        lambda n: _linear(n, 4096),
        _relu,
        _dropout,
        lambda n: _linear(n, num_classes),
    ]
    return [
        *_numbered("features", features),
        {"type": "adaptive_avgpool2d", "name": "avgpool", "output_size": 7},
        {"type": "flatten", "name": "flatten"},
        *_numbered("classifier", classifier),
    ]


def _alexnet_layers(num_classes: int) -> list[Layer]:
    features: list[Callable[[str], Layer]] = [
        lambda n: _conv(n, 64, 11, stride=4, padding=2),
        _relu,
        lambda n: _maxpool(n, 3, 2),
        lambda n: _conv(n, 192, 5, padding=2),
        _relu,
        lambda n: _maxpool(n, 3, 2),
        lambda n: _conv(n, 384, 3, padding=1),
        _relu,
        lambda n: _conv(n, 256, 3, padding=1),
        _relu,
        lambda n: _conv(n, 256, 3, padding=1),
        _relu,
        lambda n: _maxpool(n, 3, 2),
    ]
    classifier: list[Callable[[str], Layer]] = [
        _dropout,
        lambda n: _linear(n, 4096),
        _relu,
        _dropout,
        lambda n: _linear(n, 4096),
        _relu,
        lambda n: _linear(n, num_classes),
    ]
    return [
        *_numbered("features", features),
        {"type": "adaptive_avgpool2d", "name": "avgpool", "output_size": 6},
        {"type": "flatten", "name": "flatten"},
        *_numbered("classifier", classifier),
    ]


def _overfeat_layers(num_classes: int) -> list[Layer]:
    """OverFeat "fast" (Sermanet et al., ICLR 2014, table 1); dropout 0.5 on FC 6 and 7 as in the paper.

    At 231x231 the maps are 56 -> 28 -> 24 -> 12 -> 12 -> 12 -> 6 (x 1024) before the 3072-unit FC.
    At other sizes the first FC takes whatever ``1024 x s x s`` the features produce.
    """
    features: list[Callable[[str], Layer]] = [
        lambda n: _conv(n, 96, 11, stride=4),
        _relu,
        lambda n: _maxpool(n, 2, 2),
        lambda n: _conv(n, 256, 5),
        _relu,
        lambda n: _maxpool(n, 2, 2),
        lambda n: _conv(n, 512, 3, padding=1),
        _relu,
        lambda n: _conv(n, 1024, 3, padding=1),
        _relu,
        lambda n: _conv(n, 1024, 3, padding=1),
        _relu,
        lambda n: _maxpool(n, 2, 2),
    ]
    classifier: list[Callable[[str], Layer]] = [
        lambda n: _linear(n, 3072),
        _relu,
        _dropout,
        lambda n: _linear(n, 4096),
        _relu,
        _dropout,
        lambda n: _linear(n, num_classes),
    ]
    return [
        *_numbered("features", features),
        {"type": "flatten", "name": "flatten"},
        *_numbered("classifier", classifier),
    ]


_RESNET_BLOCKS = {"resnet18": ("basic", (2, 2, 2, 2)), "resnet50": ("bottleneck", (3, 4, 6, 3))}


def _resnet_layers(kind: str, blocks: tuple[int, ...], num_classes: int) -> list[Layer]:
    layers: list[Layer] = [
        _conv("conv1", 64, 7, stride=2, padding=3, bias=False),
        {"type": "batchnorm2d", "name": "bn1"},
        _relu("relu"),
        _maxpool("maxpool", 3, 2, padding=1),
    ]
    for group, (channels, count) in enumerate(zip((64, 128, 256, 512), blocks, strict=True), start=1):
        for j in range(count):
            stride = 2 if group > 1 and j == 0 else 1
            layers.append(
                {"type": "residual", "name": f"layer{group}.{j}", "kind": kind, "channels": channels, "stride": stride}
            )
    layers += [
        {"type": "adaptive_avgpool2d", "name": "avgpool", "output_size": 1},
        {"type": "flatten", "name": "flatten"},
        _linear("fc", num_classes),
    ]
    return layers


def _image_layers(name: str, num_classes: int) -> list[Layer]:
    if name in _VGG_DEPTHS:
        return _vgg_layers(_VGG_DEPTHS[name], num_classes)
    if name in _DEEP_VGG:
        return _vgg_layers(deep_vgg_groups(int(name[3])), num_classes)
    if name == "alexnet":
        return _alexnet_layers(num_classes)
    if name == "overfeat":
        return _overfeat_layers(num_classes)
    kind, blocks = _RESNET_BLOCKS[name]
    return _resnet_layers(kind, blocks, num_classes)


def _init_torchvision(model: nn.Module) -> None:
    """torchvision's VGG/ResNet initialisation: He (fan-out) convs, N(0, 0.01) linears, unit batch norms.

    Keeps activations of the deep plain VGGs from vanishing, which on CPU would mean denormal arithmetic.
    """
    from torch import nn

    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _validate_image(name: str, params: dict[str, int]) -> ValidatedSpec:
    size = params["image_size"]
    layers = _image_layers(name, params["num_classes"])
    spec = {"name": name, "input_shape": [3, size, size], "layers": layers}
    unbounded = SpecLimits(max_layers=ZOO_LIMITS.max_layers, max_params=2**62, max_activation_bytes=2**62)
    try:
        validated = validate_spec(spec, unbounded)
    except SpecError as err:
        where = "" if err.layer is None else f"at stage {layers[err.layer]['name']}: "
        raise SpecError(
            f"{size} is too small for {name} ({where}{err.detail}); use a larger image_size",
            field="image_size",
        ) from None
    if validated.param_count > ZOO_LIMITS.max_params:
        raise SpecError(
            f"{name} with {params} has {validated.param_count:,} parameters, above the zoo limit of "
            f"{ZOO_LIMITS.max_params:,}; use fewer classes",
            field="num_classes",
        )
    if validated.activation_bytes > ZOO_LIMITS.max_activation_bytes:
        raise SpecError(
            f"{name} at image_size {size} allocates about {validated.activation_bytes:,} bytes of activations "
            f"per sample, above the zoo limit of {ZOO_LIMITS.max_activation_bytes:,}; use a smaller image_size",
            field="image_size",
        )
    return validated


def _image_builder(name: str) -> Callable[[dict[str, int]], ModelChain]:
    def build_image(params: dict[str, int]) -> ModelChain:
        chain = to_chain(_validate_image(name, params), name=name, params=params)
        if name != "alexnet":  # torchvision's AlexNet keeps PyTorch's default initialisation
            _init_torchvision(chain.as_sequential())
        return chain

    return build_image


# ---------------------------------------------------------------------------------------------------
# GPT.


def gpt_param_count(params: Mapping[str, int]) -> int:
    """Trainable parameters of ``gpt`` with these (resolved) parameters; no module is built."""
    width, vocab, hidden = params["width"], params["vocab"], params["mlp_ratio"] * params["width"]
    block = 4 * width + 3 * width * width + 3 * width + width * width + width
    block += width * hidden + hidden + hidden * width + width
    embed = vocab * width + params["seq_len"] * width
    return embed + params["layers"] * block + 2 * width + width * vocab + vocab


def _gpt_activation_bytes(params: Mapping[str, int]) -> int:
    seq, width, heads = params["seq_len"], params["width"], params["heads"]
    hidden = params["mlp_ratio"] * width
    block = 11 * seq * width + 2 * seq * hidden + heads * seq * seq  # as memtune.profiler.spec's transformer
    return FLOAT_BYTES * (seq * width + params["layers"] * block + seq * width + seq * params["vocab"])


def _build_gpt(params: dict[str, int]) -> ModelChain:
    from torch import nn

    from memtune.profiler._layers import TokenPositionEmbedding, TransformerBlock
    from memtune.profiler.chain import ModelChain, flatten

    width, heads = params["width"], params["heads"]
    if width % heads != 0:
        raise SpecError(f"{heads} heads do not divide width {width}; pick heads that divide the width", field="heads")
    count = gpt_param_count(params)
    if count > ZOO_LIMITS.max_params:
        raise SpecError(
            f"gpt with {params} has {count:,} parameters, above the zoo limit of {ZOO_LIMITS.max_params:,}; "
            "use fewer layers or a smaller width or vocab",
            field="layers",
        )
    activation = _gpt_activation_bytes(params)
    if activation > ZOO_LIMITS.max_activation_bytes:
        raise SpecError(
            f"gpt at seq_len {params['seq_len']} allocates about {activation:,} bytes of activations per "
            f"sequence, above the zoo limit of {ZOO_LIMITS.max_activation_bytes:,}; use a shorter seq_len",
            field="seq_len",
        )
    modules: list[tuple[str, nn.Module]] = [
        ("embed", TokenPositionEmbedding(params["vocab"], params["seq_len"], width))
    ]
    modules += [
        (f"blocks.{i}", TransformerBlock(width, heads, params["mlp_ratio"], causal=True))
        for i in range(params["layers"])
    ]
    modules += [("ln_f", nn.LayerNorm(width)), ("head", nn.Linear(width, params["vocab"]))]
    stages: list[Stage] = []
    for stage_name, module in modules:
        stages.extend(flatten(module, prefix=f"{stage_name}."))
    return ModelChain(
        name="gpt",
        stages=stages,
        input_shape=(params["seq_len"],),
        input_kind="tokens",
        vocab_size=params["vocab"],
        params=dict(params),
    )


# ---------------------------------------------------------------------------------------------------
# The registry.


def _image_params(default_size: int, minimum_size: int) -> tuple[ParamSpec, ...]:
    return (
        ParamSpec("num_classes", 1000, 1, 1_000_000, "classifier outputs"),
        ParamSpec("image_size", default_size, minimum_size, IMAGE_SIZE_LIMIT, "input height = width, pixels"),
    )


# Smallest image_size each architecture admits (the feature maps must not collapse); tests re-derive them.
_MIN_IMAGE_SIZE = {"vgg": 32, "alexnet": 63, "overfeat": 71, "resnet": 1}

_SUMMARIES = {
    "vgg16": "VGG-16 (torchvision layout): 13 3x3 convs in 5 groups, 3 FC layers",
    "vgg19": "VGG-19 (torchvision layout): 16 3x3 convs in 5 groups, 3 FC layers",
    "alexnet": "AlexNet (torchvision layout): 5 convs, 3 FC layers",
    "overfeat": "OverFeat fast model (Sermanet et al. 2014): 5 convs, 3 FC layers, 231x231 input",
    "resnet18": "ResNet-18 (torchvision v1.5): stem, 8 basic blocks, fc",
    "resnet50": "ResNet-50 (torchvision v1.5): stem, 16 bottleneck blocks, fc",
}


def _entries() -> dict[str, ZooEntry]:
    entries: dict[str, ZooEntry] = {}
    for name in ("vgg16", "vgg19", *_DEEP_VGG):
        summary = _SUMMARIES.get(name) or (
            f"VGG-{name[3:]} (vDNN section 4.3): VGG-16 with {20 * int(name[3])} more 3x3 convs per group"
        )
        entries[name] = ZooEntry(name, summary, _image_params(224, _MIN_IMAGE_SIZE["vgg"]), _image_builder(name))
    entries["alexnet"] = ZooEntry(
        "alexnet", _SUMMARIES["alexnet"], _image_params(224, _MIN_IMAGE_SIZE["alexnet"]), _image_builder("alexnet")
    )
    entries["overfeat"] = ZooEntry(
        "overfeat", _SUMMARIES["overfeat"], _image_params(231, _MIN_IMAGE_SIZE["overfeat"]), _image_builder("overfeat")
    )
    for name in ("resnet18", "resnet50"):
        entries[name] = ZooEntry(
            name, _SUMMARIES[name], _image_params(224, _MIN_IMAGE_SIZE["resnet"]), _image_builder(name)
        )
    entries["gpt"] = ZooEntry(
        "gpt",
        "decoder-only pre-norm transformer: token+position embedding, causal blocks, LayerNorm, LM head",
        (
            ParamSpec("layers", 24, 1, 1024, "transformer blocks"),
            ParamSpec("width", 1024, 8, 65_536, "model width (features per token)"),
            ParamSpec("heads", 16, 1, 1024, "attention heads; must divide width"),
            ParamSpec("seq_len", 1024, 1, 1 << 20, "tokens per sequence"),
            ParamSpec("vocab", 50_304, 2, 1 << 22, "vocabulary size"),
            ParamSpec("mlp_ratio", 4, 1, 64, "MLP hidden width as a multiple of width"),
        ),
        _build_gpt,
    )
    return entries


ZOO: dict[str, ZooEntry] = _entries()
"""Every zoo model by canonical name."""

ZOO_NAMES: tuple[str, ...] = tuple(ZOO)
"""Canonical names, in the order listed in the module docstring."""


def _entry(name: str) -> ZooEntry:
    entry = ZOO.get(normalize_name(name))
    if entry is None:
        close = difflib.get_close_matches(normalize_name(name), ZOO_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SpecError(
            f"unknown model {name!r}{hint}; known models: {', '.join(ZOO_NAMES)}; "
            "for other networks write a JSON model spec (memtune.profiler.spec)",
            field="model",
        )
    return entry


def zoo_params(name: str) -> dict[str, int]:
    """The default parameters of a zoo model.

    Raises:
        SpecError: unknown model (``field="model"``), listing the known names.
    """
    return _entry(name).defaults()


def resolve_zoo(name: str, params: Mapping[str, object] | None = None) -> tuple[str, dict[str, int]]:
    """The canonical name and every resolved parameter that ``build(name, params)`` gives its chain, without
    building it or importing torch (NOTE [ Zoo names without torch ]).

    Raises:
        SpecError: as ``build``, for an unknown model or an unknown or out-of-range parameter; a parameter that only
            building can refuse (an image too small for the network) is not checked.
    """
    entry = _entry(name)
    return entry.name, entry.resolve(params)


def build(name: str, params: Mapping[str, object] | None = None) -> ModelChain:
    """Build a zoo model as a ``ModelChain`` on the current default device (CPU unless set otherwise).

    Args:
        name: a zoo name, case-insensitive, ``-``/``_`` ignored (``"VGG-16"``, ``"resnet_50"``).
        params: overrides of ``zoo_params(name)``; image models take ``num_classes`` and ``image_size``,
            ``gpt`` takes ``layers``, ``width``, ``heads``, ``seq_len``, ``vocab``, ``mlp_ratio``.

    Returns:
        The chain, named by the canonical name, with every resolved parameter in ``params``.

    Raises:
        SpecError: unknown model (``field="model"``) or an unknown/out-of-range parameter (``field`` set
            to it, naming the allowed range).

    Example::

        chain = build("resnet50", {"image_size": 64, "num_classes": 10})
        with torch.device("meta"):  # shapes and counts only, no memory
            big = build("vgg516")
    """
    entry = _entry(name)
    resolved = entry.resolve(params)
    chain = entry.builder(resolved)
    return replace(chain, name=entry.name, params=dict(resolved))


def image_spec(name: str, params: Mapping[str, object] | None = None) -> dict[str, Any]:
    """The JSON model spec (``memtune.profiler.spec``) an image zoo model is built from.

    A starting point for custom networks: edit it and pass it to ``memtune.profiler.spec.from_spec`` (VGG-116 and
    deeper need ``SpecLimits(max_layers=...)`` above the default 512).

    Raises:
        SpecError: unknown model, ``gpt`` (not an image model: it has an embedding), or a bad parameter.
    """
    entry = _entry(name)
    if entry.name == "gpt":
        raise SpecError("gpt is not built from a spec (token embedding); use build('gpt')", field="model")
    resolved = entry.resolve(params)
    size = resolved["image_size"]
    return {
        "name": entry.name,
        "input_shape": [3, size, size],
        "layers": _image_layers(entry.name, resolved["num_classes"]),
    }
