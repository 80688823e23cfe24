"""Run a recompute segment strip by strip along H, halos included (NOTE [ Spatial splitting ] in
``memtune.tuner._spatial``).

``SpatialSegment`` stands where ``memtune.tuner.runtime._segments.Segment`` would for a segment the plan splits
(``Plan.spatial_splits``): called the same way, it runs stages ``first..last`` as one autograd Function that saves
only the segment input, computes the output strip by strip without a graph, and in backward re-runs each strip with
a graph and accumulates its input and parameter gradients. Each leaf module runs on its strip with the padding of
the true image borders only (``_apply_leaf``); ``memtune.profiler.spatial_modules.leaf_rows`` decides which modules may.

In-place modules (NOTE [ In-place at segment boundaries ] in ``memtune.tuner.runtime._segments``): a strip of the
segment input is a view of it, so a leaf that writes its input in place (``inplace=True``) gets a clone of the strip;
the
segment input itself is never written, so nothing is cloned whole. Buffers (NOTE [ Buffers during recompute ]):
the modules a split may hold (``memtune.profiler.spatial_modules``) write none in forward, so the re-run changes
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable

from memtune.profiler import RowMap
from memtune.profiler.spatial_modules import LeafRows, leaf_rows, stage_leaves
from memtune.tuner._spatial import MAX_STRIPS, MIN_STRIPS, strip_bounds, strip_windows
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.runtime.conv import ChosenConv2d, cudnn_conv2d

__all__ = ["SpatialSegment"]

StageHook = Callable[[int, torch.Tensor], None]
Window = tuple[int, int, int, int]


@dataclass(frozen=True)
class _Leaf:
    """One module of the segment, the stage it belongs to and its row window."""

    stage: int
    module: nn.Module
    rows: LeafRows


def _rows(m: nn.Module) -> LeafRows:
    """The row window of a leaf; a convolution swapped in with chosen algorithms (``memtune.tuner.runtime.conv``) reads
    the
    rows its original does."""
    if isinstance(m, ChosenConv2d):
        if m._forward_hooks or m._forward_pre_hooks:
            raise ValueError("has forward hooks, which a split run would call once per strip on part of the image")
        return leaf_rows(m.original)
    return leaf_rows(m)


def _leaves(first: int, modules: Sequence[nn.Module], names: Sequence[str]) -> list[_Leaf]:
    """Every leaf module of stages ``first..`` with its row window.

    Raises:
        PlanError: a stage or module cannot run on strips with the same math; names the stage and module type.
    """
    out: list[_Leaf] = []
    for k, stage in enumerate(modules, start=first):
        try:
            leaves = stage_leaves(stage)
        except ValueError as exc:
            raise _refused(k, names[k], stage, str(exc)) from exc
        for leaf in leaves:
            try:
                rows = _rows(leaf)
            except ValueError as exc:
                raise _refused(k, names[k], leaf, str(exc)) from exc
            out.append(_Leaf(k, leaf, rows))
    if not out:
        raise PlanError(f"stages {first}..{first + len(modules) - 1} have no modules to split")
    return out


def _refused(k: int, name: str, module: nn.Module, why: str) -> PlanError:
    return PlanError(
        f"stage {k} ({name}): {type(module).__name__} {why}. Spatial splitting (NOTE [ Spatial splitting ] in "
        "memtune.tuner._spatial) runs a segment on strips of rows with the same math; remove this segment's key from "
        "the "
        "plan's spatial_splits"
    )


def _pad_rows(x: torch.Tensor, top: int, bottom: int, value: float = 0.0) -> torch.Tensor:
    return F.pad(x, (0, 0, top, bottom), value=value) if top or bottom else x


def _conv_w(m: nn.Conv2d | ChosenConv2d) -> tuple[int, int]:
    """Left and right padding along W of a convolution (``padding='same'`` puts an odd extra column right)."""
    conv = m.original if isinstance(m, ChosenConv2d) else m
    if isinstance(conv.padding, str):
        total = 0 if conv.padding == "valid" else conv.dilation[1] * (conv.kernel_size[1] - 1)
        return total // 2, total - total // 2
    return conv.padding[1], conv.padding[1]


def _apply_leaf(m: nn.Module, x: torch.Tensor, top: int, bottom: int) -> torch.Tensor:
    """``m`` on a strip of rows, with ``top``/``bottom`` rows of the module's own padding (true borders only)."""
    if isinstance(m, nn.Conv2d | ChosenConv2d):
        left, right = _conv_w(m)
        if left != right:
            x, left = F.pad(x, (left, right, top, bottom)), 0
        else:
            x = _pad_rows(x, top, bottom)
        if isinstance(m, ChosenConv2d):
            return cudnn_conv2d(x, m.weight, m.bias, m.choice, m.stride, (0, left), m.dilation, m.groups)
        return F.conv2d(x, m.weight, m.bias, m.stride, (0, left), m.dilation, m.groups)
    if isinstance(m, nn.MaxPool2d):
        x = _pad_rows(x, top, bottom, float("-inf"))  # a max over padding reads nothing
        pw = m.padding if isinstance(m.padding, int) else m.padding[1]
        return F.max_pool2d(x, m.kernel_size, m.stride or m.kernel_size, (0, pw), m.dilation)
    if isinstance(m, nn.AvgPool2d):
        x = _pad_rows(x, top, bottom)  # counted as the pool counts its padding (count_include_pad, leaf_rows)
        pw = m.padding if isinstance(m.padding, int) else m.padding[1]
        return F.avg_pool2d(
            x, m.kernel_size, m.stride or m.kernel_size, (0, pw), False, m.count_include_pad, m.divisor_override
        )
    return m(x)  # pointwise


