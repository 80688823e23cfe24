"""Timing training steps and reading their memory: the one loop the measuring modules share (``bench``,
``module_bench``, ``peer_measure``, ``compiler_points``).

# NOTE [ Step timing ]
``time_steps`` runs ``warmup`` untimed steps, then ``steps`` timed ones, and reports the median of the timed steps in
ms: on CUDA each step between two CUDA events (``end.synchronize()`` after each), on the CPU by the host clock. The
memory is read one of two ways (``peak``):

* ``"process"`` (CUDA only): after the warm-up a device synchronisation and ``torch.cuda.reset_peak_memory_stats``,
  then ``max_memory_allocated`` and ``max_memory_reserved`` after the timed steps: the whole process's peaks over the
  timed steps, in bytes (NOTE [ Bench step ] in ``memtune.tuner.measure.bench``).
* ``"metered"`` (CUDA or the CPU): the timed steps run inside ``memtune.profiler.memory_meter.metered``, which
  synchronises and resets the peaks itself: the bytes above what was live before the timed steps (on the CPU, from
  the allocator's events; reserved equals allocated there).

On CUDA the allocator's retries (``num_alloc_retries``) are read before the first step and after the last, so the
count covers the warm-up and the timed steps alike. ``time_first`` times the first step by the host clock with a
synchronisation after it (its wall seconds include compiling) and counts it as a warm-up step, so at least one runs.
``release_first`` collects garbage and empties the CUDA cache before anything is read. Errors (an out-of-memory
included) propagate: each caller decides whether one is a result. ``UpdateTimer`` times the optimizer's update inside
the same steps, by its step hooks (NOTE [ The optimizer's update ] in ``memtune.tuner._whole``).
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from memtune.profiler.memory_meter import metered
from memtune.profiler.module_stages import call_model

__all__ = ["StepTiming", "UpdateTimer", "alloc_retries", "time_steps", "timed_ms", "training_step", "update_timer"]


@dataclass(frozen=True)
class StepTiming:
    """What ``time_steps`` measured (NOTE [ Step timing ]).

    Attributes:
        step_ms: the median of the timed steps, ms.
        peak_bytes: the peak bytes allocated over the timed steps (the process's, or above what was live before them
            when metered).
        reserved_bytes: the peak bytes the caching allocator reserved over the timed steps (likewise; on the CPU the
            allocated peak).
        steps_run: warm-up and timed steps together.
        alloc_retries: the allocator's retries over all ``steps_run`` steps (a count; None on the CPU).
        first_step_s: the first step's wall seconds, compiling included (None unless ``time_first``).
    """

    step_ms: float
    peak_bytes: int
    reserved_bytes: int
    steps_run: int
    alloc_retries: int | None = None
    first_step_s: float | None = None

    @property
    def alloc_retries_per_step(self) -> float | None:
        """``alloc_retries`` over ``steps_run``: retries per step, warm-up included (None on the CPU)."""
        return None if self.alloc_retries is None else self.alloc_retries / self.steps_run


class UpdateTimer:
    """Each ``step()`` of one optimizer, timed from its pre-hook to its post-hook: between two CUDA events on the
    current stream (``cuda``), else by the host clock. Read ``median_ms`` once the timed steps have synchronised."""

    def __init__(self, *, cuda: bool) -> None:
        self.cuda = cuda
        self.spans: list[tuple[Any, Any]] = []

    def before(self, *_: Any) -> None:
        """The optimizer's step pre-hook."""
        self.spans.append((self._mark(), None))

    def after(self, *_: Any) -> None:
        """The optimizer's step post-hook."""
        self.spans[-1] = (self.spans[-1][0], self._mark())

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def median_ms(self, last: int) -> float | None:
        """The median of the last ``last`` updates, ms (None where none ran)."""
        spans = [(a, b) for a, b in self.spans[-last:] if b is not None] if last > 0 else []
        if not spans:
            return None
        if self.cuda:
            return statistics.median(float(a.elapsed_time(b)) for a, b in spans)
        return statistics.median((b - a) * 1e3 for a, b in spans)


@contextlib.contextmanager
def update_timer(opt: torch.optim.Optimizer | None, *, cuda: bool) -> Iterator[UpdateTimer]:
    """An ``UpdateTimer`` on ``opt``'s step hooks (``register_step_pre_hook``/``register_step_post_hook``) inside the
    block, removed after it; with no optimizer, one that times nothing."""
    timer = UpdateTimer(cuda=cuda)
    if opt is None:
        yield timer
        return
    handles = [opt.register_step_pre_hook(timer.before), opt.register_step_post_hook(timer.after)]
    try:
        yield timer
    finally:
        for h in handles:
            h.remove()


