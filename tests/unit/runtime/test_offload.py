"""The runtime's machinery on CPU: host pool, offload hooks, prefetch, segments, errors, plan loading."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

from memtune.profiler import zoo
from memtune.profiler.chain import ModelChain, flatten, may_write_input
from memtune.profiler.modeled import modeled_profile
from memtune.tuner._tuner_errors import PlanError, TunerError
from memtune.tuner.plan import Action, Plan, resolve_storages, segments
from memtune.tuner.runtime import (
    HostPool,
    PlannedChain,
    PlanOutOfMemoryError,
    budget_guard,
    check_equivalence,
    load_plan,
    planned,
)
from memtune.tuner.runtime.offload import StepState
from tests.unit.runtime.prefetch_spy import record_prefetches

torch.set_num_threads(1)


def vgg_like(seed: int = 0) -> nn.Sequential:
    """conv, ReLU(inplace), BN, conv, ReLU(inplace), pool, dropout, flatten, linear: 11 stages."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.BatchNorm2d(4),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Dropout(0.5),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 5),
    )


def image(batch: int = 2, size: int = 8) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(7))


def train_step(model: nn.Module, x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach()


# ---- exported names --------------------------------------------------------------------------------


def test_an_out_of_memory_under_a_plan_is_a_tuner_error() -> None:
    # the face's names are checked with every package's in tests/unit/arch/test_exports.py
    assert issubclass(PlanOutOfMemoryError, TunerError)


# ---- host pool -------------------------------------------------------------------------------------


def test_pool_grows_doubling_then_reuses_the_same_bytes() -> None:
    pool = HostPool(pin_memory=False)
    sizes = [300_000, 700_000, 1_500_000, 100, 2_000_000]
    first = [t.data_ptr() for t in (pool.alloc(n) for n in sizes)]
    grown = pool.allocations
    assert 1 <= grown < len(sizes)  # not one allocation per range
    assert pool.capacity_bytes >= sum(sizes)
    for _ in range(3):
        pool.reset()
        again = [t.data_ptr() for t in (pool.alloc(n) for n in sizes)]
        assert again == first
    assert pool.allocations == grown


def test_pool_ranges_do_not_overlap_and_reserve_allocates_once() -> None:
    pool = HostPool(pin_memory=False, reserve_bytes=10_000)
    a, b, c = pool.alloc(1000), pool.alloc(1), pool.alloc(5000)
    assert pool.allocations == 1
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel()) for t in (a, b, c))
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    assert (a.numel(), b.numel(), c.numel()) == (1000, 1, 5000)
    with pytest.raises(ValueError, match="positive"):
        pool.alloc(0)
    with pytest.raises(ValueError, match="reserve_bytes"):
        HostPool(pin_memory=False, reserve_bytes=-1)


# ---- offload hooks ---------------------------------------------------------------------------------


def test_all_offload_moves_every_saved_storage_through_the_pool() -> None:
    model = vgg_like()
    eq, pm = check_equivalence(model, Plan.uniform(11, Action.OFFLOAD), image(), steps=3)
    assert eq.ok(1e-6), eq
    s = pm.stats
    assert s.d2h_copies > 0 and s.d2h_copies == s.h2d_copies + s.reused_on_device
    assert s.d2h_bytes == s.h2d_bytes  # every storage came back exactly once
    assert s.deduped > 0  # ReLU(inplace) and the next conv save the same storage
    assert s.passed_through > 0  # weights and the input stay put
    assert s.pool_resets == 2  # reset at the start of steps 2 and 3
    pool = pm.pool
    assert pool is not None and not pool.pin_memory


def test_pool_is_reused_across_steps() -> None:
    chain = zoo.build("resnet18", {"image_size": 16, "num_classes": 3})
    pm = planned(chain, Plan.uniform(len(chain), Action.OFFLOAD))
    x = torch.randn(2, 3, 16, 16)
    train_step(pm, x)
    pool = pm.pool
    assert pool is not None
    allocations, pointers, used = pool.allocations, pool.chunk_pointers, pool.used_bytes
    for _ in range(2):
        train_step(pm, x)
        assert pool.allocations == allocations
        assert pool.chunk_pointers == pointers
        assert pool.used_bytes == used
    assert pm.stats.pool_resets == 2


