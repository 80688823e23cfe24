"""Run convolutions with the cuDNN algorithms a plan chose (NOTE [ Convolution choice ] in
``memtune.tuner._conv_choice``).

``CudnnConv2dFunction`` is a custom autograd Function that runs a chosen (fwd, bwd_data, bwd_filter)
algorithm triple, each at its math type, through ``memtune.profiler.cudnn`` on PyTorch's current stream with
workspaces from PyTorch's caching allocator. ``ChosenConv2d`` wraps an ``nn.Conv2d``'s parameters (the
same ``Parameter`` objects, no copy, the same ``state_dict`` keys) with its choice, and
``apply_conv_choices`` swaps them into a chain for the duration of a ``with`` block::

    with apply_conv_choices(model, plan, profile):
        loss = loss_fn(model(x), y)
        loss.backward()

On the CPU, or where libcudnn cannot be loaded, the Function computes with PyTorch's own convolution
(``F.conv2d`` and ``torch.nn.grad``) and warns once per process, saying why: the math is the same, only
the algorithm is the framework's.

Bias is added in PyTorch after the convolution. Under autocast the input and weight are cast to the
autocast dtype first (as autocast does for ``conv2d``), so bf16 autocast runs the bf16 algorithms the
profile measured. The Function supports one backward (not double backward).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable
from torch.nn.grad import conv2d_input, conv2d_weight

from memtune.profiler import ConvProfile, ModelChain, Profile, ProfilerError
from memtune.profiler.chain import Stage, conv_modules, flatten
from memtune.profiler.conv_split import batch_chunks, run_split, split_workspace_bytes
from memtune.profiler.cudnn import ConvGeometry, Pass, algo_name, cudnn_available, load_cudnn, module_padding
from memtune.tuner._conv_choice import ConvTriple, choose_algorithms
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Plan

__all__ = ["AlgoChoice", "ChosenConv2d", "CudnnConv2dFunction", "apply_conv_choices", "cudnn_conv2d"]

_CUDNN_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_fallback_warned = False


@dataclass(frozen=True)
class AlgoChoice:
    """Algorithm ids (``cudnnConvolution*Algo_t``), math types (``cudnnMathType_t``) and batch splits (NOTE
    [ Batch split ] in ``memtune.profiler.conv_split``) of the three passes."""

    fwd: int
    bwd_data: int
    bwd_filter: int
    fwd_math: int = 0
    bwd_data_math: int = 0
    bwd_filter_math: int = 0
    fwd_split: int = 1
    bwd_data_split: int = 1
    bwd_filter_split: int = 1

    @classmethod
    def from_triple(cls, triple: ConvTriple) -> AlgoChoice:
        """The choice ``memtune.tuner._conv_choice.choose_algorithms`` made, with the math types the profile
        recorded."""
        return cls(
            triple.fwd.algo,
            triple.bwd_data.algo,
            triple.bwd_filter.algo,
            triple.fwd.math_type,
            triple.bwd_data.math_type,
            triple.bwd_filter.math_type,
            triple.fwd.split,
            triple.bwd_data.split,
            triple.bwd_filter.split,
        )

    def describe(self) -> str:
        def one(pass_: Pass, algo: int, split: int) -> str:
            return f"{pass_} {algo_name(pass_, algo)}" + (f" in {split} chunks" if split > 1 else "")

        return ", ".join(
            (
                one("fwd", self.fwd, self.fwd_split),
                one("bwd_data", self.bwd_data, self.bwd_data_split),
                one("bwd_filter", self.bwd_filter, self.bwd_filter_split),
            )
        )


def _fallback_reason(x: torch.Tensor, w: torch.Tensor) -> str | None:
    """Why the Function cannot run cuDNN on these tensors, or None when it can."""
    if not (x.is_cuda and w.is_cuda):
        return f"the tensors are on {x.device}, not a CUDA device"
    if x.dtype not in _CUDNN_DTYPES:
        return f"dtype {x.dtype} is not one the cuDNN binding runs"
    if not cudnn_available():
        try:
            load_cudnn()
        except ProfilerError as exc:
            return str(exc).splitlines()[0]
        return "cuDNN is not available"
    return None


def _warn_fallback(reason: str) -> None:
    global _fallback_warned
    if _fallback_warned:
        return
    _fallback_warned = True
    warnings.warn(
        f"chosen cuDNN convolution algorithms are not applied because {reason}; "
        "PyTorch's own convolution runs instead (same math, the framework's algorithm)",
        RuntimeWarning,
        stacklevel=4,
    )


class CudnnConv2dFunction(torch.autograd.Function):
    """``conv2d(x, weight)`` (no bias) with a chosen algorithm per pass.

    ``apply(x, weight, stride, padding, dilation, groups, choice)``: ``x`` NCHW and ``weight`` of one dtype
    (fp32, bf16, fp16, fp64); ``padding`` symmetric zero padding ``(ph, pw)``; ``choice`` an ``AlgoChoice``.
    Forward runs ``choice.fwd``; backward runs ``choice.bwd_data`` for the input gradient and
    ``choice.bwd_filter`` for the weight gradient, each only when needed, each at its math type and in its
    number of batch chunks. The framework's fallback runs the same chunks, so CPU tests check their math.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        stride: tuple[int, int],
        padding: tuple[int, int],
        dilation: tuple[int, int],
        groups: int,
        choice: AlgoChoice,
    ) -> torch.Tensor:
        if x.dtype != weight.dtype:
            raise ValueError(
                f"CudnnConv2dFunction needs input and weight of one dtype, got {x.dtype} and {weight.dtype}; "
                "cast them (ChosenConv2d does it under autocast)"
            )
        x = x.contiguous()
        w = weight.contiguous()
        reason = _fallback_reason(x, w)
        geom: ConvGeometry | None = None
        if reason is None:
            geom = ConvGeometry.of(x.shape, w.shape, stride, padding, dilation, groups, x.dtype)
            y = torch.empty(geom.output_shape, dtype=x.dtype, device=x.device)
            run_split("fwd", geom, x, w, y, choice.fwd, choice.fwd_math, choice.fwd_split)
        else:
            _warn_fallback(reason)
            y = torch.cat(
                [
                    F.conv2d(x[s:e], w, None, stride, padding, dilation, groups)
                    for s, e in batch_chunks(x.shape[0], choice.fwd_split)
                ]
            )
        ctx.save_for_backward(x, w)
        c: Any = ctx
        c.geom, c.settings, c.choice = geom, (stride, padding, dilation, groups), choice
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, w = ctx.saved_tensors
        dy = grad_out.contiguous()
        geom: ConvGeometry | None = ctx.geom
        choice: AlgoChoice = ctx.choice
        dx = dw = None
        if geom is None:
            dx, dw = _fallback_backward(x, w, dy, ctx.settings, choice, ctx.needs_input_grad)
            return dx, dw, None, None, None, None, None
        ws = _backward_workspace(geom, choice, ctx.needs_input_grad[:2], dy.device)
        if ctx.needs_input_grad[0]:
            dx = torch.empty_like(x)
            run_split("bwd_data", geom, w, dy, dx, choice.bwd_data, choice.bwd_data_math, choice.bwd_data_split, ws)
        if ctx.needs_input_grad[1]:
            dw = torch.empty_like(w)
            run_split(
                "bwd_filter", geom, x, dy, dw, choice.bwd_filter, choice.bwd_filter_math, choice.bwd_filter_split, ws
            )
        return dx, dw, None, None, None, None, None


