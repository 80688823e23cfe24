"""The engine's command line: tune (table and --json), simulate, profile, models, gpus, and clear refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memtune.api.cli import app
from memtune.tuner.plan import Plan

runner = CliRunner()
SMALL = ["--param", "image_size=32", "--batch", "256"]


def budget(model: str, fraction: float, gpu: str = "h200") -> str:
    """A byte budget at ``fraction`` of the model's simulated unconstrained peak (SMALL settings)."""
    from memtune.profiler.modeled import modeled_profile
    from memtune.profiler.zoo import build
    from memtune.tuner.simulator import simulate

    prof = modeled_profile(build(model, {"image_size": 32}), 256, "float32", gpu)
    return f"{int(fraction * simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes)}B"


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.mark.slow
def test_tune_json_has_the_documented_object(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    limit = budget("resnet18", 0.9)
    code, out = invoke("tune", "resnet18", *SMALL, "--gpu", "h200", "--budget", limit, "--trials", "30",
                       "--json", "--plan-out", str(plan_file))  # fmt: skip
    assert code == 0, out
    data = json.loads(out.strip().splitlines()[-1])
    assert {"model", "batch", "gpu", "budget_bytes", "unconstrained", "policies", "best"} <= data.keys()
    assert data["model"] == "resnet18" and data["batch"] == 256 and data["gpu"] == "h200"
    assert data["best"]["feasible"] and data["best"]["peak_bytes"] <= data["budget_bytes"]
    feasible = [p["step_ms"] for p in data["policies"] if p["feasible"]]
    assert not feasible or data["best"]["step_ms"] <= min(feasible) + 1e-9
    assert Plan.model_validate_json(plan_file.read_text()) == Plan.model_validate(data["best"]["plan"])


@pytest.mark.slow
def test_tune_prints_the_policy_table_and_the_plan() -> None:
    code, out = invoke(
        "tune", "vgg16", *SMALL, "--gpu", "k40", "--budget", budget("vgg16", 0.95, "k40"), "--trials", "20"
    )
    assert code == 0, out
    for word in ("policy", "slowdown", "peak GiB", "feasible", "checkpoint_sqrt", "best plan", "modeled"):
        assert word in out
    # NOTE [ Budget bound ]: the lower bound follows the best plan, and is no slower than it
    flat = " ".join(out.split())
    found = re.search(r"best: \S+ ([0-9.]+) ms", flat)
    bound = re.search(r"can step faster than ([0-9.]+) ms \(([0-9.]+)x\) within", flat)
    assert found and bound, out
    assert float(bound.group(1)) <= float(found.group(1))


@pytest.mark.slow
def test_tune_says_when_its_best_plan_compiles_the_whole_model(tmp_path: Path) -> None:
    """NOTE [ Whole-model compile ]: a profile carrying a measured compiler point that fits and beats every plan of
    offload and recompute gets that compile as its best plan, said in words (no table of per-stage actions)."""
    from memtune.profiler._profile import CompilerPoint
    from memtune.profiler.modeled import modeled_profile
    from memtune.profiler.zoo import build
    from memtune.tuner.measure.compiler_points import with_compiler_points
    from memtune.tuner.simulator import simulate

    prof = modeled_profile(build("resnet18", {"image_size": 32}), 256, "float32", "h200")
    base = simulate(prof, Plan.uniform(prof.n_stages))
    point = CompilerPoint(activation_budget=0.5, step_ms=0.8 * base.step_ms, peak_bytes=int(0.5 * base.peak_bytes))
    path = tmp_path / "with-points.json"
    with_compiler_points(prof, [point]).save(path)
    limit = f"{int(0.6 * base.peak_bytes)}B"
    code, out = invoke("tune", "resnet18", *SMALL, "--gpu", "h200", "--budget", limit, "--trials", "10",
                       "--profile", str(path))  # fmt: skip
    assert code == 0, out
    flat = " ".join(out.split())
    assert "the whole model compiled by torch.compile with activation_memory_budget 0.5" in flat, out
    assert "best: compiled whole 0.5" in flat and "best plan: lookahead" not in flat
    # NOTE [ Compiled lower bound ]: beside the eager bound, the compiled one, at most the compile it served
    compiled = re.search(r"no compiled plan .* can step faster than ([0-9.]+) ms", flat)
    assert compiled and float(compiled.group(1)) <= 0.8 * base.step_ms + 0.01, out


@pytest.mark.slow
def test_tune_without_a_fitting_plan_exits_1() -> None:
    code, out = invoke("tune", "resnet18", *SMALL, "--gpu", "h200", "--budget", "1MiB", "--trials", "10")
    assert code == 1
    assert "no plan fits" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("tune", "resnet18", "--budget", "twelve"), "not understood"),
        (("tune", "resnet18", "--budget", "-3GiB"), "must be positive"),
        (("tune", "resnet18", "--budget", "0.6"), "has no unit"),
        (("tune", "resnet18", "--budget", "150% of peak"), "must be in (0, 1]"),
        (("tune", "resnet18", "--gpu", "h900"), "h900"),
        (("tune", "resnet999"), "resnet999"),
        (("tune", "resnet18", "--dtype", "int8"), "--dtype"),
        (("simulate", "resnet18", "--policy", "magic"), "magic"),
        (("tune", "resnet18", "--param", "image_size"), "KEY=VALUE"),
    ],
)
def test_bad_input_is_refused_clearly(args: tuple[str, ...], message: str) -> None:
    code, out = invoke(*args)
    assert code == 2
    assert message in out


