"""The parts of `memtune bench` that run without a GPU: inputs, error figures, refusal on CPU."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from api.cli import app
from profiler.zoo import build
from tuner.runtime.bench import BenchRow, make_batch


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
