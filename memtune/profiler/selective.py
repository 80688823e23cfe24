"""Selective stages: keep the outputs of a stage's costly operations, re-run its cheap ones in backward.

# NOTE [ Selective stages ]
A transformer block saves about 600 MiB for its backward at batch 16, width 1024, sequence 1024 in bf16, and
less than half of it comes from operations that cost time to re-run: layer norms (their fp32 inputs and bf16
outputs), the GELU's input and output, and the bf16 copies of the weights are made by memory-bound kernels that
take a few percent of the block's time. PyTorch's selective activation checkpointing
(``torch.utils.checkpoint.create_selective_checkpoint_contexts``) keeps the outputs of the operations a policy
names and recomputes the rest from them when the backward needs them. A ``selective`` stage (NOTE [ Plan
semantics ] in ``memtune.tuner.plan``) runs so, with the policy here: the outputs of matrix products, convolutions and
attention are kept (``SAVED_OPS``), every other operation is re-run. It is a third point between ``keep``
(nothing re-run) and ``recompute`` (everything re-run, the convolutions and matrix products too).

What the stage then holds from its forward to its backward is its input (the checkpoint's own) and the kept
outputs, ``selective_saved_bytes``: every distinct storage a ``SAVED_OPS`` operation returns, other than the
input's. Outputs that a plain backward would not read (the attention projection's and the second MLP layer's,
which only feed residual sums) are kept too: the policy sees operations, not their consumers. The backward
re-runs the cheap operations and then differentiates; its forward and backward times and its backward's transient
(the re-made tensors live only during it) are measured (``memtune.profiler.measure.time_stage`` and
``selective_backward_bytes``) and stored in the profile.

A stage gains from it only where what it re-makes is larger than what the policy keeps beyond a plain save: a
transformer block or a bottleneck, not a lone convolution, whose output a plain ``keep`` does not save at all.
``memtune.tuner.stage_choices.selective_gain_bytes`` says what a stage gains, and the search offers the action only
where it frees memory for less time than a one-stage recompute (``memtune.tuner.stage_choices.selective_pays``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import memtune.profiler._fused_attention  # noqa: F401  (defines memtune::gpu_attention)
from memtune.profiler._storages import storage_key

__all__ = [
    "SAVED_OPS",
    "KeptOutputs",
    "kept_by_selective",
    "selective_checkpoint",
    "selective_context",
    "selective_policy",
    "selective_saved_bytes",
]

_SAVED_NAMES = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "convolution",
    "_convolution",
    "cudnn_convolution",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_flash_attention_forward",
    "_efficient_attention_forward",
)


def _saved_ops() -> frozenset[Any]:
    ops: list[Any] = []
    for name in _SAVED_NAMES:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            ops.extend(getattr(packet, o) for o in packet.overloads())
    return frozenset(ops) | {torch.ops.memtune.gpu_attention.default}  # NOTE [ Fused attention on the CPU ]


SAVED_OPS: frozenset[Any] = _saved_ops()
"""The aten operations whose outputs a selective stage keeps (the overloads this torch build has)."""


def _draws_random(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``op`` draws from the random generator on this call: attention with a positive ``dropout_p``
    (NOTE [ Random kernels are re-run ])."""
    if torch.Tag.nondeterministic_seeded not in getattr(op, "tags", ()):
        return False
    for k, arg in enumerate(op._schema.arguments):
        if arg.name == "dropout_p":
            p = kwargs.get("dropout_p", args[k] if k < len(args) else arg.default_value)
            return bool(p)
    return True


def kept_by_selective(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a selective stage keeps the output of this call of ``op``: one of ``SAVED_OPS`` that draws no random
    numbers (NOTE [ Selective stages ], NOTE [ Random kernels are re-run ])."""
    return op in SAVED_OPS and not _draws_random(op, args, kwargs)


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Keep the outputs of ``SAVED_OPS``, re-run everything else (NOTE [ Selective stages ]).

    # NOTE [ Random kernels are re-run ]
    A kept operation is not run again in the backward's re-run, so it does not draw from the random generator
    there. Attention with dropout (``_scaled_dot_product_efficient_attention`` and its kin with ``dropout_p > 0``)
    draws its mask from the CUDA generator: kept, it left every later dropout of the re-run at another offset of the
    generator than in the forward, with other masks: on an H200 a small ``BertForMaskedLM`` with its default
    dropout had a relative gradient error of 0.73 with every stage selective, a T5 0.92, while the loss was right
    (on the CPU the attention's dropout runs as separate operations, which are re-run, so it was exact). Such a
    call is re-run, so that the re-run draws what the forward drew; attention without dropout is kept.
    """
    if op in SAVED_OPS and _draws_random(op, args, kwargs):
        return CheckpointPolicy.MUST_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context() -> Any:
    """The ``context_fn`` result for ``torch.utils.checkpoint.checkpoint`` that applies ``selective_policy``."""
    return create_selective_checkpoint_contexts(selective_policy)


def selective_checkpoint(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` under non-reentrant selective checkpointing with ``selective_policy``."""
    out = checkpoint(fn, x, use_reentrant=False, context_fn=selective_context, preserve_rng_state=True)
    assert isinstance(out, torch.Tensor)
    return out


class KeptOutputs(TorchDispatchMode):
    """A dispatch mode that records the distinct storages ``SAVED_OPS`` return while it is active; ``kept_bytes``
    is what a selective stage would hold of them (NOTE [ Selective stages ]). Any device, ``meta`` included."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int | tuple[str, int], int] = {}
        self.alive: list[torch.Tensor] = []  # keeps storages alive so that their keys stay unique

    @property
    def kept_bytes(self) -> int:
        """Bytes of the distinct storages recorded."""
        return sum(self.storages.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if kept_by_selective(func, args, kwargs or {}):
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.storages.setdefault(storage_key(t), t.untyped_storage().nbytes())
                    self.alive.append(t)
        return out


def selective_saved_bytes(
    module: torch.nn.Module, x: torch.Tensor, *, autocast: Callable[[], Any] | None = None
) -> int:
    """Bytes a selective stage holds from its forward to its backward besides its input (NOTE [ Selective
    stages ]): the distinct storages the ``SAVED_OPS`` of one forward of ``module`` on ``x`` return.

    Runs on any device, ``meta`` included (shapes and dtypes are what count). ``autocast``: a context-manager
    factory to run the forward under (the profile's dtype), else none.
    """
    rec = KeptOutputs()
    inp = x.detach().requires_grad_(x.is_floating_point())
    inp = inp.clone() if inp.requires_grad else inp  # not a leaf: an in-place first operation may write it
    with torch.enable_grad(), autocast() if autocast is not None else nullcontext(), rec:
        module(inp)
    return rec.kept_bytes
