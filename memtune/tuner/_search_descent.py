"""The local descent of the plan search (NOTE [ Local descent ]): first-improvement hill climbing from a trial's
start plan in the simulator, with its memo (NOTE [ Descent memo ]), and the placed descent that goes on from the best
plan on step plus the allocator's predicted cost (NOTE [ Placed descent ]).

``LocalDescent`` is the half of the search's state (``memtune.tuner._search_state.SearchState``) that descends; it
reads the attributes declared on it, which ``SearchState`` sets. Steps are in ms, peaks and budgets in bytes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence

from memtune.profiler import Profile
from memtune.tuner._search_results import Candidate
from memtune.tuner._search_space import (
    _CONV_RULES,
    _MAX_LOOKAHEAD,
    _MAX_SYNC_DELAY,
    _MAX_WS_CAP_MIB,
    _edited,
    _Knobs,
    _knobs_of,
    _Move,
    _with_knobs,
)
from memtune.tuner._spatial_search import with_strips
from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import SimResult, Simulator

__all__ = ["LocalDescent"]

_PLACED_DESCENT = 40  # NOTE [ Placed descent ]: most placements the descent after the ranking models


class LocalDescent:
    """The search state's descent: what a trial's descent and the placed descent do with the attributes below."""

    profile: Profile
    n: int
    budget: int
    sim: Simulator
    rng: random.Random
    #: per stage, the actions it may take (``memtune.tuner.stage_choices.stage_actions``)
    actions: list[tuple[Action, ...]]
    has_conv_algos: bool
    #: most simulations of one trial's descent
    descent_evals: int
    #: the rows strips of this trial's descent (NOTE [ Searching splits ])
    strips: int
    _templates: dict[_Knobs, Plan]
    _bounded: dict[Hashable, SimResult | tuple[int, float, int]]

    def placement(self, plan: Plan) -> tuple[float, float, bool]:
        """``plan``'s predicted retries per step, their price in ms, and whether the allocator model places it."""
        raise NotImplementedError

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
