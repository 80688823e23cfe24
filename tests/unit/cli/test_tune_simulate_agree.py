"""``tune`` and ``simulate --plan`` price a plan alike: the same step, allocator retries under the budget's cap
stated in both (NOTE [ Placement ranking ] in ``memtune.tuner.search``), on a shipped H200 profile, whose calibration
prices retries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memtune.api.cli import app

PROFILE = Path(__file__).resolve().parents[3] / "memtune" / "profiler" / "data" / "resnet18-b256-float32-h200.json"
BUDGET = ["--budget", "50% of peak"]


@pytest.mark.slow  # a search of 30 trials
def test_simulate_prices_the_tuned_plan_as_tune_did(tmp_path: Path) -> None:
    runner, plan = CliRunner(), tmp_path / "plan.json"
    args = ["resnet18", "--profile", str(PROFILE), *BUDGET]
    tuned = runner.invoke(app, ["tune", *args, "--trials", "30", "--json", "--plan-out", str(plan)])
    assert tuned.exit_code == 0, tuned.output
    best = json.loads(tuned.stdout.strip().splitlines()[-1])["best"]
    assert best["alloc_retries"] > 0, best  # the case: retries are part of the tuned step
    simulated = runner.invoke(app, ["simulate", *args, "--plan", str(plan), "--json"])
    assert simulated.exit_code == 0, simulated.output
    sim = json.loads(simulated.stdout)
    assert sim["step_ms"] == pytest.approx(best["step_ms"], abs=1e-3)
    assert sim["alloc_retries"] == pytest.approx(best["alloc_retries"], abs=1e-3)
    assert sim["simulated_step_ms"] + sim["allocator_ms"] == pytest.approx(sim["step_ms"])
    table = runner.invoke(app, ["tune", *args, "--trials", "30"]).output
    text = runner.invoke(app, ["simulate", *args, "--plan", str(plan)]).output
    for output in (table, text):
        assert f"{best['step_ms']:.2f} ms" in output and "allocator retries per step" in " ".join(output.split())


@pytest.mark.slow  # a search of 10 trials and its bound
def test_the_tune_report_states_its_sizes_in_one_unit_and_its_terms_in_words() -> None:
    """A small model's report in MiB (not ``0.03 GiB``), the headroom stated, no pointer into source files, no
    unlabelled string of action letters."""
    done = CliRunner().invoke(
        app, ["tune", "resnet18", "--param", "image_size=32", "--batch", "8", "--budget", "200MiB", "--trials", "10"]
    )
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert "peak MiB" in text and "GiB" not in text and "NOTE [" not in text
    assert "plans must fit" in text and "see docs/concepts.md" in text
    assert not any(set(word) <= set("kors") and len(word) > 4 for word in text.split())
