"""Plan search with Optuna: the fastest plan within a budget, or the time–memory Pareto front.

# NOTE [ Search space ]
A trial chooses a cumulative-threshold value ``threshold`` (Layup's rule, ``memtune.tuner.policies.layup_cumulative``,
gives every stage a default action), an override per stage ``aNNN`` in {auto, keep, offload, recompute}, and
``selective`` for the stages where it can beat recompute (``memtune.tuner.stage_choices.stage_actions``),
``lookahead`` (prefetch stages), ``sync`` (deferred or layer) and ``sync_delay`` (stages a deferred copy may
overlap before compute waits for it). ``auto`` takes the threshold rule's action,
so the search starts from the published policy and edits it stage by stage. ``per_layer_prefetch`` (a boolean)
replaces, once a trial's descent has ended, the global lookahead by the per-layer trigger's per-stage lookaheads
(NOTE [ Per-layer prefetch trigger ] in ``memtune.tuner._prefetch_trigger``) where that scores better; only where the
trigger can help (the plan is over the budget or stalls in its backward), so it costs a fraction of the trials' time.
Where the profile records row maps, each trial's descent also splits recompute segments into strips of rows, and
the counts are refined per segment after it (NOTE [ Searching splits ] in ``memtune.tuner._spatial_search``).

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

Seeds: ``tune``, ``memtune tune`` and a job (``memtune.api.service.worker.job_seed``) all search with ``DEFAULT_SEED``
unless told otherwise, and a study in a database keeps its seed as the study attribute ``seed``: the same request gives
the same plan from the command line and from the service.

With ``storage`` and ``study_name`` the study lives in a database (Optuna ``RDBStorage``): it is created or
resumed, finished trials count toward ``trials``, stale running trials of dead workers are failed (Optuna
heartbeat), and several processes may work on one study.

The search's parts: the result types and the rules that read them are in ``memtune.tuner._search_results``, the
space's ranges and a trial's parameters as a plan in ``memtune.tuner._search_space``, the baselines and seeds a search
starts from in ``memtune.tuner._search_seeds`` (NOTE [ Seeds kept as they are ]), the state of one search (the
objective, pricing, NOTE [ Placement ranking ], and the local edits, NOTE [ Rule basins ]) in
``memtune.tuner._search_state``, its local descent (NOTE [ Local descent ], NOTE [ Descent memo ], NOTE [ Placed
descent ]) in ``memtune.tuner._search_descent``, and the studies and their writer (NOTE [ Written behind ]) in
``memtune.tuner._search_study``. ``tune`` here runs them in order.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from memtune.profiler import Profile
from memtune.tuner._collection import collecting_less
from memtune.tuner._search_results import (
    CONSTRAINTS,
    Candidate,
    Mode,
    TuneResult,
    _named,
    compiler_candidates,
    leaves_convs_to_framework,
    pareto_front,
    trial_fits,
)
from memtune.tuner._search_seeds import evaluate_policies, evaluate_seeds, first_trials
from memtune.tuner._search_space import _params_for, decode_params
from memtune.tuner._search_state import SearchState as _Search
from memtune.tuner._search_study import Studies, _constraint_list, open_study
from memtune.tuner._trials import TrialQueue, run_trials
from memtune.tuner._tuner_errors import SearchError
from memtune.tuner.budget import search_budget
from memtune.tuner.calibration import Calibration, calibration_for
from memtune.tuner.plan import Plan

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

_PRE_TRIALS_MIN = 10  # NOTE [ Rule basins ]: fewest trials of the search without algorithm choice
DEFAULT_SEED = 0
"""The seed of ``tune``, ``memtune tune`` and every job (NOTE [ One objective ]): same request, same plan."""
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
job's measured validation runs it with its top plans (NOTE [ Measured validation ] in ``memtune.api.service.worker``).
The plan served for the GPU type is the fastest measured one, so algorithm choice is only served where the GPU measured
it faster.
"""


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
    calibration: Calibration | None = None,
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
        calibration: the GPU type's calibration every simulator and price of the search uses (its compute scale,
            its allocator price); None looks it up once with ``calibration_for(profile.device.key)`` (NOTE
            [ Calibration is an input ] in ``memtune.tuner.calibration``). ``headroom`` is given apart: a caller
            that wants the calibration's passes ``calibration.headroom`` (or ``planning_headroom``).

    Returns:
        A ``TuneResult``: unconstrained step, every baseline, the best plan and the Pareto front.

    Raises:
        SearchError: bad settings (trials < 1, unknown mode, budget not positive).
    """
    _check_settings(trials, mode, budget_bytes, storage, study_name, headroom)
    # NOTE [ Headroom ]: the runtime caps the caching allocator's *reserved* bytes; the simulator counts
    # allocated bytes. Near the cap the allocator frees its cache and waits for pending copies, which
    # serialises offloads with compute. Plans are therefore searched against a budget less a calibrated
    # fraction (``memtune.tuner.calibration``); the reported budget stays the one asked for.
    requested_budget = budget_bytes
    budget_bytes = search_budget(budget_bytes, headroom)

    # NOTE [ Calibration is an input ]: looked up here at the latest, once; below, every simulator gets this one
    cal = calibration if calibration is not None else calibration_for(profile.device.key)
    priced = placement and cal.remap_ms_per_gib is not None
    search = _Search(profile, budget_bytes, mode, seed, optimizer, cap=requested_budget, priced=priced, calibration=cal)
    policies = evaluate_policies(profile, budget_bytes, search.sim)
    unconstrained = next(c for c in policies if c.name == "none")
    seeded = evaluate_seeds(profile, seeds, budget_bytes, search.sim)  # NOTE [ Seeds kept as they are ]

    studies = open_study(storage, study_name, seed, mode, priced)
    # trials enqueued for the sampler's study (NOTE [ Fixed trials ] in memtune.tuner._trials)
    queue: TrialQueue = deque()
    if not studies.existing:
        queue = first_trials(policies, seeds, search.has_conv_algos)
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
                calibration=cal,
            ).best
            if pre is not None:
                queue.append((_params_for(pre.plan, True), {"policy": "no algorithm choice"}))
    _search_trials(search, studies, queue, trials, len(policies), progress, should_stop)
    return _served(search, studies.kept, unconstrained, policies, seeded, seed=seed, headroom=headroom)


def _check_settings(
    trials: int,
    mode: str,
    budget_bytes: int,
    storage: str | optuna.storages.BaseStorage | None,
    study_name: str | None,
    headroom: float,
) -> None:
    """Refuse bad settings of ``tune`` (the budget in bytes, the headroom a fraction).

    Raises:
        SearchError: trials < 1, unknown mode, budget not positive, a storage without a study name, or a headroom
            outside [0, 1).
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


