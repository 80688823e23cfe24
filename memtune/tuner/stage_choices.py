"""The actions a search offers each stage of a profile, and the costs that decide them: what ``selective`` frees
against ``keep`` and whether it beats a one-stage ``recompute`` (NOTE [ Selective stages ] in
``memtune.profiler.selective``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memtune.tuner.plan import Action

if TYPE_CHECKING:
    from memtune.profiler import Profile

__all__ = ["selective_gain_bytes", "selective_pays", "stage_actions"]


def selective_gain_bytes(profile: Profile, k: int) -> int:
    """What making stage ``k`` ``selective`` frees against ``keep``, bytes: the storages only it saves (its input
    aside) less what it keeps under selective checkpointing (NOTE [ Selective stages ] in
    ``memtune.profiler.selective``);
    0 where the profile did not measure it so, or the stage writes its input in place."""
    st = profile.stages[k]
    if not st.selective_measured or st.inplace or st.selective_saved_bytes is None:
        return 0
    inputs = set(profile.stage_inputs(k))
    own = sum(s.bytes for sid, s in enumerate(profile.storages) if s.saved_by == (k,) and sid not in inputs)
    return max(0, own - st.selective_saved_bytes)


def selective_pays(profile: Profile, k: int) -> bool:
    """Whether ``selective`` can beat ``recompute`` at stage ``k``: it frees memory (``selective_gain_bytes`` > 0)
    and its extra time (forward and backward, measured) is less than a one-stage recompute segment's re-run
    (measured, else the stage's forward; NOTE [ Recompute priced as measured ] in ``memtune.tuner.simulator``), which
    frees at least as much (everything the stage alone saves, holding the same input).
    Where it costs more, recompute frees more for less, and offering the action only dilutes the search: with
    GPT bf16's measured costs (4.0 ms extra against a 1.3 ms forward) the search at 80% of the peak ended at
    136.6 ms simulated instead of 130.75."""
    if selective_gain_bytes(profile, k) <= 0:
        return False
    st = profile.stages[k]
    rerun = st.forward_ms if st.recompute_extra_ms is None else st.recompute_extra_ms
    return sum(st.selective_extra_ms) < rerun


def stage_actions(profile: Profile) -> list[tuple[Action, ...]]:
    """Per stage, the actions a search gives it: ``keep``, ``offload`` and ``recompute``, and ``selective`` where
    it can beat recompute (``selective_pays``)."""
    plain = (Action.KEEP, Action.OFFLOAD, Action.RECOMPUTE)
    with_selective = (*plain, Action.SELECTIVE)
    return [with_selective if selective_pays(profile, k) else plain for k in range(profile.n_stages)]
