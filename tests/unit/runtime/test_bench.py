"""The parts of `memtune bench` that run without a GPU: inputs, error figures, refusal on CPU, the JSON's run record."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memtune.api.cli import app
from memtune.profiler.zoo import build
from memtune.tuner.measure.bench import BenchRow, make_batch


def test_make_batch_images_and_tokens() -> None:
    x, y = make_batch(build("resnet18", {"image_size": 32, "num_classes": 10}), 4, torch.device("cpu"))
    assert x.shape == (4, 3, 32, 32) and y.shape == (4,) and int(y.max()) < 10
    chain = build("gpt", {"layers": 1, "width": 32, "heads": 2, "seq_len": 8, "vocab": 50})
    x, y = make_batch(chain, 3, torch.device("cpu"))
    assert x.shape == y.shape == (3, 8) and x.dtype == torch.int64 and int(x.max()) < 50


def test_error_figures_are_relative_to_the_measurement() -> None:
    row = BenchRow("p", "tuned", 200.0, 10 << 30, 1.0, True, predicted_step_ms=180.0, predicted_peak_bytes=11 << 30)
    assert row.step_error == -0.1
    assert row.peak_error == 0.1
    assert row.to_dict()["step_error"] == -0.1
    failed = BenchRow("p", "tuned", None, None, None, False, predicted_step_ms=1.0, error="out of memory")
    assert failed.step_error is None and failed.peak_error is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_bench_refuses_without_a_gpu() -> None:
    result = CliRunner().invoke(app, ["bench", "resnet18", "--batch", "2"])
    assert result.exit_code == 2
    assert "CUDA GPU" in result.output


def test_the_bench_json_carries_the_run_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ Run record ]: the factory path's file, with the GPU's measurements (memtune's rows and the peers, which
    ``memtune bench`` measures by default) stood in for on the CPU."""
    import memtune.api.cli._cli_peers as cli_peers
    import memtune.profiler
    import memtune.profiler.factory
    import memtune.tuner.measure.module_bench as module_bench

    def fake_bench(net: torch.nn.Module, x: torch.Tensor, **kwargs: object) -> dict[str, object]:
        step = {"step_ms": 1.0, "peak_bytes": 1 << 20}
        return {"device": "Stand-in GPU", "unplanned": step, "planned": step, "plan": "kr", "budget_bytes": 1 << 20,
                "equality": {"grad": 0.0}, "spread": {"grad": 0.0}}  # fmt: skip

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setattr(memtune.profiler, "build_factory", lambda ref, params: torch.nn.Sequential())
    monkeypatch.setattr(memtune.profiler.factory, "factory_inputs", lambda *a, **k: torch.zeros(2, 3))
    monkeypatch.setattr(module_bench, "bench_module", fake_bench)
    peer = {"name": "torch.compile budget 1", "applies": True, "step_ms": 1.0, "peak_bytes": 1 << 20,
            "reserved_bytes": 1 << 20, "first_step_s": 1.0}  # fmt: skip
    monkeypatch.setattr(cli_peers, "bench_peers", lambda *a, **k: [peer])
    out = tmp_path / "bench.json"
    args = ["bench", "mine.py:build", "--batch", "2", "--input-shape", "3", "--json-out", str(out)]
    monkeypatch.setattr(sys, "argv", ["/venv/bin/memtune", *args])  # as the console script starts
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert written["peers"] == [peer]
    run = written["run"]
    assert run["command"] == f"memtune bench mine.py:build --batch 2 --input-shape 3 --json-out {out}"
    assert run["commit"] and run["date"] and run["versions"]["torch"] == torch.__version__
