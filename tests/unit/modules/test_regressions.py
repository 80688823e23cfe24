"""Module stages where they broke or could break: PyTorch's own ``nn.TransformerEncoder``, stages returning dicts,
models taking two inputs, a profile that must leave the model as found, stage names that cannot be planned, and
modules whose children run more than once per forward.

CPU, fp32; plans are compared with the unplanned step at 1e-6 relative (``memtune.tuner.runtime.verify``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from memtune.profiler._profile import Profile
from memtune.profiler.module_profile import as_inputs, profile_module
from memtune.profiler.module_stages import find_stages
from memtune.profiler.profiler_errors import ProfilerError
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Action, Plan
from memtune.tuner.runtime._planned import planned
from memtune.tuner.runtime.verify import check_equivalence, reference_step
from tests.unit.modules.models import (
    DictStageNet,
    MLPBlock,
    MobileNetV2,
    TwoInputNet,
    UNet,
    build_case,
    mean_square,
    sum_of_means,
)

RTOL = 1e-6
ACTIONS = (Action.KEEP, Action.OFFLOAD, Action.RECOMPUTE)


def assert_plans_exact(model: nn.Module, profile: Profile, inputs: Any, loss_fn: Any, letters: list[str]) -> None:
    """Each plan (one letter per stage, or one letter for every stage) gives the unplanned loss, grads, buffers."""
    ref = reference_step(model, inputs, loss_fn=loss_fn)
    for spec in letters:
        actions = spec * profile.n_stages if len(spec) == 1 else spec
        plan = Plan.from_actions(actions).named(profile)
        eq, _ = check_equivalence(model, plan, inputs, loss_fn=loss_fn, reference=ref)
        assert eq.ok(RTOL), (plan.compact(), plan.stages, eq)


# ---- nn.TransformerEncoder -----------------------------------------------------------------------------


def transformer_encoder() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, 2).train(), torch.randn(4, 10, 32)


@pytest.mark.parametrize("stages", [None, ["layers.*"]], ids=["default", "layers.*"])
def test_transformer_encoder_profiles_and_recompute_is_exact(stages: list[str] | None) -> None:
    """``nn.TransformerEncoder`` (its layers take a mask and flags as keyword arguments; an older chain profiler
    crashed on it on a GPU) profiles on CPU, its layers are the stages, and plans are exact."""
    model, x = transformer_encoder()
    profile = profile_module(model, x, loss_fn=mean_square, stages=stages, warmup=0, repeats=1)
    assert [s.name for s in profile.stages] == ["layers.0", "layers.1"]
    assert_plans_exact(model, profile, x, mean_square, ["r", "o", "ro", "kr"])


# ---- a stage returning a dict --------------------------------------------------------------------------


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.value)
def test_stage_returning_a_dict(action: Action) -> None:
    torch.manual_seed(0)
    model, x = DictStageNet(), torch.randn(32, 8)
    profile = profile_module(model, x, loss_fn=mean_square, warmup=0, repeats=1)
    assert [s.name for s in profile.stages] == ["stem", "blocks.0", "blocks.1", "blocks.2", "head"]
    assert_plans_exact(model, profile, x, mean_square, [action.value[0]])


# ---- two inputs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.value)
def test_two_inputs_called_through_planned(action: Action) -> None:
    """``planned(model, plan)(x, y=...)`` returns the model's dict and the unplanned gradients."""
    torch.manual_seed(0)
    model = TwoInputNet()
    x, y = torch.randn(16, 12), torch.randn(16, 6)
    profile = profile_module(model, ((x,), {"y": y}), loss_fn=sum_of_means, warmup=0, repeats=1)
    torch.manual_seed(1)
    expected = model(x, y=y)
    sum_of_means(expected).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    pm = planned(model, Plan.uniform(profile.n_stages, action).named(profile))
    torch.manual_seed(1)
    out = pm(x, y=y)
    assert isinstance(out, dict) and out.keys() == expected.keys()
    for k in out:
        assert torch.equal(out[k], expected[k]), k
    sum_of_means(out).backward()
    assert grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.equal(p.grad, grads[n]), n


# ---- profile hygiene -----------------------------------------------------------------------------------


def _state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, bool], list[bool]]:
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    modes = {n: m.training for n, m in model.named_modules()}
    return buffers, modes, [p.grad is None for p in model.parameters()]


