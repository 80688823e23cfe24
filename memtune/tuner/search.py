"""Plan search with Optuna: the fastest plan within a budget, or the time–memory Pareto front.

# NOTE [ Search space ]
A trial chooses a cumulative-threshold value ``threshold`` (Layup's rule, ``memtune.tuner.policies.layup_cumulative``,
gives every stage a default action), an override per stage ``aNNN`` in {auto, keep, offload, recompute}, and
``selective`` for the stages where it can beat recompute (``memtune.tuner.plan.stage_actions``),
``lookahead`` (prefetch stages), ``sync`` (deferred or layer) and ``sync_delay`` (stages a deferred copy may
overlap before compute waits for it). ``auto`` takes the threshold rule's action,
so the search starts from the published policy and edits it stage by stage. ``per_layer_prefetch`` (a boolean)
replaces, once a trial's descent has ended, the global lookahead by the per-layer trigger's per-stage lookaheads
(NOTE [ Per-layer prefetch trigger ] in ``memtune.tuner.prefetch_trigger``) where that scores better; only where the
trigger can help (the plan is over the budget or stalls in its backward), so it costs a fraction of the trials' time.
Where the profile records row maps, each trial's descent also splits recompute segments into strips of rows, and
the counts are refined per segment after it (NOTE [ Searching splits ] in ``memtune.tuner.spatial_search``).

Every baseline policy is evaluated and enqueued as one of the first trials, so the result is never worse than
the best feasible baseline (a baseline whose knobs the space cannot express, e.g. HMMS sync points, is also
kept as it is and wins if nothing beats it); the same holds for every seed plan given to ``tune``
(NOTE [ Seeds kept as they are ]). After the baselines and a few TPE trials, most trials are local edits of the
incumbent (1–3 stage overrides, a knob), enqueued into the same study; the rest come from TPE.
Infeasible plans are reported to the sampler as trial constraints (NOTE [ One objective ]).

# NOTE [ One objective ]
A trial's value, its ``step_ms`` attribute, the Pareto front, ``best`` (what a job stores for its results, the
leaderboard and ``/best``) are one number: the simulated step plus, where the search prices them, the allocator
retries predicted under the budget's cap (NOTE [ Placement ranking ]); ``simulated_step_ms``, ``allocator_ms`` and
``alloc_retries`` keep its parts. Pricing each trial's end plan once made the VGG-16 fp32 H200 search at 13 GiB
(300 trials) about 10% slower; before, only the fastest plans were priced after the search, and a job page drew
unpriced trials 40 ms below the priced best.

Feasibility is recorded as Optuna constraints (``CONSTRAINTS``, each ≤ 0 when feasible): the peak over the
search budget and, where priced, whether the allocator model found no room. Each is stored both by name
(``Trial.set_constraint``: ``study.best_trial`` and ``best_trials`` skip infeasible trials, and the TPE sampler
models them) and as the list (``constraints_func``, the ``constraints`` system attribute) that optuna-dashboard
reads to pick its best trial. The best plan (a trial's, a baseline's the space may not express, or the placed
descent's, NOTE [ Placed descent ]) is added to the study as its last finished trial (``user_attrs["recorded"]``,
its exact plan in ``user_attrs["plan"]``; NOTE [ Exact trial count ]), so that ``study.best_trial`` (fastest) is
the plan ``tune`` returns, with the same value. Only where the allocator model fits no plan does memtune serve
one against its verdict (the model's ranking is kept); that plan's recorded trial is feasible, the others not.

# NOTE [ Exact trial count ]
A study holds exactly the ``trials`` it was asked for, resumed or not: ``trials - 1`` searched (baselines and
seeds among them; a resumed study's finished trials, recorded ones included, count toward them) and, last, the plan
``tune`` serves, recorded (``user_attrs["recorded"] == "best"``) even where a searched trial holds it already, so
that the study's last trial is always what was served. Where no plan fits, the last is the plan closest to the
budget (``"closest"``), recorded with its constraints as they are, so ``study.best_trial`` finds no feasible trial.
Before, the best was recorded only where no trial held it, and a resumed 600-trial job's study ended with 601.
``TuneResult.n_trials`` counts them all. A search stopped early (a cancelled job) holds fewer.

Seeds: ``tune``, ``memtune tune`` and a job (``memtune.api.worker.job_seed``) all search with ``DEFAULT_SEED`` unless
told otherwise, and a study in a database keeps its seed as the study attribute ``seed``: the same request gives
the same plan from the command line and from the service.

With ``storage`` and ``study_name`` the study lives in a database (Optuna ``RDBStorage``): it is created or
resumed, finished trials count toward ``trials``, stale running trials of dead workers are failed (Optuna
heartbeat), and several processes may work on one study.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import queue as queue_module
import random
import time
import warnings
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers._base import _CONSTRAINTS_KEY
from optuna.trial import FrozenTrial, TrialState

from memtune.profiler import CompilerPoint, Profile
from memtune.tuner.budget import search_budget
from memtune.tuner.calibration import calibration_for
from memtune.tuner.collection import collecting_less
from memtune.tuner.errors import SearchError
from memtune.tuner.placement import AllocatorPricer
from memtune.tuner.plan import Action, Plan, stage_actions
from memtune.tuner.prefetch_trigger import prefetch_trigger
from memtune.tuner.simulator import OPTIMIZERS, SimResult, Simulator
from memtune.tuner.spatial_search import STRIP_CHOICES, split_descent, splittable, valid_splits, with_strips
from memtune.tuner.trials import FixedTrial, TrialQueue, run_trials

__all__ = [
    "CONSTRAINTS",
    "DEFAULT_SEED",
    "NO_CHOICE",
    "Candidate",
    "TuneResult",
    "decode_params",
    "leaves_convs_to_framework",
    "pareto_front",
    "trial_fits",
    "tune",
]

Mode = Literal["fastest", "pareto"]
_SYNCS = ("deferred", "layer")
_MAX_LOOKAHEAD = 8
_MAX_SYNC_DELAY = 16
_DEFAULT_SYNC_DELAY: int = Plan.model_fields["sync_delay"].default
_THRESHOLD_RANGE = (0.05, 20.0)
_CONV_RULES = ("default", "fastest", "memory_optimal", "fastest_within")
_PER_LAYER = (False, True)  # NOTE [ Search space ]: per_layer_prefetch
_MAX_WS_CAP_MIB = 16384
_PLACED_DESCENT = 40  # NOTE [ Placed descent ]: most placements the descent after the ranking models
_PRE_TRIALS_MIN = 10  # NOTE [ Rule basins ]: fewest trials of the search without algorithm choice
DEFAULT_SEED = 0
"""The seed of ``tune``, ``memtune tune`` and every job (NOTE [ One objective ]): same request, same plan."""
CONSTRAINTS = ("peak_over_budget_bytes", "allocator_out_of_memory")
"""A trial's Optuna constraints, in this order in the list form (NOTE [ One objective ]); feasible when all are ≤ 0."""
NO_CHOICE = "optuna (no algorithm choice)"
"""The name of ``TuneResult.no_choice``.

# NOTE [ Measured selection ]
The joint search (algorithms with offload and recompute) holds every plan of the search without algorithm
choice, so in the simulator it is never slower than that search. On the GPU the two searches' best plans are
often closer than the simulator's error: on the H200, ResNet-50 bf16 b256 at 50% of the peak, the joint plan was
predicted 1.0% faster and measured 1.9% slower in two runs of fresh processes; VGG-16 bf16 at 90% was predicted
2.0% faster and measured 3.2% slower (BENCHMARKS.md, "Convolution algorithms"). Two plans the simulator cannot
tell apart are settled by measuring both: ``tune`` returns, beside ``best``, the fastest feasible plan that leaves every
convolution's algorithm to the framework (``TuneResult.no_choice``, when ``best`` chooses algorithms), and a
job's measured validation runs it with its top plans (NOTE [ Measured validation ] in ``memtune.api.worker``). The plan
served for the GPU type is the fastest measured one, so algorithm choice is only served where the GPU measured
it faster.
"""
_Knobs = tuple[int, str, int, str, int | None]
"""lookahead, sync, sync_delay, conv_rule, conv workspace cap bytes: a plan's knobs in the local descent"""
_Move = tuple[int, Action | None, _Knobs]
"""one edit of the local descent: stage k takes action a (k = -1: the actions stay), and the knobs"""