def test_runtime_copies_exactly_the_bytes_the_plan_semantics_copy() -> None:
    """D2H bytes per step equal those of the storages ``resolve_storages`` marks copied (the simulator's)."""
    chain = zoo.build("resnet50", {"image_size": 16, "num_classes": 3})
    prof = modeled_profile(chain, 2, "float32", "h200")
    rng = random.Random(3)
    x = torch.randn(2, 3, 16, 16)
    tried = 0
    while tried < 4:
        actions = [rng.choice(list(Action)) for _ in range(len(chain))]
        if any(prof.stages[i].inplace for i, _ in segments(actions)):
            continue  # see NOTE [ In-place at segment boundaries ]: one storage more than the table says
        tried += 1
        expected = sum(
            st.bytes for st, fate in zip(prof.storages, resolve_storages(prof, actions), strict=True) if fate.copied
        )
        pm = planned(chain, Plan.from_actions(actions))
        train_step(pm, x)
        assert pm.stats.d2h_bytes == expected, "".join(a.value[0] for a in actions)


def test_inplace_segment_start_costs_one_storage_more_than_the_table() -> None:
    """Pins the documented divergence: the re-run needs x_{i-1} from before the in-place write."""
    chain = zoo.build("resnet50", {"image_size": 16, "num_classes": 3})
    prof = modeled_profile(chain, 2, "float32", "h200")
    assert prof.stages[2].inplace and prof.stages[2].kind == "relu"
    actions = Plan.from_actions("korokkkkkkkkkkkkkkkkkkk").actions  # segment [2] starts at the in-place ReLU
    expected = sum(st.bytes for st, f in zip(prof.storages, resolve_storages(prof, actions), strict=True) if f.copied)
    pm = planned(chain, Plan(actions=actions))
    train_step(pm, torch.randn(2, 3, 16, 16))
    assert pm.stats.d2h_bytes == expected + prof.stages[2].output_bytes


def test_parameters_buffers_and_input_are_never_offloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    model = vgg_like()
    packed: list[int] = []
    original = StepState._copy_out

    def spy(self: StepState, storage: torch.UntypedStorage, need: int) -> object:
        packed.append(storage.data_ptr())
        return original(self, storage, need)

    monkeypatch.setattr(StepState, "_copy_out", spy)
    x = image()
    pm = planned(model, Plan.uniform(11, Action.OFFLOAD))
    train_step(pm, x)
    resident = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers(), x)}
    assert packed and not resident.intersection(packed)


def test_storage_kept_elsewhere_is_used_in_place() -> None:
    # stage 1 (ReLU inplace, keep) saves the conv output; stage 3 (conv, offload) saves it again
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True), nn.Identity(), nn.Conv2d(4, 2, 3))
    eq, pm = check_equivalence(model, Plan.from_actions("kkko"), image(), steps=1)
    assert eq.ok(1e-6)
    assert pm.stats.d2h_copies == 1  # the wasted copy of NOTE [ Plan semantics ]
    assert pm.stats.reused_on_device == 1 and pm.stats.h2d_copies == 0


@pytest.mark.parametrize("lookahead", [0, 1, 3, 50])
def test_prefetch_is_issued_lookahead_stages_ahead(monkeypatch: pytest.MonkeyPatch, lookahead: int) -> None:
    issued = record_prefetches(monkeypatch)  # (backward stage when issued, stage that needs it)
    n = 11
    pm = planned(vgg_like(), Plan.uniform(n, Action.OFFLOAD, prefetch_lookahead=lookahead, sync="layer"))
    train_step(pm, image())
    assert issued
    top = n - 1  # the first backward pre-hook to fire is the last stage's
    for at, need in issued:
        assert at == min(top, need + lookahead), (at, need)
    assert pm.stats.prefetched == len(issued) and pm.stats.on_demand == 0


def test_inline_sync_fetches_on_demand_only() -> None:
    eq, pm = check_equivalence(vgg_like(), Plan.uniform(11, Action.OFFLOAD, sync="inline"), image(), steps=1)
    assert eq.ok(1e-6)
    assert pm.stats.prefetched == 0 and pm.stats.on_demand == pm.stats.h2d_copies > 0


