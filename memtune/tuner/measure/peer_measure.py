"""Measuring the peers of a module model in this process (NOTE [ Module peers ] in
``memtune.tuner.measure.module_peers``).

# NOTE [ Peer measurement ]
Each peer trains ``warmup`` + ``steps`` steps of the caller's batch in this process: forward, loss, backward and the
optimizer's update (SGD with momentum, or AdamW) at a learning rate of 0, so the update's kernels and state are there
and the parameters are left as they were; the buffers (running statistics) are restored after each peer. The first
step's wall seconds (``first_step_s``) include compiling. On CUDA: the median of the timed steps by CUDA events, the
peak bytes allocated and reserved (``max_memory_allocated``/``max_memory_reserved``, reset after the warm-up: the
whole process's, as ``memtune.tuner.measure.module_bench.measure_step`` reports the unplanned step), and the allocator's
retries per step. On the CPU (tests): wall-clock ms and the peak the CPU allocator's events give above what was live
before the timed steps (``memtune.profiler.memory_meter.metered``); reserved equals allocated there. Either way the
update inside the timed steps is timed too (``update_ms``, NOTE [ The optimizer's update ] in ``memtune.tuner._whole``).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import nn

from memtune.profiler.module_profile import as_inputs, default_loss
from memtune.tuner.measure.module_peers import COMPILER_SWEEP, ModulePeer, applicable_peers, applied, buffers_kept
from memtune.tuner.measure.step_timing import time_steps, training_step, update_timer

__all__ = ["measure_peers"]

Loss = Callable[[Any], torch.Tensor]
Progress = Callable[[int, int, str], None]


def measure_peers(
    model: nn.Module,
    example_inputs: Any,
    *,
    loss_fn: Loss | None = None,
    peers: Sequence[ModulePeer] | None = None,
    compiler_budgets: Sequence[float] = COMPILER_SWEEP,
    optimizer: Literal["sgd", "adam"] = "sgd",
    warmup: int = 3,
    steps: int = 10,
    output_held: bool = False,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Measure each peer of ``model`` that applies (NOTE [ Peer measurement ]): one JSON-ready dict per peer, in the
    order of ``peers``, with its ``ModulePeer`` fields and, where it ran, ``step_ms``, ``peak_bytes``,
    ``reserved_bytes``, ``alloc_retries_per_step`` (CUDA), ``first_step_s`` and ``update_ms``, or ``error`` (``out of
    memory: ...`` for an out-of-memory); a peer that does not apply is listed with its reason and no measurement.

    Args:
        model: the model on its device (CUDA; the CPU for tests), in the mode it trains in.
        example_inputs: its batch (a tensor, a tuple, a dict, or ``(args, kwargs)``).
        loss_fn: the loss over the model's output (default ``memtune.profiler.module_profile.default_loss``).
        peers: the peers (default ``applicable_peers(model, example_inputs, compiler_budgets=...)``).
        compiler_budgets: the compiler's sweep when ``peers`` is None.
        optimizer: ``sgd`` (momentum) or ``adam`` (AdamW), at a learning rate of 0.
        warmup, steps: untimed steps (the first compiles) and timed steps per peer.
        output_held: the loop holds the model's output until its backward ends.
        progress: called with (peers done, peers to run, name) before each peer that runs, and at the end.

    Raises:
        ValueError: ``steps`` below 1, ``warmup`` below 0, or an unknown optimizer.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be at least 1 and warmup at least 0, not {steps} and {warmup}")
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', not {optimizer!r}")
    chosen = (
        list(peers) if peers is not None else applicable_peers(model, example_inputs, compiler_budgets=compiler_budgets)
    )
    loss = loss_fn or default_loss
    args = as_inputs(example_inputs)
    runs = [p for p in chosen if p.applies]
    rows: list[dict[str, Any]] = []
    done = 0
    for peer in chosen:
        row = peer.to_dict()
        if peer.applies:
            if progress is not None:
                progress(done, len(runs), peer.name)
            row.update(_measure_one(model, peer, args, loss, optimizer, warmup, steps, output_held))
            done += 1
        rows.append(row)
    if progress is not None:
        progress(done, len(runs), "done")
    return rows


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, torch.OutOfMemoryError):
        return "out of memory: " + str(exc).split(" If reserved but unallocated")[0].strip()[:400]
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


def _measure_one(
    model: nn.Module,
    peer: ModulePeer,
    args: tuple[tuple[Any, ...], dict[str, Any]],
    loss: Loss,
    optimizer: str,
    warmup: int,
    steps: int,
    output_held: bool,
) -> dict[str, Any]:
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt: torch.optim.Optimizer = (
        torch.optim.AdamW(params, lr=0.0) if optimizer == "adam" else torch.optim.SGD(params, lr=0.0, momentum=0.9)
    )
    try:
        with buffers_kept(model), applied(model, peer) as run:
            with update_timer(opt, cuda=device.type == "cuda") as updates:
                row = _timed(training_step(run, args, loss, opt, output_held=output_held), device, warmup, steps)
            return {**row, "update_ms": updates.median_ms(steps)}
    except Exception as exc:  # an out-of-memory, a compile error, an in-place write at a segment edge: the result
        return {"error": _error_text(exc)}
    finally:
        opt.zero_grad(set_to_none=True)
        opt.state.clear()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()


def _timed(step: Callable[[], None], device: torch.device, warmup: int, steps: int) -> dict[str, Any]:
    """A peer's measurement (NOTE [ Peer measurement ]) as its row's keys, by NOTE [ Step timing ] in
    ``memtune.tuner.measure.step_timing``."""
    cuda = device.type == "cuda"
    timing = time_steps(
        step,
        warmup=warmup,
        steps=steps,
        device=device,
        peak="process" if cuda else "metered",
        time_first=True,
        release_first=True,
    )
    assert timing.first_step_s is not None
    row: dict[str, Any] = {
        "step_ms": timing.step_ms,
        "peak_bytes": timing.peak_bytes,
        "reserved_bytes": timing.reserved_bytes,
    }
    if cuda:
        row["alloc_retries_per_step"] = timing.alloc_retries_per_step
    row["first_step_s"] = round(timing.first_step_s, 3)
    return row