@dataclass(frozen=True)
class Candidate:
    """One evaluated plan. ``source`` says whether its numbers were ``simulated`` or ``measured``."""

    name: str
    plan: Plan
    step_ms: float
    peak_bytes: int
    feasible: bool
    source: Literal["simulated", "measured"] = "simulated"
    #: of ``step_ms``, what the allocator's retries under the cap are predicted to cost, ms
    allocator_ms: float = 0.0
    #: predicted allocator retries per step under the cap; None where the placement was not modelled
    alloc_retries: float | None = None

    def to_dict(self, *, with_plan: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "step_ms": round(self.step_ms, 4),
            "peak_bytes": self.peak_bytes,
            "feasible": self.feasible,
            "source": self.source,
        }
        if self.alloc_retries is not None:
            out["allocator_ms"] = round(self.allocator_ms, 4)
            out["alloc_retries"] = round(self.alloc_retries, 3)
        if with_plan:
            out["plan"] = self.plan.model_dump(mode="json")
        return out


@dataclass(frozen=True)
class TuneResult:
    """What ``tune`` found. ``best`` is None only when no plan at all fits the budget."""

    profile: Profile
    budget_bytes: int
    mode: Mode
    unconstrained: Candidate
    policies: list[Candidate]
    best: Candidate | None
    pareto: list[Candidate]
    n_trials: int
    study_name: str | None
    seed: int
    headroom: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: the fastest feasible plan that leaves every convolution's algorithm to the framework, when the profile has
    #: algorithm tables and ``best`` chooses algorithms (NOTE [ Measured selection ]); else None
    no_choice: Candidate | None = None

    def to_dict(self) -> dict[str, Any]:
        """The object ``memtune tune --json`` prints (documented in docs/command-line.md)."""
        p = self.profile
        return {
            "model": p.model,
            "batch": p.batch,
            "dtype": p.dtype,
            "gpu": p.device.key,
            "profile_source": p.source,
            "budget_bytes": self.budget_bytes,
            "headroom": self.headroom,
            "mode": self.mode,
            "trials": self.n_trials,
            "seed": self.seed,
            "unconstrained": {
                "step_ms": round(self.unconstrained.step_ms, 4),
                "peak_bytes": self.unconstrained.peak_bytes,
            },
            "policies": [c.to_dict() for c in self.policies],
            "best": self.best.to_dict(with_plan=True) if self.best else None,
            "pareto": [c.to_dict() for c in self.pareto],
            "no_algorithm_choice": self.no_choice.to_dict(with_plan=True) if self.no_choice else None,
            "compiler_points": [
                {"activation_budget": c.activation_budget, "step_ms": round(c.step_ms, 4), "peak_bytes": c.peak_bytes}
                for c in p.compiler_points
            ],
        }


