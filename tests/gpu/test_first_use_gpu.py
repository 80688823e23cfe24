"""The first use of a GPU type on a CUDA machine (NOTE [ First use of a GPU type ]), as a GPU type memtune ships no
data for sees it (``MEMTUNE_SHIPPED_DATA=0``, an empty user folder): ``memtune tune`` with nothing but the model and
the budget calibrates the GPU type, measures the profile with its cuDNN algorithm tables and keeps both; ``bench``
then reuses them and its tuned plan runs within the budget under ``budget_guard``.

Skipped without CUDA (``pytest -m gpu tests/gpu``); takes a few minutes (the calibration runs five plans).
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from memtune.api.cli import app
from memtune.profiler._profile import Profile
from memtune.profiler.library import user_data_dir, user_profile_dir
from memtune.tuner.calibration import calibration_for
from memtune.tuner.measure.first_use import present_gpu

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_tune_then_bench_on_a_gpu_type_without_shipped_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMTUNE_SHIPPED_DATA", "0")
    calibration_for.cache_clear()
    gpu = present_gpu()
    assert gpu is not None
    runner = CliRunner()
    tuned = runner.invoke(app, ["tune", "resnet18", "--batch", "64", "--budget", "60% of peak", "--trials", "60",
                                "--json"])  # fmt: skip
    assert tuned.exit_code == 0, tuned.output
    data = json.loads(tuned.output.strip().splitlines()[-1])
    assert data["gpu"] == gpu.key and data["best"]["feasible"]
    calibrations = list((user_data_dir() / "calibrations").glob(f"calibration-{gpu.key}.json"))
    assert calibrations, "the first use calibrated the GPU type and kept it"
    assert calibration_for(gpu.key).headroom > 0
    kept = user_profile_dir() / f"resnet18-b64-float32-{gpu.key}.json"
    prof = Profile.load(kept)
    assert prof.source == "measured" and prof.has_conv_algos

    bench = runner.invoke(app, ["bench", "resnet18", "--batch", "64", "--budget", "60% of peak", "--no-policies",
                                "--no-builtins", "--iters", "3", "--warmup", "1"])  # fmt: skip
    assert bench.exit_code == 0, bench.output
    assert "profiling" not in bench.output and "calibrating" not in bench.output  # both reused
    assert "out of memory" not in bench.output.lower(), bench.output
