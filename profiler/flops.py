"""Counting what a stage's forward does: FLOPs (convolution and other), bytes moved, kernels launched.

``count_stage()`` is a context manager around one stage's forward. FLOPs come from PyTorch's
``FlopCounterMode`` (2 FLOPs per multiply-accumulate). Bytes moved are counted per ATen op as the
bytes of its tensor inputs plus its tensor outputs (view ops move nothing), i.e. memory traffic with
no fusion across ops: an upper bound for the roofline. Works on any device, including ``meta``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from profiler.selective import KeptOutputs

__all__ = ["StageCount", "count_stage"]

# ops that allocate or describe without touching memory
_FREE_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias", "lift_fresh"}


@dataclass
class StageCount:
    """What one stage's forward did.

    Attributes:
        flops: forward floating-point operations, total.
        conv_flops: the part of ``flops`` spent in convolutions.
        bytes_moved: bytes read plus written by its ATen ops (no fusion), bytes.
        ops: ATen ops that move memory (each one at least a kernel launch).
        selective_saved_bytes: what the stage would hold under selective checkpointing besides its input (NOTE
            [ Selective stages ] in ``profiler.selective``), bytes.
    """

    flops: float = 0.0
    conv_flops: float = 0.0
    bytes_moved: int = 0
    ops: int = 0
    selective_saved_bytes: int = 0


def _tensor_bytes(tree: Any) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, (list, tuple)):
        return sum(_tensor_bytes(t) for t in tree)
    if isinstance(tree, Mapping):
        return sum(_tensor_bytes(t) for t in tree.values())
    return 0


class _TrafficMode(TorchDispatchMode):
    def __init__(self, count: StageCount) -> None:
        super().__init__()
        self.count = count

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        op = getattr(func, "_overloadpacket", None)
        name = getattr(op, "__name__", "")
        if not getattr(func, "is_view", False) and name not in _FREE_OPS:
            moved = _tensor_bytes(args) + _tensor_bytes(kwargs or {}) + _tensor_bytes(out)
            if moved:
                self.count.bytes_moved += moved
                self.count.ops += 1
        return out


@contextmanager
def count_stage() -> Iterator[StageCount]:
    """Count FLOPs, bytes moved and ops of the code run inside; the result is filled on exit.

    Example::

        with count_stage() as c:
            y = stage(x)
        print(c.flops, c.bytes_moved)
    """
    count = StageCount()
    flop_mode = FlopCounterMode(display=False)
    kept = KeptOutputs()
    with flop_mode, _TrafficMode(count), kept:
        yield count
    count.selective_saved_bytes = kept.kept_bytes
    per_op = flop_mode.get_flop_counts().get("Global", {})
    count.flops = float(sum(per_op.values()))
    count.conv_flops = float(sum(v for op, v in per_op.items() if "conv" in str(op)))
