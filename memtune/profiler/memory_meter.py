"""How many bytes a piece of code allocates at its peak and leaves allocated, on CUDA or on the CPU.

# NOTE [ Allocator meters ]
The profile measures memory where a plan cannot reach it by tracing storages (the loss's backward, a step's real
peak) from the allocator itself, on both devices, so that a profile made on the CPU is checked the same way as one
made on a GPU:

* CUDA: ``torch.cuda.memory_allocated`` before, ``max_memory_allocated`` (reset at the start) and
  ``memory_allocated`` after, and the reserved bytes likewise (the caching allocator's segments).
* CPU: the allocator's own events, recorded by ``torch.profiler`` with ``profile_memory=True``: every allocation
  and free with its size and time (the raw events of ``kineto_results``; the profiler's per-op table folds them).
  Their running sum from the start is what the code holds; its maximum is the peak. The CPU has no cache, so the
  reserved bytes are the allocated ones.

Both count bytes allocated inside the metered code only: what was live before it is the zero. Python's cycle
collector is paused inside the meter, so that garbage made before it is not freed inside it at a time nobody chose.

The CPU's events have one blind spot: the allocator keeps the sizes of blocks only while memory is profiled, so a
block made outside every meter and freed inside one is read at the size last recorded for its address, which is 0
when none was and a stale size when an earlier metered block lived there. Metered code is written so that what it
made before the meter lives past it (``memtune.profiler._stage_run`` holds a stage's inputs and its outputs'
gradient seeds through the backward's meter).

# NOTE [ GPU transients from the CPU's allocator ]
A profile made on the CPU for a GPU reads its transients off the CPU's allocator, whose convolutions are not the
GPU's: oneDNN copies the input and output into its own layouts inside the op, where cuDNN takes a workspace of
about three tensors (NOTE [ GPU convolution workspaces ] in ``memtune.profiler.conv_workspace``). With
``gpu_workspaces`` the CPU meter reads the events as the GPU would allocate them: ``torch.profiler`` also records every
``aten::convolution`` and ``aten::convolution_backward`` call with its shapes; inside the outermost such call the
CPU's own allocations are not counted towards the peak (what the op leaves allocated, its outputs, is), and at its
end the GPU's modeled workspace is added on top of what is live then: its inputs, its outputs and everything
before. Every other op is read as the CPU allocates it. On the promises' U-Net (width 64, batch 16 x 256 x 256,
fp32) every one of the 32 stage transients read so is at or above the H100's measured one, by 14 to 32 MiB (the
head's forward by 304: the H100 took no workspace for its 64-to-2 convolution); read as the CPU allocates them,
10 were more than 1 MiB below, by up to 256 MiB (``benchmarks/results/h100/promises/modeled-check.md``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from memtune.profiler.conv_workspace import event_workspace_bytes

__all__ = ["MemoryReading", "gpu_peak", "metered"]


@dataclass
class MemoryReading:
    """What the metered code allocated, bytes above what was live before it (filled when the block ends).

    Attributes:
        peak_bytes: the most it held at once.
        end_bytes: what it left allocated (negative where it freed more than it made).
        peak_reserved_bytes: the most the allocator reserved above its reservation before (CUDA; the CPU's equals
            ``peak_bytes``).
    """

    peak_bytes: int = 0
    end_bytes: int = 0
    peak_reserved_bytes: int = 0


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 sent to the null device for the block: what C++ libraries write there is dropped."""
    import os
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


#: what the CPU allocator writes to standard error, once per process, when the metered code frees a block made before
#: it (a model's cached tensor): true of every metered step and of no use to a user, so it is left out
_ALLOCATOR_NOTE = b"allocated before the profiling started"


@contextmanager
def _stderr_without(fragment: bytes) -> Iterator[None]:
    """File descriptor 2 held in a temporary file for the block, then written back without the lines holding
    ``fragment``: what C++ libraries and Python write there in the block comes out after it, less those lines."""
    import os
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = b"".join(line for line in held if fragment not in line)
            if kept:
                os.write(2, kept)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off for the block (as it was after): garbage made before is not freed inside."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: the ops whose CPU allocations a ``gpu_workspaces`` meter replaces by the GPU's workspace