def decode_params(params: dict[str, Any], n: int, threshold_actions: Callable[[float], Sequence[Action]]) -> Plan:
    """Turn one trial's parameters into a plan. See NOTE [ Search space ]."""
    base = threshold_actions(float(params.get("threshold", 1.0)))
    actions = []
    for k in range(n):
        choice = params.get(f"a{k:03d}", "auto")
        actions.append(base[k] if choice == "auto" else Action(choice))
    return Plan(
        actions=tuple(actions),
        prefetch_lookahead=int(params.get("lookahead", 2)),
        sync=params.get("sync", "deferred"),
        sync_delay=int(params.get("sync_delay", _DEFAULT_SYNC_DELAY)),
        label="optuna",
        **_conv_knobs(params.get("conv_rule", "default"), params.get("ws_cap_mib")),
    )


def _conv_knobs(rule: str, cap_mib: int | None) -> dict[str, Any]:
    """Plan fields for a convolution rule; the cap only matters (and is only set) for ``fastest_within``."""
    if rule == "fastest_within":
        return {"conv_rule": rule, "conv_workspace_limit_bytes": int(cap_mib or 0) << 20}
    return {"conv_rule": rule}


def pareto_front(cands: Sequence[Candidate]) -> list[Candidate]:
    """The candidates no other candidate beats in both step ms and peak bytes, by increasing step ms."""
    front: list[Candidate] = []
    best_peak = math.inf
    for c in sorted(cands, key=lambda c: (c.step_ms, c.peak_bytes)):
        if c.peak_bytes < best_peak:
            front.append(c)
            best_peak = c.peak_bytes
    return front


