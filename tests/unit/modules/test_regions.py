"""Regions (NOTE [ Regions ] in ``memtune.profiler.region_tree``): candidate partitions from the module tree, in-place
writes at their edges, and planned models whose regions run compiled (CPU inductor), wrapped once.

Gradients of a planned compiled-region model are compared with the unplanned compiled run (the same regions compiled
under the same budget, every region kept: ``CompiledRegions``): keep, offload (a copy with strides kept) and recompute
(the same compiled graph re-run) give them bitwise on the CPU here; the test allows floating-point tolerance.
"""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
import torch
from torch import nn

from memtune.profiler.module_stages import find_stages
from memtune.profiler.region_tree import CompiledRegions, RegionForward, edge_writes, region_partitions
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Plan
from memtune.tuner.runtime import load_plan, planned
from tests.unit.modules.region_models import (
    SiLUAfter,
    TinyEncoder,
    TinyResNet,
    encoder_batch,
    resnet_batch,
    square,
    taken_grads,
)

torch.set_num_threads(1)


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


# ---- discovery -----------------------------------------------------------------------------------------


def test_a_resnet_is_cut_into_its_layers_or_its_blocks() -> None:
    model = TinyResNet()
    parts = region_partitions(model, ((resnet_batch(),), {}))
    assert [p.names for p in parts] == [
        ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "avgpool", "fc"),
        ("conv1", "bn1", "relu", "maxpool", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "avgpool", "fc"),
    ]
    assert parts[0].covers[4] == ("layer1.0", "layer1.1")
    assert parts[-1].names == tuple(find_stages(model, ((resnet_batch(),), {}))[0])  # the finest: the default stages


def test_a_transformer_is_cut_into_its_encoder_or_its_layers_and_an_iterated_list_is_never_a_region() -> None:
    parts = region_partitions(TinyEncoder(), ((encoder_batch(),), {}))
    assert [p.names for p in parts] == [
        ("embed", "encoder", "head"),
        ("embed", "encoder.layers.0", "encoder.layers.1", "encoder.norm", "head"),  # encoder.layers is iterated
    ]


def test_a_module_whose_call_does_not_cover_its_stages_is_not_a_region() -> None:
    class Pair(nn.Module):  # its forward runs its first child only; the model calls the second itself
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
            self.second = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.first(x)  # type: ignore[no-any-return]

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pair = Pair()
            self.head = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.pair.second(self.pair(x)))  # type: ignore[no-any-return]

    parts = region_partitions(Model(), ((torch.randn(2, 4),), {}), stages=["pair.*", "head"])
    assert [p.names for p in parts] == [("pair.first", "pair.second", "head")]


def test_writes_in_place_at_region_edges_are_found_with_who_wrote() -> None:
    x = torch.randn(4, 16)
    reasons = edge_writes(SiLUAfter(), ["a", "b", "head"], ((x,), {}), loss_fn=square)
    assert list(reasons) == [0]
    assert "output is written in place after it returned, by the model's own code before stage 'b'" in reasons[0]
    stem = edge_writes(TinyResNet(), ["conv1", "bn1", "relu", "maxpool"], ((resnet_batch(),), {}), loss_fn=square)
    assert sorted(stem) == [1, 2]  # the in-place ReLU writes the BN's output
    assert "by stage 'relu'" in stem[1] and "inplace=True" in stem[2]
    assert edge_writes(TinyEncoder(), ["embed", "encoder", "head"], ((encoder_batch(),), {}), loss_fn=square) == {}


# ---- plans ---------------------------------------------------------------------------------------------


def test_a_compiled_region_plan_round_trips_json_and_states_its_eager_regions() -> None:
    plan = Plan.from_actions("kor", stages=("a", "b", "head"), compile_budget=0.5, eager_stages=(0,))
    back = load_plan(plan.model_dump_json())
    assert back == plan and back.eager_stages == (0,) and back.compile_budget == 0.5
    with pytest.raises(ValueError, match="eager_stages names stages of a plan whose module stages run compiled"):
        Plan.from_actions("kor", stages=("a", "b", "head"), eager_stages=(0,))
    with pytest.raises(ValueError, match=r"eager_stages \[3\] are outside the stage range 0..2"):
        Plan.from_actions("kor", stages=("a", "b", "head"), compile_budget=0.5, eager_stages=(3,))
    with pytest.raises(ValueError, match="stage 1 is 'selective'"):
        Plan.from_actions("ksk", stages=("a", "b", "head"), compile_budget=0.5)


def test_a_compiled_region_plan_is_checked_against_its_profile() -> None:
    from memtune.profiler.module_profile import profile_module

    model = SiLUAfter()
    eager = profile_module(model, torch.randn(4, 16), loss_fn=square, stages=["a", "b", "head"], warmup=0, repeats=1)
    compiled = eager.model_copy(update={"compile_budget": 0.5, "eager_stages": (0,)})
    plan = Plan.from_actions("kkk").named(compiled)
    assert (plan.compile_budget, plan.eager_stages, plan.stages) == (0.5, (0,), ("a", "b", "head"))
    plan.check(compiled)
    with pytest.raises(PlanError, match=r"runs stages \[\] \(none\) eager .* measured \[0\] \(a\) so"):
        plan.with_(eager_stages=()).check(compiled)
    with pytest.raises(PlanError, match="the profile was measured with an eager profile"):
        plan.check(eager)
    with pytest.raises(PlanError, match=r"budget 0\.5; price it on the compiled profile"):
        plan.with_(compile_budget=1.0).check(compiled)


