"""Compiled regions in the layout the compiler gives the whole model (NOTE [ Regions in the whole model's layout ] in
``memtune.profiler.region_layout``): the compiler's rule asked about all of the regions' convolutions together, the
regions compiled with that decision, and a planned model whose regions run so giving the unplanned compiled run's
gradients (CPU inductor)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from benchmarks.peer_rows import region_runs
from memtune.profiler.compiled import budget_backend
from memtune.profiler.region_layout import regions_channels_last
from memtune.profiler.region_profile import profile_regions
from memtune.profiler.region_tree import CompiledRegions, edge_writes, region_partitions
from memtune.tuner.plan import Plan
from memtune.tuner.region_plans import RegionTrial
from memtune.tuner.runtime import planned
from tests.unit.modules.region_models import TinyEncoder, TinyResNet, resnet_batch, square, taken_grads

torch.set_num_threads(1)

WIDE = 72  # channels: above the compiler's 64 for "every convolution small"


def test_the_compilers_rule_takes_a_networks_convolutions_together_where_its_stem_alone_is_turned_down() -> None:
    wide, narrow = TinyResNet(WIDE), TinyResNet()
    assert regions_channels_last([wide])
    assert regions_channels_last([wide.conv1, wide.layer1, wide.layer2, wide.fc])  # the regions cover its convolutions
    assert not regions_channels_last([nn.Conv2d(3, 64, 7, 2, 3)])  # ResNet-50's stem alone: at most 64 each way
    assert not regions_channels_last([narrow])  # every convolution small, as the stem
    assert not regions_channels_last([TinyEncoder()])  # no convolution
    assert not regions_channels_last([nn.Conv2d(256, 64, 3)])  # at least twice as many inputs as outputs, kernel 3
    grouped = [nn.Conv2d(128, 128, 3, groups=2), nn.Conv2d(128, 256, 1)]
    assert not regions_channels_last(grouped)  # a grouped convolution of more than one input channel per group
    depthwise = [nn.Conv2d(128, 128, 3, groups=128), nn.Conv2d(128, 256, 1)]
    assert regions_channels_last(depthwise)  # one input channel per group: MobileNet's and EfficientNet's


def test_a_backend_that_forces_the_layout_is_its_own_so_that_dynamo_keeps_a_graph_per_layout() -> None:
    assert budget_backend(1.0, None, True) is not budget_backend(1.0)
    assert budget_backend(1.0, None, True).__name__ == "inductor_activation_budget_1_nhwc"
    assert budget_backend(0.5, "compute", True).__name__ == "inductor_activation_budget_0.5_saves_compute_nhwc"


def test_compiled_regions_take_the_layout_of_all_their_convolutions_together() -> None:
    wide = TinyResNet(WIDE)
    names = list(region_partitions(wide, ((resnet_batch(),), {}))[1].names)
    regions = CompiledRegions([wide.get_submodule(n) for n in names], 1.0, [1, 2], names)
    assert regions.channels_last
    assert not CompiledRegions([TinyResNet().get_submodule(n) for n in names], 1.0, [1, 2], names).channels_last
    with regions:
        assert "channels-last" in repr(wide.layer1[0].__dict__["forward"])


@pytest.mark.slow  # CPU inductor compiles the regions' graphs
@pytest.mark.parametrize("actions", ["kkkkkkkk", "kokrkrok"])
def test_planned_regions_in_the_whole_models_layout_give_the_unplanned_compiled_gradients(actions: str) -> None:
    torch.manual_seed(0)
    model, x = TinyResNet(WIDE), resnet_batch()
    names = list(region_partitions(model, ((x,), {}))[0].names)
    eager = sorted(edge_writes(model, names, ((x,), {}), loss_fn=square))
    state = copy.deepcopy(model.state_dict())
    with CompiledRegions([model.get_submodule(n) for n in names], 1.0, eager) as regions:
        assert regions.channels_last
        square(model(x)).backward()
    reference = taken_grads(model)
    model.load_state_dict(state)
    square(model(x)).backward()
    eager_grads = taken_grads(model)
    model.load_state_dict(state)
    run = planned(model, Plan.from_actions(actions, stages=tuple(names), compile_budget=1.0, eager_stages=tuple(eager)))
    square(run(x)).backward()
    got = taken_grads(model)
    run.release()
    for name in reference:
        torch.testing.assert_close(got[name], reference[name], rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(got[name], eager_grads[name], rtol=1e-3, atol=1e-4, msg=name)


def test_a_region_candidates_line_says_its_convolutions_ran_in_the_whole_models_layout() -> None:
    trial = RegionTrial(label="depth 1: 8 regions (conv1, …)", regions=("conv1",), budget=1.0, step_ms=40.0,
                        whole_ms=None, best_ms=45.0, best_peak_bytes=2**30, plan=None, eager_regions=("bn1",),
                        compile_seconds=30.0, seconds=40.0, channels_last=True)  # fmt: skip
    assert "convolutions channels-last, as the model compiled whole; eager: bn1" in trial.line()
    assert "channels-last" not in dataclasses.replace(trial, channels_last=False).line()


def test_a_grid_rows_region_entries_keep_the_layout_they_were_measured_in() -> None:
    entry = {"depth": 1, "regions": ["a", "b"], "budget": 1.0, "profile": None, "error": "x", "seconds": 1.0}
    assert [r.channels_last for r in region_runs([entry, {**entry, "channels_last": True}])] == [False, True]


@pytest.mark.slow  # CPU inductor compiles the regions' graphs
def test_a_region_profile_records_the_layout_its_regions_were_compiled_in() -> None:
    model, x = TinyResNet(WIDE), resnet_batch()
    part = region_partitions(model, ((x,), {}))[0]
    (run,) = profile_regions(model, x, (1.0,), partitions=[part], loss_fn=square, warmup=0, repeats=1, rules=())
    assert run.error is None and run.channels_last