_CONVOLUTIONS = ("aten::convolution", "aten::convolution_backward")


def gpu_peak(memory: Sequence[tuple[int, int]], ops: Sequence[tuple[int, int, int]]) -> int:
    """The peak of the allocator's events as the GPU would allocate them (NOTE [ GPU transients from the CPU's
    allocator ]), bytes above the start.

    Args:
        memory: ``(time ns, bytes)`` per allocation (positive) and free (negative), in time order.
        ops: ``(start ns, end ns, workspace bytes)`` per convolution call, in time order; calls inside an earlier
            call's span are left out.
    """
    held = peak = 0
    k = 0
    last_end = -1
    for start, end, workspace in ops:
        if start < last_end:  # inside the call before
            continue
        last_end = end
        while k < len(memory) and memory[k][0] < start:
            held += memory[k][1]
            peak = max(peak, held)
            k += 1
        while k < len(memory) and memory[k][0] <= end:  # the CPU's own scratch: not the GPU's
            held += memory[k][1]
            k += 1
        peak = max(peak, held + workspace)
    for _, nbytes in memory[k:]:
        held += nbytes
        peak = max(peak, held)
    return peak


def _convolutions(events: Any) -> list[tuple[int, int, int]]:
    """``(start ns, end ns, modeled GPU workspace bytes)`` of every convolution call among ``torch.profiler``'s
    events, in time order."""
    out = []
    for e in events:
        if e.name() not in _CONVOLUTIONS:
            continue
        workspace = event_workspace_bytes(e.name(), e.shapes(), e.dtypes(), e.concrete_inputs())
        out.append((e.start_ns(), e.end_ns(), workspace or 0))
    return sorted(out)


@contextmanager
def metered(device: torch.device, *, gpu_workspaces: bool = False) -> Iterator[MemoryReading]:
    """Meter the allocations of the code in the block on ``device`` (``cpu`` or a CUDA device); NOTE [ Allocator
    meters ]. On the CPU, ``gpu_workspaces`` reads the peak as a GPU would allocate it: each convolution's own
    allocations replaced by the GPU's modeled workspace (NOTE [ GPU transients from the CPU's allocator ]); what
    the code leaves allocated is the same either way. On CUDA it changes nothing.

    Example::

        with metered(torch.device("cpu")) as m:
            y = model(x).sum()
            y.backward()
        print(m.peak_bytes)
    """
    reading = MemoryReading()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        reserved = torch.cuda.memory_reserved(device)
        torch.cuda.reset_peak_memory_stats(device)
        with _collector_paused():
            yield reading
        torch.cuda.synchronize(device)
        reading.peak_bytes = max(0, torch.cuda.max_memory_allocated(device) - before)
        reading.end_bytes = torch.cuda.memory_allocated(device) - before
        reading.peak_reserved_bytes = max(0, torch.cuda.max_memory_reserved(device) - reserved)
        return
    if device.type != "cpu":
        raise ValueError(f"metered measures cpu or cuda memory, not {device}")
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=gpu_workspaces)
    with _quiet_stderr():  # Kineto writes two log lines (profiler_start, profiler_stop) to standard error
        prof.start()
    try:
        with _stderr_without(_ALLOCATOR_NOTE), _collector_paused():
            yield reading
    finally:
        with _quiet_stderr():
            prof.stop()
    # NOTE: ``_KinetoEvent.nbytes`` (an allocation's size, negative for a free) exists in torch 2.11 and 2.13; the
    # stubs do not list it
    recorded = list(prof.profiler.kineto_results.events())  # type: ignore[union-attr]
    events = sorted(
        (e.start_ns(), e.nbytes())  # type: ignore[attr-defined]
        for e in recorded
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    peak = gpu_peak(events, _convolutions(recorded) if gpu_workspaces else ())
    reading.peak_bytes = reading.peak_reserved_bytes = peak
    reading.end_bytes = sum(nbytes for _, nbytes in events)