@pytest.mark.parametrize("model_cls", [MobileNetV2, UNet], ids=lambda c: c.__name__)
@pytest.mark.parametrize("mode", ["train", "eval", "mixed"])
def test_profile_leaves_the_model_as_found(model_cls: type[nn.Module], mode: str) -> None:
    """BatchNorm running statistics, ``num_batches_tracked``, every module's training flag, the parameters' (absent)
    gradients and the CPU RNG state are what they were before ``profile_module``."""
    torch.manual_seed(0)
    model = model_cls()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn_like(x))  # running statistics away from their initial values
    if mode == "eval":
        model.eval()
    elif mode == "mixed":
        next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d)).eval()
    buffers, modes, no_grad = _state(model)
    assert any(n.endswith("num_batches_tracked") and int(b) == 2 for n, b in buffers.items())
    rng = torch.get_rng_state()

    profile_module(model, x, loss_fn=mean_square, warmup=1, repeats=1)

    after_buffers, after_modes, after_no_grad = _state(model)
    assert after_buffers.keys() == buffers.keys()
    for n, b in buffers.items():
        assert torch.equal(after_buffers[n], b), n
    assert after_modes == modes
    assert after_no_grad == no_grad
    assert torch.equal(torch.get_rng_state(), rng)


def test_profile_that_fails_leaves_the_model_as_found() -> None:
    """A loss that is not a scalar stops the profile after a forward has updated the running statistics; they and
    the training flags are restored all the same."""
    torch.manual_seed(0)
    model = MobileNetV2().eval()
    buffers, modes, _ = _state(model)
    with pytest.raises(ProfilerError, match="scalar"):
        profile_module(model, torch.randn(2, 3, 32, 32), loss_fn=lambda out: out, warmup=0, repeats=1)
    after_buffers, after_modes, _ = _state(model)
    for n, b in buffers.items():
        assert torch.equal(after_buffers[n], b), n
    assert after_modes == modes


# ---- stage names that cannot be planned ------------------------------------------------------------------


class SharedTwice(nn.Module):
    """The child ``shared`` runs twice per forward."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.shared = MLPBlock(16)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.shared(self.shared(self.stem(x))))  # type: ignore[no-any-return]


class Body(nn.Module):
    """Two blocks, each followed by the same LayerNorm: ``norm`` runs twice."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(16) for _ in range(2))
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = self.drop(self.norm(block(x)))
        return x


class CoarseNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.body = Body()
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)))  # type: ignore[no-any-return]


def test_pattern_matching_nothing_names_the_pattern() -> None:
    torch.manual_seed(0)
    model, x = CoarseNet(), torch.randn(4, 8)
    with pytest.raises(ProfilerError, match=r"'blocks\.\*'"):
        find_stages(model, as_inputs(x), ["stem", "blocks.*"])
    with pytest.raises(ProfilerError, match=r"'nothing'"):
        profile_module(model, x, stages=["nothing"], warmup=0, repeats=1)


def test_named_stage_running_twice_is_refused() -> None:
    torch.manual_seed(0)
    model, x = SharedTwice(), torch.randn(4, 8)
    with pytest.raises(ProfilerError, match=r"'shared' runs 2 times"):
        find_stages(model, as_inputs(x), ["stem", "shared", "head"])
    with pytest.raises(ProfilerError, match="'shared'"):
        profile_module(model, x, stages=["stem", "shared", "head"], warmup=0, repeats=1)


def test_parent_of_a_child_running_twice_is_one_stage() -> None:
    """By default ``body`` (whose ``norm`` runs twice) is planned whole, the profile says so, and plans are exact."""
    torch.manual_seed(0)
    model, x = CoarseNet(), torch.randn(32, 8)
    names, coarse = find_stages(model, as_inputs(x))
    assert names == ["stem", "body", "head"]
    assert len(coarse) == 1 and "body" in coarse[0] and "body.norm" in coarse[0]
    profile = profile_module(model, x, loss_fn=mean_square, warmup=0, repeats=1)
    assert "body.norm" in str(profile.model_params["coarser"])
    assert_plans_exact(model, profile, x, mean_square, ["k", "o", "r", "ork", "rrk"])


def test_model_whose_own_child_runs_twice_is_one_stage() -> None:
    """A shared child of the model itself leaves one stage, the whole model (named ''), and plans stay exact."""
    torch.manual_seed(0)
    model, x = SharedTwice(), torch.randn(32, 8)
    names, coarse = find_stages(model, as_inputs(x))
    assert names == [""] and coarse
    profile = profile_module(model, x, loss_fn=mean_square, warmup=0, repeats=1)
    assert_plans_exact(model, profile, x, mean_square, ["k", "o", "r"])


# ---- what the default stages and patterns find ---------------------------------------------------------


