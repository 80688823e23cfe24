"""Per-stage facts that need no timing: bytes, FLOPs, convolution shapes, from one traced forward.

``chain_facts`` traces a chain once (``memtune.profiler._storages.trace_chain``) with a per-stage counter
(``memtune.profiler._flops.count_stage``) and returns what both the roofline (``memtune.profiler.modeled``) and the
measured profile (``memtune.profiler.measure``) need besides times: output, saved and parameter bytes, the
saved-storage table, forward FLOPs, bytes moved, and the convolution shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from memtune.profiler._flops import StageCount, count_stage
from memtune.profiler._profile import ConvProfile, SavedStorage
from memtune.profiler._storages import stage_saved_bytes, trace_chain
from memtune.profiler.chain import ModelChain, Stage, conv_modules

__all__ = ["ChainFacts", "StageFacts", "chain_facts", "conv_profiles", "param_bytes", "torch_dtype"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(dtype: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; raises ValueError naming the accepted values."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(_DTYPES)}") from None


@dataclass(frozen=True)
class StageFacts:
    """Timing-free facts of one stage. Sizes in bytes, FLOPs per forward.

    Attributes:
        output_bytes: bytes of the stage's output tensor.
        saved_bytes: S_i (NOTE [ Saved storages ]).
        param_bytes: bytes of the stage's parameters (as stored, fp32 under autocast).
        count: forward FLOPs, convolution FLOPs, bytes moved and ops.
        input_needs_grad: the stage's input requires a gradient (False for the model input).
        has_params: the stage has parameters that require a gradient.
        convs: the stage's ``nn.Conv2d`` shapes (no algorithm table).
    """

    output_bytes: int
    saved_bytes: int
    param_bytes: int
    count: StageCount
    input_needs_grad: bool
    has_params: bool
    convs: tuple[ConvProfile, ...]


@dataclass(frozen=True)
class ChainFacts:
    """Facts of every stage plus the storage table and the stages' output storages."""

    stages: tuple[StageFacts, ...]
    storages: tuple[SavedStorage, ...]
    output_storage: tuple[int | None, ...]
    inplace: tuple[bool, ...]
    input_bytes: int
    #: each stage's output shape (batch included); ``output_shapes[i - 1]`` is stage i's input shape
    output_shapes: tuple[tuple[int, ...], ...] = ()
    input_shape: tuple[int, ...] = ()


def param_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s parameters, each counted once."""
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def _pair(v: int | tuple[int, ...] | str, kernel: tuple[int, int], dilation: tuple[int, int]) -> tuple[int, int]:
    if isinstance(v, str):  # "valid" or "same"
        if v == "valid":
            return (0, 0)
        return (dilation[0] * (kernel[0] - 1) // 2, dilation[1] * (kernel[1] - 1) // 2)
    if isinstance(v, int):
        return (v, v)
    return (int(v[0]), int(v[-1]))


def conv_profiles(stage: Stage, input_hw: dict[str, tuple[int, int]]) -> tuple[ConvProfile, ...]:
    """Shapes of the stage's 2-D convolutions; ``input_hw`` maps conv name -> input (H, W)."""
    out: list[ConvProfile] = []
    for name, conv in conv_modules(stage):
        if name not in input_hw:
            continue  # not run in this forward
        k = _pair(conv.kernel_size, (1, 1), (1, 1))
        dil = _pair(conv.dilation, (1, 1), (1, 1))
        out.append(
            ConvProfile(
                name=name,
                in_channels=conv.in_channels,
                out_channels=conv.out_channels,
                kernel_size=k,
                stride=_pair(conv.stride, k, dil),
                padding=_pair(conv.padding, k, dil),
                input_hw=input_hw[name],
                dilation=dil,
                groups=conv.groups,
            )
        )
    return tuple(out)


def chain_facts(chain: ModelChain, x: torch.Tensor, dtype: str = "float32", *, eager: bool = True) -> ChainFacts:
    """Trace ``chain`` once on ``x`` (any device; ``meta`` for CUDA semantics at no cost).

    Args:
        chain: the model, on ``x``'s device.
        x: the batch's input.
        dtype: ``float32``, or ``bfloat16``/``float16`` for autocast.
        eager: count FLOPs and bytes moved per stage and read convolution shapes through module hooks; False leaves
            them out (compiled stages: a dispatch mode or a new hook would make dynamo trace again, NOTE [ Compiled
            stages ] in ``memtune.profiler.compiled``).
    """
    low = None if dtype == "float32" else torch_dtype(dtype)
    tr = trace_chain(
        chain, x, autocast_dtype=low, stage_context=(lambda i: count_stage()) if eager else None, conv_shapes=eager
    )
    n = len(chain)
    saved = stage_saved_bytes(tr.storages, n)
    stages = []
    for i, stage in enumerate(chain.stages):
        counted = cast(StageCount, tr.stage_results[i]) if eager else StageCount()
        stages.append(
            StageFacts(
                output_bytes=tr.output_bytes[i],
                saved_bytes=saved[i],
                param_bytes=param_bytes(stage.module),
                count=counted,
                input_needs_grad=i > 0 and tr.output_requires_grad[i - 1],
                has_params=any(p.requires_grad for p in stage.module.parameters()),
                convs=conv_profiles(stage, tr.conv_inputs[i]),
            )
        )
    return ChainFacts(
        stages=tuple(stages),
        storages=tuple(tr.storages),
        output_storage=tuple(tr.output_storage),
        inplace=tuple(tr.inplace),
        input_bytes=x.numel() * x.element_size(),
        output_shapes=tuple(tr.output_shapes),
        input_shape=tuple(x.shape),
    )