def test_two_forwards_before_one_backward() -> None:
    """Gradient accumulation: the second forward must not reuse host bytes the first still needs."""
    x1, x2 = image(), image() * 2
    ref = vgg_like()
    ref.eval()  # no dropout: two forwards in a row draw different masks otherwise
    (ref(x1).square().mean() + ref(x2).square().mean()).backward()
    expected = [p.grad.clone() for p in ref.parameters() if p.grad is not None]
    model = vgg_like()
    model.eval()
    pm = planned(model, Plan.uniform(11, Action.OFFLOAD))
    (pm(x1).square().mean() + pm(x2).square().mean()).backward()
    got = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=0)
    assert pm.stats.pool_resets == 0  # the first graph was alive when the second forward began


def test_retain_graph_backward_twice() -> None:
    model = vgg_like()
    model.eval()
    x = image()
    ref_loss = model(x).square().mean()
    ref_loss.backward()
    expected = [p.grad.clone() * 2 for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    pm = planned(model, Plan.from_actions("oroorokorok"))
    loss = pm(x).square().mean()
    loss.backward(retain_graph=True)
    loss.backward()
    for p, e in zip(model.parameters(), expected, strict=True):
        assert p.grad is not None
        torch.testing.assert_close(p.grad, e, rtol=1e-6, atol=1e-9)


def test_no_grad_runs_plainly() -> None:
    model = vgg_like()
    model.eval()
    pm = planned(model, Plan.uniform(11, Action.OFFLOAD))
    x = image()
    with torch.no_grad():
        assert torch.equal(pm(x), model(x))
    assert pm.stats.d2h_copies == 0


# ---- recompute segments and in-place ops -----------------------------------------------------------


def inplace_chain() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 6), nn.ReLU(inplace=True), nn.Linear(6, 6), nn.ReLU(inplace=True), nn.Linear(6, 3)
    )


def test_checkpoint_sequential_really_fails_on_inplace_segment_start() -> None:
    """PyTorch's own segments break here (so the next test means something)."""
    model = inplace_chain()
    x = torch.randn(4, 6)
    # 3 segments of 5 modules: [0], [1], [2, 3, 4]; segment [1] starts with ReLU(inplace=True)
    out = checkpoint_sequential(model, 3, x, use_reentrant=False)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("letters", ["krrrr", "krkrk", "orrok", "orror", "rrrrr", "kkrrr"])
def test_segments_starting_with_inplace_relu_keep_the_math(letters: str) -> None:
    model = inplace_chain()
    assert may_write_input(model[1])
    eq, _ = check_equivalence(model, Plan.from_actions(letters), torch.randn(4, 6), steps=2)
    assert eq.ok(1e-6), eq


class AddOneInPlace(nn.Module):
    """A stage that writes its input in place without an ``inplace`` flag."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1.0)


def test_undeclared_inplace_segment_start_is_caught_and_clone_fixes_it() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), AddOneInPlace(), nn.Tanh(), nn.Linear(4, 2))
    assert not may_write_input(model[1])
    plan = Plan.from_actions("krrk")
    x = torch.randn(3, 4)
    with pytest.raises(PlanError, match=r"stage 1 .*clone_segment_inputs=True"):
        planned(model, plan, clone_segment_inputs=False)(x)
    eq, _ = check_equivalence(model, plan, x, clone_segment_inputs=True)
    assert eq.ok(1e-6), eq


def test_recompute_does_not_update_batchnorm_statistics_twice() -> None:
    model = vgg_like()
    eq, _ = check_equivalence(model, Plan.from_actions("krrrrrrrrrk"), image(), steps=2)
    assert eq.buffer == 0.0 and eq.ok(1e-6), eq


def test_dropout_masks_are_replayed_in_recompute() -> None:
    model = vgg_like()
    assert isinstance(model[8], nn.Dropout)
    eq, _ = check_equivalence(model, Plan.from_actions("kkkkkkkrrrk"), image(), steps=2)
    assert eq.ok(1e-6), eq


# ---- out of memory ---------------------------------------------------------------------------------


class OOMOnce(nn.Module):
    """Raises the allocator's error the first ``times`` calls, in forward or backward."""

    def __init__(self, where: str, times: int = 1) -> None:
        super().__init__()
        self.where = where
        self.left = times

    def _fail(self) -> bool:
        if self.left > 0:
            self.left -= 1
            return True
        return False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.where == "forward" and self._fail():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if self.where == "backward":
            return _FailInBackward.apply(x, self)
        return x * 1.0


class _FailInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, owner: OOMOnce) -> torch.Tensor:
        ctx.owner = owner  # type: ignore[attr-defined]
        return x * 1.0

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.owner._fail():  # type: ignore[attr-defined]
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return grad, None