class _Search:
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
        self.sim = Simulator(profile, optimizer)
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
        self.splittable = splittable(profile)  # NOTE [ Searching splits ] (memtune.tuner.spatial_search)
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
        if self.splittable:  # NOTE [ Searching splits ] (memtune.tuner.spatial_search)
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
                self._pricer = AllocatorPricer(self.profile, self.cap, optimizer=self.optimizer)
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

    # NOTE [ Local descent ]: each trial refines its start plan by first-improvement hill climbing in the
    # simulator (one stage's action, or a knob, changed at a time, in random order) for at most
    # ``descent_evals`` simulations. Simulations cost a fraction of a millisecond, so Optuna's trials
    # become an iterated local search: the sampler and the edits of the incumbent pick starting points,
    # the descent finishes them. A trial records the plan it ended at (user attributes), not its start.
    #
    # NOTE [ Descent without repeats ]: a plan the descent has priced once cannot beat its incumbent later (it lost
    # to an incumbent at least as good, or was one), so it is not simulated again: after each improving move the
    # move back is among the new moves, and on VGG-16 at 13 GiB about one move in eight is such a repeat. It still
    # counts toward ``descent_evals``, so every trial ends at the plan it ended at before.
    def _score(self, r: SimResult, budget: int) -> tuple[int, float, float]:
        if r.peak_bytes <= budget:
            return (0, r.step_ms, float(r.peak_bytes))
        return (1, float(r.peak_bytes - budget), r.step_ms)

    def descend(self, plan: Plan, budget: int) -> tuple[Plan, SimResult]:
        actions = list(plan.actions)
        knobs = _knobs_of(plan)

        def template(k: _Knobs) -> Plan:
            if k not in self._templates:
                self._templates[k] = _with_knobs(Plan(actions=tuple(actions), label="optuna"), actions, k)
            return self._templates[k]

        best_r = self.sim.run_actions(actions, self.split(actions, template(knobs)))
        best = self._score(best_r, budget)
        evals = 1
        seen = {(tuple(actions), knobs)}  # NOTE [ Descent without repeats ]
        improved = True
        while improved and evals < self.descent_evals:
            improved = False
            moves = self._moves(actions, knobs)
            for k, a, k2 in moves:
                if evals >= self.descent_evals:
                    break
                evals += 1
                acts = _edited(actions, k, a)
                key = (tuple(acts), k2)
                if key in seen:
                    continue
                seen.add(key)
                # NOTE [ Bounded simulations ] (memtune.tuner.simulator): None where the move cannot beat the incumbent
                peak_limit = budget if best[0] == 0 else best_r.peak_bytes  # over the budget: no higher peak wins
                r = self.bounded(
                    (*key, self.strips),
                    acts,
                    lambda: self.split(acts, template(k2)),  # noqa: B023 (called at once)
                    peak_limit,
                    best_r.step_ms,
                    0 if best[0] == 0 else best_r.peak_bytes,
                )
                if r is None:
                    continue
                score = self._score(r, budget)
                if score < best:
                    actions, knobs, best, best_r = acts, k2, score, r
                    improved = True
                    break
        return self.split(actions, template(knobs)).model_copy(update={"actions": tuple(actions)}), best_r

    def bounded(
        self,
        key: Hashable,
        actions: Sequence[Action],
        plan: Callable[[], Plan],
        peak_limit: int,
        step_limit: float,
        step_limit_peak: int,
    ) -> SimResult | None:
        """``self.sim.run_bounded(actions, plan(), ...)``, or an answer that decides the same (NOTE [ Descent memo ]).

        # NOTE [ Descent memo ]
        Descents of different trials often price the same plan (on VGG-16 at 13 GiB one simulation in nine), each
        against its own incumbent. A plan's numbers do not depend on the incumbent, so they are kept by ``key`` (its
        actions, knobs and strips): a plan simulated in full is not simulated again, and gives None where
        ``run_bounded`` would (its peak over ``peak_limit``, or its step over ``step_limit`` at a peak of at least
        ``step_limit_peak``), or its numbers; where costs can be negative ``run_bounded`` gives the numbers instead of
        None, and they lose to the incumbent as well. A plan that gave None gives None again under limits at least as
        tight, the cause (its peak, or its step: NOTE [ Bounded simulations ]) being the same; under looser limits it
        is simulated again. Every trial therefore ends where it did.
        """
        held = self._bounded.get(key)
        if isinstance(held, SimResult):
            over = held.peak_bytes > peak_limit
            if over or (held.peak_bytes >= step_limit_peak and held.step_ms > step_limit):
                return None
            return held
        if held is not None and peak_limit <= held[0] and step_limit <= held[1] and step_limit_peak <= held[2]:
            return None
        r = self.sim.run_bounded(
            actions, plan(), peak_limit=peak_limit, step_limit=step_limit, step_limit_peak=step_limit_peak
        )
        self._bounded[key] = r if r is not None else (peak_limit, step_limit, step_limit_peak)
        return r

    def split(self, actions: Sequence[Action], plan: Plan) -> Plan:
        """``plan`` as the descent prices ``actions``: with this trial's strips (NOTE [ Searching splits ])."""
        return with_strips(self.profile, plan, actions, self.strips) if self.strips > 1 else plan

    def _moves(self, actions: list[Action], knobs: _Knobs) -> list[_Move]:
        """Every plan one edit from (``actions``, ``knobs``), in random order (NOTE [ Local descent ]), as edits
        (``_edited`` makes a move's actions: the descent looks at a few moves of the hundred or so it is given)."""
        la, sync, delay, rule, cap = knobs
        moves: list[_Move] = [(k, a, knobs) for k in range(self.n) for a in self.actions[k] if a is not actions[k]]
        moves += [
            (-1, None, (v, sync, delay, rule, cap))
            for v in (la - 2, la - 1, la + 1, la + 2)
            if 0 <= v <= _MAX_LOOKAHEAD
        ]
        if sync == "deferred":
            moves.append((-1, None, (la, "layer", delay, rule, cap)))
        else:  # under "layer" the delay is unused, so flipping to "deferred" tries the short delays as well as its own
            moves += [(-1, None, (la, "deferred", d, rule, cap)) for d in sorted({1, 2, delay}) if d <= _MAX_SYNC_DELAY]
        if sync == "deferred":
            moves += [(-1, None, (la, sync, d, rule, cap)) for d in (delay - 1, delay + 1) if 0 <= d <= _MAX_SYNC_DELAY]
        if self.has_conv_algos:
            moves += [(-1, None, (la, sync, delay, r, None)) for r in _CONV_RULES[:3] if r != rule]
            for c in (cap or (256 << 20)) // 2, (cap or (256 << 20)) * 2, 64 << 20, 1 << 30:
                if 0 < c <= _MAX_WS_CAP_MIB << 20 and (rule, cap) != ("fastest_within", c):
                    moves.append((-1, None, (la, sync, delay, "fastest_within", c)))
        self.rng.shuffle(moves)
        return moves

    def descend_placed(self, start: Candidate, *, max_placed: int = _PLACED_DESCENT) -> Candidate:
        """Hill climbing from ``start`` on step plus the allocator's predicted cost.

        # NOTE [ Placed descent ]
        The trials descend on the simulator alone and only the plan each ends at is priced (NOTE [ Placement
        ranking ]), so a search can settle among plans that the placement model then prices out, and fall back
        to a slower plan that nothing descended from: GPT bf16 b16 at 80% of its peak found plans of 124.5 ms
        simulated, which the ranking priced above 137.2 ms or found out of memory, and returned a 137.2 ms plan
        whose neighbours keep more blocks for free (133.5 ms, no retries predicted). So the best placed plan is
        descended further, one edit at a time: of the edits that fit the search budget and beat the incumbent on
        the simulator alone, the fastest there is priced first, and the first whose simulated step plus priced
        retries beats the incumbent is taken; at most ``max_placed`` placements are modelled in all.
        """
        plan = start.plan
        actions = list(plan.actions)
        knobs = _knobs_of(plan)
        best = start
        placed = 0
        improved = True
        while improved and placed < max_placed:
            improved = False
            # the moves that fit and beat the incumbent on the simulator alone, most promising first
            tried: list[tuple[float, int, Plan, int]] = []
            for i, (k, a, k2) in enumerate(self._moves(actions, knobs)):
                acts = _edited(actions, k, a)
                cand = _with_knobs(plan, acts, k2)
                r = self.sim.run_bounded(acts, cand, peak_limit=self.budget, step_limit=best.step_ms)
                if r is not None and r.step_ms < best.step_ms:
                    tried.append((r.step_ms, i, cand, r.peak_bytes))
            for step_ms, _, cand, peak in sorted(tried, key=lambda x: (x[0], x[1])):
                if placed >= max_placed:
                    break
                placed += 1
                retries, priced, fits = self.placement(cand)
                total = step_ms + priced
                if fits and total < best.step_ms:
                    best = Candidate(
                        "optuna",
                        cand.model_copy(update={"label": "optuna"}),
                        total,
                        peak,
                        True,
                        allocator_ms=priced,
                        alloc_retries=retries,
                    )
                    actions = list(cand.actions)
                    knobs = _knobs_of(cand)
                    plan = cand
                    improved = True
                    break
        return best

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


def _edited(actions: list[Action], k: int, a: Action | None) -> list[Action]:
    """``actions`` with stage ``k``'s action ``a`` (a copy), or ``actions`` itself where ``k`` is -1 (``_Move``)."""
    if k < 0 or a is None:
        return actions
    acts = actions.copy()
    acts[k] = a
    return acts


