"""The saved-storage table: which storages autograd keeps for backward, who made them, who holds them.

Implements NOTE [ Saved storages ] (``memtune.profiler._profile``). One forward of the whole chain runs under
``torch.autograd.graph.saved_tensors_hooks`` with the current stage tracked; every tensor autograd packs
is resolved to its storage (views and in-place results share their base's storage), and each storage is
listed once with ``saved_by`` (the stages whose saved set holds it) and ``producer`` (the stage that
allocated it; -1 for the model input). Every stage's output storage is listed too, even when nobody
saves it (``saved_by`` empty), so ``output_storage[i]`` always names it. Parameters and buffers of the
model are never listed. A stage's S_i (``saved_bytes``) is the total of the storages whose smallest
``saved_by`` is i (``stage_saved_bytes``).

Devices: on CUDA the table is the GPU's own. On the ``meta`` device the forward follows CUDA's kernels
and autocast policy (NOTE [ CUDA semantics on meta ] in ``memtune.profiler._meta``), at any batch size, at no
cost. On the CPU it is the CPU's table (e.g. ``Dropout`` keeps a float noise tensor, not a bool mask).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from memtune.profiler._meta import CudaSemantics
from memtune.profiler._profile import SavedStorage
from memtune.profiler.chain import ModelChain
from memtune.profiler.profiler_errors import ProfilerError

__all__ = ["ChainTrace", "saved_storage_table", "stage_saved_bytes", "storage_key", "trace_chain"]


@dataclass
class ChainTrace:
    """What one traced forward of a chain found.

    Attributes:
        storages: the saved-storage table, in order of discovery.
        output_storage: per stage, index into ``storages`` of its output's storage.
        inplace: per stage, True when its output storage is its input's storage (in-place ops, views).
        output_bytes: per stage, bytes of its output tensor.
        output_shapes: per stage, its output's shape.
        stage_results: per stage, what ``stage_context(i)`` yielded (e.g. a FLOP count), else None.
        conv_inputs: per stage, ``{conv name: (H, W)}`` of each ``nn.Conv2d``'s input.
        output_requires_grad: per stage, whether its output needs a gradient.
    """

    storages: list[SavedStorage]
    output_storage: list[int | None]
    inplace: list[bool]
    output_bytes: list[int]
    output_shapes: list[tuple[int, ...]]
    stage_results: list[Any] = field(default_factory=list)
    conv_inputs: list[dict[str, tuple[int, int]]] = field(default_factory=list)
    output_requires_grad: list[bool] = field(default_factory=list)


def storage_key(t: torch.Tensor) -> int | tuple[str, int]:
    """An identity for ``t``'s storage, equal for views and in-place results."""
    s = t.untyped_storage()
    ptr = s.data_ptr()
    if ptr:
        return (s.device.type, ptr)
    return int(s._cdata)  # meta storages have no address; the StorageImpl identifies them


class _Table:
    """Accumulates storages; see NOTE [ Saved storages ]."""

    def __init__(self, excluded: set[int | tuple[str, int]], input_key: int | tuple[str, int] | None) -> None:
        self.excluded = excluded
        self.input_key = input_key
        self.index: dict[int | tuple[str, int], int] = {}
        self.bytes: list[int] = []
        self.saved_by: list[list[int]] = []
        self.producer: list[int] = []
        self.alive: list[torch.Tensor] = []  # keeps every storage alive so keys stay unique
        self.stage = -1

    def lookup(self, t: torch.Tensor, producer: int) -> int | None:
        """Index of ``t``'s storage, registering it with ``producer`` if new; None for params/empty."""
        if t.untyped_storage().nbytes() == 0:
            return None
        key = storage_key(t)
        if key in self.excluded:
            return None
        k = self.index.get(key)
        if k is None:
            if key == self.input_key:
                producer = -1
            k = len(self.bytes)
            self.index[key] = k
            self.bytes.append(t.untyped_storage().nbytes())
            self.saved_by.append([])
            self.producer.append(producer)
            self.alive.append(t.detach())  # the storage, not the graph (NOTE [ No graph cycles in traces ])
        return k

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        k = self.lookup(t, self.stage)
        if k is not None and self.stage not in self.saved_by[k]:
            self.saved_by[k].append(self.stage)
        # NOTE [ No graph cycles in traces ]: what a pack hook returns is held by the graph; a tensor returned as it
        # is holds its grad_fn, which holds the tensor again: a cycle through autograd's C++ graph that Python's
        # collector cannot see, so every traced activation stayed allocated after the trace (about 10 GiB after a
        # profile on an H100; 13.9 MiB for ResNet-18 at batch 8, 64x64). A detached tensor shares the storage only.
        return t.detach()

    def storages(self) -> list[SavedStorage]:
        return [
            SavedStorage(bytes=b, saved_by=tuple(sorted(by)), producer=p)
            for b, by, p in zip(self.bytes, self.saved_by, self.producer, strict=True)
        ]


def _semantics(x: torch.Tensor, dtype: torch.dtype | None) -> AbstractContextManager[Any]:
    """Autocast on real devices; CUDA semantics (with emulated autocast) on meta."""
    if x.device.type == "meta":
        return CudaSemantics(dtype)
    if dtype is None:
        return nullcontext()
    return torch.autocast(x.device.type, dtype=dtype)