def _search_trials(
    search: _Search,
    studies: Studies,
    queue: TrialQueue,
    trials: int,
    n_baselines: int,
    progress: Callable[[int, int, Candidate | None], None] | None,
    should_stop: Callable[[], bool] | None,
) -> None:
    """Run the trials ``studies.searched`` still needs, less the served plan's (NOTE [ Exact trial count ]), then
    write the last trials to the kept study (NOTE [ Written behind ])."""
    # NOTE [ Exact trial count ]: the last of ``trials`` is the served plan, recorded after the search
    finished = sum(1 for t in studies.existing if t.state is TrialState.COMPLETE)
    searched = trials - 1
    remaining = max(0, searched - finished)
    callback = _Callback(search, studies, queue, trials, finished, n_baselines, progress, should_stop)
    if remaining > 0 and not (should_stop is not None and should_stop()):
        try:
            run_trials(
                studies.searched,
                search.objective,
                remaining,
                queue,
                search.distributions(),
                callback,
                _constraint_list,
            )
        finally:
            if studies.mirror is not None:
                studies.mirror.close()


# NOTE [ Cheap callbacks ]: reading every trial back after each one costs O(n) reads per trial; the callback
# keeps the incumbent and the count from the trials it sees.
class _Callback:
    """Called after each trial: keeps the incumbent, reports progress, says when to stop, and enqueues a local edit
    of the incumbent (or of another parent, NOTE [ Rule basins ]) most of the time."""

    def __init__(
        self,
        search: _Search,
        studies: Studies,
        queue: TrialQueue,
        trials: int,
        finished: int,
        n_baselines: int,
        progress: Callable[[int, int, Candidate | None], None] | None,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        self.search, self.mirror, self.queue = search, studies.mirror, queue
        self.trials, self.searched, self.finished, self.n_baselines = trials, trials - 1, finished, n_baselines
        self.progress, self.should_stop = progress, should_stop
        #: trials complete, the incumbent trial and the best feasible candidate so far
        self.done = finished
        self.incumbent: FrozenTrial | None = search.incumbent(studies.existing)
        self.best: Candidate | None = None

    def __call__(self, trial: FrozenTrial) -> bool:
        search = self.search
        if self.mirror is not None:
            self.mirror.write()
        if trial.state is TrialState.COMPLETE:
            self.done += 1
        if trial.state is TrialState.COMPLETE and "peak_bytes" in trial.user_attrs:
            inc = self.incumbent
            self.incumbent = trial if inc is None else search.better(trial, inc)
            search.note(trial)
            if search.mode == "pareto":
                search.front_pool.append(trial)
        inc = self.incumbent
        if inc is not None and search.fits(inc):
            self.best = search._candidate(inc)
        done = self.done
        if self.progress is not None:
            self.progress(min(done, self.trials), self.trials, self.best)
        if done >= self.searched or (self.should_stop is not None and self.should_stop()):
            return True
        if inc is not None and done >= self.finished + self.n_baselines + 10 and search.rng.random() < 0.8:
            parent = search.pick_parent(inc)
            self.queue.append((search.mutate(_params_for(search._candidate(parent).plan, search.has_conv_algos)), None))
        return False


def _served(
    search: _Search,
    study: optuna.Study,
    unconstrained: Candidate,
    policies: list[Candidate],
    seeded: list[Candidate],
    *,
    seed: int,
    headroom: float,
) -> TuneResult:
    """What ``tune`` returns once the trials are done: the best plan of the trials, baselines, seeds and measured
    compile plans, recorded in ``study`` as its last trial (NOTE [ Exact trial count ]), and the Pareto front."""
    profile, budget_bytes, mode, priced = search.profile, search.budget, search.mode, search.priced
    all_trials = study.get_trials(deepcopy=False)
    done_trials = [t for t in all_trials if t.state is TrialState.COMPLETE and "peak_bytes" in t.user_attrs]
    cands = [search._candidate(t) for t in done_trials]
    if priced:  # NOTE [ One objective ]: baselines, and trials of a study searched without prices, are priced here
        policies = [search.price(c) if c.feasible else c for c in policies]
        seeded = [search.price(c) if c.feasible else c for c in seeded]
        cands = [search.price(c) if c.feasible and c.alloc_retries is None else c for c in cands]
    as_is = policies + seeded  # evaluated as they are, beside the trials (NOTE [ Seeds kept as they are ])
    best, no_choice = _best_recorded(search, study, cands, as_is)
    compiled = compiler_candidates(profile, search.cap, budget_bytes, search.optimizer)  # NOTE [ Whole-model compile ]
    fastest = min((c for c in compiled if c.feasible), key=lambda c: (c.step_ms, c.peak_bytes), default=None)
    if fastest is not None and (best is None or fastest.step_ms < best.step_ms):
        best, no_choice = fastest, None
    front = pareto_front(cands + as_is + compiled)
    if profile.modules or profile.compile_budget is not None:  # NOTE [ Module stages ], NOTE [ Compiled stages ]
        unconstrained = _named(unconstrained, profile)  # type: ignore[assignment]
        best, no_choice = _named(best, profile), _named(no_choice, profile)
        policies = [_named(c, profile) for c in policies]  # type: ignore[misc]
        front = [_named(c, profile) for c in front]  # type: ignore[misc]
        compiled = [_named(c, profile) for c in compiled]  # type: ignore[misc]
    return TuneResult(
        profile=profile,
        budget_bytes=search.cap,
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
        compiled=compiled,
    )


def _best_recorded(
    search: _Search, study: optuna.Study, cands: list[Candidate], as_is: list[Candidate]
) -> tuple[Candidate | None, Candidate | None]:
    """The best feasible plan of the trials (``cands``) and of the plans evaluated as they are (``as_is``), descended
    further where placements are priced (NOTE [ Placed descent ]) and recorded in ``study``, and the best that leaves
    every convolution to the framework where the best does not (NOTE [ Measured selection ]); (None, None) where no
    plan fits, the plan closest to the budget then recorded as not fitting."""
    priced, budget_bytes = search.priced, search.budget
    feasible = [c for c in cands + as_is if c.feasible]
    if priced and not feasible:  # the allocator model fits none: keep its ranking, not its verdict
        feasible = [dataclasses.replace(c, feasible=True) for c in cands + as_is if c.peak_bytes <= budget_bytes]
    best: Candidate | None = None
    no_choice: Candidate | None = None
    if feasible:
        best = min(feasible, key=lambda c: (c.step_ms, c.peak_bytes))
        if priced and search.mode == "fastest":  # NOTE [ Placed descent ]
            best = search.descend_placed(best)
        search.record(study, best)  # NOTE [ One objective ], NOTE [ Exact trial count ]
        if best.name.startswith("trial "):
            best = dataclasses.replace(best, name="optuna")
        framework = [c for c in feasible if leaves_convs_to_framework(c.plan)]
        if search.has_conv_algos and framework and not leaves_convs_to_framework(best.plan):
            no_choice = dataclasses.replace(min(framework, key=lambda c: (c.step_ms, c.peak_bytes)), name=NO_CHOICE)
    elif cands or as_is:  # NOTE [ Exact trial count ]: the plan closest to the budget, recorded as not fitting
        search.record(study, min(cands + as_is, key=lambda c: (c.peak_bytes, c.step_ms)), served=False)
    return best, no_choice
