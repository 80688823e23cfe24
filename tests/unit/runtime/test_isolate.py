"""``run_isolated``: a call in a fresh process returns its result, raises its error, and a dead child is named."""

from __future__ import annotations

import os

import pytest

from memtune.profiler.modeled import modeled_profile
from memtune.profiler.zoo import build
from memtune.tuner.measure._isolate import IsolatedProcessError, run_isolated
from memtune.tuner.measure.bench import row_specs
from memtune.tuner.plan import Plan


def _exit_hard(code: int) -> None:
    os._exit(code)


def _fail(message: str) -> None:
    raise ValueError(message)


def _chain_size(name: str, params: dict[str, int]) -> int:
    return len(build(name, params))


@pytest.mark.slow
def test_runs_in_another_process_and_returns_the_result() -> None:
    assert run_isolated(os.getpid) != os.getpid()
    # two calls, two processes: nothing carries over from one call to the next
    assert run_isolated(os.getpid) != run_isolated(os.getpid)
    here = len(build("resnet18", {"image_size": 32, "num_classes": 10}))
    assert run_isolated(_chain_size, "resnet18", {"image_size": 32, "num_classes": 10}) == here


@pytest.mark.slow
def test_an_exception_in_the_child_is_raised_here() -> None:
    with pytest.raises(ValueError, match="bad layer 3"):
        run_isolated(_fail, "bad layer 3")


def test_a_child_that_dies_is_reported() -> None:
    with pytest.raises(IsolatedProcessError, match="_exit_hard ended without a result"):
        run_isolated(_exit_hard, 3)


def test_row_specs_order_and_caps() -> None:
    chain = build("resnet18", {"image_size": 32, "num_classes": 10})
    profile = modeled_profile(chain, 2, "float32", "h200")
    plan = Plan.uniform(profile.n_stages, label="x")
    specs = row_specs(chain, profile, [("mine", "tuned", plan)], capped_builtins=True)
    assert [s.kind for s in specs] == ["unconstrained", "tuned", "pytorch", "pytorch"]
    assert [s.capped for s in specs] == [False, True, True, True]
    assert specs[2].builtin == "save_on_cpu" and specs[3].builtin == "checkpoint_sequential"
    assert specs[3].name.endswith("under the cap")
    assert [s.kind for s in row_specs(chain, profile, [], pytorch_builtins=False)] == ["unconstrained"]
