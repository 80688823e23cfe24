"""``memtune tune`` where the bound's linear program gives no answer (``BoundError``): the best plan is printed, and
in the bound's place what the solver said (NOTE [ Bound beside the search ]: the forked child cannot answer either,
so the command computes the bound itself and catches the error)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import scipy.optimize
from profiles import conv_profile
from typer.testing import CliRunner

from memtune.api.cli import app
from memtune.tuner import Simulator
from memtune.tuner.plan import Plan

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no fork start method")


def _unsolved(*args: object, **kwargs: object) -> SimpleNamespace:
    return SimpleNamespace(status=4, message="numerical difficulties (test)", x=None)


def test_tune_prints_the_plan_and_why_there_is_no_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile = conv_profile(blocks=2)
    budget = int(Simulator(profile).run(Plan.uniform(profile.n_stages)).peak_bytes * 0.7)
    path = tmp_path / "p.json"
    profile.save(path)
    monkeypatch.setattr(scipy.optimize, "linprog", _unsolved)
    options = ["--profile", str(path), "--budget", f"{budget}B", "--trials", "10", "--headroom", "0"]
    done = CliRunner().invoke(app, ["tune", profile.model, *options])
    flat = " ".join(done.output.split())
    assert done.exit_code == 0, done.output
    assert "best:" in flat
    assert "no lower bound: the budget bound's linear program was not solved: numerical difficulties (test)" in flat
