"""What a plan costs under ``budget_guard``'s cap: PyTorch's convolutions falling back, and allocator retries.

``predict_capped`` is the prediction ``memtune bench`` and ``benchmarks.repredict`` put beside a capped row: the
simulator on the plan as it will run (``framework_fallback``), plus the allocator retries the placement model
predicts (NOTE [ Allocator placement ] in ``memtune.tuner.placement``) at the GPU type's calibrated price.

# NOTE [ Framework fallback ]
A convolution a plan leaves to the framework (``default``, NOTE [ Convolution choice ]) runs PyTorch's
``run_single_conv`` (ATen ``Conv_v8.cpp``): it runs cuDNN's first heuristic execution plan, and when that
plan's workspace cannot be allocated it tries the next one, and the next, until one fits, and caches it for
that shape and pass. Under ``budget_guard`` a step whose live bytes plus a convolution's workspace exceed the
cap therefore does not run out of memory: it runs a slower convolution with a smaller workspace. The
simulator, which charges every convolution its framework workspace, calls such a plan over the budget.

``framework_fallback`` predicts the fallback with the profile's algorithm tables: where a stage's forward or
backward needs more than the cap (live bytes from the simulator's timeline), each of its framework
convolutions' passes takes the fastest listed algorithm whose workspace fits the room left (the cap less the
other live bytes), the least-workspace one when none does; repeated until nothing changes. The result is the
plan with those algorithms as explicit ``conv_algos``, which the simulator and the placement model price as
usual. cuDNN's heuristic order is not the measured order, so the time is a model; the measured check is in
BENCHMARKS.md (VGG-16 ``save_on_cpu`` under 70% of the peak). The first, not the steady, step chooses (the
choice is cached); the model uses the steady step's memory. Algorithms the plan chooses itself
(``memtune.tuner.runtime.conv``) never fall back: there an over-budget workspace is out of memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from memtune.profiler import ConvAlgo, ConvProfile, Profile
from memtune.tuner._conv_choice import PASSES, choose_algorithms, conv_key, working_algos
from memtune.tuner.placement import PlacementResult, allocator_cost
from memtune.tuner.plan import ConvChoice, Plan
from memtune.tuner.simulator import SimResult, Simulator

__all__ = ["CappedPrediction", "framework_fallback", "predict_capped"]

_ROUNDS = 8  #: re-simulations at most (each round only moves to algorithms that fit the room it saw)
_UNLIMITED = 1 << 62  #: bytes: no workspace limit


def _fitting(conv: ConvProfile, pass_: str, room: int) -> ConvAlgo | None:
    """The fastest working algorithm of ``pass_`` with workspace within ``room`` bytes, else the leanest."""
    usable = working_algos(conv.algos, pass_)
    if not usable:
        return None
    within = [a for a in usable if a.workspace_bytes <= room]
    if within:
        return min(within, key=lambda a: (a.ms or 0.0, a.workspace_bytes, a.algo))
    return min(usable, key=lambda a: (a.workspace_bytes, a.ms or 0.0, a.algo))


def _fallen_back(conv: ConvProfile, passes: tuple[str, ...], room: int, old: ConvChoice | None) -> ConvChoice | None:
    """The triple of ``conv`` when ``passes`` must fit ``room`` bytes: those passes take what fits, the others
    keep an earlier fallback's algorithm or else the fastest one (standing in for the framework's). None when a
    pass has no working algorithm."""
    algos: dict[str, int] = {}
    for p in PASSES:
        if old is not None and p not in passes:
            algos[p] = getattr(old, p)
            continue
        pick = _fitting(conv, p, room if p in passes else _UNLIMITED)
        if pick is None:
            return None
        algos[p] = pick.algo
    return ConvChoice(**algos)


def framework_fallback(profile: Profile, plan: Plan, cap_bytes: int, sim: Simulator | None = None) -> Plan:
    """``plan`` with the algorithms PyTorch's convolution is predicted to fall back to under ``cap_bytes``.

    See NOTE [ Framework fallback ]. Convolutions without an algorithm table, and those the plan already
    chooses, are left as they are; a plan that fits the cap comes back unchanged.

    Args:
        profile: the chain's profile (its ``conv_algos`` tables are the candidates).
        plan: the plan to run under the cap.
        cap_bytes: the cap (``budget_guard``'s budget), bytes.
        sim: a simulator of ``profile`` to reuse (one is made otherwise).

    Returns:
        A plan whose ``conv_algos`` add the fallen-back convolutions (its ``label`` is kept).
    """
    if cap_bytes <= 0:
        raise ValueError(f"cap must be positive, not {cap_bytes} bytes")
    sim = sim or Simulator(profile)
    chosen = set(choose_algorithms(profile, plan))
    by_stage: dict[int, list[ConvProfile]] = {}
    for stage in profile.stages:
        for conv in stage.convs:
            if conv.algos and conv_key(stage.index, conv) not in chosen:
                by_stage.setdefault(stage.index, []).append(conv)
    if not by_stage:
        return plan
    overrides = dict(plan.conv_algos)
    current = plan
    for _ in range(_ROUNDS):
        result = sim.run(current, timeline=True, check=False)
        if result.peak_bytes <= cap_bytes:
            break
        _, _, ws_f, ws_b = sim.stage_costs(current)
        live = {label: bytes_ for _, bytes_, label in result.timeline}
        changed = False
        for k, convs in by_stage.items():
            for phase, ws, passes in (("fwd", ws_f[k], ("fwd",)), ("bwd", ws_b[k], ("bwd_data", "bwd_filter"))):
                need = live.get(f"{phase} {k} start")
                if need is None or need <= cap_bytes or ws == 0:
                    continue
                room = max(0, cap_bytes - (need - ws))
                for conv in convs:
                    key = conv_key(k, conv)
                    new = _fallen_back(conv, passes, room, overrides.get(key))
                    if new is not None and new != overrides.get(key):
                        overrides[key] = new
                        changed = True
        if not changed:
            break
        current = plan.with_(conv_algos=overrides)
    return current


@dataclass(frozen=True)
class CappedPrediction:
    """The prediction for one plan run under a cap.

    Attributes:
        plan: the plan as it is predicted to run (``framework_fallback``'s algorithms added).
        sim: the simulator's step for it.
        placed: the placement model's retries under the cap.
        allocator_ms: what those retries cost per step, ms (None where the GPU type has no price).
        fallbacks: how many convolutions are predicted to fall back.
    """

    plan: Plan
    sim: SimResult
    placed: PlacementResult
    allocator_ms: float | None
    fallbacks: int

    @property
    def step_ms(self) -> float:
        """Simulated step plus the retries' price, ms."""
        return self.sim.step_ms + (self.allocator_ms or 0.0)


def predict_capped(
    profile: Profile, plan: Plan, cap_bytes: int, *, steps: int = 6, optimizer: str = "sgd"
) -> CappedPrediction:
    """Predict ``plan`` under ``cap_bytes``: NOTE [ Framework fallback ], then NOTE [ Allocator placement ].

    Args:
        profile: the chain's profile.
        plan: the plan to run.
        cap_bytes: the cap, bytes.
        steps: training steps the placement model replays (a bench row's warm-up plus timed steps).
        optimizer: ``sgd``, ``adam`` or ``none``.
    """
    sim = Simulator(profile, optimizer)
    run = framework_fallback(profile, plan, cap_bytes, sim)
    placed, alloc_ms = allocator_cost(profile, run, cap_bytes, steps=steps, optimizer=optimizer)
    return CappedPrediction(
        run, sim.run(run, check=False), placed, alloc_ms, len(run.conv_algos) - len(plan.conv_algos)
    )
