"""The layers of a chain an inference plan can run, their shapes, and how a weighted layer runs a partition.

``chain_layers`` lists a model's layers (``nn.Sequential`` containers flattened as ``memtune.profiler.chain.flatten``
does) and refuses, by name, a layer that is not one an inference plan runs: Conv2d, Linear, parameter-free activations,
pooling, Flatten, Dropout and Identity. ``layer_shapes`` reads each layer's bytes on the meta device (no memory, no
compute); ``weighted_forward`` runs a Conv2d or Linear on a slice of its weights.
``memtune.tuner.measure.inference_measure`` times the layers on a device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from memtune.profiler import ModelChain
from memtune.profiler.chain import flatten
from memtune.profiler.cudnn import module_padding
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.inference import LayerShape
from memtune.tuner.inference._facts import ConvWorkspace
from memtune.tuner.runtime.conv import AlgoChoice, cudnn_conv2d

__all__ = [
    "SUPPORTED",
    "aliases_input",
    "chain_layers",
    "layer_shapes",
    "out_dim",
    "scratch_bytes",
    "split_units",
    "units_of",
    "weighted_forward",
]

#: layers an inference plan runs: those with weights (split by output channels) and parameter-free ones (run whole)
SUPPORTED: tuple[type[nn.Module], ...] = (
    nn.Conv2d,
    nn.Linear,
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Sigmoid,
    nn.Tanh,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
    nn.Flatten,
    nn.Dropout,
    nn.Dropout2d,
    nn.Identity,
)
_ALIASING = (nn.Flatten, nn.Dropout, nn.Dropout2d, nn.Identity)  # in eval: a view of the input, or the input itself


def chain_layers(model: nn.Module | ModelChain) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of each layer of ``model`` in run order: a module's ``flatten``ed stages, or a
    ``ModelChain``'s stages (named as its profiles name them).

    Raises:
        PlanError: a layer is not supported (named, with what is) or has parameters an inference plan does not place
            (a Conv2d or Linear's are the only ones).
    """
    stages = model.stages if isinstance(model, ModelChain) else flatten(model)
    layers = [(s.name, s.module) for s in stages]
    for name, module in layers:
        if not isinstance(module, SUPPORTED):
            raise PlanError(
                f"layer {name!r} ({type(module).__name__}) is not supported by inference plans: they run chains "
                "(nn.Sequential) of Conv2d, Linear, parameter-free activations, pooling, Flatten, Dropout and "
                "Identity layers; fold batch norms into their convolutions and give other blocks as such layers"
            )
        params = {n for n, _ in module.named_parameters()}
        if not isinstance(module, (nn.Conv2d, nn.Linear)) and params:
            raise PlanError(f"layer {name!r} ({type(module).__name__}) has parameters {sorted(params)}, which an "
                            "inference plan does not place; use a parameter-free form")  # fmt: skip
    return layers


def units_of(module: nn.Module) -> int:
    """Output channels a plan may split ``module`` into: a Conv2d's (one group) or a Linear's; 1 for the rest."""
    if isinstance(module, nn.Conv2d) and module.groups == 1:
        return module.out_channels
    if isinstance(module, nn.Linear):
        return module.out_features
    return 1


def aliases_input(module: nn.Module) -> bool:
    """Whether ``module`` in eval mode returns its input's storage (in place, a view, or the input itself)."""
    return isinstance(module, _ALIASING) or bool(getattr(module, "inplace", False))


def scratch_bytes(module: nn.Module, y: torch.Tensor) -> int:
    """What ``module``'s kernel allocates besides its output ``y``, bytes: a max pool's int64 indices (CUDA's kernel
    makes them even when they are not returned: measured on an H100, the first max pool of VGG-16 at 224x224 took
    6.12 MiB more than its input and output); 0 for the other supported layers."""
    if isinstance(module, (nn.MaxPool2d, nn.AdaptiveMaxPool2d)):
        return y.numel() * 8
    return 0


def out_dim(module: nn.Module, ndim: int) -> int:
    """The output dimension that holds ``module``'s output channels: 1 for a Conv2d, the last for a Linear."""
    return 1 if isinstance(module, nn.Conv2d) else ndim - 1


def split_units(units: int, parts: int) -> list[tuple[int, int]]:
    """``(first channel, channels)`` of each partition (``torch.tensor_split``'s rule, as
    ``memtune.tuner.inference``)."""
    out = []
    start = 0
    for p in range(parts):
        n = units // parts + (1 if p < units % parts else 0)
        out.append((start, n))
        start += n
    return out


_NO_WORKSPACE = AlgoChoice(fwd=0, bwd_data=0, bwd_filter=0)  # IMPLICIT_GEMM: no workspace in any pass


def weighted_forward(
    module: nn.Conv2d | nn.Linear,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_workspace: ConvWorkspace = "framework",
) -> torch.Tensor:
    """``module``'s forward on ``x`` with ``weight`` and ``bias`` (a slice of its output channels, or all of them).

    A convolution on CUDA with ``conv_workspace="none"`` runs cuDNN's IMPLICIT_GEMM forward, which takes no
    workspace (NOTE [ Inference plans ]; ``memtune.tuner.runtime.conv``); otherwise the framework's own call runs.
    """
    if isinstance(module, nn.Linear):
        return nn.functional.linear(x, weight, bias)
    if conv_workspace == "none" and x.is_cuda:
        padding, pre_pad = module_padding(module)
        if pre_pad:
            x = nn.functional.pad(x, module._reversed_padding_repeated_twice, mode=module.padding_mode)
        stride = (int(module.stride[0]), int(module.stride[1]))
        dilation = (int(module.dilation[0]), int(module.dilation[1]))
        return cudnn_conv2d(x, weight, bias, _NO_WORKSPACE, stride, padding, dilation, module.groups)
    return module._conv_forward(x, weight, bias)


def _meta_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(module, nn.Conv2d):
        bias = None if module.bias is None else torch.empty_like(module.bias, device="meta")
        return module._conv_forward(x, torch.empty_like(module.weight, device="meta"), bias)
    if isinstance(module, nn.Linear):
        bias = None if module.bias is None else torch.empty_like(module.bias, device="meta")
        return nn.functional.linear(x, torch.empty_like(module.weight, device="meta"), bias)
    return module(x)


def layer_shapes(
    model: nn.Module | ModelChain, input_shape: Sequence[int], dtype: torch.dtype = torch.float32
) -> list[LayerShape]:
    """Each layer's bytes for an input of ``input_shape`` (the batch included), read on the meta device.

    Raises:
        PlanError: a layer is not supported (``chain_layers``) or rejects the shape it gets (named).
    """
    x = torch.empty(tuple(input_shape), dtype=dtype, device="meta")
    shapes = []
    for name, module in chain_layers(model):
        in_bytes = x.numel() * x.element_size()
        try:
            y = _meta_forward(module, x)
        except RuntimeError as exc:
            raise PlanError(f"layer {name!r} ({type(module).__name__}) cannot take an input of shape "
                            f"{tuple(x.shape)}: {exc}") from exc  # fmt: skip
        weight = sum(p.numel() * p.element_size() for p in module.parameters())
        shapes.append(
            LayerShape(
                name=name,
                kind=type(module).__name__.lower(),
                units=units_of(module),
                weight_bytes=weight,
                input_bytes=in_bytes,
                output_bytes=y.numel() * y.element_size(),
                aliases_input=aliases_input(module),
                scratch_bytes=scratch_bytes(module, y),
            )
        )
        x = y
    return shapes