def _fallback_backward(
    x: torch.Tensor,
    w: torch.Tensor,
    dy: torch.Tensor,
    settings: tuple[tuple[int, int], tuple[int, int], tuple[int, int], int],
    choice: AlgoChoice,
    needs: tuple[bool, ...],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """PyTorch's own input and weight gradients, in the chunks ``choice`` runs (NOTE [ Batch split ])."""
    stride, padding, dilation, groups = settings
    dx = dw = None
    if needs[0]:
        dx = torch.cat(
            [
                conv2d_input(x[s:e].shape, w, dy[s:e], stride, padding, dilation, groups)
                for s, e in batch_chunks(x.shape[0], choice.bwd_data_split)
            ]
        )
    if needs[1]:
        parts = [
            conv2d_weight(x[s:e], w.shape, dy[s:e], stride, padding, dilation, groups)
            for s, e in batch_chunks(x.shape[0], choice.bwd_filter_split)
        ]
        dw = torch.stack(parts).sum(0) if len(parts) > 1 else parts[0]
    return dx, dw


def _backward_workspace(
    geom: ConvGeometry, choice: AlgoChoice, needs: tuple[bool, ...], device: torch.device
) -> torch.Tensor | None:
    """One workspace for both backward passes, the larger of their sizes, allocated before either runs.

    # NOTE [ One backward workspace ]
    Allocating each pass's workspace in turn made the caching allocator grow under a memory cap: on the H200
    (``scripts/memory_trace.py``, VGG-16 fp32 at 70%, 2026-11-21) ``features.12``'s data pass took 1570.25 MiB
    and its weight pass, right after, 1577.0 MiB; the freed 1570.25 MiB block was 6.75 MiB short, mapping
    one more page crossed the cap, and the allocator's retry unmapped all its free memory (that block too) to
    map it again: two of the step's four retries were such pairs (``features.12``/``14`` and ``features.7``).
    One block of the larger size serves both passes on the same stream, and the simulator already counts a
    stage's backward workspace as that maximum (NOTE [ Convolution costs ]).
    """
    sizes = []
    if needs[0]:
        sizes.append(
            split_workspace_bytes(
                geom, "bwd_data", choice.bwd_data, choice.bwd_data_math, choice.bwd_data_split, device
            )
        )
    if needs[1]:
        sizes.append(
            split_workspace_bytes(
                geom, "bwd_filter", choice.bwd_filter, choice.bwd_filter_math, choice.bwd_filter_split, device
            )
        )
    size = max(sizes, default=0)
    return torch.empty(size, dtype=torch.uint8, device=device) if size else None


def cudnn_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    choice: AlgoChoice,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
) -> torch.Tensor:
    """``F.conv2d`` with a chosen algorithm triple; casts to the autocast dtype under autocast; adds bias."""

    def pair(v: int | tuple[int, int]) -> tuple[int, int]:
        return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))

    device = x.device.type
    autocast = device in ("cuda", "cpu") and torch.is_autocast_enabled(device)
    if autocast and x.dtype != torch.float64:
        low = torch.get_autocast_dtype(device)
        x, weight = x.to(low), weight.to(low)
    with torch.autocast(device, enabled=False) if autocast else contextlib.nullcontext():
        y = CudnnConv2dFunction.apply(x, weight, pair(stride), pair(padding), pair(dilation), groups, choice)
        if bias is not None:
            # in place, as cuDNN adds bias in PyTorch's own convolution: an out-of-place add would hold a second
            # output-sized tensor (3.3 GB for VGG-16's first convolutions at batch 256) that no profile counts;
            # the Function saves its input and weight, not its output, so autograd allows it
            y = y.add_(bias.to(y.dtype).view(1, -1, 1, 1))
    return y  # type: ignore[no-any-return]


