"""``memtune tune MODEL --inference`` end to end on the CPU: the plan table, JSON, --measure, and clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memtune.api.cli import app
from memtune.tuner import InferencePlan

runner = CliRunner()

SPEC = {
    "name": "small-cnn",
    "input_shape": [3, 32, 32],
    "layers": [
        {"type": "conv2d", "out_channels": 32, "kernel_size": 3, "padding": 1},
        {"type": "relu", "inplace": True},
        {"type": "conv2d", "out_channels": 64, "kernel_size": 3, "padding": 1},
        {"type": "relu", "inplace": True},
        {"type": "maxpool2d", "kernel_size": 2},
        {"type": "flatten"},
        {"type": "linear", "out_features": 256},
        {"type": "relu"},
        {"type": "dropout"},
        {"type": "linear", "out_features": 10},
    ],
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "small-cnn.json"
    path.write_text(json.dumps(SPEC))
    return path


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_prints_the_plan_and_its_priced_latency(spec: Path, tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    code, out = invoke("tune", "spec", "--spec", str(spec), "--inference", "-b", "1", "--budget", "1MiB",
                       "--plan-out", str(plan_file))  # fmt: skip
    assert code == 0, out
    flat = " ".join(out.split())
    for words in ("inference plan (mmcnn)", "parts", "working set", "prefetch", "priced latency", "within 1.00 MiB"):
        assert words in flat, words
    plan = InferencePlan.model_validate_json(plan_file.read_text())
    assert plan.budget_bytes == 1 << 20
    assert plan.layers[6].weights == "host_prefetch" and plan.layers[6].channel_parts > 1  # 16 MiB of weights


def test_json_has_the_plan_and_its_price(spec: Path) -> None:
    code, out = invoke("tune", "spec", "--spec", str(spec), "--inference", "-b", "1", "--budget", "50% of peak",
                       "--json")  # fmt: skip
    assert code == 0, out
    data = json.loads(out.strip().splitlines()[-1])
    assert data["budget_bytes"] == data["resident_peak_bytes"] // 2
    priced = data["priced"]
    assert priced["latency_ms"] > 0 and priced["peak_bytes"] <= data["budget_bytes"]
    assert max(priced["working_set_bytes"]) == priced["peak_bytes"]
    assert InferencePlan.model_validate(data["plan"]).label == "mmcnn"
    assert data["facts_source"] == "modeled" and data["measured"] is None


def test_measure_runs_the_plan_on_the_cpu(spec: Path) -> None:
    code, out = invoke("tune", "spec", "--spec", str(spec), "--inference", "-b", "2", "--budget", "1MiB",
                       "--measure", "--device", "cpu", "--json")  # fmt: skip
    assert code == 0, out
    data = json.loads(out.strip().splitlines()[-1])
    assert data["facts_source"] == "measured" and data["device"] == "cpu"
    measured = data["measured"]
    assert measured["equal"] and measured["max_abs_diff"] < 1e-5 and measured["latency_ms"] > 0
    code, out = invoke("tune", "spec", "--spec", str(spec), "--inference", "-b", "1", "--budget", "1MiB",
                       "--measure")  # fmt: skip
    assert code == 0, out
    flat = " ".join(out.split())
    assert "measured latency" in flat and "equals the plain model's" in flat


def test_an_impossible_budget_names_the_layer(spec: Path) -> None:
    code, out = invoke("tune", "spec", "--spec", str(spec), "--inference", "-b", "1", "--budget", "100KiB")
    assert code == 2
    flat = " ".join(out.split())
    # its input 256 KiB, output 64 KiB and int64 indices 128 KiB, the input image 12 KiB, the next layer's first row
    assert "layer '4' (maxpool2d) needs a working set of 524.00 KiB" in flat
    assert "above the budget of 100.00 KiB" in flat and "raise the budget to at least 524.00 KiB" in flat


def test_models_that_are_not_chains_of_supported_layers_are_refused() -> None:
    code, out = invoke("tune", "resnet18", "--inference", "-b", "1", "--param", "image_size=32")
    assert code == 2
    assert "layer 'bn1' (BatchNorm2d) is not supported by inference plans" in " ".join(out.split())


def test_measure_needs_inference(spec: Path) -> None:
    code, out = invoke("tune", "spec", "--spec", str(spec), "--measure")
    assert code == 2 and "add --inference" in out


def test_workspace_free_convolutions_are_measured_and_kept_in_the_plan(spec: Path) -> None:
    code, out = invoke("tune", "spec", "--spec", str(spec), "--inference", "-b", "1", "--budget", "1MiB",
                       "--measure", "--device", "cpu", "--conv-workspace", "none", "--json")  # fmt: skip
    assert code == 0, out
    data = json.loads(out.strip().splitlines()[-1])
    assert data["plan"]["conv_workspace"] == "none" and data["measured"]["equal"]


def test_workspace_free_convolutions_need_measured_facts(spec: Path) -> None:
    code, out = invoke("tune", "spec", "--spec", str(spec), "--inference", "--conv-workspace", "none")
    assert code == 2 and "--conv-workspace none needs --measure" in " ".join(out.split())
    code, out = invoke("tune", "spec", "--spec", str(spec), "--inference", "--measure", "--conv-workspace", "some")
    assert code == 2 and "'framework' or 'none'" in " ".join(out.split())
