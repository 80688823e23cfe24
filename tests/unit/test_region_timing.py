"""``benchmarks.region_timing``: the tensors its hooks watch and the tables it prints (its spans need a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.region_timing import _first_grad_tensor, table


def test_the_hooks_watch_the_first_tensor_that_takes_a_gradient() -> None:
    plain, grad = torch.zeros(2), torch.zeros(2, requires_grad=True)
    assert _first_grad_tensor(((plain, 3), {"x": plain, "h": grad})) is grad
    assert _first_grad_tensor((plain, [plain])) is None


def test_the_table_puts_each_region_beside_its_profile_and_the_time_between_regions(tmp_path: Path) -> None:
    entry = {
        "fraction": 0.9, "variant": "plan", "compact": "ok", "simulated_ms": 10.0, "profile_loss_ms": 1.0,
        "profiled": {"a": {"forward": 1.0, "backward": 2.0}, "b": {"forward": 3.0, "backward": 4.0}},
        "wall_ms": 14.0, "issue_ms": 5.0, "gpu_ms": 13.0, "fb_gpu_ms": 12.0,
        "regions": {"a": {"forward": 1.5, "backward": 2.5}, "b": {"forward": 3.0, "backward": 4.0, "recompute": 3.0}},
        "trace": {"compute_stream": "7", "compute_idle_ms": 0.5, "compute_span_ms": 12.5, "host_blocked_ms": 0.4,
                  "stream_waits": 3, "file": "m.json.gz",
                  "streams": {"7": {"kernel_ms": 11.0, "copy_ms": 0.0}, "20": {"kernel_ms": 0.0, "copy_ms": 3.0}}},
    }  # fmt: skip
    failed = {"fraction": 0.9, "variant": "keep", "compact": "kk", "simulated_ms": 9.0, "error": "OutOfMemoryError"}
    row = {"model": "m", "device": "GPU", "update_ms": 1.0, "plans": [entry, failed]}
    (tmp_path / "m.json").write_text(json.dumps(row))
    text = table(tmp_path)
    # the regions' forward and backward add up to 11.0 of the 12.0 ms step; a recompute runs inside its backward
    assert "| 90% | plan | `ok` | 10.0 | 12.0 | 13.0 | 14.0 | 5.0 | 11.0 | 1.0 |" in text
    assert "| 90% | plan | a | 1.00 / 1.50 | 2.00 / 2.50 |" in text
    assert "| 90% | keep | `kk` | 9.0 | OutOfMemoryError |" in text
    assert "| 90% | plan | 11.0 / 0.5 / 12.5 | 3.0 | 0.4 | 3 | `m.json.gz` |" in text


def test_a_trace_says_what_each_stream_ran_and_where_the_compute_stream_idled(tmp_path: Path) -> None:
    import gzip

    from benchmarks.stream_trace import summary

    def gpu(cat: str, tid: int, ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": cat, "tid": tid, "ts": ts, "dur": dur, "name": cat}

    events = [
        gpu("kernel", 7, 0, 1000), gpu("kernel", 7, 1500, 1000), gpu("kernel", 7, 2000, 200),  # 0.5 ms idle
        gpu("gpu_memcpy", 20, 100, 3000),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "ts": 0, "dur": 2, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": 5, "dur": 400, "tid": 1},
    ]  # fmt: skip
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    got = summary(path)
    assert got["compute_stream"] == "7" and got["compute_idle_ms"] == 0.5 and got["compute_span_ms"] == 2.5
    assert got["streams"]["20"] == {"kernel_ms": 0.0, "copy_ms": 3.0} and got["streams"]["7"]["kernel_ms"] == 2.2
    assert got["host_blocked_ms"] == 0.4 and got["stream_waits"] == 1


def test_a_step_traced_on_the_cpu_writes_a_trace_that_reads_back(tmp_path: Path) -> None:
    from benchmarks.stream_trace import summary, trace_step

    w = torch.ones(8, requires_grad=True)
    path = trace_step(lambda: (w * 2).sum().backward(), tmp_path / "step.json.gz")
    got = summary(path)
    assert path.exists() and got["streams"] == {} and got["host_blocked_ms"] == 0.0