class ChosenConv2d(nn.Module):
    """An ``nn.Conv2d``'s parameters run with a chosen cuDNN algorithm triple.

    ``weight`` and ``bias`` are the wrapped conv's own ``Parameter`` objects (no copy; ``state_dict`` keys
    unchanged); the conv itself is kept (not as a submodule) so ``apply_conv_choices`` can put it back.
    Non-zero padding modes pad in PyTorch first, as ``nn.Conv2d`` does.

    Args:
        conv: the convolution to wrap.
        choice: its algorithms.
        key: its plan key (``"<stage>.<conv name>"``), for display.

    Raises:
        ProfilerError: ``padding='same'`` would need asymmetric padding.
    """

    def __init__(self, conv: nn.Conv2d, choice: AlgoChoice, key: str = "") -> None:
        super().__init__()
        self.weight = conv.weight
        self.bias = conv.bias
        self.choice = choice
        self.key = key
        self._original = (conv,)  # a tuple: not registered as a submodule
        self.stride = (int(conv.stride[0]), int(conv.stride[1]))
        self.dilation = (int(conv.dilation[0]), int(conv.dilation[1]))
        self.groups = conv.groups
        self.padding, self._pre_pad = module_padding(conv)

    @property
    def original(self) -> nn.Conv2d:
        """The wrapped ``nn.Conv2d``."""
        return self._original[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.original
        if self._pre_pad:
            x = F.pad(x, conv._reversed_padding_repeated_twice, mode=conv.padding_mode)
        return cudnn_conv2d(
            x, self.weight, self.bias, self.choice, self.stride, self.padding, self.dilation, self.groups
        )

    def extra_repr(self) -> str:
        conv = self.original
        return f"{conv.in_channels}, {conv.out_channels}, kernel_size={conv.kernel_size}, {self.choice.describe()}"


def _stages(model: ModelChain | nn.Sequential) -> list[Stage]:
    if isinstance(model, ModelChain):
        return model.stages
    if isinstance(model, nn.Sequential):
        return flatten(model)
    raise TypeError(f"apply_conv_choices takes a ModelChain or an nn.Sequential, not {type(model).__name__}")


def _set_child(root: nn.Module, path: str, module: nn.Module) -> Callable[[], None]:
    """Put ``module`` at dotted ``path`` under ``root``; returns the undo."""
    parent_path, _, attr = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    old = getattr(parent, attr)
    setattr(parent, attr, module)
    return lambda: setattr(parent, attr, old)


def _set_stage(chain: ModelChain, index: int, module: nn.Module) -> Callable[[], None]:
    """Make stage ``index`` of ``chain`` run ``module``; returns the undo."""
    old = chain.stages[index]
    chain.stages[index] = dataclasses.replace(old, module=module)
    return lambda: chain.stages.__setitem__(index, old)


def _check_matches(key: str, conv: nn.Conv2d, prof: ConvProfile) -> None:
    got = (conv.in_channels, conv.out_channels, tuple(conv.kernel_size), conv.groups)
    want = (prof.in_channels, prof.out_channels, tuple(prof.kernel_size), prof.groups)
    if got != want:
        raise PlanError(
            f"conv {key!r}: the model's conv (in, out, kernel, groups) {got} differs from the profile's {want}; "
            "the profile was measured on another model"
        )


@contextlib.contextmanager
def apply_conv_choices(
    model: ModelChain | nn.Sequential, plan: Plan, profile: Profile
) -> Iterator[dict[str, ChosenConv2d]]:
    """Within the block, every convolution the plan chooses for runs as a ``ChosenConv2d``.

    The plan's ``conv_rule``/``conv_algos`` are resolved against ``profile``'s algorithm tables by
    ``memtune.tuner._conv_choice.choose_algorithms`` (the simulator's reading); convolutions left to the framework
    are untouched. On exit (also on error) the original modules are put back. A stage that is itself a
    convolution is replaced in the ``ModelChain``'s stage list or in the ``nn.Sequential`` (build
    ``planned(...)`` inside the block so it sees the swap). Hooks registered on a swapped conv do not run
    while it is swapped.

    Args:
        model: the chain (``ModelChain``) or ``nn.Sequential`` the profile describes.
        plan: the plan.
        profile: a profile of this model with algorithm tables (``profile(..., conv_algos=True)``).

    Yields:
        ``{plan key: ChosenConv2d}`` of the swapped convolutions.

    Raises:
        PlanError: the plan or the model does not match the profile (stage count, conv names or shapes),
            or an override names an algorithm the profile does not list as working.
    """
    choices = choose_algorithms(profile, plan)
    stages = _stages(model)
    if len(stages) != profile.n_stages:
        raise PlanError(
            f"the model has {len(stages)} stages (nested nn.Sequential flattened) but profile "
            f"{profile.model!r} has {profile.n_stages}; use the model the profile was measured on"
        )
    undo: list[Callable[[], None]] = []
    swapped: dict[str, ChosenConv2d] = {}
    try:
        for key, triple in choices.items():
            stage_s, _, name = key.partition(".")
            index = int(stage_s)
            stage = stages[index]
            convs = dict(conv_modules(stage))
            conv = convs.get(name)
            if conv is None:
                raise PlanError(
                    f"conv {key!r}: stage {index} ({stage.name}) of the model has no nn.Conv2d named {name!r} "
                    f"(has {sorted(convs) or 'none'})"
                )
            prof = next(c for c in profile.stages[index].convs if c.name == name)
            _check_matches(key, conv, prof)
            wrapped = ChosenConv2d(conv, AlgoChoice.from_triple(triple), key=key)
            if name:
                undo.append(_set_child(stage.module, name, wrapped))
            elif isinstance(model, ModelChain):
                undo.append(_set_stage(model, index, wrapped))
            else:
                undo.append(_set_child(model, stage.name, wrapped))
            swapped[key] = wrapped
        yield swapped
    finally:
        for restore in reversed(undo):
            restore()
