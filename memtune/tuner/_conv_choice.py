"""Which cuDNN algorithms a plan gives each convolution: the plan's rule and overrides against the profile.

# NOTE [ Convolution choice ]
A plan's ``conv_rule`` applies to every convolution of the profile and ``conv_algos`` overrides single
convolutions by key ``"<stage index>.<conv name>"`` (NOTE [ Plan semantics ] in ``memtune.tuner.plan``). Each of
the three passes (fwd, bwd_data, bwd_filter) is chosen on its own, among the algorithms the profile
lists as working (status ``ok`` with a time):

* ``default``: no choice; the framework's own algorithm runs (the convolution is not in the result).
* ``fastest``: the least ms (ties: less workspace, then the lower id).
* ``memory_optimal``: the least workspace bytes, then the least ms (vDNN's memory-optimal algorithm).
* ``fastest_within``: the fastest whose workspace is at most ``conv_workspace_limit_bytes``; when no
  algorithm of a pass fits the cap, the memory-optimal one (the cap cannot be met, the least is used).
  Only this rule also weighs the batch-split runs the profile measured (NOTE [ Batch split ] in
  ``memtune.profiler.conv_split``): IMPLICIT_PRECOMP_GEMM in four chunks needs a quarter of its workspace at about the
  same total time, so under a cap it is often far faster than the algorithm that fits unsplit. ``fastest``
  and ``memory_optimal`` are vDNN's performance- and memory-optimal algorithms and stay unsplit.

A convolution whose table lacks a working algorithm for some pass (a modeled profile, a measured one
without ``conv_algos``, or every algorithm failed) keeps the framework's choice under a rule. An override
must name algorithms the table lists as working, else ``PlanError``. The simulator and the runtime
(``memtune.tuner.runtime.conv``) both call ``choose_algorithms``, so a plan means the same to both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from memtune.profiler import ConvAlgo, ConvProfile
from memtune.tuner._tuner_errors import PlanError

if TYPE_CHECKING:
    from memtune.profiler import Profile
    from memtune.tuner.plan import Plan

__all__ = ["PASSES", "ConvTriple", "RuleChoices", "choose_algorithms", "conv_key", "select_algo", "working_algos"]

PASSES = ("fwd", "bwd_data", "bwd_filter")


class ConvTriple(NamedTuple):
    """The algorithms of one convolution's three passes."""

    fwd: ConvAlgo
    bwd_data: ConvAlgo
    bwd_filter: ConvAlgo

    @property
    def workspace_bytes(self) -> int:
        """The largest workspace of the three (the passes run one at a time), bytes."""
        return max(self.fwd.workspace_bytes, self.bwd_data.workspace_bytes, self.bwd_filter.workspace_bytes)

    @property
    def backward_ms(self) -> float:
        """bwd_data + bwd_filter ms."""
        return (self.bwd_data.ms or 0.0) + (self.bwd_filter.ms or 0.0)


def conv_key(stage: int, conv: ConvProfile | str) -> str:
    """The plan's key of a convolution: ``"<stage index>.<conv name>"`` (``"3."`` for a conv stage)."""
    return f"{stage}.{conv if isinstance(conv, str) else conv.name}"


def working_algos(algos: Iterable[ConvAlgo], pass_: str, *, split: bool = False) -> list[ConvAlgo]:
    """The algorithms of ``pass_`` with status ``ok`` and a time; batch-split runs too when ``split``."""
    return [a for a in algos if a.pass_ == pass_ and a.status == "ok" and a.ms is not None and (split or a.split == 1)]


def select_algo(algos: Iterable[ConvAlgo], pass_: str, rule: str, limit_bytes: int | None = None) -> ConvAlgo | None:
    """The algorithm NOTE [ Convolution choice ] picks for one pass; None when none works or rule is default.

    Raises:
        PlanError: ``rule`` is unknown, or ``fastest_within`` without ``limit_bytes``.
    """
    return _pick(working_algos(algos, pass_, split=rule == "fastest_within"), rule, limit_bytes)