def _writes_input(m: nn.Module) -> bool:
    return bool(getattr(m, "inplace", False))


class _Runner:
    """The strips of one call: the leaves, their windows on this input's height, and the strip loop."""

    def __init__(self, leaves: list[_Leaf], strips: int, height: int, autocast: tuple[str, bool, torch.dtype]) -> None:
        self.leaves = leaves
        maps: list[RowMap] = []
        rows = height
        for leaf in leaves:
            out_rows = leaf.rows.out_rows(rows)
            if out_rows < 1:
                raise PlanError(
                    f"stage {leaf.stage}: {type(leaf.module).__name__} leaves no rows of a {rows}-row input"
                )
            maps.append(leaf.rows.row_map(rows))
            rows = out_rows
        if strips > rows:
            raise PlanError(
                f"stages {leaves[0].stage}..{leaves[-1].stage} make {rows} rows, fewer than the plan's {strips} "
                f"strips; split them into at most {rows} strips"
            )
        self.out_rows = rows
        self.bounds = strip_bounds(rows, strips)
        self.windows = strip_windows(maps, strips)
        self.autocast = autocast

    def strip(self, x: torch.Tensor, windows: Sequence[Window], owned: bool) -> torch.Tensor:
        """Run every leaf on one strip; ``x`` holds the first window's rows; ``owned``: in-place writes are safe."""
        for leaf, (_, _, top, bottom) in zip(self.leaves, windows, strict=True):
            if not owned and _writes_input(leaf.module):
                x = x.clone()  # the strip is a view of the segment input, which must stay intact
            x = _apply_leaf(leaf.module, x, top, bottom)
            owned = True
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The segment's output, strip by strip, without a graph."""
        out: torch.Tensor | None = None
        for (a, b), wins in zip(self.bounds, self.windows, strict=True):
            y = self.strip(x[:, :, wins[0][0] : wins[0][1]], wins, owned=False)
            if out is None:
                shape = (*y.shape[:2], self.out_rows, *y.shape[3:])
                channels_last = not y.is_contiguous() and y.is_contiguous(memory_format=torch.channels_last)
                fmt = torch.channels_last if channels_last else torch.contiguous_format
                out = torch.empty(shape, dtype=y.dtype, device=y.device, memory_format=fmt)
            out[:, :, a:b] = y
            del y
        assert out is not None
        return out

    def backward(
        self, x: torch.Tensor, grad: torch.Tensor, params: Sequence[torch.Tensor], need_input: bool
    ) -> tuple[torch.Tensor | None, list[torch.Tensor | None]]:
        """Re-run each strip with a graph and back-propagate its rows of ``grad``; the input's gradient (halo rows
        added from each strip that reads them) and the parameters' gradients, summed over strips."""
        wanted = [p for p in params if p.requires_grad]
        gx = torch.zeros_like(x) if need_input else None
        gp: list[torch.Tensor | None] = [None] * len(wanted)
        device, enabled, dtype = self.autocast
        for (a, b), wins in zip(self.bounds, self.windows, strict=True):
            lo, hi = wins[0][0], wins[0][1]
            leaf = x[:, :, lo:hi].detach().requires_grad_(need_input)
            with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=enabled):
                y = self.strip(leaf, wins, owned=False)
            inputs = [leaf, *wanted] if need_input else wanted
            if not inputs or not y.requires_grad:
                continue
            grads = torch.autograd.grad(y, inputs, grad[:, :, a:b], allow_unused=True)
            del y
            if gx is not None:
                gx[:, :, lo:hi] += grads[0]
            for n, g in enumerate(grads[1:] if need_input else grads):
                if g is not None:
                    held = gp[n]
                    gp[n] = g if held is None else held.add_(g)
        by_param = dict(zip(map(id, wanted), gp, strict=True))
        return gx, [by_param.get(id(p)) for p in params]