def _knobs_of(plan: Plan) -> _Knobs:
    """A plan's knobs as the local descent varies them."""
    return plan.prefetch_lookahead, plan.sync, plan.sync_delay, plan.conv_rule, plan.conv_workspace_limit_bytes


def _with_knobs(plan: Plan, actions: Sequence[Action], knobs: _Knobs) -> Plan:
    """``plan`` with ``actions`` and ``knobs`` (not validated again: both come from valid plans' moves). A new global
    lookahead replaces per-stage ones (NOTE [ Prefetch lookahead ] in ``memtune.tuner.plan``)."""
    la, sync, delay, rule, cap = knobs
    return plan.model_copy(
        update={
            "actions": tuple(actions),
            "prefetch_lookahead": la,
            "prefetch_lookaheads": plan.prefetch_lookaheads if la == plan.prefetch_lookahead else None,
            "sync": sync,
            "sync_delay": delay,
            "conv_rule": rule,
            "conv_workspace_limit_bytes": cap,
            "spatial_splits": valid_splits(plan.spatial_splits, actions),  # NOTE [ Searching splits ]
        }
    )


def _params_for(plan: Plan, with_conv: bool = False) -> dict[str, Any]:
    """Express a baseline plan in the search space (explicit per-stage actions)."""
    params: dict[str, Any] = {"threshold": 1.0}
    for k, a in enumerate(plan.actions):
        params[f"a{k:03d}"] = a.value
    params["lookahead"] = min(_MAX_LOOKAHEAD, plan.prefetch_lookahead)
    params["sync"] = plan.sync if plan.sync in _SYNCS else "layer"
    params["sync_delay"] = min(_MAX_SYNC_DELAY, plan.sync_delay)
    params["per_layer_prefetch"] = plan.prefetch_lookaheads is not None
    if with_conv:
        params["conv_rule"] = plan.conv_rule
        cap = plan.conv_workspace_limit_bytes
        params["ws_cap_mib"] = min(_MAX_WS_CAP_MIB, max(1, (cap or (256 << 20)) >> 20))
    return params


def evaluate_seeds(profile: Profile, seeds: Sequence[Plan], budget_bytes: int, sim: Simulator) -> list[Candidate]:
    """Each seed plan as it is, simulated, named ``seed`` (NOTE [ Seeds kept as they are ]).

    # NOTE [ Seeds kept as they are ]
    A seed is enqueued as a trial like a baseline, and a trial records where its descent ends, not its start
    (NOTE [ Local descent ]). The descent ranks by the simulator alone and the end plan is priced once (NOTE
    [ Placement ranking ]), so a seed the allocator model places well can descend to a neighbour it cannot place, and
    no trial then holds the seed. ResNet-50 b256 fp32 on the H200 profile at 40% of its peak, 300 trials,
    ``benchmarks.conv_joint``: the seed (the best plan without algorithm choice, 156.8 ms simulated, 157.5 priced)
    descended to 155.7 ms by keeping one more stage and taking ``fastest_within``; the allocator model found that plan
    out of memory, every feasible trial was slower, and the joint search served 210.7 ms. So each seed is also
    kept as it is, simulated and priced as the baselines are, and ranked beside the trials: the result is never
    worse than a feasible seed, as it is never worse than a feasible baseline.

    Raises:
        PlanError: a seed does not fit the profile (``Plan.check``).
    """
    out = []
    for plan in seeds:
        plan.check(profile)
        r = sim.run(plan)
        out.append(Candidate("seed", plan, r.step_ms, r.peak_bytes, r.peak_bytes <= budget_bytes))
    return out


def evaluate_policies(profile: Profile, budget_bytes: int, sim: Simulator) -> list[Candidate]:
    """Run every baseline policy and simulate its plan."""
    from memtune.tuner.policies import POLICIES

    out = []
    for name, fn in POLICIES.items():
        plan = fn(profile, budget_bytes)
        r = sim.run(plan)
        out.append(Candidate(name, plan, r.step_ms, r.peak_bytes, r.peak_bytes <= budget_bytes))
    return out


def trial_fits(attrs: Mapping[str, Any], budget_bytes: int) -> bool:
    """Whether the trial with user attributes ``attrs`` is feasible as the search judged it (NOTE [ One objective ]):
    its simulated peak fits ``budget_bytes`` (the budget less the headroom) and the allocator model places it."""
    return bool(int(attrs["peak_bytes"]) <= budget_bytes and not attrs.get("allocator_out_of_memory"))


