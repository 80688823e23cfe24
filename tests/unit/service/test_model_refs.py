"""``memtune.api.service.model_refs``: the builder a worker hands to a fresh measuring process is text plus a
module-level function (NOTE [ Bench isolation ]), and it builds the model that was stored."""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime
from typing import Any, Literal

import pytest
from service_fixtures import SMALL_SPEC

from memtune.api.service.model_refs import build_stored_chain, stored_chain_builder
from memtune.profiler.chain import ModelChain
from memtune.profiler.spec import from_spec
from memtune.profiler.zoo import build
from memtune.storage.records import ModelRecord


def _record(kind: Literal["zoo", "spec"], definition: dict[str, Any]) -> ModelRecord:
    return ModelRecord("m1", "m", kind, "d" * 64, definition, None, datetime.now(UTC))


def _shapes(chain: ModelChain) -> list[tuple[int, ...]]:
    return [tuple(p.shape) for p in chain.as_sequential().parameters()]


def test_the_builder_survives_pickling_and_builds_the_stored_zoo_model() -> None:
    params = {"image_size": 32, "num_classes": 10}
    builder = stored_chain_builder(_record("zoo", {"zoo": "resnet18", "params": params}))
    copy = pickle.loads(pickle.dumps(builder))
    assert all(isinstance(a, str) for a in copy.args)  # only text crosses the process boundary
    assert _shapes(copy()) == _shapes(build("resnet18", params))


def test_the_builder_builds_a_stored_spec_model() -> None:
    builder = stored_chain_builder(_record("spec", {"spec": SMALL_SPEC}))
    assert _shapes(pickle.loads(pickle.dumps(builder))()) == _shapes(from_spec(SMALL_SPEC))


def test_an_unknown_kind_is_named() -> None:
    with pytest.raises(ValueError, match="unknown stored model kind 'onnx'"):
        build_stored_chain("onnx", json.dumps({}))