class _SpatialFunction(torch.autograd.Function):
    """``apply(x, runner, *params)``: the runner's output; saves only ``x``; backward re-runs the strips."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx, x: torch.Tensor, runner: _Runner, *params: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(x)  # the only tensor kept: the segment input (NOTE [ Spatial splitting ])
        ctx.runner = runner  # type: ignore[attr-defined]
        ctx.params = params  # type: ignore[attr-defined]  # leaves: holding them makes no cycle
        return runner.forward(x)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        runner: _Runner = ctx.runner  # type: ignore[attr-defined]
        need = ctx.needs_input_grad  # type: ignore[attr-defined]
        gx, gp = runner.backward(x, grad, ctx.params, bool(need[0]))  # type: ignore[attr-defined]
        return (gx, None, *gp)


def _autocast_state(device: torch.device) -> tuple[str, bool, torch.dtype]:
    kind = device.type if device.type in ("cuda", "cpu") else "cpu"
    return kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)


class SpatialSegment:
    """Stages ``first..last`` of a chain run as one recompute segment in ``strips`` strips of rows (NOTE
    [ Spatial splitting ] in ``memtune.tuner._spatial``). Called like ``memtune.tuner.runtime._segments.Segment``; the
    stage modules are passed to each call, so a convolution swapped in by ``apply_conv_choices`` is the one that runs.

    Args:
        first, last: stage indices (inclusive).
        modules: the chain's stage modules now (all of them), checked for splittability.
        names: the chain's stage names (all of them), for error messages.
        strips: strips of the segment's output rows (2..64).

    Raises:
        PlanError: a module of the segment cannot run on strips with the same math (names stage and module type),
            or ``strips`` is outside 2..64.
    """

    selective = False

    def __init__(self, first: int, last: int, modules: Sequence[nn.Module], names: Sequence[str], strips: int) -> None:
        if not MIN_STRIPS <= strips <= MAX_STRIPS:
            raise PlanError(f"spatial split of stages {first}..{last}: {strips} strips is outside 2..64")
        self.first = first
        self.last = last
        self.strips = strips
        self.names = tuple(names)
        _leaves(first, modules[first : last + 1], names)  # refuse early, before a step runs

    def __call__(
        self,
        x: torch.Tensor,
        modules: Sequence[nn.Module],
        on_stage_output: StageHook | None = None,
        on_stage_start: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """Run the segment on ``x`` (N, C, H, W). The whole segment's backward is one autograd node, marked as stage
        ``first``'s backward (``on_stage_output(first, out)``): the prefetches due up to that stage are issued when
        it starts, as the simulator has it."""
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            what = f"a {x.dim()}-d tensor" if isinstance(x, torch.Tensor) else type(x).__name__
            raise PlanError(
                f"stage {self.first} ({self.names[self.first]}) starts a spatially split segment but gets {what}; "
                "a split needs images (N, C, H, W)"
            )
        if on_stage_start is not None:
            on_stage_start(self.first)
        leaves = _leaves(self.first, modules[self.first : self.last + 1], self.names)
        runner = _Runner(leaves, self.strips, x.shape[2], _autocast_state(x.device))
        params = list({id(p): p for leaf in leaves for p in leaf.module.parameters()}.values())
        out: torch.Tensor = _SpatialFunction.apply(x, runner, *params)
        if on_stage_output is not None:
            on_stage_output(self.first, out)
        return out
