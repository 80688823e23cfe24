"""Whole-step measurements of a module profile (``memtune.profiler.module_profile.profile_module``): the step's time
in ms (eager, and with every stage recomputed), the first step's wall seconds when regions compile, the unplanned
step's peak and the loss backward's transient in bytes, read off the allocator (NOTE [ Allocator meters ] in
``memtune.profiler.memory_meter``)."""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from memtune.profiler._profile import StepPeak
from memtune.profiler.chain import may_write_input
from memtune.profiler.measure import _autocast, _Timer
from memtune.profiler.memory_meter import metered
from memtune.profiler.module_stages import Inputs, call_model, checkpointed_call, tensor_leaves
from memtune.profiler.profiler_errors import ProfilerError

# the steps ``profile_module`` takes; private to the profiler
__all__ = [
    "CUBLAS_HELD_BYTES",
    "CUBLAS_HELD_BYTES_DEFAULT",
    "_first_step_seconds",
    "_loss_backward_bytes",
    "_recompute_step_ms",
    "_resident_bytes",
    "_step_ms",
    "_step_peak",
    "modeled_resident_bytes",
]

# NOTE [ Memory held before the step ]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A training step on CUDA starts with more on the device than the parameters, their gradients, the optimizer state
# and the batch: PyTorch keeps a cuBLAS workspace for every (cuBLAS handle, stream) pair that ran a matrix product,
# allocated through the caching allocator and never freed, and handles are per thread, so the forward's thread and
# autograd's backward thread hold one each (32 MiB each on an H100 by default, and with
# ``CUBLAS_WORKSPACE_CONFIG=:4096:8``). They count against ``budget_guard``'s cap like any tensor. A measured module
# profile reads them once, after its unplanned step has run both threads' products: the allocated bytes that
# ``torch._C._cuda_clearCublasWorkspaces()`` frees (``Profile.resident_bytes``), after which one more unplanned step
# makes them again. The simulator adds them to every plan's base. Seen on the H100: a small ResNet's served plan was
# simulated at 557.81 MiB and peaked at 623.18 MiB, its growth over the step's start equal to the simulation's (544.51
# MiB) and the 65.37 MiB difference held before the step. The step's measured peak (``StepPeak``) is read above what was
# held before it, so the profile's self-check compares growth with growth either way.
#
# A profile made on the CPU for a GPU cannot read them, so it models them (``modeled_resident_bytes``): where the
# model runs a matrix product, two handles' workspaces of ``CUBLAS_HELD_BYTES`` for the GPU's compute capability.
# Compute capability 9.0: 32.5 MiB a handle, from the H100 (65 MiB held in ``scripts/held_memory_check.py``; 64-66
# MiB in the module profiles of the eight promises models that run matrix products). Others: PyTorch's default
# workspace below compute capability 9.0 (4,096 KiB x 2 + 16 KiB x 8 a handle), not measured here. Without them a
# CPU-made ResNet-50 plan ran 65 MiB over its budget on the H100's profile.


def _first_step_seconds(
    model: nn.Module, inputs: Inputs, loss_fn: Callable[[Any], torch.Tensor], dtype: str, dev: torch.device
) -> float:
    """Wall seconds of one step (forward, loss, backward; gradients dropped): with regions compiled, the first step
    compiles them (NOTE [ Profiles of compiled regions ])."""
    began = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    with _autocast(dev, dtype):
        out = call_model(model, inputs)
    grads = torch.autograd.grad(loss_fn(out), params, allow_unused=True)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    del grads, out
    return time.perf_counter() - began


def _step_ms(
    model: nn.Module,
    inputs: Inputs,
    loss_fn: Callable[[Any], torch.Tensor],
    dtype: str,
    dev: torch.device,
    warmup: int,
    repeats: int,
    recomputed: Sequence[nn.Module] = (),
) -> float:
    """Median ms of one whole step: forward, loss and backward (gradients dropped after each), unplanned or with
    every module of ``recomputed`` run under a non-reentrant checkpoint of its call."""
    timer = _Timer(dev)
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        with _autocast(dev, dtype):
            out = call_model(model, inputs)
        torch.autograd.grad(loss_fn(out), params, allow_unused=True)

    times = []
    with _checkpointed(recomputed):
        for k in range(warmup + repeats):
            _, ms = timer.run(step)
            if k >= warmup:
                times.append(ms)
    return statistics.median(times)


