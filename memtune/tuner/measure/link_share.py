"""Measuring the host link the GPUs of one host share: each GPU's pinned copy rate while 1, 2, 4 ... of them copy at
once, and the all-reduce bus bandwidth among them (the calibration fields ``shared_link_gbps`` and ``allreduce_gbps``
of ``memtune.tuner._link``; ``python -m benchmarks.shared_link`` runs it).

# NOTE [ Measuring the shared link ]
One process drives every GPU, each with a device-to-host and a host-to-device stream, a device buffer and two
pinned host buffers of ``nbytes`` (256 MiB: past the size where one GPU's rate stops growing). A round starts every
copy stream with a short ``torch.cuda._sleep`` gate, so that the copies the host queues one device after another all
start together once the gate ends, then records a CUDA event, copies, records another. Per GPU and direction the rate
is ``nbytes`` over the events' time; a round's rate is the mean over its GPUs; the table keeps the median over
``repeats`` rounds after ``warmup``. For c copiers the GPUs are the first c of ``devices`` (order them to put GPUs of
one PCIe switch together, or apart). Three modes per c: every GPU copying device-to-host, every GPU host-to-device,
and every GPU both ways at once (``both_d2h``/``both_h2d``). The pinned buffers are allocated by the process on its
NUMA node; a host with one node per socket sees the rate of that placement.

The all-reduce is NCCL's (``torch.cuda.nccl.all_reduce`` over one fp32 buffer per GPU, in one process), timed by
the host around a device synchronisation, median over rounds; its bus bandwidth is 2 (c - 1) / c * nbytes over the
time, as ``nccl-tests`` reports it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from memtune.tuner.runtime._stagger import gpu_cycles_per_ms

__all__ = ["SharedLinkRun", "copier_counts", "measure_allreduce", "measure_shared_link"]

_GATE_MS = 2.0  # the spin every copy stream starts a round with


def copier_counts(gpus: int) -> list[int]:
    """1, 2, 4 ... up to ``gpus``, and ``gpus`` itself: how many GPUs copy at once in each measurement."""
    out = [c for c in (1 << i for i in range(gpus.bit_length())) if c <= gpus]
    return out if out[-1] == gpus else [*out, gpus]


@dataclass
class SharedLinkRun:
    """What ``measure_shared_link`` measured.

    Attributes:
        table: the calibration's ``shared_link_gbps``: per copiers (as text), GB/s per GPU by mode.
        per_gpu: per copiers and mode, each GPU's median GB/s (by device index, as text).
        devices: the CUDA device indices, in the order copiers were added.
        nbytes: bytes per copy.
    """

    table: dict[str, dict[str, float]] = field(default_factory=dict)
    per_gpu: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    devices: list[int] = field(default_factory=list)
    nbytes: int = 0


class _Rig:
    """Buffers, streams and the gate of every GPU (NOTE [ Measuring the shared link ])."""

    def __init__(self, devices: Sequence[int], nbytes: int) -> None:
        self.nbytes = nbytes
        self.dev = {d: torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{d}") for d in devices}
        self.host_out = {d: torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for d in devices}
        self.host_in = {d: torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for d in devices}
        self.streams = {d: {m: torch.cuda.Stream(device=d) for m in ("d2h", "h2d")} for d in devices}
        self.gate = {d: max(1, int(_GATE_MS * gpu_cycles_per_ms(d))) for d in devices}

    def round(self, devices: Sequence[int], modes: Sequence[str]) -> dict[tuple[int, str], float]:
        """One round: every device in ``devices`` copies each way in ``modes`` at once; GB/s per (device, mode)."""
        events = {}
        for d in devices:
            for m in modes:
                stream = self.streams[d][m]
                with torch.cuda.device(d), torch.cuda.stream(stream):
                    torch.cuda._sleep(self.gate[d])
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record(stream)
                    if m == "d2h":
                        self.host_out[d].copy_(self.dev[d], non_blocking=True)
                    else:
                        self.dev[d].copy_(self.host_in[d], non_blocking=True)
                    end.record(stream)
                events[(d, m)] = (start, end)
        for d in devices:
            torch.cuda.synchronize(d)
        return {key: self.nbytes / (s.elapsed_time(e) * 1e-3) / 1e9 for key, (s, e) in events.items()}


def measure_shared_link(
    devices: Sequence[int] | None = None, *, nbytes: int = 256 << 20, warmup: int = 2, repeats: int = 7
) -> SharedLinkRun:
    """Per-GPU pinned copy rates while 1, 2, 4 ... of ``devices`` copy at once (NOTE [ Measuring the shared link ]).

    Args:
        devices: CUDA device indices (default: every visible GPU), in the order copiers are added.
        nbytes: bytes per copy.
        warmup / repeats: untimed rounds, then timed rounds per count and mode (the median is kept).

    Raises:
        RuntimeError: CUDA is not available.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("measure_shared_link needs CUDA GPUs; run it on the host whose link it measures")
    devs = list(devices) if devices is not None else list(range(torch.cuda.device_count()))
    rig = _Rig(devs, nbytes)
    run = SharedLinkRun(devices=devs, nbytes=nbytes)
    for count in copier_counts(len(devs)):
        group = devs[:count]
        row: dict[str, float] = {}
        per_gpu: dict[str, dict[str, float]] = {}
        for label, modes in (("one", ("d2h",)), ("one", ("h2d",)), ("both", ("d2h", "h2d"))):
            for _ in range(warmup):
                rig.round(group, modes)
            rounds = [rig.round(group, modes) for _ in range(repeats)]
            for m in modes:
                name = m if label == "one" else f"both_{m}"
                row[name] = round(statistics.median(statistics.fmean(r[(d, m)] for d in group) for r in rounds), 3)
                per_gpu[name] = {str(d): round(statistics.median(r[(d, m)] for r in rounds), 3) for d in group}
        run.table[str(count)] = row
        run.per_gpu[str(count)] = per_gpu
    return run


def measure_allreduce(
    devices: Sequence[int] | None = None, *, nbytes: int = 256 << 20, warmup: int = 3, repeats: int = 10
) -> dict[str, float]:
    """NCCL's all-reduce bus GB/s among the first 2, 4 ... of ``devices`` (NOTE [ Measuring the shared link ]);
    empty with fewer than two GPUs or without NCCL. Keys are ranks as text (the calibration's ``allreduce_gbps``)."""
    from torch.cuda import nccl

    devs = list(devices) if devices is not None else list(range(torch.cuda.device_count()))
    out: dict[str, float] = {}
    for count in copier_counts(len(devs)):
        if count < 2:
            continue
        group = devs[:count]
        bufs = [torch.ones(nbytes // 4, dtype=torch.float32, device=f"cuda:{d}") for d in group]
        if not nccl.is_available(bufs):
            return out
        times = []
        for k in range(warmup + repeats):
            for d in group:
                torch.cuda.synchronize(d)
            t0 = time.perf_counter()
            nccl.all_reduce(bufs)
            for d in group:
                torch.cuda.synchronize(d)
            if k >= warmup:
                times.append(time.perf_counter() - t0)
        out[str(count)] = round(2 * (count - 1) / count * nbytes / statistics.median(times) / 1e9, 3)
        del bufs
    return out
