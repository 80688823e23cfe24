"""The committed H200 calibration (NOTE [ Compute scale ]) and how inline offload holds storages."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memtune.api.cli import resolve_profile
from memtune.profiler.zoo import build
from memtune.tuner.calibration import calibration_for, profile_key
from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import Simulator, backward_transients


@pytest.mark.slow
def test_a_measured_profile_runs_at_its_calibrated_scale() -> None:
    prof = resolve_profile(build("gpt", {}), 16, "bfloat16", "h200")
    cal = calibration_for("h200")
    scale = cal.compute_scale[profile_key(prof)]
    assert 0.8 < scale < 1.0  # stages timed alone run slower than a whole step
    plan = Plan.uniform(prof.n_stages)
    raw = Simulator(prof, compute_scale=1.0).run(plan)
    scaled = Simulator(prof).run(plan)
    assert Simulator(prof).compute_scale == scale
    # compute scales, memory does not: the unconstrained step is all compute
    assert scaled.step_ms == pytest.approx(raw.step_ms * scale)
    assert scaled.peak_bytes == raw.peak_bytes


def test_copies_are_not_scaled() -> None:
    """Offloading everything inline (save_on_cpu): every copy stalls compute, and only compute scales."""
    prof = resolve_profile(build("resnet50", {}), 256, "float32", "h200")
    plan = Plan.uniform(prof.n_stages, Action.OFFLOAD).with_(sync="inline")
    raw = Simulator(prof, compute_scale=1.0).run(plan)
    half = Simulator(prof, compute_scale=0.5).run(plan)
    assert raw.stall_ms > 0
    assert half.stall_ms == pytest.approx(raw.stall_ms)
    assert half.step_ms == pytest.approx(0.5 * (raw.step_ms - raw.stall_ms) + raw.stall_ms)


@pytest.mark.slow
def test_profiles_without_a_calibration_keep_their_times() -> None:
    prof = resolve_profile(build("vgg16", {}), 64, "float32", "h200")  # measured, not in the calibration
    assert profile_key(prof) not in calibration_for("h200").compute_scale
    assert Simulator(prof).compute_scale == 1.0
    modeled = resolve_profile(build("resnet50", {}), 256, "float32", "k40")  # a roofline profile
    assert Simulator(modeled).compute_scale == 1.0


def test_the_calibration_file_says_where_its_numbers_came_from() -> None:
    from importlib.resources import files

    data = json.loads(files("memtune.tuner").joinpath("data", "calibration-h200.json").read_text())
    assert "benchmarks.calibrate" in data["compute_source"] and "benchmarks.calibrate" in data["remap_source"]
    assert data["remap_ms_per_gib"] > 0


def test_inline_offload_holds_one_storage_of_a_stage_at_a_time() -> None:
    """NOTE [ Inline fetches ]: save_on_cpu fetches each saved tensor at its first unpack, frees it after its last.
    Without a measured inline transient (a profile of before the field), the stage holds its largest storage."""
    measured = resolve_profile(build("resnet50", {}), 256, "float32", "h200")
    assert all(s.backward_inline_bytes is not None for s in measured.stages)  # the committed profile has it
    stages = tuple(s.model_copy(update={"backward_inline_bytes": None}) for s in measured.stages)
    prof = measured.model_copy(update={"stages": stages})
    plan = Plan.uniform(prof.n_stages, Action.OFFLOAD).with_(sync="inline")
    res = Simulator(prof, compute_scale=1.0).run(plan, timeline=True)
    k = 6  # layer1.2: an identity bottleneck
    stage = prof.stages[k]
    own = [s.bytes for s in prof.storages if s.producer == k and s.saved_by == (k,)]
    assert len(own) > 3
    lives = [(label, live) for _, live, label in res.timeline]
    i = next(j for j, (label, _) in enumerate(lives) if label == f"bwd {k} start")
    grew = lives[i][1] - lives[i - 1][1]
    transient = backward_transients(prof)[k]  # NOTE [ Backward transient ]
    expected = prof.stages[k - 1].output_bytes + stage.param_bytes + transient + max(own)
    assert grew == expected  # the largest of the stage's own storages, not their sum
    assert grew < expected - max(own) + sum(own)


def test_a_measured_inline_transient_stands_for_the_stage_and_the_fetches_it_shares() -> None:
    """NOTE [ Inline fetches ]: where the profile measured a stage's inline backward, that transient stands for
    the stage's fetches, and a storage only such stages save is never held whole between them."""
    prof = resolve_profile(build("resnet50", {}), 256, "float32", "h200")
    plan = Plan.uniform(prof.n_stages, Action.OFFLOAD).with_(sync="inline")
    x = 3 << 30

    def with_inline(values: dict[int, int]) -> Any:
        stages = tuple(s.model_copy(update={"backward_inline_bytes": values.get(s.index)}) for s in prof.stages)
        return prof.model_copy(update={"stages": stages})

    every = Simulator(with_inline(dict.fromkeys(range(prof.n_stages), x)), compute_scale=1.0).run(plan, timeline=True)
    lives = [(label, live) for _, live, label in every.timeline]
    k = 6
    i = next(j for j, (label, _) in enumerate(lives) if label == f"bwd {k} start")
    # the workspace part stays the plan's, and the output's gradient is the simulator's own (held all along)
    transient = max(x - prof.stages[k].output_bytes, backward_transients(prof)[k])
    assert lives[i][1] - lives[i - 1][1] == prof.stages[k - 1].output_bytes + prof.stages[k].param_bytes + transient
    assert not [label for label, _ in lives if label.startswith("prefetch")]
    old = Simulator(with_inline({}), compute_scale=1.0).run(plan)  # the largest-storage model
    assert every.step_ms == old.step_ms  # bytes move, time does not

    # one measured stage alone: its neighbours keep the largest-storage model, and what it shares is held whole
    one = Simulator(with_inline({k: x}), compute_scale=1.0).run(plan, timeline=True)
    assert [label for _, _, label in one.timeline if label.startswith("prefetch")]
