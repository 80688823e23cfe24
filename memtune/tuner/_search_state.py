"""The state of one plan search (``SearchState``): the Optuna objective (a trial's plan, its local descent and its
pricing, NOTE [ Placement ranking ]), what a trial records, the incumbent and the local edits made from it
(NOTE [ Rule basins ]). Its descent is ``memtune.tuner._search_descent.LocalDescent``; ``memtune.tuner.search.tune``
drives it. Steps are in ms, peaks and budgets in bytes.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Hashable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers._base import _CONSTRAINTS_KEY
from optuna.trial import FrozenTrial, TrialState

from memtune.profiler import Profile
from memtune.tuner._prefetch_trigger import prefetch_trigger
from memtune.tuner._search_descent import LocalDescent
from memtune.tuner._search_results import CONSTRAINTS, Candidate, Mode, pareto_front, trial_fits
from memtune.tuner._search_space import (
    _CONV_RULES,
    _DEFAULT_SYNC_DELAY,
    _MAX_LOOKAHEAD,
    _MAX_SYNC_DELAY,
    _MAX_WS_CAP_MIB,
    _PER_LAYER,
    _SYNCS,
    _THRESHOLD_RANGE,
    _contains,
    _Knobs,
    _params_for,
    decode_params,
)
from memtune.tuner._spatial_search import STRIP_CHOICES, split_descent, splittable
from memtune.tuner._trials import FixedTrial
from memtune.tuner.calibration import Calibration
from memtune.tuner.placement import AllocatorPricer
from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import SimResult, Simulator
from memtune.tuner.stage_choices import stage_actions

__all__ = ["SearchState"]


class SearchState(LocalDescent):
    """The state of one ``tune`` call: the simulator, the incumbent, the mutation stream."""

    def __init__(
        self,
        profile: Profile,
        budget: int,
        mode: Mode,
        seed: int,
        optimizer: str,
        *,
        cap: int | None = None,
        priced: bool = False,
        calibration: Calibration | None = None,
    ) -> None:
        from memtune.tuner.policies.layup_cumulative import layup_cumulative

        self.profile = profile
        self.n = profile.n_stages
        self.budget = budget
        self.mode = mode
        self.optimizer = optimizer
        # NOTE [ One objective ]: with ``priced``, a plan that fits ``budget`` pays its allocator retries under ``cap``
        self.cap = budget if cap is None else cap
        self.priced = priced
        self._placements: dict[str, tuple[float, float, bool]] = {}
        self._pricer: AllocatorPricer | None = None  # made on the first placement
        # NOTE [ Calibration is an input ] (memtune.tuner.calibration): every price of the search reads this one
        self.sim = Simulator(profile, optimizer, calibration=calibration)
        self.calibration = self.sim.calibration
        self.rng = random.Random(seed)
        self._threshold_cache: dict[float, tuple[Action, ...]] = {}
        self._layup = layup_cumulative
        # stages whose action can matter: they save bytes, or they can join a recompute segment
        self.front_pool: list[FrozenTrial] = []
        # NOTE [ Rule basins ]: the best trial per convolution rule, each a parent for local edits now and then
        self.rule_best: dict[str, FrozenTrial] = {}
        self.peak_range: tuple[int, int] | None = None
        self.descent_evals = max(60, 4 * self.n)
        self._templates: dict[_Knobs, Plan] = {}
        # NOTE [ Descent memo ]: per plan, its numbers, or the limits (peak, step, step's peak) it gave None under
        self._bounded: dict[Hashable, SimResult | tuple[int, float, int]] = {}
        self.has_conv_algos = profile.has_conv_algos
        # per stage, the actions it may take, and its override parameter's choices (NOTE [ Search space ])
        self.actions = stage_actions(profile)
        self.choices = [("auto", *(a.value for a in acts)) for acts in self.actions]
        self.splittable = splittable(profile)  # NOTE [ Searching splits ] (memtune.tuner._spatial_search)
        self.strips = 1

    def threshold_actions(self, threshold: float) -> tuple[Action, ...]:
        key = round(threshold, 6)
        if key not in self._threshold_cache:
            plan = self._layup(self.profile, self.budget, threshold=key)
            self._threshold_cache[key] = plan.actions
        return self._threshold_cache[key]

    def evaluate(self, plan: Plan) -> SimResult:
        return self.sim.run(plan, check=False)

    # ---- Optuna objective ------------------------------------------------------------------------
    def suggest(self, trial: optuna.Trial | FixedTrial) -> Plan:
        params: dict[str, Any] = {"threshold": trial.suggest_float("threshold", *_THRESHOLD_RANGE, log=True)}
        for k in range(self.n):
            params[f"a{k:03d}"] = trial.suggest_categorical(f"a{k:03d}", self.choices[k])
        params["lookahead"] = trial.suggest_int("lookahead", 0, _MAX_LOOKAHEAD)
        params["sync"] = trial.suggest_categorical("sync", _SYNCS)
        params["sync_delay"] = trial.suggest_int("sync_delay", 0, _MAX_SYNC_DELAY)
        if self.has_conv_algos:
            params["conv_rule"] = trial.suggest_categorical("conv_rule", _CONV_RULES)
            params["ws_cap_mib"] = trial.suggest_int("ws_cap_mib", 1, _MAX_WS_CAP_MIB, log=True)
        trial.suggest_categorical("per_layer_prefetch", _PER_LAYER)  # applied after the descent (objective)
        return decode_params(params, self.n, self.threshold_actions)

    def objective(self, trial: optuna.Trial | FixedTrial) -> float | tuple[float, float]:
        start = self.suggest(trial)
        budget = self.budget
        if self.mode == "pareto" and self.peak_range is not None:  # aim each descent at a random budget
            lo, hi = self.peak_range
            budget = int(lo + self.rng.random() * (hi - lo))
        self.strips = self.rng.choice(STRIP_CHOICES) if self.splittable else 1  # NOTE [ Searching splits ]
        plan, r = self.descend(start, budget)
        if self.splittable:  # NOTE [ Searching splits ] (memtune.tuner._spatial_search)
            plan, r = split_descent(self.profile, self.sim, plan, r, lambda res: self._score(res, budget))
        if trial.params.get("per_layer_prefetch"):
            plan, r = self.per_layer(plan, r, budget)
        lo_hi = self.peak_range
        self.peak_range = (min(r.peak_bytes, lo_hi[0]), max(r.peak_bytes, lo_hi[1])) if lo_hi else (r.peak_bytes,) * 2
        c = Candidate(f"trial {trial.number}", plan, r.step_ms, r.peak_bytes, r.peak_bytes <= self.budget)
        if c.feasible:
            c = self.price(c)
        for key, value in self.trial_attrs(c).items():
            trial.set_user_attr(key, value)
        for key, value in self.constraints(c).items():
            trial.set_constraint(key, value)
        if self.mode == "pareto":
            return c.step_ms, float(c.peak_bytes)
        return c.step_ms

    def per_layer(self, plan: Plan, r: SimResult, budget: int) -> tuple[Plan, SimResult]:
        """``plan`` with the per-layer prefetch trigger's lookaheads where they score better within ``budget``, else
        ``plan`` (NOTE [ Search space ]). In ``fastest`` mode a plan that fits and never waits for a prefetch is
        left as it is: the trigger could only lower its peak, which that mode does not score."""
        if self.mode == "fastest" and r.peak_bytes <= budget and not any(r.backward_stalls_ms):
            return plan, r
        trig = prefetch_trigger(self.profile, plan, budget, simulator=self.sim)
        if self._score(trig.result, budget) < self._score(r, budget):
            return trig.plan, trig.result
        return plan, r

    # NOTE [ One objective ]: what a trial records, and what pricing adds
    def price(self, c: Candidate) -> Candidate:
        """``c`` with its allocator retries under the cap priced into ``step_ms``; ``c`` as it is when the search
        does not price them. A plan the allocator model cannot fit is infeasible.

        # NOTE [ Placement ranking ]
        The simulator's step assumes every request finds room. Under the budget's cap a plan whose free memory
        is scattered pays allocator retries (NOTE [ Allocator placement ] in ``memtune.tuner.placement``), which cost
        VGG-16 fp32 on the H200 13.6-18.3% of its step. Where the GPU type's calibration prices them, every
        feasible plan is therefore ranked by its step plus the predicted retries' cost (``allocator_cost``: the
        calibrated ms per GiB unmapped), and a plan that the allocator model cannot fit even after a retry is
        infeasible. The descent inside a trial stays on the simulator (the model costs milliseconds per plan, the
        simulator microseconds); the plan it ends at is priced once, and that priced step is the trial's value
        (NOTE [ One objective ]). So the result is never worse than the best feasible baseline by the same measure:
        the baselines are priced too.
        """
        if not self.priced:
            return c
        retries, ms, fits = self.placement(c.plan)
        return dataclasses.replace(
            c, step_ms=c.step_ms + ms, allocator_ms=ms, alloc_retries=retries, feasible=c.feasible and fits
        )

    def placement(self, plan: Plan) -> tuple[float, float, bool]:
        """``plan``'s predicted retries per step under the cap, their price in ms, and whether the allocator model
        places it; kept per plan (descents often end at a plan an earlier trial ended at)."""
        key = plan.model_dump_json(exclude={"label"})
        if key not in self._placements:
            if self._pricer is None:
                self._pricer = AllocatorPricer(
                    self.profile, self.cap, optimizer=self.optimizer, calibration=self.calibration
                )
            placed, cost = self._pricer.cost(plan)
            self._placements[key] = (placed.steady_retries, cost or 0.0, placed.out_of_memory is None)
        return self._placements[key]

    def trial_attrs(self, c: Candidate) -> dict[str, Any]:
        """The user attributes a trial of ``c`` records: its priced step, its peak and its plan."""
        plan = c.plan
        attrs: dict[str, Any] = {
            "step_ms": c.step_ms,
            "peak_bytes": c.peak_bytes,
            "actions": plan.compact(),
            "lookahead": plan.prefetch_lookahead,
            "lookaheads": None if plan.prefetch_lookaheads is None else list(plan.prefetch_lookaheads),
            "sync": plan.sync,
            "sync_delay": plan.sync_delay,
            "conv_rule": plan.conv_rule,
            "conv_workspace_limit_bytes": plan.conv_workspace_limit_bytes,
        }
        if plan.spatial_splits:  # NOTE [ Searching splits ]
            attrs["spatial_splits"] = dict(plan.spatial_splits)
        if c.alloc_retries is not None:
            attrs["simulated_step_ms"] = c.step_ms - c.allocator_ms
            attrs["allocator_ms"] = c.allocator_ms
            attrs["alloc_retries"] = c.alloc_retries
            attrs["allocator_out_of_memory"] = c.peak_bytes <= self.budget and not c.feasible
        return attrs

    def constraints(self, c: Candidate) -> dict[str, float]:
        """``c``'s Optuna constraints (``CONSTRAINTS``): feasible when every value is ≤ 0."""
        over = float(c.peak_bytes - self.budget)
        return {"peak_over_budget_bytes": over, "allocator_out_of_memory": 0.0 if over > 0 or c.feasible else 1.0}

    def fits(self, t: FrozenTrial) -> bool:
        """Whether a trial's plan is feasible: its peak fits and the allocator model places it."""
        return trial_fits(t.user_attrs, self.budget)

    def distributions(self) -> dict[str, BaseDistribution]:
        """The search space's distributions by parameter (NOTE [ Search space ])."""
        d: dict[str, BaseDistribution] = {"threshold": FloatDistribution(*_THRESHOLD_RANGE, log=True)}
        for k in range(self.n):
            d[f"a{k:03d}"] = CategoricalDistribution(self.choices[k])
        d["lookahead"] = IntDistribution(0, _MAX_LOOKAHEAD)
        d["sync"] = CategoricalDistribution(_SYNCS)
        d["sync_delay"] = IntDistribution(0, _MAX_SYNC_DELAY)
        if self.has_conv_algos:
            d["conv_rule"] = CategoricalDistribution(_CONV_RULES)
            d["ws_cap_mib"] = IntDistribution(1, _MAX_WS_CAP_MIB, log=True)
        d["per_layer_prefetch"] = CategoricalDistribution(_PER_LAYER)
        return d

    def record(self, study: optuna.Study, c: Candidate, *, served: bool = True) -> None:
        """Add ``c``, the plan ``tune`` serves (a trial's, a baseline's or the placed descent's), to ``study`` as a
        finished trial with its value, attributes and constraints (NOTE [ One objective ]); with ``served=False``,
        the plan closest to the budget where none fits, its constraints as they are (NOTE [ Exact trial count ]).
        Its parameters are those of the search space that express it; its plan is the ``plan`` attribute."""
        dists = self.distributions()
        params = {
            k: v for k, v in _params_for(c.plan, self.has_conv_algos).items() if k in dists and _contains(dists[k], v)
        }
        attrs = self.trial_attrs(c)
        attrs["plan"] = c.plan.model_dump(mode="json")
        attrs["recorded"] = "best" if served else "closest"
        if c.name != "optuna" and not c.name.startswith("trial "):
            attrs["policy"] = c.name
        # memtune's verdict: a served plan fits
        constraints = self.constraints(dataclasses.replace(c, feasible=True) if served else c)
        values = [c.step_ms, float(c.peak_bytes)] if self.mode == "pareto" else [c.step_ms]
        study.add_trial(
            optuna.trial.create_trial(
                values=values,
                params=params,
                distributions={k: dists[k] for k in params},
                user_attrs=attrs,
                system_attrs={_CONSTRAINTS_KEY: [constraints[k] for k in CONSTRAINTS]},
                constraints=constraints,
            )
        )

    # ---- incumbent and local edits ---------------------------------------------------------------
    def incumbent(self, trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
        """The best trial among ``trials`` (see ``better``), or None."""
        best: FrozenTrial | None = None
        for t in trials:
            if t.state is TrialState.COMPLETE and "peak_bytes" in t.user_attrs:
                best = t if best is None else self.better(t, best)
        return best

    def better(self, a: FrozenTrial, b: FrozenTrial) -> FrozenTrial:
        """The better of two trials: feasible first, then faster (then smaller); infeasible by smaller peak."""
        fa, fb = self.fits(a), self.fits(b)
        if fa != fb:
            return a if fa else b
        if fa:
            ka = (a.user_attrs["step_ms"], a.user_attrs["peak_bytes"])
            kb = (b.user_attrs["step_ms"], b.user_attrs["peak_bytes"])
        else:
            ka = (a.user_attrs["peak_bytes"], a.user_attrs["step_ms"])
            kb = (b.user_attrs["peak_bytes"], b.user_attrs["step_ms"])
        return a if ka < kb else b

    def note(self, trial: FrozenTrial) -> None:
        """Keep ``trial`` if it is the best so far of its convolution rule (NOTE [ Rule basins ])."""
        rule = trial.user_attrs.get("conv_rule", "default")
        held = self.rule_best.get(rule)
        self.rule_best[rule] = trial if held is None else self.better(trial, held)

    def pick_parent(self, incumbent: FrozenTrial) -> FrozenTrial:
        """The trial to edit next: the incumbent, or in Pareto mode often a member of the front so far.

        # NOTE [ Rule basins ]
        A convolution rule changes every convolution's time and workspace at once, so the best plan under one rule
        is rarely one local edit from the best under another: editing only the incumbent kept the joint search in
        the first good rule's basin. On the committed ResNet-50 H200 profile at 60% of the peak it settled at
        130.15 ms under ``fastest`` for seeds 0 and 2 (and with 900 trials), while the same search on the profile
        without algorithm tables found 129.12 ms under ``default`` — a plan the joint space also holds. A third
        of the local edits (with tables) therefore start from the best plan of a random rule instead, and
        ``tune`` first runs a quarter of its trials without algorithm choice and enqueues that search's best
        plan into the joint study, whose local descent can only improve it: the joint result is then never
        slower than that shorter search's.
        """
        if self.has_conv_algos and len(self.rule_best) > 1 and self.rng.random() < 1 / 3:
            return self.rule_best[self.rng.choice(sorted(self.rule_best))]
        if self.mode == "pareto" and self.front_pool and self.rng.random() < 0.5:
            cands = {f"trial {t.number}": t for t in self.front_pool}
            front = pareto_front([self._candidate(t) for t in cands.values()])
            self.front_pool = [cands[c.name] for c in front]
            return self.rng.choice(self.front_pool)
        return incumbent

    def mutate(self, params: dict[str, Any]) -> dict[str, Any]:
        p = dict(params)
        rng = self.rng
        for _ in range(rng.choice((1, 1, 2, 3))):
            k = rng.randrange(self.n)
            key = f"a{k:03d}"
            p[key] = rng.choice([c for c in self.choices[k] if c != p.get(key, "auto")])
        if rng.random() < 0.2:  # a run of recompute: the shape checkpointing wants
            i = rng.randrange(self.n)
            for k in range(i, min(self.n, i + rng.randint(2, 4))):
                p[f"a{k:03d}"] = "recompute"
        if rng.random() < 0.15:
            p["lookahead"] = min(_MAX_LOOKAHEAD, max(0, int(p.get("lookahead", 2)) + rng.choice((-2, -1, 1, 2))))
        if rng.random() < 0.08:
            p["sync"] = "layer" if p.get("sync") == "deferred" else "deferred"
        if rng.random() < 0.15:
            d = int(p.get("sync_delay", _DEFAULT_SYNC_DELAY)) + rng.choice((-1, 1))
            p["sync_delay"] = min(_MAX_SYNC_DELAY, max(0, d))
        if rng.random() < 0.1:
            p["per_layer_prefetch"] = not p.get("per_layer_prefetch", False)
        if self.has_conv_algos and rng.random() < 0.15:
            p["conv_rule"] = rng.choice(_CONV_RULES)
            p["ws_cap_mib"] = min(
                _MAX_WS_CAP_MIB, max(1, int(p.get("ws_cap_mib", 256) * math.exp(rng.gauss(0.0, 1.0))))
            )
        if rng.random() < 0.1:
            t = float(p.get("threshold", 1.0)) * math.exp(rng.gauss(0.0, 0.7))
            p["threshold"] = min(_THRESHOLD_RANGE[1], max(_THRESHOLD_RANGE[0], t))
        return p

    def _candidate(self, t: FrozenTrial) -> Candidate:
        attrs = t.user_attrs
        if "plan" in attrs:  # a recorded plan (``record``)
            plan = Plan.model_validate(attrs["plan"])
        else:
            plan = Plan.from_actions(
                attrs["actions"],
                prefetch_lookahead=attrs["lookahead"],
                prefetch_lookaheads=attrs.get("lookaheads"),
                sync=attrs["sync"],
                sync_delay=attrs.get("sync_delay", _DEFAULT_SYNC_DELAY),
                conv_rule=attrs.get("conv_rule", "default"),
                conv_workspace_limit_bytes=attrs.get("conv_workspace_limit_bytes"),
                spatial_splits=attrs.get("spatial_splits") or {},
                label="optuna",
            )
        retries = attrs.get("alloc_retries")
        return Candidate(
            f"trial {t.number}",
            plan,
            float(attrs["step_ms"]),
            int(attrs["peak_bytes"]),
            self.fits(t),
            allocator_ms=float(attrs.get("allocator_ms", 0.0)),
            alloc_retries=None if retries is None else float(retries),
        )
