"""Enforcing a memory budget on CUDA while planned steps run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from tuner.errors import BudgetError, TunerError
from tuner.runtime.planned import PlannedModel

__all__ = ["budget_guard"]


@contextlib.contextmanager
def budget_guard(
    budget_bytes: int,
    model: PlannedModel | None = None,
    *,
    device: torch.device | int | str | None = None,
) -> Iterator[None]:
    """Cap this process's CUDA caching allocator at ``budget_bytes`` inside the block.

    Uses ``torch.cuda.set_per_process_memory_fraction(budget / total memory)`` after emptying the
    cache, and restores the previous fraction in ``finally``. The cap covers everything the caching
    allocator reserves (parameters, gradients, optimizer state, activations, prefetch buffers,
    workspaces), not the CUDA context. With ``model``, an out-of-memory error inside the block, in
    forward or backward, becomes ``PlanOutOfMemoryError`` naming the plan label and the stage that was
    running; the runtime's in-flight state is dropped and the cache emptied, so the next step runs.

    Args:
        budget_bytes: bytes one step may use on the device (see ``tuner.budget.parse_budget``).
        model: the planned model whose steps run in the block (for error messages and cleanup).
        device: the CUDA device (default: the current one).

    Raises:
        BudgetError: the budget is not positive or exceeds the device's memory.
        TunerError: CUDA is not available (there is no GPU budget to enforce on CPU).

    Example::

        with budget_guard(parse_budget("12GiB", total), model):
            loss_fn(model(x), y).backward()
    """
    if not torch.cuda.is_available():
        raise TunerError("budget_guard needs a CUDA device; on CPU there is no GPU budget to enforce")
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.type != "cuda":
        raise TunerError(f"budget_guard needs a CUDA device, got {dev}")
    total = torch.cuda.get_device_properties(dev).total_memory
    if not 0 < budget_bytes <= total:
        raise BudgetError(
            f"budget {budget_bytes} bytes is outside 1..{total} (the memory of {torch.cuda.get_device_name(dev)})"
        )
    previous = torch.cuda.get_per_process_memory_fraction(dev)
    torch.cuda.empty_cache()  # cached blocks would otherwise count against the cap
    torch.cuda.set_per_process_memory_fraction(budget_bytes / total, dev)
    try:
        with model.oom_guard(budget_bytes) if model is not None else contextlib.nullcontext():
            yield
    finally:
        torch.cuda.set_per_process_memory_fraction(previous, dev)
