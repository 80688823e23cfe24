"""A spatially split segment keeps the math (NOTE [ Spatial splitting ] in ``memtune.tuner._spatial``): outputs, input
and parameter gradients equal the unsplit run's, for strip counts that do not divide odd heights; modules it cannot
split are refused by stage and type; ``planned`` applies ``spatial_splits`` with gradients equal to the unplanned
model's.
CPU, fp32: rtol 1e-5, atol 1e-6 (the gradients differ from the unsplit run's only in the order of summation)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from memtune.profiler import zoo
from memtune.profiler.chain import ModelChain, flatten
from memtune.profiler.measure import model_input
from memtune.profiler.modeled import modeled_profile
from memtune.profiler.spatial_modules import leaf_rows, stage_row_map
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Plan
from memtune.tuner.runtime import check_equivalence, reference_step
from memtune.tuner.runtime._spatial_strips import SpatialSegment

torch.set_num_threads(1)

RTOL, ATOL = 1e-5, 1e-6


def vgg_like() -> list[nn.Module]:
    """conv3x3 s1 p1 + in-place ReLU + maxpool 2x2 + conv with stride 2 + dilated conv + average pool."""
    torch.manual_seed(0)
    return [
        nn.Conv2d(3, 6, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=2, dilation=2),
        nn.AvgPool2d(3, stride=1, padding=1),
    ]


def step(modules: list[nn.Module], x0: torch.Tensor, strips: int | None) -> tuple[torch.Tensor, ...]:
    """One forward and backward, unsplit or split; returns output, input gradient and parameter gradients."""
    for m in modules:
        m.zero_grad(set_to_none=True)
    x = x0.clone().requires_grad_()
    h = x * 1.0  # a non-leaf input, as inside a chain
    if strips is None:
        for m in modules:
            h = m(h)
    else:
        names = [f"s{k}" for k in range(len(modules))]
        h = SpatialSegment(0, len(modules) - 1, modules, names, strips)(h, modules)
    h.square().sum().backward()
    grads = [p.grad for m in modules for p in m.parameters()]
    assert x.grad is not None and all(g is not None for g in grads)
    return (h.detach(), x.grad, *grads)  # type: ignore[arg-type]


@pytest.mark.parametrize("height", [37, 41])
@pytest.mark.parametrize("strips", [2, 3, 4, 7])
def test_split_stack_equals_unsplit(strips: int, height: int) -> None:
    modules = vgg_like()
    x0 = torch.randn(2, 3, height, 11)
    want = step(modules, x0, None)
    got = step(modules, x0, strips)
    names = ("output", "input grad", *(f"param {k}" for k in range(len(want) - 2)))
    for name, a, b in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=f"{name} differs with {strips} strips")


def test_only_the_input_is_saved_and_never_written() -> None:
    modules = vgg_like()
    x = torch.randn(2, 3, 21, 9, requires_grad=True)
    h = x * 1.0
    before = h.detach().clone()
    packed: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = SpatialSegment(0, 6, modules, [str(k) for k in range(7)], 3)(h, modules)
    assert len(packed) == 1 and packed[0] is h  # recompute semantics: x_{i-1} alone
    assert torch.equal(h, before)  # the in-place ReLU wrote strip clones, not the segment input
    out.sum().backward()


def test_autocast_state_is_replayed_in_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """The strips' re-run in backward (outside the caller's autocast block) computes in bf16, as the forward did."""
    modules = vgg_like()
    seen: list[torch.dtype] = []
    conv2d = torch.nn.functional.conv2d

    def recording(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = conv2d(*args, **kwargs)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr(torch.nn.functional, "conv2d", recording)
    x = torch.randn(1, 3, 19, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = SpatialSegment(0, 6, modules, [str(k) for k in range(7)], 2)(x * 1.0, modules)
    forward = len(seen)
    out.float().sum().backward()  # autocast is off here
    assert forward == 3 * 2 and len(seen) == 2 * forward
    assert set(seen) == {torch.bfloat16}
    assert x.grad is not None and x.grad.dtype == torch.float32


def test_batch_norm_in_training_is_refused_by_stage_and_type() -> None:
    modules = [nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()]
    names = ["features.0", "features.1", "features.2"]
    with pytest.raises(PlanError, match=r"stage 1 \(features\.1\): BatchNorm2d normalises with statistics"):
        SpatialSegment(0, 2, modules, names, 2)
    modules[1].eval()  # in eval mode it is pointwise: accepted, and the math holds
    x0 = torch.randn(1, 3, 13, 5)
    for a, b in zip(step(modules, x0, 3), step(modules, x0, None), strict=True):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("module", "why"),
    [
        (nn.Dropout(0.5), "draws random numbers"),
        (nn.Linear(4, 4), "is not a module that maps rows to rows"),
        (nn.MaxPool2d(2, ceil_mode=True), "has ceil_mode=True"),
        (nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"), "pads with 'reflect'"),
        (nn.AvgPool2d(3, padding=1, count_include_pad=False), "pads H with count_include_pad=False"),
        (nn.AdaptiveAvgPool2d(3), "is not a module that maps rows to rows"),
    ],
)
def test_unsplittable_modules_are_refused(module: nn.Module, why: str) -> None:
    with pytest.raises(PlanError, match=f"stage 3 \\(s3\\): {type(module).__name__} {why}"):
        SpatialSegment(3, 3, [nn.Identity()] * 3 + [module], ["s0", "s1", "s2", "s3"], 2)
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        leaf_rows(module)


def test_too_many_strips_for_the_rows_is_refused() -> None:
    modules = [nn.Conv2d(3, 3, 3, stride=2, padding=1)]
    seg = SpatialSegment(0, 0, modules, ["conv"], 8)
    with pytest.raises(PlanError, match="make 4 rows, fewer than the plan's 8 strips"):
        seg(torch.randn(1, 3, 7, 7), modules)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
def test_same_padding_and_row_maps() -> None:
    conv = nn.Conv2d(2, 2, 4, padding="same")  # an even kernel: one more row of padding below than above
    rows = leaf_rows(conv)
    assert (rows.kernel, rows.stride, rows.pad_top, rows.pad_bottom) == (4, 1, 1, 2)
    x0 = torch.randn(1, 2, 17, 6)
    for a, b in zip(step([conv], x0, 5), step([conv], x0, None), strict=True):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    dilated = stage_row_map(nn.Conv2d(3, 3, 3, padding=2, dilation=2), (1, 3, 9, 9), (1, 3, 9, 9))
    assert dilated is not None and (dilated.kernel, dilated.padding, dilated.out_rows) == (5, 2, 9)
    assert stage_row_map(nn.Linear(3, 3), (2, 3), (2, 3)) is None


# ---- planned() ------------------------------------------------------------------------------------


def small_chain() -> ModelChain:
    torch.manual_seed(0)
    layers: list[nn.Module] = [
        nn.Conv2d(3, 6, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(6, 6, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3, stride=2, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=2, dilation=2),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    ]
    return ModelChain(name="split-chain", stages=flatten(nn.Sequential(*layers)), input_shape=(3, 21, 13))


@pytest.mark.parametrize(
    ("actions", "splits"),
    [
        ("rrrrrrrrrkkk", {"0-8": 3}),  # from the model input to the last splittable stage
        ("krrrrkrrrkkk", {"1-4": 2, "6-8": 3}),  # starting at an in-place ReLU; two split segments
        ("kkkkorrrrkkk", {"5-8": 5}),  # its input offloaded
        ("orrrrkkkkkkk", {"1-4": 7}),
    ],
)
def test_planned_split_keeps_the_math(actions: str, splits: dict[str, int]) -> None:
    chain = small_chain()
    x = torch.randn(2, 3, 21, 13)
    plan = Plan.from_actions(actions, spatial_splits=splits)
    prof = modeled_profile(chain, 2, "float32", "h100")
    plan.check(prof)  # the profile says these stages can be split
    eq, _ = check_equivalence(chain, plan, x, steps=2, reference=reference_step(chain, x))
    assert eq.ok(RTOL), eq
    assert eq.loss == 0.0  # the forward is the unsplit one


def test_profile_records_row_maps_of_splittable_stages() -> None:
    prof = modeled_profile(small_chain(), 2, "float32", "h100")
    assert [s.rows is not None for s in prof.stages] == [True] * 9 + [False] * 3
    assert prof.stages[4].rows is not None and (prof.stages[4].rows.in_rows, prof.stages[4].rows.out_rows) == (21, 10)


@pytest.mark.slow
def test_zoo_vgg16_split_blocks_keep_the_math() -> None:
    """The zoo's VGG-16 (32x32 images): its first two blocks re-run in 3 strips, its fourth block in 2."""
    torch.manual_seed(0)
    chain = zoo.build("vgg16", {"image_size": 32, "num_classes": 10})
    x = model_input(chain, 2)
    n = len(chain)
    actions = ["k"] * n
    for k in (*range(0, 10), *range(17, 24)):
        actions[k] = "r"
    plan = Plan.from_actions(actions, spatial_splits={"0-9": 3, "17-23": 2})
    plan.check(modeled_profile(chain, 2, "float32", "h100"))
    eq, _ = check_equivalence(chain, plan, x, steps=1)
    assert eq.ok(RTOL), eq
