"""``memtune.tune(model, ..., compile=...)`` on a module (NOTE [ Compiler points of a module ] in
``memtune.tuner.measure.compiler_points``): the whole model compiled at activation budgets 1, 0.5 and 0.25 is measured
after profiling (CPU inductor here), its points join the search, a whole-model plan applied by ``memtune.planned``
trains with the compiler's math, and ``"auto"`` leaves a CPU model eager."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import memtune
from memtune.tuner import TunerError

pytestmark = pytest.mark.slow  # three compilations by CPU inductor


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(3))
        self.head = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return _Net()


def _batch() -> torch.Tensor:
    return torch.randn(16, 64, generator=torch.Generator().manual_seed(1))


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_compiled_points_join_the_search_and_run_with_the_compilers_math() -> None:
    model = _model()
    tuned = memtune.tune(model, "100% of peak", example_inputs=_batch(), compile=True, trials=20, progress=False)
    points = tuned.profile.compiler_points
    assert [p.activation_budget for p in points] == [0.25, 0.5, 1.0]
    assert all(p.step_ms > 0 and p.peak_bytes > tuned.profile.param_bytes for p in points)
    assert all(p.update_ms is not None and 0 < p.update_ms < p.step_ms for p in points)  # timed inside the steps
    compiled = [c for c in tuned.result.pareto if c.plan.whole_compile is not None]
    whole = compiled[0].plan if compiled else None
    if whole is None:  # no point on the front: take one from the profile the way the search does
        from memtune.tuner.search import compiler_candidates

        whole = compiler_candidates(tuned.profile, 1 << 40, 1 << 40)[0].plan.named(tuned.profile)
    reference = _model()
    reference(_batch()).sum().backward()
    run = memtune.planned(model, whole)
    run(_batch()).sum().backward()
    for name, grad in _grads(reference).items():
        torch.testing.assert_close(_grads(model)[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_auto_leaves_a_cpu_model_eager_and_a_bad_value_is_refused() -> None:
    tuned = memtune.tune(_model(), "100% of peak", example_inputs=_batch(), trials=10, progress=False)
    assert tuned.profile.compiler_points == ()
    with pytest.raises(TunerError, match="compile must be"):
        memtune.tune(_model(), "100% of peak", example_inputs=_batch(), compile="yes", progress=False)


def test_cli_tune_compiles_a_factory_model_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from memtune.api.cli import app

    (tmp_path / "compiled_factory.py").write_text(
        "from tests.unit.runtime.test_module_compiler_points import _model\n\ndef build():\n    return _model()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = CliRunner()
    args = ["tune", "compiled_factory:build", "--input-shape", "64", "--batch", "16", "--trials", "10", "--json"]
    result = runner.invoke(app, [*args, "--compile", "on"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert [p["activation_budget"] for p in data["compiler_points"]] == [0.25, 0.5, 1.0]
    # NOTE [ Compiled-region candidates ]: each region partition at each budget and under each save rule, one line each
    lines = data["compiled_regions"]
    assert any("at activation budget 0.5" in line for line in lines), lines
    assert any("at save rule 'compute'" in line for line in lines), lines
    shown = runner.invoke(app, [*args[:-1], "--compile", "on"])
    assert shown.exit_code == 0, shown.output
    flat = " ".join(shown.stdout.split())
    assert "compiled regions (each partition of the model compiled at one activation budget or save rule):" in flat
    assert "save rule 'compute': unplanned" in flat and "no compiled plan" in flat  # the compiled bound, regions in
    refused = runner.invoke(app, ["tune", "resnet18", "--compile", "on"])
    assert refused.exit_code != 0 and "--compiler-sweep" in refused.output
    off = runner.invoke(app, [*args, "--compile", "off"])
    assert off.exit_code == 0 and json.loads(off.stdout.strip().splitlines()[-1])["compiler_points"] == []


@pytest.mark.parametrize("budget", ["2", "60%", "12 parsecs"])
def test_a_bad_budget_is_refused_before_profiling(budget: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget not in the grammar is refused at once, not after the model was profiled."""
    import memtune.tuner.measure.tune_module
    from memtune.tuner import BudgetError

    def no_profiling(*args: object, **kwargs: object) -> None:
        raise AssertionError("profiled before the budget was read")

    monkeypatch.setattr(memtune.tuner.measure.tune_module, "profile", no_profiling)
    with pytest.raises(BudgetError):
        memtune.tune(_model(), budget, example_inputs=_batch(), progress=False)


def test_a_factory_models_saved_profile_is_tuned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``memtune profile FACTORY --output p.json`` then ``memtune tune FACTORY --profile p.json`` (the model is not
    loaded again: the file stands for it)."""
    from typer.testing import CliRunner

    from memtune.api.cli import app

    (tmp_path / "saved_factory.py").write_text(
        "from tests.unit.runtime.test_module_compiler_points import _model\n\ndef build():\n    return _model()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    runner, saved = CliRunner(), tmp_path / "p.json"
    made = runner.invoke(app, ["profile", "saved_factory:build", "--device", "cpu", "--input-shape", "64",
                               "--batch", "16", "--output", str(saved)])  # fmt: skip
    assert made.exit_code == 0, made.output
    tuned = runner.invoke(app, ["tune", "saved_factory:build", "--profile", str(saved), "--trials", "10", "--json"])
    assert tuned.exit_code == 0, tuned.output
    assert json.loads(tuned.stdout.strip().splitlines()[-1])["batch"] == 16
    simulated = runner.invoke(app, ["simulate", "saved_factory:build", "--profile", str(saved), "--json"])
    assert simulated.exit_code == 0, simulated.output
    refused = runner.invoke(app, ["simulate", "saved_factory:build"])
    assert refused.exit_code != 0 and "--profile p.json" in refused.output
