"""``memtune.tuner.measure.validate`` without a GPU: the refusals (no CUDA, another GPU type, bad arguments) and the
glue around ``bench_plans`` (progress indices, stopping between plans), with ``bench_plans`` stood in for."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from memtune.profiler._profile import DeviceIdentity
from memtune.profiler.devices import GPUS
from memtune.profiler.identity import spec_identity
from memtune.profiler.modeled import modeled_profile
from memtune.profiler.zoo import build
from memtune.tuner._tuner_errors import TunerError
from memtune.tuner.measure import validate
from memtune.tuner.measure.bench import BenchRow
from memtune.tuner.measure.validate import ValidationUnavailable, check_validation_device, validate_plans
from memtune.tuner.plan import Action, Plan

PARAMS = {"image_size": 32, "num_classes": 10}


def _profile() -> Any:
    with torch.device("meta"):
        chain = build("resnet18", PARAMS)
    return modeled_profile(chain, 4, "float32", "h200")


def _never_built() -> Any:
    raise AssertionError("the chain must not be built where nothing can be measured")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_refuses_without_cuda_before_building_anything() -> None:
    prof = _profile()
    plan = Plan.uniform(prof.n_stages, Action.KEEP)
    with pytest.raises(ValidationUnavailable, match="no CUDA device") as e:
        validate_plans(_never_built, prof, 4, "float32", 1 << 30, [("p", "optuna", plan)], gpu_key="h200")
    assert "h200" in e.value.reason and isinstance(e.value, TunerError)


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, ident: DeviceIdentity) -> list[str]:
    """Pretend a CUDA device of ``ident``'s type; returns the record of ``configure_allocator`` calls."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(validate, "cuda_identity", lambda index: ident)
    configured: list[str] = []
    monkeypatch.setattr(validate, "configure_allocator", lambda: configured.append("set") or "set")
    return configured


def test_refuses_another_gpu_type(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, spec_identity(GPUS["a100-80gb"]))
    with pytest.raises(ValidationUnavailable) as e:
        check_validation_device("h200")
    assert "A100" in e.value.reason and "not 'h200'" in e.value.reason and "must come from a h200" in e.value.reason
    _fake_cuda(monkeypatch, spec_identity(GPUS["h200"]))
    assert check_validation_device("h200").key == "h200"


def test_bad_arguments_are_refused() -> None:
    prof = _profile()
    with pytest.raises(TunerError, match="iters >= 1"):
        validate_plans(_never_built, prof, 4, "float32", 1 << 30, [], gpu_key="h200", iters=0)
    with pytest.raises(TunerError, match="batch 4 float32, not batch 8"):
        validate_plans(_never_built, prof, 8, "float32", 1 << 30, [], gpu_key="h200")


def _stand_in(calls: list[dict[str, Any]]) -> Callable[..., list[BenchRow]]:
    """A ``bench_plans`` that reports each configuration as ``bench_plans`` does, with made-up numbers."""

    def bench(chain: Any, profile: Any, batch: int, dtype: str, budget: int, plans: Any, **kw: Any) -> list[BenchRow]:
        calls.append({"chain": chain, "budget": budget, **kw})
        rows = []
        for name, kind in [("unconstrained", "unconstrained"), *[(n, k) for n, k, _ in plans]]:
            kw["progress"](name)
            row = BenchRow(name, kind, 5.0, 1000, 10.0, True, reserved_bytes=2000)
            rows.append(row)
            kw["on_row"](row)
        return rows

    return bench


def test_measures_the_reference_then_each_plan_and_stops_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    configured = _fake_cuda(monkeypatch, spec_identity(GPUS["h200"]))
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(validate, "bench_plans", _stand_in(calls))
    prof = _profile()
    plan = Plan.uniform(prof.n_stages, Action.KEEP)
    plans = [("a", "optuna", plan), ("b", "baseline", plan), ("c", "baseline", plan)]
    seen: list[tuple[int, int, str, str]] = []
    chain = build("resnet18", PARAMS)

    run = validate_plans(
        lambda: chain,
        prof,
        4,
        "float32",
        1 << 30,
        plans,
        gpu_key="h200",
        iters=4,
        warmup=1,
        progress=lambda i, k, name, dev: seen.append((i, k, name, dev.key)),
        isolate=False,
    )
    assert seen == [(0, 3, "unconstrained", "h200"), (1, 3, "a", "h200"), (2, 3, "b", "h200"), (3, 3, "c", "h200")]
    assert run.unconstrained.name == "unconstrained" and [r.name for r in run.rows] == ["a", "b", "c"]
    assert not run.stopped and run.device.key == "h200"
    assert configured == ["set"]  # the allocator settings of NOTE [ Allocator retries ], before measuring
    (call,) = calls
    assert call["chain"] is chain and call["pytorch_builtins"] is False and call["chain_factory"] is None
    assert (call["budget"], call["iters"], call["warmup"]) == (1 << 30, 4, 1)

    polls = iter([False, True])
    run = validate_plans(chain, prof, 4, "float32", 1 << 30, plans, gpu_key="h200", should_stop=lambda: next(polls))
    assert run.stopped and [r.name for r in run.rows] == ["a"]  # asked after the reference and after plan a


def test_a_builder_is_handed_to_bench_plans_to_measure_each_plan_in_a_fresh_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_cuda(monkeypatch, spec_identity(GPUS["h200"]))
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(validate, "bench_plans", _stand_in(calls))
    prof = _profile()
    plan = Plan.uniform(prof.n_stages, Action.KEEP)
    builder = functools.partial(build, "resnet18", PARAMS)

    run = validate_plans(builder, prof, 4, "float32", 1 << 30, [("a", "optuna", plan)], gpu_key="h200")
    assert [r.name for r in run.rows] == ["a"]
    (call,) = calls
    # NOTE [ Bench isolation ]: nothing is built here; each row's process builds its own model
    assert call["chain"] is None and call["chain_factory"] is builder


def test_an_unpicklable_builder_is_refused_before_anything_is_measured() -> None:
    prof = _profile()
    plan = Plan.uniform(prof.n_stages, Action.KEEP)
    with pytest.raises(TunerError, match="must be picklable") as e:
        validate_plans(lambda: _never_built(), prof, 4, "float32", 1 << 30, [("p", "optuna", plan)], gpu_key="h200")
    assert "isolate=False" in str(e.value)
