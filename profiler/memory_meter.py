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

Both count bytes allocated inside the metered code only: what was live before it is the zero.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = ["MemoryReading", "metered"]


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
def metered(device: torch.device) -> Iterator[MemoryReading]:
    """Meter the allocations of the code in the block on ``device`` (``cpu`` or a CUDA device); NOTE [ Allocator
    meters ].

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
        yield reading
        torch.cuda.synchronize(device)
        reading.peak_bytes = max(0, torch.cuda.max_memory_allocated(device) - before)
        reading.end_bytes = torch.cuda.memory_allocated(device) - before
        reading.peak_reserved_bytes = max(0, torch.cuda.max_memory_reserved(device) - reserved)
        return
    if device.type != "cpu":
        raise ValueError(f"metered measures cpu or cuda memory, not {device}")
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():  # Kineto writes two log lines (profiler_start, profiler_stop) to standard error
        prof.start()
    try:
        with _stderr_without(_ALLOCATOR_NOTE):
            yield reading
    finally:
        with _quiet_stderr():
            prof.stop()
    # NOTE: ``_KinetoEvent.nbytes`` (an allocation's size, negative for a free) exists in torch 2.11 and 2.13; the
    # stubs do not list it
    events = sorted(
        (e.start_ns(), e.nbytes())  # type: ignore[union-attr]
        for e in prof.profiler.kineto_results.events()  # type: ignore[union-attr]
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    held = peak = 0
    for _, nbytes in events:
        held += nbytes
        peak = max(peak, held)
    reading.peak_bytes = reading.peak_reserved_bytes = peak
    reading.end_bytes = held
