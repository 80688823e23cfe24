"""memtune's save rules inside compiled regions (NOTE [ Saved tensors chosen inside a compiled region ] in
``memtune.profiler.saved_tags``), on the CPU with CPU inductor: the tags reach the partitioner, the compiled backward
keeps what the rule says and nothing else of the forward, the math is the compiler's, and a profile, a plan and a
planned model carry the rule through.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from memtune.profiler import ProfilerError
from memtune.profiler.compiled import CompiledStage
from memtune.profiler.module_profile import profile_module
from memtune.profiler.region_profile import profile_regions
from memtune.profiler.region_tree import CompiledRegions, RegionPartition
from memtune.profiler.saved_tags import SavedTags, forward_nodes
from memtune.profiler.selective import SAVED_OPS
from memtune.tuner.plan import Action, Plan, PlanError
from memtune.tuner.runtime import planned
from memtune.tuner.simulator import simulate
from tests.unit.modules.region_models import TinyResNet, square, taken_grads

torch.set_num_threads(1)

LAYERS = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "avgpool", "fc")


def _block() -> nn.Module:
    """Two convolutions with batch norm and activations, then a linear head: three compute operations."""
    return nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.SiLU(),
        nn.Flatten(), nn.Linear(16 * 8 * 8, 10),
    )  # fmt: skip


def _saved(fn: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """What one forward of ``fn`` saves for its backward, through saved-tensor hooks (the backward then runs)."""
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)
    square(out).backward()
    return kept


def test_a_rule_is_checked_and_tags_only_the_forward() -> None:
    with pytest.raises(ValueError, match="save rule 'everything' is not one of compute"):
        SavedTags("everything")
    assert {torch.ops.aten.mm.default, torch.ops.aten.convolution.default} <= SAVED_OPS
    with pytest.raises(ValueError, match="compile_saves"):  # a stored plan names a rule memtune has
        Plan.uniform(3, compile_budget=1.0, compile_saves="everything")

    def f(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(a @ w).sum()

    gm = torch.fx.symbolic_trace(f)
    graph = gm.graph
    tangent = graph.placeholder("tangents_1")
    graph.call_function(torch.ops.aten.mul.Tensor, (tangent, 2.0))
    names = [n.name for n in forward_nodes(graph)]
    assert names and "mul" not in names  # the node fed by a tangent is the backward's


@pytest.mark.slow  # CPU inductor compiles the block twice (about 40 s cold)
def test_the_compute_rule_keeps_the_compute_outputs_and_the_math() -> None:
    torch.manual_seed(0)
    block, x = _block(), torch.randn(4, 8, 8, 8)
    block(x)  # batch-norm statistics once, so both compiled runs start from the same buffers
    state = copy.deepcopy(block.state_dict())
    eager_saved = _saved(block, x)
    reference = taken_grads(block)
    block.load_state_dict(state)
    default = CompiledStage(block, 1.0)
    default_saved = _saved(default, x)
    taken_grads(block)
    block.load_state_dict(state)
    ruled = CompiledStage(block, 1.0, "compute")
    ruled_saved = _saved(ruled, x)
    grads = taken_grads(block)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference[name], rtol=1e-4, atol=1e-5, msg=name)
    # kept: the input, the two convolutions' outputs and the parameters; re-made: the activations, the flattened
    # input of the head and every batch-norm statistic the compiler's own partition keeps
    activations = [t for t in ruled_saved if t.dim() == 4 and t.shape[0] == 4]
    assert sorted(tuple(t.shape) for t in activations) == [(4, 8, 8, 8), (4, 16, 8, 8), (4, 16, 8, 8)]
    assert not any(t.shape == (4, 16 * 8 * 8) for t in ruled_saved)

    def nbytes(ts: list[torch.Tensor]) -> int:
        return sum(t.numel() * t.element_size() for t in ts)

    assert nbytes(ruled_saved) < nbytes(default_saved) < nbytes(eager_saved)
    assert "saves" not in default.extra_repr() and ruled.saves == "compute"


@pytest.mark.slow  # CPU inductor: the regions compiled under the rule
def test_a_profile_and_plan_under_a_rule_train_with_the_ruled_compiled_math() -> None:
    torch.manual_seed(0)
    model, x = TinyResNet(), torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    kw = {"loss_fn": square, "stages": list(LAYERS), "warmup": 0, "repeats": 1, "compile_budget": 1.0}
    with pytest.raises(ProfilerError, match="compile_saves='some': a save rule"):
        profile_module(model, x, **kw, compile_saves="some")  # type: ignore[arg-type]
    ruled = profile_module(model, x, **kw, compile_saves="compute")  # type: ignore[arg-type]
    plain = profile_module(model, x, **kw)  # type: ignore[arg-type]
    assert (ruled.compile_budget, ruled.compile_saves, plain.compile_saves) == (1.0, "compute", None)
    k = LAYERS.index("layer1")
    assert ruled.stages[k].saved_bytes < plain.stages[k].saved_bytes  # the blocks' activations are re-made
    plan = Plan.from_actions("kkkkrokk").named(ruled)
    assert (plan.compile_budget, plan.compile_saves) == (1.0, "compute")
    assert Plan.model_validate_json(plan.model_dump_json()) == plan
    with pytest.raises(PlanError, match="save by memtune's rule 'compute' but the profile was measured saving by "
                                        "the compiler's choice"):  # fmt: skip
        plan.check(plain)
    with pytest.raises(ValueError, match="compile_saves is a save rule of compiled stages: it needs compile_budget"):
        Plan.uniform(3, compile_saves="compute")
    assert simulate(ruled, plan).peak_bytes > 0
    state = copy.deepcopy(model.state_dict())
    with CompiledRegions([model.get_submodule(n) for n in LAYERS], 1.0, plan.eager_stages, saves="compute"):
        square(model(x)).backward()
    reference = taken_grads(model)
    model.load_state_dict(state)
    run = planned(model, plan)
    square(run(x)).backward()
    for name, grad in taken_grads(model).items():
        torch.testing.assert_close(grad, reference[name], rtol=1e-5, atol=1e-6, msg=name)
    assert Action.OFFLOAD in plan.actions
    run.release()


def test_profile_regions_measures_each_rule_after_the_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    import memtune.profiler.region_profile as region_profile

    calls: list[tuple[float | None, str | None]] = []

    def fake(*_args: object, compile_budget: float | None = None, compile_saves: str | None = None, **_kw: object):
        calls.append((compile_budget, compile_saves))
        raise RuntimeError("not measured here")

    monkeypatch.setattr(region_profile, "profile_module", fake)
    runs = profile_regions(nn.Linear(2, 2), torch.zeros(1, 2), (1.0, 0.5), partitions=[RegionPartition(1, ("a",))])
    assert calls == [(1.0, None), (0.5, None), (1.0, "compute")]
    assert [r.policy for r in runs] == ["activation budget 1", "activation budget 0.5", "save rule 'compute'"]
    with pytest.raises(ValueError, match=r"save rules \['other'\] are not among \['compute'\]"):
        profile_regions(nn.Linear(2, 2), torch.zeros(1, 2), (1.0,), rules=("other",))


class _Drawing(nn.Module):
    """A residual block with torchvision's stochastic depth (a per-sample ``bernoulli_``) and a dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(64, 64), nn.Linear(64, 64), nn.Dropout(0.3)
        self.w = nn.Parameter(torch.randn(64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keep = torch.empty(x.shape[0], 1, device=x.device).bernoulli_(0.8) / 0.8
        out = self.drop(x + keep * self.b(torch.relu(self.a(x))).sin())
        return out, (out * self.w).sum()


@pytest.mark.parametrize(("budget", "saves"), [(1.0, None), (0.5, None), (0.25, None), (0.0, None), (1.0, "compute")])
@pytest.mark.parametrize("eager_draws", [True, False])
def test_a_compiled_region_never_draws_its_random_numbers_again(
    budget: float, saves: str | None, eager_draws: bool
) -> None:
    # NOTE [ Random draws kept in a compiled region ]: under a budget below 1 the stock partitioner re-made the draws
    # in the backward (the gradient of ``w`` then was not the sum of the forward's output)
    drawn_once(budget, saves, "cpu", eager_draws)


def drawn_once(budget: float, saves: str | None, device: str, eager_draws: bool = True) -> None:
    """A compiled ``_Drawing`` under ``budget`` and ``saves``: its gradients are those of the forward's own draws and,
    with ``eager_draws`` (inductor's fallback_random, which draws as eager does), eager's."""
    from memtune.profiler.compiled import budget_backend

    torch.manual_seed(0)
    model, x = _Drawing().to(device), torch.randn(256, 64, device=device)
    torch.manual_seed(1)
    _, loss = model(x)
    loss.backward()
    eager = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=eager_draws):
        torch.manual_seed(1)
        out, loss = torch.compile(model, dynamic=False, backend=budget_backend(budget, saves))(x)
        loss.backward()
    torch.testing.assert_close(model.w.grad, out.detach().sum(0), rtol=1e-5, atol=1e-5)  # the forward's own mask
    if eager_draws:
        for got, want in zip((p.grad for p in model.parameters()), eager, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("budget", [0.5, 0.0])
def test_kept_and_replayed_draws_keep_about_the_stock_partitions_saved_bytes(budget: float) -> None:
    # NOTE [ Random draws kept in a compiled region ]: the small draw (stochastic depth's per-sample mask) is kept,
    # the dropout replayed from a saved generator state; the rest is what the stock partitioner keeps
    import torch._functorch.config as functorch_config

    from memtune.profiler.compiled import budget_backend
    from memtune.profiler.saved_tags import SAVED_DRAW_BYTES

    def stock(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        from torch._inductor.compile_fx import compile_fx

        with functorch_config.patch(activation_memory_budget=budget):
            return compile_fx(gm, example_inputs, config_patches={"keep_output_stride": False})

    def saved_bytes(backend: object) -> int:
        torch.manual_seed(0)
        model, x = _Drawing(), torch.randn(256, 64)
        torch._dynamo.reset()
        fn = torch.compile(model, dynamic=False, backend=backend)
        return sum(t.nbytes for t in _saved(lambda t: fn(t)[1], x))  # type: ignore[arg-type]

    with torch._inductor.config.patch(fallback_random=True):
        theirs, mine = saved_bytes(stock), saved_bytes(budget_backend(budget))
    assert abs(mine - theirs) <= SAVED_DRAW_BYTES, (mine, theirs)


@pytest.mark.slow  # CPU inductor with its caches off: about 3 s a case
@pytest.mark.parametrize(
    ("budget", "eager_draws", "tags"),
    [
        (1.0, True, {}),  # the stock partition keeps its draws: nothing to tag
        (0.5, True, {"MUST_SAVE": 1, "MUST_RECOMPUTE": 1}),  # the per-sample mask kept, the dropout replayed
        (0.0, True, {"MUST_SAVE": 1, "MUST_RECOMPUTE": 1}),
        (0.5, False, {"MUST_SAVE": 2}),  # inductor's seeds kept: its random kernels draw from them again alike
    ],
)
def test_only_the_draws_the_backward_would_make_again_are_tagged(
    budget: float, eager_draws: bool, tags: dict[str, int]
) -> None:
    # NOTE [ Random draws kept in a compiled region ]: small draws kept, large ones replayed, the rest untouched
    import torch._functorch.config as functorch_config
    from torch._inductor.compile_fx import compile_fx

    from memtune.profiler.saved_tags import KeptDraws

    partitioner = KeptDraws()

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        with functorch_config.patch(activation_memory_budget=budget):
            return compile_fx(gm, example_inputs, config_patches={"custom_partitioner_fn": partitioner})

    torch.manual_seed(0)
    model, x = _Drawing(), torch.randn(256, 64)
    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=eager_draws, force_disable_caches=True):
        _, loss = torch.compile(model, dynamic=False, backend=backend)(x)
        loss.backward()
    assert dict(partitioner.tagged) == tags
