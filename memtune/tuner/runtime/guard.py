"""Enforcing a memory budget on CUDA while planned steps run, and the allocator settings that suit it.

# NOTE [ Allocator retries ]
The simulator counts allocated bytes; the cap (``set_per_process_memory_fraction``) counts what the caching
allocator has *reserved*. Freed blocks stay reserved, and when a request fits no cached block and growing would
pass the cap, the allocator releases every cached block and retries (``num_alloc_retries``): by PyTorch's
allocator source, it synchronizes the stream and unmaps every free 20 MiB page of the cache, and this and later
allocations map pages again while the GPU waits on the host. Measured on
the H200 (``scripts/memory_trace.py``, per-stage trace): a VGG-16 b256 fp32 plan whose allocated bytes matched the
simulator within 0.07 GiB at every stage ran 267.7 ms uncapped (simulated 273.4) but 394.8 ms under a cap 0.85
GiB above its peak, 8 retries costing 5-37 ms each; a GPT b16 bf16 plan paid one retry (about 14 ms) at the
loss's 3.3 GB fp32 logits. Two things help, both measured:
- expandable segments (fragmentation does not strand whole segments; without them the same VGG-16 plan ran
  out of memory with 3.93 GiB reserved but unallocated), and
- ``garbage_collection_threshold``: the allocator frees old cached blocks before it reaches the cap instead of
  releasing everything at once (VGG-16 above: 376.3 ms -> 349.2 ms at 0.8).
``configure_allocator`` sets both; ``memtune bench`` and measured validation call it first. What remains is
counted per step in ``BenchRow.alloc_retries`` and is one reason for the budget headroom
(``memtune.tuner.calibration``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from memtune.tuner._tuner_errors import BudgetError, TunerError
from memtune.tuner.runtime._planned import PlannedBase

__all__ = ["ALLOCATOR_SETTINGS", "budget_guard", "configure_allocator"]

#: PyTorch caching-allocator settings for planned steps under a budget (NOTE [ Allocator retries ])
ALLOCATOR_SETTINGS = "expandable_segments:True,garbage_collection_threshold:0.8"


def configure_allocator() -> str:
    """Apply ``ALLOCATOR_SETTINGS`` unless ``PYTORCH_CUDA_ALLOC_CONF`` is set; returns the settings in force.

    Before CUDA is initialized the settings go into the environment (read at initialization); after, through
    ``torch.cuda.memory._set_allocator_settings``, which applies to segments allocated from then on, so the
    cache is emptied first: a free block of an old segment would otherwise take the next allocations, and a
    segment holding one live block cannot be released (on the H200, a validation after other CUDA work in the
    same process ran out of memory under a 2 GiB cap with 1.97 GiB reserved but unallocated, in a segment made
    before the switch; emptying here did not cure that test, setting the allocator before CUDA initialized
    did: ``tests/gpu/conftest.py``, ``memtune worker``). Call it before the first CUDA allocation.
    """
    chosen = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if chosen:
        return chosen
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR_SETTINGS
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.memory._set_allocator_settings(ALLOCATOR_SETTINGS)
    return ALLOCATOR_SETTINGS


@contextlib.contextmanager
def budget_guard(
    budget_bytes: int,
    model: PlannedBase | None = None,
    *,
    device: torch.device | int | str | None = None,
) -> Iterator[None]:
    """Cap this process's CUDA caching allocator at ``budget_bytes`` inside the block.

    Uses ``torch.cuda.set_per_process_memory_fraction(budget / total memory)`` after emptying the
    cache, and restores the previous fraction in ``finally``. The cap covers everything the caching
    allocator reserves (parameters, gradients, optimizer state, activations, prefetch buffers,
    workspaces), not the CUDA context, and what was allocated before the block counts against it; call
    ``configure_allocator`` first (NOTE [ Allocator retries ]). A planned model of compiled regions compiles and
    tunes them at its first step, outside the plan's memory: run that step before the block (NOTE [ Regions compile
    at their first call ] in ``memtune.tuner.runtime._planned_module``).
    With ``model``, an out-of-memory error inside the block, in forward or backward, becomes
    ``PlanOutOfMemoryError`` naming the plan label and the stage that was running; the runtime's
    in-flight state is dropped and the cache emptied, so the next step runs.

    Args:
        budget_bytes: bytes one step may use on the device (see ``memtune.tuner.budget.parse_budget``).
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