class _Mirror:
    """Writes the finished trials of an in-memory study to the database's study in batches, at most every
    ``interval_s`` seconds (NOTE [ Written behind ]): in a child process when the database is an Optuna
    ``RDBStorage`` (its writes, some 100 ms a trial on PostgreSQL, then run beside the search on another core),
    else here. The search waits while more than ``max_lag`` trials it sent are not in the database yet, so a
    process killed mid-search loses at most ``max_lag`` trials besides those of the last ``interval_s``."""

    interval_s = 1.0
    max_lag = 64

    def __init__(self, kept: optuna.Study, searched: optuna.Study, storage: str | optuna.storages.BaseStorage) -> None:
        self.kept, self.searched = kept, searched
        #: numbers (in ``searched``) of the trials the kept study holds; an enqueued trial has its number before it
        #: runs, so trials do not finish in number order
        self.written = {t.number for t in searched.get_trials(deepcopy=False) if t.state.is_finished()}
        self.last = time.monotonic()
        self._queue: Any = None
        self._writer: Any = None
        self._committed: Any = None  # trials the child has added to the database's study (shared with it)
        url: object = storage if isinstance(storage, str) else getattr(storage, "url", None)
        kwargs: dict[str, Any] | None = {} if isinstance(storage, str) else None
        if isinstance(storage, optuna.storages.RDBStorage):
            kwargs = dict(storage.engine_kwargs)
        if isinstance(url, str) and kwargs is not None and not multiprocessing.current_process().daemon:
            ctx = multiprocessing.get_context("spawn")  # a daemonic process may have no children: it writes itself
            self._queue = ctx.Queue()
            self._committed = ctx.Value("q", len(self.written))
            args = (url, kwargs, kept.study_name, self._queue, self._committed)
            self._writer = ctx.Process(target=_write_trials, args=args, name="memtune-trials", daemon=True)
            self._writer.start()

    def write(self, *, every: bool = False) -> None:
        """Send the trials finished since the last write to the kept study (``every``: whatever the time)."""
        if not every and time.monotonic() - self.last < self.interval_s:
            return
        trials = self.searched.get_trials(deepcopy=False)
        new = [t for t in trials if t.state.is_finished() and t.number not in self.written]
        if new:
            if self._queue is not None:
                self._queue.put(new)
            else:
                self.kept.add_trials(new)
            self.written.update(t.number for t in new)
        self.last = time.monotonic()
        while self.lag() > self.max_lag and self._writer is not None and self._writer.is_alive():
            time.sleep(0.005)  # the database is behind: the search waits for it (the lag stays bounded)

    def lag(self) -> int:
        """Trials sent to the database's study and not yet in it (0 when written here, synchronously)."""
        return 0 if self._committed is None else len(self.written) - int(self._committed.value)

    def close(self) -> None:
        """Write what is left and wait until the kept study holds every trial.

        Raises:
            SearchError: the child process that writes trials failed.
        """
        self.write(every=True)
        if self._writer is None:
            return
        self._queue.put(None)
        self._writer.join()
        if self._writer.exitcode != 0:
            raise SearchError(f"writing the trials to the study's database failed (exit code {self._writer.exitcode})")