def _pick(usable: Sequence[ConvAlgo], rule: str, limit_bytes: int | None) -> ConvAlgo | None:
    """``select_algo`` among ``usable``, the pass's working algorithms (with the batch-split runs for
    ``fastest_within``)."""
    if rule == "default" or not usable:
        return None

    def fastest(a: ConvAlgo) -> tuple[float, int, int, int]:
        return (a.ms or 0.0, a.workspace_bytes, a.algo, a.split)

    def leanest(a: ConvAlgo) -> tuple[int, float, int, int]:
        return (a.workspace_bytes, a.ms or 0.0, a.algo, a.split)

    if rule == "fastest":
        return min(usable, key=fastest)
    if rule == "memory_optimal":
        return min(usable, key=leanest)
    if rule == "fastest_within":
        if limit_bytes is None:
            raise PlanError("conv_rule 'fastest_within' needs conv_workspace_limit_bytes")
        within = [a for a in usable if a.workspace_bytes <= limit_bytes]
        return min(within, key=fastest) if within else min(usable, key=leanest)
    raise PlanError(f"conv_rule {rule!r} is unknown; use default, fastest, memory_optimal or fastest_within")


def _override(key: str, conv: ConvProfile, pass_: str, algo: int, split: int) -> ConvAlgo:
    usable = [a for a in working_algos(conv.algos, pass_, split=True) if a.algo == algo and a.split == split]
    if usable:
        return min(usable, key=lambda a: a.ms or 0.0)
    if not conv.algos:
        raise PlanError(
            f"conv_algos[{key!r}] chooses algorithms but the profile has no algorithm table for this "
            "convolution; measure it on the GPU with conv_algos=True (scripts/profile_zoo.py --conv-algos)"
        )
    listed = sorted({a.algo for a in working_algos(conv.algos, pass_, split=True) if a.split == split})
    at = "" if split == 1 else f" in {split} batch chunks"
    raise PlanError(
        f"conv_algos[{key!r}].{pass_} is {algo}{at}, which the profile does not list as a working {pass_} "
        f"algorithm{at} for this convolution (working: {listed or 'none'})"
    )


def choose_algorithms(profile: Profile, plan: Plan, *, check: bool = True) -> dict[str, ConvTriple]:
    """The algorithm triple of every convolution the plan gives a choice, by NOTE [ Convolution choice ].

    Args:
        profile: the profile whose algorithm tables are chosen from.
        plan: the plan (``conv_rule``, ``conv_workspace_limit_bytes``, ``conv_algos``).
        check: first check that the plan fits the profile (``Plan.check``).

    Returns:
        ``{"<stage>.<conv name>": ConvTriple}`` in forward order; convolutions left to the framework are
        absent (so a ``default`` plan without overrides gives ``{}``).

    Raises:
        PlanError: the plan does not fit the profile, or an override names an algorithm the table does
            not list as working.
    """
    if check:
        plan.check(profile)
    rule, limit = plan.conv_rule, plan.conv_workspace_limit_bytes
    if rule == "default" and not plan.conv_algos:
        return {}
    out: dict[str, ConvTriple] = {}
    for stage in profile.stages:
        for conv in stage.convs:
            key = conv_key(stage.index, conv)
            forced = plan.conv_algos.get(key)
            if forced is not None:
                out[key] = ConvTriple(
                    _override(key, conv, "fwd", forced.fwd, forced.fwd_split),
                    _override(key, conv, "bwd_data", forced.bwd_data, forced.bwd_data_split),
                    _override(key, conv, "bwd_filter", forced.bwd_filter, forced.bwd_filter_split),
                )
                continue
            picked = [select_algo(conv.algos, p, rule, limit) for p in PASSES]
            if picked[0] is not None and picked[1] is not None and picked[2] is not None:
                out[key] = ConvTriple(picked[0], picked[1], picked[2])
    return out


class RuleChoices:
    """``choose_algorithms`` for many plans of one profile: each convolution's working algorithms per pass are
    listed once, not per plan (the budget bound prices every workspace cap of a profile, some 330 for VGG-16).

    Args:
        profile: the profile whose algorithm tables are chosen from.
    """

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        convs = [(conv_key(st.index, c), c) for st in profile.stages for c in st.convs]
        self._working = {
            split: [(key, [working_algos(c.algos, p, split=split) for p in PASSES]) for key, c in convs]
            for split in (False, True)
        }

    def choose(self, plan: Plan) -> dict[str, ConvTriple]:
        """What ``choose_algorithms(profile, plan, check=False)`` returns."""
        rule, limit = plan.conv_rule, plan.conv_workspace_limit_bytes
        if plan.conv_algos or rule == "default":
            return choose_algorithms(self.profile, plan, check=False)
        out: dict[str, ConvTriple] = {}
        for key, usable in self._working[rule == "fastest_within"]:
            f, d, w = (_pick(u, rule, limit) for u in usable)
            if f is not None and d is not None and w is not None:
                out[key] = ConvTriple(f, d, w)
        return out