def test_sibling_module_lists_are_split() -> None:
    """Two ``nn.ModuleList`` side by side (a U-Net's encoder and decoder) are containers, not repeated blocks."""
    case = build_case("unet")
    names, _ = find_stages(case.model, as_inputs(case.inputs))
    assert names == ["enc.0", "enc.1", "enc.2", "bottleneck", "dec.0", "dec.1", "dec.2", "head"]


def test_sibling_sequentials_are_split() -> None:
    """MobileNetV2's ``features`` and ``classifier`` (both plain ``nn.Sequential``) are split: its inverted residual
    blocks are stages of their own."""
    case = build_case("mobilenet_v2")
    names, _ = find_stages(case.model, as_inputs(case.inputs))
    assert {f"features.{k}" for k in range(1, 6)} <= set(names), names
    assert "features" not in names and "classifier" not in names


def test_pattern_names_its_outermost_matches() -> None:
    """NOTE [ Module stages ]: ``enc.*`` names ``enc.0`` to ``enc.2``, not also the modules inside them."""
    case = build_case("unet")
    names, _ = find_stages(case.model, as_inputs(case.inputs), ["enc.*", "bottleneck", "dec.*", "head"])
    assert names == ["enc.0", "enc.1", "enc.2", "bottleneck", "dec.0", "dec.1", "dec.2", "head"]


# ---- the planned module ----------------------------------------------------------------------------------


def test_plan_for_another_model_is_refused() -> None:
    gpt2, llama = build_case("gpt2"), build_case("llama")
    profile = profile_module(gpt2.model, gpt2.inputs, loss_fn=gpt2.loss_fn, warmup=0, repeats=1)
    with pytest.raises(PlanError, match="transformer"):
        planned(llama.model, Plan.uniform(profile.n_stages, Action.RECOMPUTE).named(profile))


class Failing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("stage failed")
        return self.fc(x)  # type: ignore[no-any-return]


def test_stage_forwards_are_unchanged_by_a_step_and_by_an_error_and_restored_by_release() -> None:
    """NOTE [ Stage modules are wrapped once ] in memtune.tuner.runtime._planned_module: a step, even one that fails,
    leaves each stage's wrapper as planning installed it, and stops applying the plan; ``release`` removes it."""
    torch.manual_seed(0)
    failing = Failing()
    model = nn.Sequential(nn.Linear(8, 16), Failing(), failing, nn.Linear(16, 1))
    x = torch.randn(4, 8)
    profile = profile_module(model, x, loss_fn=mean_square, warmup=0, repeats=1)
    pm = planned(model, Plan.from_actions("korr"[: profile.n_stages]).named(profile))
    wrappers = {id(m): m.__dict__.get("forward") for m in model.modules()}
    mean_square(pm(x)).backward()
    assert {id(m): m.__dict__.get("forward") for m in model.modules()} == wrappers
    failing.fail = True
    with pytest.raises(RuntimeError, match="stage failed"):
        pm(x)
    assert {id(m): m.__dict__.get("forward") for m in model.modules()} == wrappers
    assert not pm.in_step  # the failed step ended: the model called directly runs plainly
    failing.fail = False
    with torch.no_grad():
        assert torch.equal(pm(x), model(x))  # without grad the model runs plainly
    pm.release()
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_the_chain_profiler_given_a_plain_module_says_to_use_memtune_profile() -> None:
    """A torchvision-style model given to the chain profiler failed with ``AttributeError: 'ResNet' object has no
    attribute 'stages'``; it now says which function profiles any module."""
    from memtune.profiler.measure import profile as chain_profile

    with pytest.raises(ProfilerError, match=r"memtune\.profile"):
        chain_profile(torch.nn.Linear(4, 4), batch=2)  # type: ignore[arg-type]


def test_a_stage_is_timed_alone_under_the_autocast_the_model_turns_on() -> None:
    """NOTE [ A stage runs under the autocast it was called in ]: a model whose own forward enters bf16 autocast,
    profiled at the default dtype (float32), measures each stage alone in bf16 as the step runs it: a selective
    stage keeps its matrix products' bf16 outputs, half the fp32 bytes it was said to keep before."""
    from torch import nn

    from memtune.profiler.module_profile import profile_module

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    class Bf16(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                for block in self.blocks:
                    x = block(x)
                return x

    torch.manual_seed(0)
    x = torch.randn(8, 32, 64)
    profile = profile_module(Bf16(), x, stages=["blocks.*"], warmup=0, repeats=1)
    rows = 8 * 32
    bf16_outputs = rows * (256 + 64) * 2  # up's and down's outputs, bf16
    assert [s.selective_saved_bytes for s in profile.stages] == [bf16_outputs, bf16_outputs]
