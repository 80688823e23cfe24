"""Python's cycle collector is paused inside a meter, so garbage made before it is not freed inside it at a time
nobody chose (NOTE [ Allocator meters ] in ``memtune.profiler.memory_meter``)."""

from __future__ import annotations

import gc

import torch

from memtune.profiler.memory_meter import metered


class _Cycle:
    """An object that refers to itself, holding a tensor: freed only by the cycle collector."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.me = self


def test_garbage_made_before_the_meter_is_not_freed_inside_it() -> None:
    cpu = torch.device("cpu")
    threshold = gc.get_threshold()
    gc.collect()
    try:
        with metered(cpu):  # a block made under a meter: its free is read at its size
            _Cycle(torch.empty(250_000))  # 1,000,000 bytes, garbage as soon as it is made
        gc.set_threshold(1)  # any allocation of a Python object would run the collector
        with metered(cpu) as reading:
            assert not gc.isenabled()
            junk = [[] for _ in range(1000)]
            kept = torch.empty(10_000)  # 40,000 bytes
        assert gc.isenabled()
        # the cycle's 1,000,000 bytes were not freed inside: its free would have made the peak 0
        assert (reading.peak_bytes, reading.end_bytes) == (40_000, 40_000)
        del junk, kept
    finally:
        gc.set_threshold(*threshold)
        gc.collect()


def test_the_collector_stays_off_where_it_was_off() -> None:
    gc.disable()
    try:
        with metered(torch.device("cpu")):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
