"""Staggered copies: one rank of several waits its turn on the host link before each burst of copies.

# NOTE [ Staggered copies ]
The runtime half of the stagger in NOTE [ Shared host link ] (``memtune.tuner._ranks``). A rank in slot s of the
schedule (``memtune.tuner._ranks.stagger_for``) waits, before each burst, s times the burst's copy time at the rate of
the ranks
that copy at once in the schedule (``Stagger.delay_ms``):

* a forward burst is what one offloaded region packs (``StepState.hooks``: a stage, or a segment under the hooks of
  the stage before it); the wait goes on the device-to-host stream after it has caught up with compute, just before
  the region's first copy, so the copies start that much later;
* a backward burst is what one backward pre-hook prefetches (``StepState.on_backward``); the wait goes on the
  host-to-device stream before its first copy. On-demand fetches do not wait (compute needs them now).

A burst's bytes are not known before its copies are packed, so each wait uses the bytes the same burst copied in the
step before (a training step packs the same storages every time); the first step does not wait. A wait only delays
a copy on its stream: every allocation, free and stream wait of NOTE [ Offload runtime ] is where it was, so the
math and the memory are those of the plan without stagger. On CUDA the wait is ``torch.cuda._sleep`` on the copy
stream (no host sync, no SM time beyond one spinning thread block), its cycles per ms measured once per device at
the clock of a busy GPU (``gpu_cycles_per_ms``); on CPU, where copies are synchronous, it is a host sleep (the path
runs, and is tested, without a GPU).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from memtune.tuner import Stagger
from memtune.tuner.runtime.offload import OffloadRuntime, StepState, _Entry

__all__ = ["StaggeredRuntime", "StaggeredStep", "gpu_cycles_per_ms"]


@functools.cache
def gpu_cycles_per_ms(index: int) -> float:
    """GPU clock cycles ``torch.cuda._sleep`` spins per ms on device ``index``: the fastest of ten 10-million-cycle
    spins, measured once.

    ``_sleep`` counts SM clock cycles, so its length follows the clock, which an idle GPU lowers and a busy one
    raises within milliseconds, so a single spin timed on an idle GPU reads a low clock. On a fresh pair of H100s,
    waits priced by one spin came out about 5x shorter than asked (14.3 ms asked per step, 2.6 ms longer steps),
    which an idle-clock reading explains (not measured directly). The later spins run at the clock the GPU keeps
    while it works, as it does during a step.
    """
    cycles = 10_000_000
    rates = []
    with torch.cuda.device(index):
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            rates.append(cycles / max(start.elapsed_time(end), 1e-3))
    return max(rates)


class StaggeredStep(StepState):
    """A ``StepState`` whose copy bursts wait their turn (NOTE [ Staggered copies ]); made by ``StaggeredRuntime``."""

    runtime: StaggeredRuntime

    def __init__(self, runtime: OffloadRuntime, device: torch.device, **knobs: Any) -> None:
        super().__init__(runtime, device, **knobs)
        self._burst: tuple[str, int] | None = None
        self._wait_ms = 0.0  # the wait still due before the current burst's first copy

    def _start_burst(self, direction: str, stage: int) -> None:
        rt = self.runtime
        key = (direction, stage)
        self._burst = key
        self._wait_ms = rt.stagger.delay_ms("d2h" if direction == "d2h" else "h2d", rt.burst_bytes.get(key, 0))
        rt.burst_bytes[key] = 0

    def _wait_turn(self, stream: torch.cuda.Stream | None) -> None:
        """Wait the due time on ``stream`` (after it has caught up with compute), or on the host without CUDA."""
        ms, self._wait_ms = self._wait_ms, 0.0
        if ms <= 0:
            return
        rt = self.runtime
        rt.waited_ms += ms
        rt.waits += 1
        if stream is None:
            time.sleep(ms / 1e3)
            return
        stream.wait_stream(torch.cuda.current_stream(self.device))
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(max(1, int(ms * gpu_cycles_per_ms(index))))

    def _copied(self, nbytes: int) -> None:
        if self._burst is not None:
            self.runtime.burst_bytes[self._burst] += nbytes

    # ---- forward: a region's packs --------------------------------------------------------------
    def hooks(self, stage: int, need: int) -> torch.autograd.graph.saved_tensors_hooks:
        self._start_burst("d2h", stage)
        return super().hooks(stage, need)

    def _copy_out(self, storage: torch.UntypedStorage, need: int) -> _Entry:
        streams = self.cuda and self.sync != "inline"
        self._wait_turn(self.runtime.d2h_stream(self.device) if streams else None)
        entry = super()._copy_out(storage, need)
        self._copied(entry.nbytes)
        return entry

    # ---- backward: a pre-hook's prefetches ------------------------------------------------------
    def on_backward(self, stage: int) -> None:
        self._start_burst("h2d", stage)
        super().on_backward(stage)
        self._burst = None

    def _fetch(self, entry: _Entry, *, prefetch: bool) -> None:
        copies = prefetch and self._burst is not None and entry.storage_ref() is None  # else no copy, or needed now
        if copies:
            streams = self.cuda and self.sync != "inline"
            self._wait_turn(self.runtime.h2d_stream(self.device) if streams else None)
        super()._fetch(entry, prefetch=prefetch)
        if copies:
            self._copied(entry.nbytes)


class StaggeredRuntime(OffloadRuntime):
    """An ``OffloadRuntime`` for one rank of a staggered data-parallel run (NOTE [ Staggered copies ]).

    Args:
        stagger: this rank's place in the schedule (``memtune.tuner.stagger_for``).
        reserve_bytes: host bytes to allocate up front (0: grow during the first step).

    Attributes:
        burst_bytes: bytes each burst copied in its last step, by ``("d2h", forward stage)`` or ``("h2d", backward
            stage)``: what the next step's waits are priced on.
        waited_ms / waits: the waits issued so far, ms in all and how many.
    """

    step_type = StaggeredStep

    def __init__(self, stagger: Stagger, *, reserve_bytes: int = 0) -> None:
        super().__init__(reserve_bytes=reserve_bytes)
        self.stagger = stagger
        self.burst_bytes: dict[tuple[str, int], int] = {}
        self.waited_ms = 0.0
        self.waits = 0
