"""Compiled regions' backward transients as a step runs them, read off the CUDA allocator.

# NOTE [ Region backward measured in the chain ]
A stage's backward is measured alone (``memtune.profiler._stage_run``), its output's gradient made inside it. For a
compiled region on CUDA that measurement reads less than a step holds. Measured on an H100 (torch 2.11, ResNet-50,
batch 128, fp32): the compiled backward of ``layer2.0`` hands ``layer1.2`` its gradient channels-last, and ``layer1.2``
compiled at activation budget 1 then holds 890 MiB above what was live when its backward began (the incoming gradient
counted, the gradients it made not), where the profile's measurement of it alone, given the same channels-last
gradient (NOTE [ Incoming gradients as the chain makes them ]), read 498 MiB; at budget 0.5, 1,275 against 988 MiB.
The difference, 392 MiB at budget 1, is one incoming gradient: AOTAutograd's backward copies the gradient into the
layout it traced. A hand-made call of the same compiled region given that gradient also read 890 MiB, so what keeps
the profile's own isolated run from copying is not located; reading the backward where the step runs it does not
depend on knowing. A region plan at 30% of the compiled peak was simulated at 2.82 GiB and peaked 3.11 GiB, every
compiled region's backward 57 to 300 MiB above its profile (``scripts/region_plan_peak.py --trace``); with the
backward read in the step the same budget's plan was predicted at 2.82 GiB and peaked 2.77 GiB.

So a profile of compiled regions on CUDA also runs one step with every region kept and reads each compiled region's
backward where it runs: from its node's pre-hook (the allocator's count then, and its peak reset) to its post-hook
(the peak since), the incoming gradients counted as the isolated measurement counts them (made inside) and the
gradients the node made taken off. A region's profile keeps the larger of the two; the chain's excess over the
isolated plain measurement is added to its recomputed backward's too, whose compiled backward gets the same gradient.
A compiled region is one autograd node (its output's ``grad_fn``); eager stages are many and keep their isolated
measurement. On the CPU nothing is read: its allocator's meter cannot be reset from a hook.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from memtune.profiler._stage_run import _Timing
from memtune.profiler.measure import _autocast
from memtune.profiler.module_stages import Inputs, call_model, tensor_leaves

__all__ = ["chain_backward_bytes", "with_chain_backward"]


def _nbytes(tensors: Sequence[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def chain_backward_bytes(
    model: nn.Module,
    modules: Sequence[nn.Module],
    compiled: Sequence[bool],
    inputs: Inputs,
    loss_fn: Callable[[Any], torch.Tensor],
    dtype: str,
    dev: torch.device,
) -> list[int | None]:
    """Per stage, its backward's transient as one unplanned step runs it, as ``chained_backward_bytes`` counts it
    (NOTE [ Region backward measured in the chain ]), bytes; None for a stage not ``compiled`` and on the CPU."""
    got: list[int | None] = [None] * len(modules)
    if dev.type != "cuda":
        return got

    def watch(k: int) -> Callable[..., None]:
        def after_forward(_m: nn.Module, _args: Any, out: Any) -> None:
            first = next((t for t in tensor_leaves(out) if t.grad_fn is not None), None)
            if first is None or first.grad_fn is None:
                return
            began: list[int] = []

            def pre(grads: Sequence[Any]) -> None:
                began[:] = [torch.cuda.memory_allocated(dev) - _nbytes(grads)]
                torch.cuda.reset_peak_memory_stats(dev)

            def post(made: Sequence[Any], _grads: Sequence[Any]) -> None:
                if began:
                    held = torch.cuda.max_memory_allocated(dev) - began[0] - _nbytes(made)
                    got[k] = max(got[k] or 0, held)

            first.grad_fn.register_prehook(pre)
            first.grad_fn.register_hook(post)

        return after_forward

    handles = [m.register_forward_hook(watch(k)) for k, m in enumerate(modules) if compiled[k]]
    params = [p for p in model.parameters() if p.requires_grad]
    kept = [p.grad for p in params]
    try:
        with _autocast(dev, dtype):
            out = call_model(model, inputs)
        loss = loss_fn(out)
        loss.backward()
        del loss, out
    finally:
        for h in handles:
            h.remove()
        for p, g in zip(params, kept, strict=True):
            p.grad = g
    return got


def with_chain_backward(timing: _Timing, chained: int | None) -> _Timing:
    """``timing`` with its backward transients raised to what the chain measured (NOTE [ Region backward measured in
    the chain ]): the plain one to ``chained`` where larger, the recomputed one by the same excess."""
    if chained is None or timing.chained_backward_bytes is None or chained <= timing.chained_backward_bytes:
        return timing
    excess = chained - timing.chained_backward_bytes
    rec = timing.recompute_backward_bytes
    return dataclasses.replace(
        timing, chained_backward_bytes=chained, recompute_backward_bytes=None if rec is None else rec + excess
    )