def _write_trials(url: str, engine_kwargs: dict[str, Any], study_name: str, queue: Any, committed: Any) -> None:
    """The child of ``_Mirror``: add the trials of each batch from ``queue`` to the study, until None. When the
    searching process is gone (killed), it stops at once: another worker may be resuming the study, and a trial
    written then would be one the resumed search does not know of."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    study = optuna.load_study(study_name=study_name, storage=storage)
    parent = multiprocessing.parent_process()
    while True:
        try:
            batch = queue.get(timeout=0.5)
        except queue_module.Empty:
            if parent is not None and not parent.is_alive():
                return
            continue
        if batch is None:
            return
        for trial in batch:
            if parent is not None and not parent.is_alive():
                return
            study.add_trial(trial)
            with committed.get_lock():
                committed.value += 1


@collecting_less  # NOTE [ Garbage collection in a search ]
def tune(
    profile: Profile,
    budget_bytes: int,
    *,
    trials: int = 300,
    mode: Mode = "fastest",
    seed: int = 0,
    storage: str | optuna.storages.BaseStorage | None = None,
    study_name: str | None = None,
    optimizer: str = "sgd",
    progress: Callable[[int, int, Candidate | None], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    headroom: float = 0.0,
    placement: bool = True,
    seeds: Sequence[Plan] = (),
) -> TuneResult:
    """Search plans for ``profile`` within ``budget_bytes``. See NOTE [ Search space ].

    Args:
        profile: the chain's profile (measured or modeled).
        budget_bytes: GPU memory one training step may use, bytes.
        trials: total Optuna trials for the study (baselines included; earlier trials of a resumed study count).
        mode: ``fastest`` (min step ms subject to peak ≤ budget) or ``pareto`` (min step ms and peak bytes).
        seed: seeds the TPE sampler and the local edits; same seed, same in-memory result.
        storage: an Optuna storage or database URL; with ``study_name``, the study is created or resumed.
        study_name: the study's name in ``storage``.
        optimizer: ``sgd`` (momentum), ``adam`` or ``none`` (optimizer state bytes).
        progress: called after each trial with ``(trials finished, trials, best candidate so far)``.
        should_stop: polled after each trial; returning True stops the search early (e.g. job cancelled).
        headroom: fraction of the budget kept free for the allocator (NOTE [ Headroom ]): a plan is
            feasible when its simulated peak is at most ``budget_bytes * (1 - headroom)``.
        placement: rank the fastest feasible plans by their step plus the allocator retries they are
            predicted to pay under the budget (NOTE [ Placement ranking ]), where the GPU type's calibration
            prices retries; False keeps the simulator's step alone.
        seeds: plans enqueued as first trials beside the baselines, e.g. the best plan of a tighter budget, which
            fits this one too (a sweep's searches then never get worse with more memory). Their actions and knobs
            are taken; per-convolution overrides (``conv_algos``) are outside the search space and dropped.

    Returns:
        A ``TuneResult``: unconstrained step, every baseline, the best plan and the Pareto front.

    Raises:
        SearchError: bad settings (trials < 1, unknown mode, budget not positive).
    """
    if trials < 1:
        raise SearchError(f"trials must be at least 1, not {trials}")
    if mode not in ("fastest", "pareto"):
        raise SearchError(f"mode must be 'fastest' or 'pareto', not {mode!r}")
    if budget_bytes <= 0:
        raise SearchError(f"budget must be positive, not {budget_bytes} bytes")
    if storage is not None and study_name is None:
        raise SearchError("a study in a storage needs a study_name")
    if not 0.0 <= headroom < 1.0:
        raise SearchError(f"headroom must be a fraction in [0, 1), not {headroom}")
    # NOTE [ Headroom ]: the runtime caps the caching allocator's *reserved* bytes; the simulator counts
    # allocated bytes. Near the cap the allocator frees its cache and waits for pending copies, which
    # serialises offloads with compute. Plans are therefore searched against a budget less a calibrated
    # fraction (``memtune.tuner.calibration``); the reported budget stays the one asked for.
    requested_budget = budget_bytes
    budget_bytes = search_budget(budget_bytes, headroom)

    priced = placement and calibration_for(profile.device.key).remap_ms_per_gib is not None
    search = _Search(profile, budget_bytes, mode, seed, optimizer, cap=requested_budget, priced=priced)
    policies = evaluate_policies(profile, budget_bytes, search.sim)
    unconstrained = next(c for c in policies if c.name == "none")
    seeded = evaluate_seeds(profile, seeds, budget_bytes, search.sim)  # NOTE [ Seeds kept as they are ]

    with warnings.catch_warnings():  # the list form of constraints is deprecated in Optuna 5 (NOTE [ One objective ])
        warnings.simplefilter("ignore", FutureWarning)
        sampler = optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=10,
            multivariate=True,
            constraints_func=_constraint_list,
        )
    directions: list[Literal["minimize", "maximize"]] = ["minimize", "minimize"] if mode == "pareto" else ["minimize"]
    kept = optuna.create_study(
        storage=storage, study_name=study_name, sampler=sampler, directions=directions, load_if_exists=True
    )
    with warnings.catch_warnings():  # heartbeat handling is marked experimental in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(kept)
    existing = [t for t in kept.get_trials(deepcopy=False) if t.state.is_finished()]
    if not existing:
        kept.set_user_attr("seed", seed)
        kept.set_user_attr("priced", priced)
    # NOTE [ Written behind ]: a study in a database is searched in memory and its finished trials written to the
    # database in batches by a child process (``_Mirror``): Optuna's RDBStorage commits some 45 times per trial,
    # which made a job 2.6x slower than the same search from the command line. The database can lag the search
    # (a job's progress counts the trials searched) by at most ``_Mirror.max_lag`` trials, the search waiting for it
    # beyond; a job that is killed keeps the trials written before and is searched on from them when resumed, and
    # the writer stops with the process it writes for
    study = kept
    mirror: _Mirror | None = None
    if storage is not None:
        study = optuna.create_study(sampler=sampler, directions=directions)
        study.add_trials(existing)
        mirror = _Mirror(kept, study, storage)
    queue: TrialQueue = (
        deque()
    )  # trials enqueued for the sampler's study (NOTE [ Fixed trials ] in memtune.tuner.trials)
    if not existing:
        seen: set[str] = set()
        for c in policies:
            params = _params_for(c.plan, search.has_conv_algos)
            key = repr(sorted(params.items()))
            if key not in seen:
                seen.add(key)
                queue.append((params, {"policy": c.name}))
        for plan in seeds:
            params = _params_for(plan, search.has_conv_algos)
            key = repr(sorted(params.items()))
            if key not in seen:
                seen.add(key)
                queue.append((params, {"policy": "seed"}))
        if search.has_conv_algos and trials >= 4 * _PRE_TRIALS_MIN:
            # NOTE [ Rule basins ]: a short search without algorithm choice first; its best starts this one
            pre = tune(
                profile.without_conv_algos(),
                requested_budget,
                trials=trials // 4,
                mode=mode,
                seed=seed,
                optimizer=optimizer,
                should_stop=should_stop,
                headroom=headroom,
                placement=False,
            ).best
            if pre is not None:
                queue.append((_params_for(pre.plan, True), {"policy": "no algorithm choice"}))

    # NOTE [ Exact trial count ]: the last of ``trials`` is the served plan, recorded after the search
    finished = sum(1 for t in existing if t.state is TrialState.COMPLETE)
    searched = trials - 1
    remaining = max(0, searched - finished)
    n_baselines = len(policies)
    # NOTE [ Cheap callbacks ]: reading every trial back after each one costs O(n) reads per trial; the callback
    # keeps the incumbent and the count from the trials it sees.
    state: dict[str, Any] = {"done": finished, "seen": 0, "incumbent": search.incumbent(existing), "best": None}

    def callback(trial: FrozenTrial) -> bool:
        state["seen"] += 1
        if mirror is not None:
            mirror.write()
        if trial.state is TrialState.COMPLETE:
            state["done"] += 1
        if trial.state is TrialState.COMPLETE and "peak_bytes" in trial.user_attrs:
            inc = state["incumbent"]
            state["incumbent"] = trial if inc is None else search.better(trial, inc)
            search.note(trial)
            if search.mode == "pareto":
                search.front_pool.append(trial)
        inc = state["incumbent"]
        if inc is not None and search.fits(inc):
            state["best"] = search._candidate(inc)
        done = state["done"]
        if progress is not None:
            progress(min(done, trials), trials, state["best"])
        if done >= searched or (should_stop is not None and should_stop()):
            return True
        if inc is not None and done >= finished + n_baselines + 10 and search.rng.random() < 0.8:
            parent = search.pick_parent(inc)
            queue.append((search.mutate(_params_for(search._candidate(parent).plan, search.has_conv_algos)), None))
        return False

    if remaining > 0 and not (should_stop is not None and should_stop()):
        try:
            run_trials(study, search.objective, remaining, queue, search.distributions(), callback, _constraint_list)
        finally:
            if mirror is not None:
                mirror.close()
    study = kept  # what is served and recorded is the database's study (NOTE [ Written behind ])

    all_trials = study.get_trials(deepcopy=False)
    done_trials = [t for t in all_trials if t.state is TrialState.COMPLETE and "peak_bytes" in t.user_attrs]
    cands = [search._candidate(t) for t in done_trials]
    if priced:  # NOTE [ One objective ]: baselines, and trials of a study searched without prices, are priced here
        policies = [search.price(c) if c.feasible else c for c in policies]
        seeded = [search.price(c) if c.feasible else c for c in seeded]
        cands = [search.price(c) if c.feasible and c.alloc_retries is None else c for c in cands]
    as_is = policies + seeded  # evaluated as they are, beside the trials (NOTE [ Seeds kept as they are ])
    feasible = [c for c in cands + as_is if c.feasible]
    if priced and not feasible:  # the allocator model fits none: keep its ranking, not its verdict
        feasible = [dataclasses.replace(c, feasible=True) for c in cands + as_is if c.peak_bytes <= budget_bytes]
    best: Candidate | None = None
    no_choice: Candidate | None = None
    if feasible:
        best = min(feasible, key=lambda c: (c.step_ms, c.peak_bytes))
        if priced and mode == "fastest":  # NOTE [ Placed descent ]
            best = search.descend_placed(best)
        search.record(study, best)  # NOTE [ One objective ], NOTE [ Exact trial count ]
        if best.name.startswith("trial "):
            best = dataclasses.replace(best, name="optuna")
        framework = [c for c in feasible if leaves_convs_to_framework(c.plan)]
        if search.has_conv_algos and framework and not leaves_convs_to_framework(best.plan):
            no_choice = dataclasses.replace(min(framework, key=lambda c: (c.step_ms, c.peak_bytes)), name=NO_CHOICE)
    elif cands or as_is:  # NOTE [ Exact trial count ]: the plan closest to the budget, recorded as not fitting
        search.record(study, min(cands + as_is, key=lambda c: (c.peak_bytes, c.step_ms)), served=False)
    compiled = compiler_candidates(profile, requested_budget, budget_bytes, optimizer)  # NOTE [ Whole-model compile ]
    fastest = min((c for c in compiled if c.feasible), key=lambda c: (c.step_ms, c.peak_bytes), default=None)
    if fastest is not None and (best is None or fastest.step_ms < best.step_ms):
        best, no_choice = fastest, None
    front = pareto_front(cands + as_is + compiled)
    if profile.modules or profile.compile_budget is not None:  # NOTE [ Module stages ], NOTE [ Compiled stages ]
        unconstrained = _named(unconstrained, profile)  # type: ignore[assignment]
        best, no_choice = _named(best, profile), _named(no_choice, profile)
        policies = [_named(c, profile) for c in policies]  # type: ignore[misc]
        front = [_named(c, profile) for c in front]  # type: ignore[misc]
    return TuneResult(
        profile=profile,
        budget_bytes=requested_budget,
        mode=mode,
        unconstrained=unconstrained,
        policies=policies,
        best=best,
        pareto=front,
        n_trials=len([t for t in study.get_trials(deepcopy=False) if t.state is TrialState.COMPLETE]),
        study_name=study.study_name,
        seed=seed,
        headroom=headroom,
        no_choice=no_choice,
    )


def _contains(d: BaseDistribution, value: Any) -> bool:
    """Whether a categorical distribution holds ``value`` (numbers are clamped to their range by ``_params_for``)."""
    return not isinstance(d, CategoricalDistribution) or value in d.choices


def _constraint_list(t: FrozenTrial) -> list[float]:
    """A trial's constraints in the list form (``CONSTRAINTS`` order) that optuna-dashboard reads."""
    named = t.constraints
    return [float(named.get(k, 0.0)) for k in CONSTRAINTS]


def compiler_candidates(
    profile: Profile, cap_bytes: int, search_budget_bytes: int, optimizer: str = "sgd"
) -> list[Candidate]:
    """Every measured compiler point of ``profile`` as a whole-model compile plan (NOTE [ Whole-model compile ] in
    ``memtune.tuner.whole``), feasible where it runs under the cap (``CompilerPoint.fits``). A point measured with
    another optimizer than ``optimizer`` is priced with the difference in optimizer state (per parameter byte, as the
    simulator counts it): a point measured with SGD serves an Adam plan one parameter copy higher."""
    return [
        Candidate(
            f"compiled whole {p.activation_budget:g}",
            Plan.uniform(profile.n_stages, whole_compile=p.activation_budget, label="compiled whole"),
            p.step_ms,
            p.peak_bytes,
            p.fits(cap_bytes, search_budget_bytes),
            source="measured",
        )
        for p in (_for_optimizer(q, profile.param_bytes, optimizer) for q in profile.compiler_points)
    ]


def _for_optimizer(point: CompilerPoint, param_bytes: int, optimizer: str) -> CompilerPoint:
    """``point`` as its step would hold under ``optimizer``: its peaks moved by the change in optimizer state."""
    extra = int(param_bytes * (OPTIMIZERS[optimizer] - OPTIMIZERS[point.optimizer]))
    if extra == 0:
        return point
    reserved = None if point.reserved_bytes is None else max(1, point.reserved_bytes + extra)
    return point.model_copy(update={"peak_bytes": max(1, point.peak_bytes + extra), "reserved_bytes": reserved})


def _named(c: Candidate | None, profile: Profile) -> Candidate | None:
    return None if c is None else dataclasses.replace(c, plan=c.plan.named(profile))


def leaves_convs_to_framework(plan: Plan) -> bool:
    """Whether ``plan`` runs every convolution with the framework's own algorithm (no algorithm choice)."""
    return plan.conv_rule == "default" and not plan.conv_algos
