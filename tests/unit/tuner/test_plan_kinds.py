"""NOTE [ Plan kinds ]: ``Plan.kind`` read off the fields, each kind refusing the fields it forbids with the validator's
message, and every stored plan of the repository loading with the kind its fields say."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from memtune.tuner.plan import Action, ConvChoice, Plan, PlanKind

REPO = Path(__file__).resolve().parents[3]
STAGES = ("embed", "block", "head")


def _refused(match: str, **fields: Any) -> None:
    with pytest.raises(ValidationError, match=match):
        Plan.model_validate(fields)


def test_chain() -> None:
    plan = Plan.from_actions("kors", spatial_splits={"2-2": 2}, conv_rule="fastest")
    assert plan.kind is PlanKind.CHAIN
    _refused(r"eager_stages .* needs compile_budget and stages", actions=["keep"] * 3, eager_stages=[1])
    _refused(r"compile_saves .* needs compile_budget", actions=["keep"] * 3, compile_saves="compute")


def test_compiled_chain() -> None:
    plan = Plan.from_actions("kor", compile_budget=0.5, compile_saves="compute")
    assert plan.kind is PlanKind.COMPILED_CHAIN
    base = {"actions": ["keep", "offload", "recompute"], "compile_budget": 0.5}
    _refused(r"stage 1 is 'selective', which a compiled plan cannot take", **{**base, "actions": ["keep", "selective"]})
    _refused("a compiled plan leaves convolutions to the compiler", **base, conv_rule="fastest")
    _refused("a compiled plan leaves convolutions to the compiler", **base, conv_algos={"0.c": ConvChoice(
        fwd=0, bwd_data=0, bwd_filter=0).model_dump()})  # fmt: skip
    _refused("runs its stages compiled; spatial splitting applies to eager chain plans only", **{
        **base, "actions": ["keep", "recompute", "keep"]}, spatial_splits={"1-1": 2})  # fmt: skip
    _refused(r"eager_stages .* needs compile_budget and stages", **base, eager_stages=[1])


def test_module_stages() -> None:
    plan = Plan.from_actions("ksr", stages=STAGES)
    assert plan.kind is PlanKind.MODULE_STAGES
    base = {"actions": ["keep", "recompute", "keep"], "stages": STAGES}
    _refused("names module stages .* spatial splitting applies to eager chain plans only", **base,
             spatial_splits={"1-1": 2})  # fmt: skip
    _refused(r"eager_stages .* needs compile_budget and stages", **base, eager_stages=[1])
    _refused(r"compile_saves .* needs compile_budget", **base, compile_saves="compute")
    _refused("plan names 2 stages but has 3 actions", **{**base, "stages": STAGES[:2]})


def test_compiled_regions() -> None:
    plan = Plan.from_actions("kor", stages=STAGES, compile_budget=0.0, compile_saves="compute", eager_stages=(1,))
    assert plan.kind is PlanKind.COMPILED_REGIONS
    base = {"actions": ["keep", "offload", "keep"], "stages": STAGES, "compile_budget": 0.0}
    _refused(r"stage 2 is 'selective', which a compiled plan cannot take", **{
        **base, "actions": ["keep", "offload", "selective"]})  # fmt: skip
    _refused("a compiled plan leaves convolutions to the compiler", **base, conv_rule="memory_optimal")
    _refused("names module stages", **{**base, "actions": ["keep", "recompute", "keep"]}, spatial_splits={"1-1": 2})
    _refused("outside the stage range 0..2", **base, eager_stages=[3])


def test_whole_compile() -> None:
    assert Plan.uniform(3, whole_compile=0.5).kind is PlanKind.WHOLE_COMPILE
    assert Plan.uniform(3, whole_compile=0.5, stages=STAGES).kind is PlanKind.WHOLE_COMPILE
    base = {"actions": ["keep"] * 3, "whole_compile": 0.5}
    _refused(r"stage 1 is 'offload': a plan that compiles the whole model keeps every stage", **{
        **base, "actions": ["keep", "offload", "keep"]})  # fmt: skip
    _refused("whole_compile excludes compile_budget", **base, compile_budget=0.5)
    _refused("whole_compile excludes compile_budget and convolution choices", **base, conv_rule="fastest")
    _refused(r"compile_saves .* needs compile_budget", **base, compile_saves="compute")
    _refused(r"eager_stages .* needs compile_budget and stages", **base, stages=STAGES, eager_stages=[0])
    _refused("is not a recompute segment of the plan", **base, spatial_splits={"1-1": 2})


def test_kind_follows_a_change_and_is_not_stored() -> None:
    """``with_`` and ``model_copy`` change the kind with the fields; the kind is in no dump and no schema (the JSON and
    the service's OpenAPI are the fields)."""
    chain = Plan.from_actions("kok")
    assert chain.with_(stages=STAGES).kind is PlanKind.MODULE_STAGES
    assert chain.model_copy(update={"compile_budget": 1.0}).kind is PlanKind.COMPILED_CHAIN
    assert chain.with_(actions=(Action.KEEP,) * 3, whole_compile=1.0).kind is PlanKind.WHOLE_COMPILE
    assert chain.kind == "chain"  # a str enum: its value compares equal
    assert "kind" not in chain.model_dump() and "kind" not in json.loads(chain.model_dump_json())
    assert "kind" not in Plan.model_json_schema()["properties"]


def _kind_by_flags(raw: dict[str, Any]) -> PlanKind:
    """A stored plan's kind read from its raw JSON, apart from ``Plan.kind``."""
    if raw.get("whole_compile") is not None:
        return PlanKind.WHOLE_COMPILE
    compiled = raw.get("compile_budget") is not None
    if raw.get("stages") is None:
        return PlanKind.COMPILED_CHAIN if compiled else PlanKind.CHAIN
    return PlanKind.COMPILED_REGIONS if compiled else PlanKind.MODULE_STAGES


def _stored_plans(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object in ``node`` that is a stored plan: a ``schema_version`` and a list of ``actions``."""
    if isinstance(node, dict):
        if "schema_version" in node and isinstance(node.get("actions"), list):
            yield where, node
        for key, value in node.items():
            yield from _stored_plans(value, f"{where}/{key}")
    elif isinstance(node, list):
        for k, value in enumerate(node):
            yield from _stored_plans(value, f"{where}[{k}]")


def _holds(dumped: Any, raw: Any) -> bool:
    """Whether ``dumped`` has every value ``raw`` stores (it may add fields written since, with their defaults)."""
    if isinstance(raw, dict):
        return isinstance(dumped, dict) and all(k in dumped and _holds(dumped[k], v) for k, v in raw.items())
    return bool(dumped == raw)


def test_every_stored_plan_loads_with_the_kind_of_its_fields() -> None:
    """The plans under tests/ and benchmarks/results/ validate, keep every stored value through a dump, and have the
    kind their fields say. The cut-point plans of an earlier schema (``segment_starts``, a field no plan of this
    version has) are the only ones left out, and they are counted so that no other plan is left out unseen."""
    fields = set(Plan.model_fields)
    kinds: dict[PlanKind, int] = {}
    old: set[str] = set()
    for path in sorted(p for root in ("tests", "benchmarks/results") for p in (REPO / root).rglob("*.json")):
        for where, raw in _stored_plans(json.loads(path.read_text()), str(path.relative_to(REPO))):
            if set(raw) - fields:
                assert set(raw) - fields == {"segment_starts"}, where
                old.add(str(path.relative_to(REPO)))
                continue
            plan = Plan.model_validate(raw)
            assert plan.kind is _kind_by_flags(raw), where
            dumped = plan.model_dump(mode="json")
            assert _holds(dumped, raw) and Plan.model_validate(dumped) == plan, where
            kinds[plan.kind] = kinds.get(plan.kind, 0) + 1
    assert old == {"benchmarks/results/bench-gpt-b16-bfloat16-cuts.json"}
    assert {PlanKind.CHAIN, PlanKind.COMPILED_CHAIN, PlanKind.MODULE_STAGES, PlanKind.WHOLE_COMPILE} <= set(kinds)
    assert sum(kinds.values()) > 500
