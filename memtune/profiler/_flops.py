"""Counting what a stage's forward does: FLOPs (convolution and other), bytes moved, kernels launched.

``count_stage()`` is a context manager around one stage's forward. FLOPs come from PyTorch's
``FlopCounterMode`` (2 FLOPs per multiply-accumulate). Bytes moved are counted per ATen op as the
bytes of its tensor inputs plus its tensor outputs (view ops move nothing), i.e. memory traffic with
no fusion across ops: an upper bound for the roofline. Every op that moves memory is also kept, in order,
as an ``OpCount`` (its kind, FLOPs, bytes, dtype and the shape facts NOTE [ Roofline ] in
``memtune.profiler.modeled`` prices it by). Works on any device, including ``meta``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from memtune.profiler.selective import KeptOutputs

__all__ = ["OpCount", "OpKind", "StageCount", "count_stage", "op_kind"]

# ops that allocate or describe without touching memory
_FREE_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias", "lift_fresh"}

OpKind = Literal["conv", "matmul", "batch_norm", "pool", "memory"]
"""How the roofline prices an op (NOTE [ Roofline ] in ``memtune.profiler.modeled``)."""

_CONV_OPS = {"convolution", "_convolution", "cudnn_convolution", "convolution_overrideable", "_slow_conv2d_forward"}
_MATMUL_OPS = {
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "addbmm",
    "_scaled_mm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
    "gpu_attention",  # NOTE [ Fused attention on the CPU ] in memtune.profiler._fused_attention
}
_BATCH_NORM_OPS = {
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training",
    "cudnn_batch_norm",
    "_batch_norm_with_update",
}
_POOL_OPS = {
    "max_pool2d_with_indices",
    "max_pool3d_with_indices",
    "max_pool2d",
    "avg_pool2d",
    "avg_pool3d",
    "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "mean",
    "sum",
    "amax",
    "amin",
}


def op_kind(name: str) -> OpKind:
    """The roofline kind of the ATen op called ``name`` (its overload packet's name, ``"addmm"``)."""
    if name in _CONV_OPS:
        return "conv"
    if name in _MATMUL_OPS:
        return "matmul"
    if name in _BATCH_NORM_OPS:
        return "batch_norm"
    if name in _POOL_OPS:
        return "pool"
    return "memory"


@dataclass(frozen=True)
class OpCount:
    """One ATen op of a stage's forward that moves memory (each is at least one kernel launch).

    Attributes:
        kind: how the roofline prices it (``op_kind``).
        flops: its floating-point operations.
        bytes_moved: bytes of its tensor inputs plus outputs.
        dtype: its (first) output's dtype, ``"bfloat16"``; ``""`` when it returns no tensor.
        channels: a convolution's input channels per group, a batch norm's channels; else 0.
        per_channel: a batch norm's elements per channel (batch x spatial); else 0.
    """

    kind: OpKind
    flops: float
    bytes_moved: int
    dtype: str = "float32"
    channels: int = 0
    per_channel: int = 0


@dataclass
class StageCount:
    """What one stage's forward did.

    Attributes:
        flops: forward floating-point operations, total.
        conv_flops: the part of ``flops`` spent in convolutions.
        bytes_moved: bytes read plus written by its ATen ops (no fusion), bytes.
        ops: ATen ops that move memory (each one at least a kernel launch).
        selective_saved_bytes: what the stage would hold under selective checkpointing besides its input (NOTE
            [ Selective stages ] in ``memtune.profiler.selective``), bytes.
        kernels: those ``ops`` in the order they ran, one ``OpCount`` each.
    """

    flops: float = 0.0
    conv_flops: float = 0.0
    bytes_moved: int = 0
    ops: int = 0
    selective_saved_bytes: int = 0
    kernels: list[OpCount] = field(default_factory=list)


def _tensor_bytes(tree: Any) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, (list, tuple)):
        return sum(_tensor_bytes(t) for t in tree)
    if isinstance(tree, Mapping):
        return sum(_tensor_bytes(t) for t in tree.values())
    return 0


def _first_tensor(tree: Any) -> torch.Tensor | None:
    if isinstance(tree, torch.Tensor):
        return tree
    if isinstance(tree, (list, tuple)):
        for t in tree:
            found = _first_tensor(t)
            if found is not None:
                return found
    return None


def _channels(
    kind: OpKind, args: tuple[Any, ...], kwargs: Mapping[str, Any], out: torch.Tensor | None
) -> tuple[int, int]:
    """``(channels, per_channel)`` of an op for ``OpCount``."""
    if kind == "conv":
        x = args[0] if args else kwargs.get("input")
        groups = args[8] if len(args) > 8 else kwargs.get("groups", 1)
        if isinstance(x, torch.Tensor) and x.dim() >= 2 and isinstance(groups, int) and groups > 0:
            return x.shape[1] // groups, 0
    if kind == "batch_norm" and out is not None and out.dim() >= 2 and out.shape[1] > 0:
        return int(out.shape[1]), out.numel() // out.shape[1]
    return 0, 0


class _TrafficMode(TorchDispatchMode):
    def __init__(self, count: StageCount, flop_mode: FlopCounterMode) -> None:
        super().__init__()
        self.count = count
        self.flop_mode = flop_mode

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        before = self.flop_mode.get_total_flops()
        out = func(*args, **kwargs)  # the flop counter, below this mode, counts it here
        op = getattr(func, "_overloadpacket", None)
        name = getattr(op, "__name__", "")
        if not getattr(func, "is_view", False) and name not in _FREE_OPS:
            moved = _tensor_bytes(args) + _tensor_bytes(kwargs) + _tensor_bytes(out)
            if moved:
                self.count.bytes_moved += moved
                self.count.ops += 1
                kind = op_kind(name)
                first = _first_tensor(out)
                channels, per_channel = _channels(kind, args, kwargs, first)
                self.count.kernels.append(
                    OpCount(
                        kind=kind,
                        flops=float(self.flop_mode.get_total_flops() - before),
                        bytes_moved=moved,
                        dtype=str(first.dtype).removeprefix("torch.") if first is not None else "",
                        channels=channels,
                        per_channel=per_channel,
                    )
                )
        return out


@contextmanager
def count_stage() -> Iterator[StageCount]:
    """Count FLOPs, bytes moved and ops of the code run inside; the result is filled on exit.

    Example::

        with count_stage() as c:
            y = stage(x)
        print(c.flops, c.bytes_moved, len(c.kernels))
    """
    count = StageCount()
    flop_mode = FlopCounterMode(display=False)
    kept = KeptOutputs()
    with flop_mode, _TrafficMode(count, flop_mode), kept:
        yield count
    count.selective_saved_bytes = kept.kept_bytes
    per_op = flop_mode.get_flop_counts().get("Global", {})
    count.flops = float(sum(per_op.values()))
    count.conv_flops = float(sum(v for op, v in per_op.items() if "conv" in str(op)))
