"""The plan schema and NOTE [ Plan semantics ]."""

from __future__ import annotations

import pytest
from chains import linear_chain
from pydantic import ValidationError

from memtune.profiler._profile import SavedStorage
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Action, Plan, resolve_storages, segments


def test_segments_are_maximal_runs() -> None:
    acts = Plan.from_actions("krrkorrrk").actions
    assert segments(acts) == [(1, 2), (5, 7)]
    assert segments(Plan.from_actions("rrr").actions) == [(0, 2)]
    assert segments(Plan.from_actions("kok").actions) == []


def test_json_round_trip_and_versioning() -> None:
    plan = Plan.from_actions("kor", prefetch_lookahead=3, sync="layer", label="x")
    assert Plan.model_validate_json(plan.model_dump_json()) == plan
    with pytest.raises(ValidationError, match="schema_version"):
        Plan.model_validate({"schema_version": 9, "actions": ["keep"]})
    with pytest.raises(ValidationError):
        Plan.model_validate({"actions": ["keep"], "surprise": 1})
    with pytest.raises(ValidationError):
        Plan.model_validate({"actions": ["stash"]})


def test_knob_validation() -> None:
    with pytest.raises(ValidationError, match="sync_points"):
        Plan.from_actions("kk", sync="points")
    with pytest.raises(ValidationError, match="increasing"):
        Plan.from_actions("kkk", sync="points", sync_points=(2, 1))
    with pytest.raises(ValidationError, match="conv_workspace_limit_bytes"):
        Plan.from_actions("k", conv_rule="fastest_within")
    with pytest.raises(ValidationError):
        Plan.from_actions("k", prefetch_lookahead=-1)


def test_check_names_the_mismatch() -> None:
    p = linear_chain(4)
    with pytest.raises(PlanError, match="3 actions but 'linear-chain' has 4 stages"):
        Plan.from_actions("kkk").check(p)
    with pytest.raises(PlanError, match="outside the stage range"):
        Plan.from_actions("kkkk", sync="points", sync_points=(7,)).check(p)
    with pytest.raises(PlanError, match="no convolution"):
        Plan.from_actions("kkkk", conv_algos={"1.conv": {"fwd": 1, "bwd_data": 1, "bwd_filter": 1}}).check(p)


def test_storage_fates_follow_the_rules() -> None:
    p = linear_chain(5)  # storage k = x_k, saved by stage k+1
    fates = resolve_storages(p, Plan.from_actions("kokrk").actions)
    # x_0 saved by stage 1 (offload) -> offloaded; x_1 saved by 2 (keep) -> kept
    assert fates[0].fate == "offload" and fates[0].copied and fates[0].need == 1
    assert fates[1].fate == "keep" and not fates[1].copied
    # x_2 is saved by stage 3 (recompute): the segment 3..3 saves its input x_2 with stage 2's action (keep)
    assert fates[2].fate == "keep" and fates[2].need == 3
    # x_3 saved by stage 4 (keep)
    assert fates[3].fate == "keep"
    # the last output is saved by nobody
    assert fates[4].fate == "none"


def test_mixed_references_keep_but_copy() -> None:
    p = linear_chain(4)
    shared = p.model_copy(update={"storages": (SavedStorage(bytes=10, saved_by=(1, 2), producer=0), *p.storages[1:])})
    fate = resolve_storages(shared, (Action.KEEP, Action.OFFLOAD, Action.KEEP, Action.KEEP))[0]
    assert fate.fate == "keep" and fate.copied
    fate = resolve_storages(shared, (Action.KEEP, Action.OFFLOAD, Action.OFFLOAD, Action.KEEP))[0]
    assert fate.fate == "offload" and fate.need == 2 and fate.release == 1
