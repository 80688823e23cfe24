"""``memtune tune`` on a factory model compiled on CUDA measures its finalists as ``memtune.tune`` does (NOTE
[ Measured finalists ] in ``memtune.tuner.finalists``). Measuring needs CUDA (``tests/gpu/test_regions_gpu.py`` runs
the measurement itself); here it is replaced by a stand-in that records what it was given and serves the compiler
point, so what is tested is the command's wiring: every search's result reaches the finalists, and the result served
is theirs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import memtune.tuner.measure.finalists
from memtune.api.cli._tune import _finalists
from memtune.profiler import zoo
from memtune.profiler._profile import CompilerPoint
from memtune.profiler.modeled import modeled_profile
from memtune.tuner.finalists import Finalist, finalists, served
from memtune.tuner.measure.compiler_points import with_compiler_points
from memtune.tuner.plan import Plan
from memtune.tuner.search import tune
from memtune.tuner.simulator import simulate
from memtune.tuner.tuned import Tuned


def test_the_command_serves_the_finalist_measured_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    prof = modeled_profile(zoo.build("resnet50"), 64, "float32", "h100")
    base = simulate(prof, Plan.uniform(prof.n_stages))
    point = CompilerPoint(activation_budget=0.5, step_ms=base.step_ms * 3.0, peak_bytes=int(base.peak_bytes * 0.5))
    result = tune(with_compiler_points(prof, [point]), int(base.peak_bytes * 0.7), trials=20, seed=0)
    assert result.best is not None and result.best.plan.whole_compile is None
    seen: dict[str, Any] = {}

    def stand_in(model: Any, x: Any, tuned: Tuned, loss_fn: Any, **kwargs: Any) -> Tuned:
        seen.update(model=model, x=x, searched=tuned.searched, **kwargs)
        chosen = finalists(tuned.searched, kwargs["limit"])
        ran = tuple(Finalist(n, c.step_ms, c.peak_bytes, step_ms=1.0 + k, reserved_bytes=1) for k, (n, _, c)
                    in enumerate(reversed(chosen)))  # fmt: skip
        won = dataclasses.replace(ran[0], served=True)
        return dataclasses.replace(tuned, result=served(chosen[-1]), measured=(won, *ran[1:]))

    monkeypatch.setattr(memtune.tuner.measure.finalists, "measure_finalists", stand_in)
    got, measured = _finalists(("net", "batch"), result, [result], "sgd", True, 2)
    assert seen["model"] == "net" and seen["x"] == "batch" and seen["searched"] == (result,)
    assert (seen["optimizer"], seen["output_held"], seen["limit"]) == ("sgd", True, 2)
    assert got.best is not None and got.best.plan.whole_compile == 0.5  # the compiler point, measured fastest
    assert [f.served for f in measured] == [True, False]
    assert _finalists(("net", "batch"), result, [result], "sgd", True, 0) == (result, ())  # --finalists 0


def test_where_no_plan_ran_the_command_serves_none_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    prof = modeled_profile(zoo.build("resnet50"), 64, "float32", "h100")
    base = simulate(prof, Plan.uniform(prof.n_stages))
    result = tune(prof, int(base.peak_bytes * 0.7), trials=20, seed=0)
    failed = (Finalist("optuna", 1.0, 1, error="PlanOutOfMemoryError: stage 6", out_of_memory=True),)

    def stand_in(model: Any, x: Any, tuned: Tuned, loss_fn: Any, **kwargs: Any) -> Tuned:
        return dataclasses.replace(tuned, result=dataclasses.replace(tuned.result, best=None), measured=failed)

    monkeypatch.setattr(memtune.tuner.measure.finalists, "measure_finalists", stand_in)
    got, measured = _finalists(("net", "batch"), result, [result], "sgd", True, 3)
    assert got.best is None and measured == failed
    err = capsys.readouterr().err
    assert "no plan ran under the budget (optuna: PlanOutOfMemoryError: stage 6); none is served" in " ".join(
        err.split()
    )
