"""The search's loop over Optuna trials, with trials whose every parameter is fixed kept out of Optuna's bookkeeping.

# NOTE [ Fixed trials ]
Most of a search's trials have every parameter fixed before they start: the baselines, the seeds, the best plan of
the search without algorithm choice, and the local edits of the incumbent (NOTE [ Search space ] in
``memtune.tuner.search``). Run as Optuna trials (``enqueue_trial``, then ``study.optimize``), each such trial writes its
40-odd parameters one by one into the in-memory storage, which copies the trial's parameter and distribution
dictionaries at every write, and ``study.optimize`` hands each callback a deep copy of the finished trial: 300 trials
of 47 fixed parameters and an empty objective took 3.3 s of CPU on the 2-core machine, under load. No sampler is
asked for a fixed parameter (``Trial._suggest`` takes the fixed value first), so ``run_trials`` evaluates such a
trial on a ``FixedTrial`` and adds it to the study finished (``study.add_trial``), holding what Optuna would have
stored: the same number (a queued trial runs next, as an enqueued one did), parameters as their distributions
represent them, user attributes (the queue's, then the objective's), the ``fixed_params`` system attribute, the
named constraints and the sampler's list of constraints (``TPESampler.after_trial`` with ``constraints_func``),
value and state. The other trials are asked from the study and told as ``study.optimize`` does; callbacks get the
study's own finished trial, not a copy (none of them changes it). The TPE sampler therefore sees the same trials
and draws the same samples (``tests/unit/tuner/test_trials.py`` compares every finished trial with those of Optuna's
own loop; on the README's VGG-16 job both studies' trials are equal). A queued trial whose parameters do not all lie
in the search space, or leave some out, goes through Optuna as before (``enqueue_trial``, then ``ask``). One
difference: a trial still queued when the search stops is dropped, where Optuna's loop left it waiting in the study.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers._base import _CONSTRAINTS_KEY
from optuna.trial import FrozenTrial, TrialState

__all__ = ["FixedTrial", "TrialQueue", "run_trials"]

TrialQueue = deque[tuple[dict[str, Any], dict[str, Any] | None]]
"""Trials to run before the sampler is asked again, first first: each one's fixed parameters and user attributes
(``study.enqueue_trial``'s arguments)."""


class FixedTrial:
    """The trial an objective sees where every parameter it suggests is fixed (NOTE [ Fixed trials ]): ``suggest_*``
    returns the fixed value as ``optuna.Trial`` does, and records the distribution; attributes and constraints are
    kept for the finished trial.

    Args:
        number: the trial's number in its study.
        fixed: the fixed parameters, by name.
    """

    def __init__(self, number: int, fixed: Mapping[str, Any]) -> None:
        self.number = number
        self._fixed = fixed
        self.params: dict[str, Any] = {}
        self.distributions: dict[str, BaseDistribution] = {}
        self.user_attrs: dict[str, Any] = {}
        self.constraints: dict[str, float] = {}

    def _suggest(self, name: str, dist: BaseDistribution) -> Any:
        if name in self.distributions:  # suggested before: the first value stands, as in Optuna
            return self.params[name]
        value = self._fixed[name]
        self.params[name] = value
        self.distributions[name] = dist
        return value

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False) -> Any:
        return self._suggest(name, FloatDistribution(low, high, step=step, log=log))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> Any:
        return self._suggest(name, IntDistribution(low, high, step=step, log=log))

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._suggest(name, CategoricalDistribution(choices))

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value

    def set_constraint(self, key: str, value: float) -> None:
        if key not in self.constraints:  # as in Optuna: a constraint set twice keeps its first value
            self.constraints[key] = float(value)

    def frozen(
        self,
        state: TrialState,
        values: list[float] | None,
        queued_attrs: Mapping[str, Any] | None,
        constraints_func: Callable[[FrozenTrial], Sequence[float]] | None,
    ) -> FrozenTrial:
        """The finished trial Optuna would store (NOTE [ Fixed trials ])."""
        params = {k: d.to_external_repr(d.to_internal_repr(self.params[k])) for k, d in self.distributions.items()}
        system: dict[str, Any] = {"fixed_params": dict(self._fixed)}
        system.update({f"{_CONSTRAINTS_KEY}:{k}": v for k, v in self.constraints.items()})
        trial = optuna.trial.create_trial(
            state=state,
            values=values,
            params=params,
            distributions=dict(self.distributions),
            user_attrs={**(queued_attrs or {}), **self.user_attrs},
            system_attrs=system,
        )
        if constraints_func is not None and state is TrialState.COMPLETE:
            trial.system_attrs[_CONSTRAINTS_KEY] = tuple(constraints_func(trial))
        return trial