def test_simulate_a_policy_as_json() -> None:
    code, out = invoke("simulate", "resnet18", *SMALL, "--policy", "checkpoint_sqrt", "--json")
    assert code == 0, out
    data = json.loads(out.strip().splitlines()[-1])
    assert data["plan"]["label"] == "checkpoint_sqrt"
    assert data["peak_bytes"] < data["unconstrained"]["peak_bytes"]
    assert data["step_ms"] >= data["unconstrained"]["step_ms"]


def test_profile_modeled_table_and_file(tmp_path: Path) -> None:
    out_file = tmp_path / "p.json"
    code, out = invoke("profile", "resnet18", *SMALL, "--gpu", "a100-80gb", "-o", str(out_file))
    assert code == 0, out
    assert "layer1.0" in out and "residual" in out
    assert json.loads(out_file.read_text())["source"] == "modeled"


def test_spec_file_model(tmp_path: Path) -> None:
    spec = {"input_shape": [3, 16, 16], "layers": [
        {"type": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1}, {"type": "relu"},
        {"type": "flatten"}, {"type": "linear", "out_features": 10}]}  # fmt: skip
    path = tmp_path / "net.json"
    path.write_text(json.dumps(spec))
    code, out = invoke(
        "tune", "spec", "--spec", str(path), "--batch", "4", "--budget", "1GiB", "--trials", "10", "--json"
    )
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["model"].startswith("spec:")
    path.write_text(json.dumps({**spec, "layers": [{"type": "conv3d"}]}))
    code, out = invoke("tune", "spec", "--spec", str(path))
    assert code == 2 and "conv3d" in out


def test_models_and_gpus_lists() -> None:
    code, out = invoke("models")
    assert code == 0 and "vgg516" in out and "gpt" in out
    code, out = invoke("gpus")
    assert code == 0 and "h200" in out and "k40" in out


def test_a_budget_is_a_fraction_of_the_peak_or_of_the_gpu_as_written() -> None:
    """NOTE [ Budget grammar ]: '60% of peak' is of the model's simulated unconstrained peak, '1% of gpu' of the GPU."""
    from memtune.profiler.modeled import modeled_profile
    from memtune.profiler.zoo import build
    from memtune.tuner.simulator import simulate

    prof = modeled_profile(build("resnet18", {"image_size": 32}), 256, "float32", "h200")
    peak = simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes
    for text, expected in (("60% of peak", int(0.6 * peak)), ("1% of gpu", int(0.01 * prof.device.memory_bytes))):
        code, out = invoke("tune", "resnet18", *SMALL, "--gpu", "h200", "--budget", text, "--trials", "5", "--json")
        assert code in (0, 1), out
        assert json.loads(out.strip().splitlines()[-1])["budget_bytes"] == expected