@contextmanager
def _checkpointed(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Each of ``modules`` called under a non-reentrant checkpoint of its own call while inside (its instance's
    ``forward`` replaced, then restored)."""
    own = [m.__dict__.get("forward") for m in modules]
    for m in modules:
        m.forward = functools.partial(_checkpointed_forward, m.forward, may_write_input(m))  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m, f in zip(modules, own, strict=True):
            if f is None:
                del m.forward
            else:
                m.forward = f  # type: ignore[method-assign]


def _checkpointed_forward(fn: Callable[..., Any], clone: bool, *args: Any, **kwargs: Any) -> Any:
    return checkpointed_call(fn, args, kwargs, clone=clone, selective=False)


def _recompute_step_ms(
    model: nn.Module,
    inputs: Inputs,
    loss_fn: Callable[[Any], torch.Tensor],
    dtype: str,
    dev: torch.device,
    rounds: tuple[int, int],
    modules: Sequence[nn.Module],
) -> float | None:
    """The whole step with every stage recomputed (NOTE [ Recompute priced as measured ] in
    ``memtune.tuner.simulator``),
    median ms; None where autograd refuses it or a stage's state cannot be copied."""
    try:
        return _step_ms(model, inputs, loss_fn, dtype, dev, *rounds, recomputed=modules)
    except (RuntimeError, ProfilerError):
        return None


def _step_peak(
    model: nn.Module,
    inputs: Inputs,
    loss_fn: Callable[[Any], torch.Tensor],
    dtype: str,
    dev: torch.device,
    output_held: bool,
    gpu_workspaces: bool = False,
) -> StepPeak:
    """The unplanned step's peak read off the allocator (NOTE [ Allocator meters ]): forward, loss and ``backward()``
    as a training loop runs them (gradients accumulated into ``.grad``, a tied weight's in place, NOTE [ Tied
    weights ]), the output held through the backward or dropped before it as ``output_held`` says. The parameters'
    ``.grad`` are restored after. ``gpu_workspaces``: on the CPU, read as the GPU would allocate it (NOTE [ GPU
    transients from the CPU's allocator ])."""
    params = [p for p in model.parameters() if p.requires_grad]
    kept = [p.grad for p in params]
    for p in params:
        p.grad = None
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # the reserved peak is this step's, not an earlier cache's
    try:
        with metered(dev, gpu_workspaces=gpu_workspaces) as reading:
            with _autocast(dev, dtype):
                out = call_model(model, inputs)
            loss = loss_fn(out)
            if not output_held:
                del out
            loss.backward()
            del loss
            out = None
            for p in params:
                p.grad = None
    finally:
        for p, g in zip(params, kept, strict=True):
            p.grad = g
    return StepPeak(
        allocated_bytes=reading.peak_bytes, reserved_bytes=reading.peak_reserved_bytes, output_held=output_held
    )


#: bytes of cuBLAS workspace one handle holds, by compute capability (NOTE [ Memory held before the step ])
CUBLAS_HELD_BYTES = {"9.0": 32 * 2**20 + 2**19}
#: below compute capability 9.0: PyTorch's default cuBLAS workspace (4,096 KiB x 2 + 16 KiB x 8)
CUBLAS_HELD_BYTES_DEFAULT = (4096 * 2 + 16 * 8) * 1024


def modeled_resident_bytes(compute_capability: str, runs_matmul: bool) -> int:
    """Bytes a training step on a GPU of ``compute_capability`` holds in cuBLAS workspaces (NOTE [ Memory held before
    the step ]): two handles' (the forward's thread and autograd's) where the model runs a matrix product, else 0."""
    if not runs_matmul:
        return 0
    return 2 * CUBLAS_HELD_BYTES.get(compute_capability, CUBLAS_HELD_BYTES_DEFAULT)


def _resident_bytes(dev: torch.device, step: Callable[[], object]) -> int:
    """Bytes of cuBLAS workspaces the process holds on ``dev`` (NOTE [ Memory held before the step ]); 0 off CUDA or
    where this torch has no way to free them. Call after a step has run (its products create them): they are freed to
    be counted, and ``step`` (one unplanned training step) then makes them again, so that later measurements start
    from the state a training loop is in."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if dev.type != "cuda" or clear is None:
        return 0
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_allocated(dev)
    clear()
    held = max(0, before - torch.cuda.memory_allocated(dev))
    step()
    return held


def _loss_backward_bytes(
    model: nn.Module,
    last: nn.Module,
    inputs: Inputs,
    loss_fn: Callable[[Any], torch.Tensor],
    dtype: str,
    dev: torch.device,
    gpu_workspaces: bool = False,
) -> int:
    """``Profile.loss_backward_bytes``: the peak of the backward from the loss to the last stage's output above what
    was live before it and that output's gradient, bytes, read off the allocator (NOTE [ Allocator meters ])."""
    got: list[torch.Tensor] = []

    def hook(_m: nn.Module, _a: Any, out: Any) -> None:
        got.extend(t for t in tensor_leaves(out) if t.requires_grad and t.is_floating_point())

    handle = last.register_forward_hook(hook)
    try:
        with _autocast(dev, dtype):
            out = call_model(model, inputs)
    finally:
        handle.remove()
    loss = loss_fn(out)
    if not got:
        return 0
    with metered(dev, gpu_workspaces=gpu_workspaces) as reading:
        grads = torch.autograd.grad(loss, got[:1], allow_unused=True)
    made = sum(g.untyped_storage().nbytes() for g in grads if g is not None)
    got.clear()
    del grads, loss, out
    return max(0, reading.peak_bytes - made)