# ---- the runtime, wrapped once --------------------------------------------------------------------------


def _reference(
    model: nn.Module, names: list[str], eager: list[int], x: torch.Tensor, budget: float
) -> dict[str, torch.Tensor]:
    """Gradients of the unplanned compiled run: the same regions compiled under ``budget``, every region kept."""
    with CompiledRegions([model.get_submodule(n) for n in names], budget, eager):
        square(model(x)).backward()
    return taken_grads(model)


@pytest.mark.slow  # CPU inductor compiles six graphs (seconds from its cache, minutes cold on a busy machine)
@pytest.mark.parametrize("actions", ["kkkkkkkk", "rrrrrrrr", "oooooooo", "kokrkrok"])
def test_planned_compiled_regions_give_the_unplanned_compiled_gradients(actions: str) -> None:
    torch.manual_seed(0)
    model, x = TinyResNet(), resnet_batch()
    names = list(region_partitions(model, ((x,), {}))[0].names)
    eager = sorted(edge_writes(model, names, ((x,), {}), loss_fn=square))
    assert eager == [1, 2]
    state = copy.deepcopy(model.state_dict())
    reference = _reference(model, names, eager, x, 0.5)
    model.load_state_dict(state)
    plan = Plan.from_actions(actions, stages=tuple(names), compile_budget=0.5, eager_stages=tuple(eager))
    run = planned(model, plan)
    square(run(x)).backward()
    _close(taken_grads(model), reference)
    if "o" in actions:
        assert run.stats.d2h_copies > 0
    assert list(run.state_dict()) == list(model.state_dict()) == list(state)  # the model's own keys
    run.release()
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.slow
def test_a_region_is_wrapped_once_and_compiles_once() -> None:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model, x = TinyEncoder(), encoder_batch()
    names = ("embed", "encoder", "head")
    run = planned(model, Plan.from_actions("kor", stages=names, compile_budget=1.0))
    wrapped = model.encoder.forward
    assert isinstance(wrapped, RegionForward)
    square(run(x)).backward()
    graphs = counters["stats"]["unique_graphs"]
    for _ in range(2):
        square(run(x)).backward()
        assert model.encoder.forward is wrapped  # the same attribute between calls, never re-patched
    assert counters["stats"]["unique_graphs"] == graphs  # no recompile
    with torch.no_grad():
        torch.testing.assert_close(model(x), type(model).forward(model, x))  # called directly: the model's own math
    again = planned(model, Plan.from_actions("kkk", stages=names, compile_budget=1.0))
    assert model.encoder.forward is wrapped  # a second planned model shares the wrapper and its compiled callables
    square(again(x)).backward()
    assert counters["stats"]["unique_graphs"] == graphs
    clone = copy.deepcopy(model)  # a copy gets a wrapper of its own that runs eagerly
    assert isinstance(clone.encoder.forward, RegionForward) and clone.encoder.forward.module is clone.encoder
    pickled = pickle.loads(pickle.dumps(model))  # torch.save of the whole model: the same
    assert pickled.encoder.forward.module is pickled.encoder
    torch.testing.assert_close(pickled(x), model(x))
    assert list(inspect.signature(model.encoder.forward).parameters) == ["x"]  # the module's own, for inspectors
    run.release()
    assert model.encoder.forward is wrapped  # ``again`` still runs it
    again.release()
    assert "forward" not in model.encoder.__dict__
    with pytest.raises(PlanError, match="released"):
        run(x)


@pytest.mark.slow
@pytest.mark.parametrize("actions", ["kkk", "rrr", "ooo"])
def test_an_in_place_write_after_a_region_runs_it_eager_with_correct_gradients(actions: str) -> None:
    torch.manual_seed(0)
    model, x = SiLUAfter(), torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    square(model(x)).backward()
    eager_grads = taken_grads(model)
    names = ("a", "b", "head")
    eager = tuple(sorted(edge_writes(model, list(names), ((x,), {}), loss_fn=square)))
    run = planned(model, Plan.from_actions(actions, stages=names, compile_budget=0.0, eager_stages=eager))
    square(run(x)).backward()
    _close(taken_grads(model), eager_grads)  # region 'a' eager, 'b' and 'head' compiled: the compiler's math, close
    run.release()


@pytest.mark.slow
def test_a_plan_that_compiles_a_region_written_in_place_is_refused() -> None:
    model, x = SiLUAfter(), torch.randn(4, 16)
    run = planned(model, Plan.from_actions("okk", stages=("a", "b", "head"), compile_budget=0.0))
    with pytest.raises(PlanError, match=r"region 0 \(a\) runs compiled but has its input or output written in place"):
        run(x)
    run.release()


def test_candidate_partitions_are_the_coarsest_split_and_the_first_of_about_a_region_per_block() -> None:
    from memtune.profiler.region_tree import RegionPartition, candidate_partitions

    def depths(*sizes: int) -> list[int]:
        parts = [RegionPartition(d + 1, tuple(f"r{i}" for i in range(n))) for d, n in enumerate(sizes)]
        return [p.depth for p in candidate_partitions(parts)]

    assert depths(1, 2, 20, 60) == [2, 3]  # the Llama decoder: the whole model, then the decoder and the head
    assert depths(2, 3, 14) == [1, 3]  # BERT: its encoder split by layer
    assert depths(10, 22, 53) == [1, 2]  # ResNet-50: layers, then bottlenecks; the finest left out
    assert depths(2, 3) == [1]  # no finer split of eight regions
    assert depths(1) == []  # one region is the whole model, measured as compiler points
