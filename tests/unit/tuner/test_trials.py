"""The search's trial loop (NOTE [ Fixed trials ] in ``memtune.tuner._trials``) leaves a study as Optuna's own loop
does."""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any

import optuna
import pytest
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from memtune.tuner._trials import TrialQueue, run_trials

optuna.logging.set_verbosity(optuna.logging.WARNING)

CHOICES = ("auto", "keep", "offload", "recompute")
SPACE: dict[str, BaseDistribution] = {
    "threshold": FloatDistribution(0.05, 20.0, log=True),
    **{f"a{k:03d}": CategoricalDistribution(CHOICES) for k in range(6)},
    "lookahead": IntDistribution(0, 8),
    "flag": CategoricalDistribution((False, True)),
}


def _objective(trial: Any) -> float:
    """A search-like objective: every parameter suggested, attributes and two named constraints set."""
    x = trial.suggest_float("threshold", 0.05, 20.0, log=True)
    acts = [trial.suggest_categorical(f"a{k:03d}", CHOICES) for k in range(6)]
    la = trial.suggest_int("lookahead", 0, 8)
    flag = trial.suggest_categorical("flag", (False, True))
    value = math.log(x) ** 2 + sum(CHOICES.index(a) for a in acts) + 0.1 * la + (0.5 if flag else 0.0)
    trial.set_user_attr("value_again", value)
    trial.set_user_attr("flag_seen", trial.params["flag"])
    trial.set_constraint("over", value - 6.0)
    trial.set_constraint("other", -1.0)
    return value


def _constraints(t: FrozenTrial) -> list[float]:
    return [float(t.constraints.get(k, 0.0)) for k in ("over", "other")]


def _fixed(rng: random.Random) -> dict[str, Any]:
    params: dict[str, Any] = {"threshold": round(math.exp(rng.uniform(-2.0, 2.0)), 4)}
    params.update({f"a{k:03d}": rng.choice(CHOICES) for k in range(6)})
    params["lookahead"] = rng.randint(0, 8)
    params["flag"] = rng.random() < 0.5
    return params


def _study(seed: int) -> optuna.Study:
    with pytest.warns(FutureWarning):  # the list form of constraints (as memtune.tuner.search uses it)
        sampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=5, multivariate=True, constraints_func=_constraints
        )
    return optuna.create_study(sampler=sampler)


def _record(t: FrozenTrial) -> tuple[Any, ...]:
    return (t.number, t.state, t.values, list(t.params.items()), t.distributions, list(t.user_attrs.items()),
            list(t.system_attrs.items()))  # fmt: skip


@pytest.mark.filterwarnings("ignore:Fixed parameter lookahead with value 12")  # the edit outside the space
@pytest.mark.parametrize("seed", [0, 3])
def test_run_trials_leaves_the_study_optunas_loop_leaves(seed: int) -> None:
    """Queued trials (a fixed start, then local edits the callback queues now and then, one with a parameter out
    of the space and one that leaves a parameter out) and sampled ones: the same trials, in the same order, with
    the same parameters, attributes, constraints and values as ``study.optimize`` with ``enqueue_trial``."""
    first = [(_fixed(random.Random(i)), {"policy": f"p{i}"}) for i in range(4)]
    odd = {**_fixed(random.Random(99)), "lookahead": 12}  # outside the space: Optuna's own path
    partial = {k: v for k, v in _fixed(random.Random(98)).items() if k != "flag"}  # the sampler draws "flag"

    def edits(rng: random.Random, trial: FrozenTrial, done: int) -> dict[str, Any] | None:
        if done == 9:
            return odd
        if done == 11:
            return partial
        if done > 6 and rng.random() < 0.7:
            params = {k: trial.params[k] for k in SPACE}
            params[f"a{rng.randrange(6):03d}"] = rng.choice(CHOICES)
            return params
        return None

    # Optuna's own loop
    reference = _study(seed)
    for params, attrs in first:
        reference.enqueue_trial(params, user_attrs=attrs)
    rng = random.Random(seed)

    def callback(study: optuna.Study, trial: FrozenTrial) -> None:
        nxt = edits(rng, trial, len(study.trials))
        if nxt is not None:
            study.enqueue_trial(nxt)

    reference.optimize(_objective, n_trials=30, callbacks=[callback])

    # the search's loop
    study = _study(seed)
    queue: TrialQueue = deque(first)
    rng = random.Random(seed)
    seen: list[FrozenTrial] = []

    def mine(trial: FrozenTrial) -> bool:
        seen.append(trial)
        nxt = edits(rng, trial, len(study.trials))
        if nxt is not None:
            queue.append((nxt, None))
        return False

    run_trials(study, _objective, 30, queue, SPACE, mine, _constraints)

    ours = [_record(t) for t in study.get_trials(deepcopy=False)]
    # Optuna's loop also leaves the edit queued after the last trial, waiting
    theirs = [_record(t) for t in reference.get_trials(deepcopy=False) if t.state.is_finished()]
    assert len(ours) == len(theirs) == 30
    for a, b in zip(ours, theirs, strict=True):
        assert a == b
    assert [t.number for t in seen] == list(range(30))
    assert study.best_trial.number == reference.best_trial.number


def test_a_failing_objective_leaves_a_failed_trial_and_raises() -> None:
    study = _study(0)
    queue: TrialQueue = deque([({"threshold": 1.0, **{f"a{k:03d}": "keep" for k in range(6)}, "lookahead": 1,
                                 "flag": False}, None)])  # fmt: skip

    def boom(trial: Any) -> float:
        trial.suggest_float("threshold", 0.05, 20.0, log=True)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_trials(study, boom, 3, queue, SPACE, lambda t: False, _constraints)
    assert [t.state for t in study.trials] == [TrialState.FAIL]


def test_the_callback_stops_the_loop() -> None:
    study = _study(1)
    run_trials(study, _objective, 10, deque(), SPACE, lambda t: t.number == 2, _constraints)
    assert len(study.trials) == 3


def test_a_search_collects_garbage_less_often_and_restores_the_thresholds() -> None:
    """NOTE [ Garbage collection in a search ]: raised while searches run (nested, or in two threads), restored after
    the last one, also when it raises."""
    import gc
    import threading

    from memtune.tuner._collection import SEARCH_THRESHOLDS, collecting_less, fewer_collections

    before = gc.get_threshold()
    raised = tuple(max(a, b) for a, b in zip(before, SEARCH_THRESHOLDS, strict=True))
    seen: list[tuple[int, int, int]] = []
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        with fewer_collections():
            inside.set()
            release.wait(10)

    @collecting_less
    def search(depth: int) -> int:
        seen.append(gc.get_threshold())
        if depth:
            return search(depth - 1)
        raise ValueError("the search failed")

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    with pytest.raises(ValueError, match="failed"):
        search(2)
    assert gc.get_threshold() == raised  # the other thread's search still runs
    release.set()
    thread.join()
    assert seen == [raised] * 3
    assert gc.get_threshold() == before
