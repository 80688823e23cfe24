"""A bad argument is refused before any profiling, in Python and on the command line, naming what it takes.

Profiling a model takes minutes on a CPU; a typo in the budget, the optimizer, the dtype or the GPU type must not
cost them. Profiling is replaced by a function that fails the test, so only a check made first passes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import memtune
import memtune.api.cli
import memtune.tuner.measure.tune_module
from memtune.profiler import ProfilerError
from memtune.tuner import TunerError

BAD = [
    ({"budget": "2"}, "has no unit"),
    ({"optimizer": "adamw"}, "optimizer 'adamw' is not known: use sgd"),
    ({"dtype": "fp16"}, "dtype 'fp16' is not known: use float32, bfloat16 or float16"),
    ({"gpu": "h900"}, "h900"),
    ({"trials": 0}, "trials must be a whole number of at least 1"),
    ({"headroom": 1.5}, "headroom 1.5 is not a fraction"),
    ({"compile": "yes"}, "compile must be True, False or 'auto', not 'yes'"),
    ({"finalists": -1}, "finalists must be a whole number of plans, 0 or more, not -1"),
    ({"finalists": 2.5}, "finalists must be a whole number of plans, 0 or more, not 2.5"),
]


def _no_profiling(*args: object, **kwargs: object) -> None:
    raise AssertionError("profiled before the arguments were checked")


@pytest.mark.parametrize(("bad", "message"), BAD)
def test_tune_refuses_a_bad_argument_before_profiling(
    bad: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memtune.tuner.measure.tune_module, "profile", _no_profiling)
    arguments: dict[str, Any] = {"budget": "60% of peak", **bad}
    budget = arguments.pop("budget")
    with pytest.raises((TunerError, ProfilerError), match=message):
        memtune.tune(nn.Linear(4, 4), budget, example_inputs=torch.randn(2, 4), progress=False, **arguments)


def test_profile_refuses_a_bad_dtype_or_gpu_before_measuring() -> None:
    with pytest.raises(TunerError, match="dtype 'half' is not known"):
        memtune.profile(nn.Linear(4, 4), torch.randn(2, 4), dtype="half", progress=False)
    with pytest.raises(ProfilerError, match="h900"):
        memtune.profile(nn.Linear(4, 4), torch.randn(2, 4), gpu="h900", progress=False)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--budget", "2"], "has no unit"),
        (["--optimizer", "adamw"], "--optimizer 'adamw' is not known"),
        (["--dtype", "fp16"], "--dtype 'fp16' is not known"),
        (["--gpu", "h900"], "h900"),
        (["--headroom", "1.5"], "--headroom 1.5 is not a fraction"),
    ],
)
def test_the_command_line_refuses_a_bad_option_before_measuring_a_factory(
    options: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("memtune.api.cli._tune.factory_profile", _no_profiling)
    done = CliRunner().invoke(memtune.api.cli.app, ["tune", "my_model.py:build", "--input-shape", "4", *options])
    assert done.exit_code == 2, done.output
    assert message in " ".join(done.output.split())