@pytest.mark.parametrize("letters", ["ooooro", "okrrrk"])  # stage 3 offloaded / inside a segment
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_out_of_memory_names_plan_and_stage_and_the_next_step_runs(where: str, letters: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), OOMOnce(where), nn.Tanh(), nn.Linear(8, 2))
    plan = Plan.from_actions(letters, label="layup")
    pm = planned(model, plan)
    x = torch.randn(3, 4)
    with pytest.raises(PlanOutOfMemoryError) as info, pm.oom_guard(budget_bytes=3 << 30):
        train_step(pm, x)
    err = info.value
    assert (err.label, err.stage, err.stage_name, err.phase) == ("layup", 3, "3", where)
    assert err.budget_bytes == 3 << 30
    assert "'layup'" in str(err) and f"{where} of stage 3" in str(err) and "3.00 GiB" in str(err)
    del info, err
    model.zero_grad(set_to_none=True)
    loss = train_step(pm, x)  # the process is still usable
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())


def test_budget_guard_needs_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("covered by tests/gpu/test_runtime_gpu.py")
    with pytest.raises(TunerError, match="needs a CUDA device"), budget_guard(1 << 30):
        pass


# ---- construction and plan loading -----------------------------------------------------------------


def test_plan_must_match_the_chain() -> None:
    with pytest.raises(PlanError, match="3 actions but the model has 11 stages"):
        planned(vgg_like(), Plan.from_actions("kko"))
    with pytest.raises(PlanError, match=r"sync_points \[11\]"):
        planned(vgg_like(), Plan.uniform(11, sync="points", sync_points=(2, 11)))
    pm = planned(vgg_like(), Plan.uniform(11))
    with pytest.raises(PlanError, match="already planned"):
        planned(pm, Plan.uniform(11))
    assert isinstance(pm, PlannedChain) and pm.stage_names[0] == "0"


def test_planned_shares_parameters_and_flattens_nested_sequentials() -> None:
    inner = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 2)))
    pm = planned(inner, Plan.from_actions("kor"))
    assert pm.stage_names == ("0", "1.0", "1.1")
    assert [id(p) for p in pm.parameters()] == [id(p) for p in inner.parameters()]


def test_conv_choices_warn_that_they_are_not_applied() -> None:
    with pytest.warns(UserWarning, match="conv_rule 'fastest'"):
        planned(vgg_like(), Plan.uniform(11, conv_rule="fastest"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        planned(vgg_like(), Plan.uniform(11))


def test_load_plan_reads_files_text_dicts_and_tune_output(tmp_path: Path) -> None:
    plan = Plan.from_actions("kor", sync="layer", label="x")
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    assert load_plan(path) == plan
    assert load_plan(str(path)) == plan
    assert load_plan(plan.model_dump_json()) == plan
    assert load_plan(plan.model_dump(mode="json")) == plan
    tune = {"model": "m", "best": {"name": "x", "plan": plan.model_dump(mode="json")}}
    (tmp_path / "tune.json").write_text(json.dumps(tune))
    assert load_plan(tmp_path / "tune.json") == plan
    assert planned(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)), path).plan == plan


def test_load_plan_errors_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="does not exist"):
        load_plan(tmp_path / "missing.json")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_plan("{nope")
    with pytest.raises(PlanError, match=r"'actions\.1'"):
        load_plan({"actions": ["keep", "sideways"]})
    with pytest.raises(PlanError, match="no feasible plan"):
        load_plan({"model": "m", "best": None})
    with pytest.raises(PlanError, match="JSON object"):
        load_plan("[1, 2]")


def test_stage_modules_are_looked_up_at_every_forward() -> None:
    """A module swapped into the chain after planning (as ``apply_conv_choices`` does) is the one that runs."""
    torch.manual_seed(0)
    chain = ModelChain(
        name="swap",
        stages=flatten(nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))),
        input_shape=(4,),
    )
    pm = planned(chain, Plan.from_actions("orr"))
    x = torch.randn(3, 4)
    chain.stages[1] = dataclasses.replace(chain.stages[1], module=nn.Sigmoid())
    expected = chain.as_sequential()(x)
    torch.testing.assert_close(pm(x), expected, rtol=0, atol=0)
    chain.stages.append(chain.stages[2])
    with pytest.raises(PlanError, match="now has 4 stages but had 3"):
        pm(x)