def alloc_retries(device: torch.device | None = None) -> int:
    """The CUDA caching allocator's retries so far on ``device`` (None: the current device): allocations that
    failed and succeeded only after it released its cached blocks."""
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))


def timed_ms(step: Callable[[], None], steps: int, *, cuda: bool) -> list[float]:
    """Run ``step`` ``steps`` times and return each run's ms: between two CUDA events on the current stream with the
    end event synchronised (``cuda``), else by the host clock."""
    times: list[float] = []
    for _ in range(steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        else:
            began = time.perf_counter()
            step()
            times.append((time.perf_counter() - began) * 1e3)
    return times


def time_steps(
    step: Callable[[], None],
    *,
    warmup: int,
    steps: int,
    device: torch.device | None = None,
    peak: Literal["process", "metered"] = "process",
    time_first: bool = False,
    release_first: bool = False,
) -> StepTiming:
    """Time ``step`` and read its memory (NOTE [ Step timing ]).

    Args:
        step: one training step (forward, loss, backward, update).
        warmup: untimed steps before the timed ones (with ``time_first``, the first of them is timed by the clock).
        steps: timed steps; their median is ``step_ms``.
        device: where the step runs; None is the current CUDA device.
        peak: ``"process"`` (CUDA's peak statistics, reset after the warm-up) or ``"metered"`` (above what was live
            before the timed steps; needs ``device``).
        time_first: time the first step by the host clock and count it as a warm-up step (at least one runs).
        release_first: ``gc.collect()`` and, on CUDA, ``torch.cuda.empty_cache()`` before the first step.

    Raises:
        ValueError: ``"process"`` on a device other than CUDA, or ``"metered"`` without a device.
        Whatever ``step`` raises (an out-of-memory included).
    """
    cuda = device is None or device.type == "cuda"
    if peak == "process" and not cuda:
        raise ValueError(f"the process's peak is CUDA's statistics; meter the steps on {device} instead")
    if peak == "metered" and device is None:
        raise ValueError("metered steps need their device")
    if release_first:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    retries = alloc_retries(device) if cuda else None
    first_s = None
    if time_first:
        began = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        first_s = time.perf_counter() - began
    warmed = max(1, warmup) if time_first else warmup
    for _ in range(max(0, warmup - 1) if time_first else warmup):
        step()
    if peak == "process":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        times = timed_ms(step, steps, cuda=True)
        peak_bytes, reserved_bytes = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
    else:
        assert device is not None
        with metered(device) as reading:  # synchronises and resets the peaks on CUDA
            times = timed_ms(step, steps, cuda=cuda)
        peak_bytes, reserved_bytes = reading.peak_bytes, reading.peak_reserved_bytes
    return StepTiming(
        step_ms=statistics.median(times),
        peak_bytes=peak_bytes,
        reserved_bytes=reserved_bytes,
        steps_run=warmed + steps,
        alloc_retries=None if retries is None else alloc_retries(device) - retries,
        first_step_s=first_s,
    )


def training_step(
    run: torch.nn.Module,
    args: tuple[tuple[Any, ...], dict[str, Any]],
    loss_fn: Callable[[Any], torch.Tensor],
    opt: torch.optim.Optimizer | None,
    *,
    output_held: bool = False,
    autocast: torch.dtype | None = None,
) -> Callable[[], None]:
    """One step of ``run`` on ``args`` (``memtune.profiler.module_profile.as_inputs``'s form): the gradients set to
    None, forward, ``loss_fn`` over the output, backward, ``opt.step()``; ``opt`` None: forward, loss and backward
    alone (the caller drops the gradients). ``output_held``: the output is held until the backward ends (NOTE [ Held
    output ] in ``memtune.tuner.simulator``); otherwise it is dropped before it. ``autocast``: the forward and the loss
    run under ``torch.autocast`` to that dtype on the parameters' device."""
    device = next((p.device.type for p in run.parameters()), "cpu")
    cast = contextlib.nullcontext() if autocast is None else torch.autocast(device, dtype=autocast)

    def step() -> None:
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        with cast:
            out = call_model(run, args)
            value = loss_fn(out)
        if not output_held:
            del out
        value.backward()
        if opt is not None:
            opt.step()

    return step
