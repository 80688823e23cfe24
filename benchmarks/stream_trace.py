"""One training step under ``torch.profiler``, and what its Chrome trace says of the GPU's streams and the host's waits.

``trace_step`` runs a step (after one to warm up) with the CPU and CUDA activities on and writes the trace as
gzipped Chrome trace JSON (``torch.profiler.profile.export_chrome_trace``, a public format: ``traceEvents`` with the
GPU's kernels, copies and memsets on one ``tid`` per stream, the host's CUDA runtime calls with their names).
``summary`` reads one back: per stream the ms its kernels and its copies ran; the compute stream's (the one with the
most kernel time) idle ms between its first and last event; and the host's ms in calls that block it
(``cudaEventSynchronize``, ``cudaStreamSynchronize``, ``cudaDeviceSynchronize``; the synchronisation that ends the
traced step counts too, so a host that ran ahead shows its lead there) and its count of ``cudaStreamWaitEvent`` (a
stream made to wait on the GPU). Where the compute stream idles, and what the host did meanwhile, is read from the
trace itself in a trace viewer (Perfetto, ``chrome://tracing``).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["summary", "trace_step"]

_GPU = {"kernel", "gpu_memcpy", "gpu_memset"}
_BLOCKING = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize")


def trace_step(step: Callable[[], None], path: Path) -> Path:
    """``step`` run once to warm up, then once under the profiler (the CUDA activity where there is a GPU); its trace
    gzipped to ``path`` (returned)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    step()
    sync()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        step()
        sync()
    raw = path.with_name(path.name.removesuffix(".gz"))
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(raw))
    path.write_bytes(gzip.compress(raw.read_bytes()))
    raw.unlink()
    return path


def summary(path: Path) -> dict[str, Any]:
    """What the gzipped Chrome trace at ``path`` says (see the module docstring); times in ms."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    streams: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in _GPU:
            s = streams.setdefault(str(e["tid"]), {"kernel_ms": 0.0, "copy_ms": 0.0, "spans": []})
            s["kernel_ms" if e["cat"] == "kernel" else "copy_ms"] += e["dur"] / 1e3
            s["spans"].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"]
    out: dict[str, Any] = {
        "host_blocked_ms": sum(e["dur"] for e in host if e.get("name") in _BLOCKING) / 1e3,
        "stream_waits": sum(1 for e in host if e.get("name") == "cudaStreamWaitEvent"),
        "streams": {k: {"kernel_ms": v["kernel_ms"], "copy_ms": v["copy_ms"]} for k, v in streams.items()},
    }
    if streams:
        compute = max(streams, key=lambda k: streams[k]["kernel_ms"])
        spans = sorted(streams[compute]["spans"])
        idle, end = 0.0, spans[0][1]
        for a, b in spans[1:]:
            idle += max(0.0, a - end)
            end = max(end, b)
        out.update(compute_stream=compute, compute_span_ms=(end - spans[0][0]) / 1e3, compute_idle_ms=idle / 1e3)
    return out