def trace_chain(
    chain: ModelChain,
    x: torch.Tensor,
    *,
    autocast_dtype: torch.dtype | None = None,
    stage_context: Callable[[int], AbstractContextManager[Any]] | None = None,
    conv_shapes: bool = True,
) -> ChainTrace:
    """Run one training-mode forward of ``chain`` on ``x`` and build its saved-storage table.

    Args:
        chain: the model; its modules are put in training mode.
        x: the batch's input, on the device to trace on (``meta`` traces with CUDA semantics).
        autocast_dtype: run under autocast to this dtype (``torch.bfloat16``), or None for fp32.
        stage_context: called with the stage index; the context it returns wraps that stage's forward
            and what it yields is kept in ``stage_results`` (used to count FLOPs per stage).
        conv_shapes: record each ``nn.Conv2d``'s input size through a forward pre-hook (``conv_inputs``).

    Returns:
        A ``ChainTrace``. The forward's graph is dropped before returning.
    """
    excluded: set[int | tuple[str, int]] = set()
    for i, stage in enumerate(chain.stages):
        stage.module.train()
        for t in (*stage.module.parameters(), *stage.module.buffers()):
            if t.device != x.device and t.device.type != x.device.type:
                raise ProfilerError(
                    f"stage {i} ({stage.name}) has a tensor on {t.device} but the input is on {x.device}; "
                    "move the model to the input's device (for meta use memtune.profiler._meta.meta_chain)"
                )
            if t.untyped_storage().nbytes():
                excluded.add(storage_key(t))
    table = _Table(excluded, input_key=storage_key(x) if x.untyped_storage().nbytes() else None)
    output_storage: list[int | None] = []
    inplace: list[bool] = []
    output_bytes: list[int] = []
    output_shapes: list[tuple[int, ...]] = []
    results: list[Any] = []
    conv_inputs: list[dict[str, tuple[int, int]]] = []
    out_grad: list[bool] = []
    with torch.autograd.graph.saved_tensors_hooks(table.pack, lambda t: t), _semantics(x, autocast_dtype):
        cur = x
        for i, stage in enumerate(chain.stages):
            table.stage = i
            shapes: dict[str, tuple[int, int]] = {}
            handles = [
                m.register_forward_pre_hook(_conv_shape_hook(shapes, name))
                for name, m in stage.module.named_modules()
                if conv_shapes and isinstance(m, torch.nn.Conv2d)
            ]
            in_key = storage_key(cur) if cur.untyped_storage().nbytes() else None
            try:
                ctx = stage_context(i) if stage_context is not None else nullcontext()
                with ctx as result:
                    out = stage.module(cur)
            finally:
                for h in handles:
                    h.remove()
            if not isinstance(out, torch.Tensor):
                raise TypeError(
                    f"stage {i} ({stage.name}) returned {type(out).__name__}, not a tensor; "
                    "a chain stage must map one tensor to one tensor"
                )
            output_storage.append(table.lookup(out, i))
            inplace.append(in_key is not None and out.untyped_storage().nbytes() > 0 and storage_key(out) == in_key)
            output_bytes.append(out.numel() * out.element_size())
            output_shapes.append(tuple(out.shape))
            results.append(result)
            conv_inputs.append(shapes)
            out_grad.append(out.requires_grad)
            cur = out
    return ChainTrace(
        storages=table.storages(),
        output_storage=output_storage,
        inplace=inplace,
        output_bytes=output_bytes,
        output_shapes=output_shapes,
        stage_results=results,
        conv_inputs=conv_inputs,
        output_requires_grad=out_grad,
    )


def _conv_shape_hook(shapes: dict[str, tuple[int, int]], name: str) -> Callable[..., None]:
    def hook(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0]
        shapes[name] = (int(x.shape[-2]), int(x.shape[-1]))

    return hook


def saved_storage_table(
    chain: ModelChain, x: torch.Tensor, *, autocast_dtype: torch.dtype | None = None
) -> tuple[list[SavedStorage], list[int | None], list[bool]]:
    """The saved-storage table of one forward of ``chain`` on ``x``. See NOTE [ Saved storages ].

    Returns:
        ``(storages, output_storage, inplace)``: each storage once (bytes, ``saved_by``, ``producer``);
        per stage the index of its output's storage; per stage whether that is its input's storage.

    Example::

        storages, out, inplace = saved_storage_table(chain, torch.randn(2, 3, 32, 32))
        s = stage_saved_bytes(storages, len(chain))
    """
    tr = trace_chain(chain, x, autocast_dtype=autocast_dtype)
    return tr.storages, tr.output_storage, tr.inplace


def stage_saved_bytes(storages: list[SavedStorage], n_stages: int) -> list[int]:
    """S_i per stage: bytes of the storages whose smallest ``saved_by`` is i (each storage once)."""
    out = [0] * n_stages
    for s in storages:
        if s.saved_by:
            out[min(s.saved_by)] += s.bytes
    return out