def run_trials(
    study: optuna.Study,
    objective: Callable[[Any], float | Sequence[float]],
    n_trials: int,
    queue: TrialQueue,
    space: Mapping[str, BaseDistribution],
    callback: Callable[[FrozenTrial], bool],
    constraints_func: Callable[[FrozenTrial], Sequence[float]] | None = None,
) -> None:
    """Run up to ``n_trials`` trials of ``objective`` on ``study``, as ``study.optimize`` would with the queued trials
    enqueued (NOTE [ Fixed trials ]): first the trials of ``queue`` (which the callback may add to), then trials
    asked from the study's sampler. ``callback`` gets each finished trial and returns True to stop.

    Args:
        study: an in-memory study.
        objective: the objective, given an ``optuna.Trial`` or a ``FixedTrial``.
        n_trials: most trials to run.
        queue: trials to run first, first first.
        space: the distribution of every parameter ``objective`` suggests: a queued trial that fixes each within
            it runs as a ``FixedTrial``.
        callback: called after each trial with the study's finished trial; True stops the loop.
        constraints_func: the sampler's ``constraints_func``, whose list a ``FixedTrial`` stores as the sampler does.

    Raises:
        Whatever ``objective`` raises, after recording the trial as failed.
    """
    for _ in range(n_trials):
        fixed, attrs = queue.popleft() if queue else (None, None)
        if fixed is not None and _fixes(space, fixed):
            frozen = _run_fixed(study, objective, fixed, attrs, constraints_func)
        else:
            if fixed is not None:
                study.enqueue_trial(fixed, user_attrs=attrs)
            frozen = _run_asked(study, objective)
        if callback(frozen):
            return


def _fixes(space: Mapping[str, BaseDistribution], fixed: Mapping[str, Any]) -> bool:
    """Whether ``fixed`` holds every parameter of ``space`` at a value its distribution contains."""
    for name, dist in space.items():
        if name not in fixed:
            return False
        value = fixed[name]
        if isinstance(dist, CategoricalDistribution):
            if not any(type(value) is type(c) and value == c for c in dist.choices):
                return False
        elif isinstance(dist, IntDistribution | FloatDistribution):
            if isinstance(value, bool) or not isinstance(value, int | float) or not dist.low <= value <= dist.high:
                return False
            if isinstance(dist, IntDistribution) and value != int(value):
                return False
        else:
            return False
    return True


def _run_fixed(
    study: optuna.Study,
    objective: Callable[[Any], float | Sequence[float]],
    fixed: dict[str, Any],
    attrs: dict[str, Any] | None,
    constraints_func: Callable[[FrozenTrial], Sequence[float]] | None,
) -> FrozenTrial:
    trial = FixedTrial(len(study.get_trials(deepcopy=False)), fixed)
    try:
        result = objective(trial)
    except BaseException:
        study.add_trial(trial.frozen(TrialState.FAIL, None, attrs, constraints_func))
        raise
    values = [float(v) for v in (result if isinstance(result, Sequence) else [result])]
    ok = len(values) == len(study.directions) and not any(math.isnan(v) for v in values)
    study.add_trial(trial.frozen(TrialState.COMPLETE if ok else TrialState.FAIL, values if ok else None, attrs,
                                 constraints_func))  # fmt: skip
    return study.get_trials(deepcopy=False)[-1]


def _run_asked(study: optuna.Study, objective: Callable[[Any], float | Sequence[float]]) -> FrozenTrial:
    trial = study.ask()
    try:
        result = objective(trial)
    except BaseException:
        study.tell(trial, state=TrialState.FAIL)
        raise
    study.tell(trial, result)
    return study.get_trials(deepcopy=False)[trial.number]
