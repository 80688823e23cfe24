"""Spatially split recompute segments on a CUDA GPU (NOTE [ Spatial splitting ] in ``memtune.tuner._spatial``): the same
math as the unplanned run in fp32 (cuDNN deterministic, TF32 off) and under bf16 autocast, and a lower measured peak
than the same segment re-run whole.

Skipped without CUDA (run on the GPU with ``pytest -m gpu tests/gpu``).
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic GEMMs

import dataclasses
import gc

import pytest
import torch
from torch import nn

from benchmarks.spatial_split import CASES, build_case, case_plans
from memtune.profiler.chain import ModelChain
from memtune.profiler.loss import step_loss
from memtune.profiler.modeled import modeled_profile
from memtune.tuner.measure.bench import make_batch
from memtune.tuner.plan import Plan
from memtune.tuner.runtime import planned, reference_step
from memtune.tuner.runtime._spatial_strips import SpatialSegment

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEVICE = torch.device("cuda")


@pytest.fixture(autouse=True)
def _deterministic(deterministic: None) -> None:
    """Every test here runs deterministically (the ``deterministic`` fixture of ``conftest``)."""


def _blocks(image: int) -> ModelChain:
    """VGG-16's first two blocks and a small head (``benchmarks.spatial_split``) at ``image`` pixels, on the GPU."""
    chain = build_case(dataclasses.replace(CASES["vgg16-blocks12-1024"], image=image))
    chain.as_sequential().to(DEVICE)
    return chain


@pytest.mark.parametrize("strips", [2, 3, 8])
def test_split_blocks_keep_the_math(strips: int) -> None:
    """fp32 (cuDNN deterministic, TF32 off): the loss and every gradient within rtol 1e-5 / atol 1e-6 of the
    unplanned step's, elementwise (the split sums weight gradients over strips, in another order)."""
    chain = _blocks(67)  # odd rows: strips of unequal height
    torch.manual_seed(1)
    x = torch.randn(4, 3, 67, 45, device=DEVICE)
    plan = Plan.from_actions("r" * 10 + "kkk", spatial_splits={"0-9": strips})
    plan.check(modeled_profile(chain, 4, "float32", "h100"))
    want = reference_step(chain, x)
    got = reference_step(chain, x, run=planned(chain, plan))
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    for a, b in zip(got.grads, want.grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_autocast_is_replayed_in_the_strips_backward() -> None:
    """Under bf16 autocast the split segment's output and gradients are the unsplit bf16 run's, up to bf16 rounding
    (``tests/unit/runtime/test_spatial_runtime.py`` checks on the CPU that the re-run computes in bf16)."""
    torch.manual_seed(0)
    modules = [nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1)]
    for m in modules:
        m.to(DEVICE)
    x0 = torch.randn(2, 8, 41, 40, device=DEVICE)

    def grads(strips: int | None) -> list[torch.Tensor]:
        for m in modules:
            m.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = x * 1.0
            if strips is None:
                for m in modules:
                    h = m(h)
            else:
                h = SpatialSegment(0, 3, modules, ["a", "b", "c", "d"], strips)(h, modules)
        assert h.dtype == torch.bfloat16
        h.float().square().mean().backward()
        return [x.grad, *(p.grad for m in modules for p in m.parameters())]  # type: ignore[list-item]

    whole, split = grads(None), grads(4)
    for a, b in zip(split, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-3)


def test_split_lowers_the_measured_peak() -> None:
    """The blocks at 512x512, batch 2: the segment re-run in 4 strips peaks lower than re-run whole."""
    chain = _blocks(512)
    plans = dict(case_plans(CASES["vgg16-blocks12-1024"], len(chain)))
    x, y = make_batch(chain, 2, DEVICE)
    peaks = {}
    for name in ("recompute", "split 4"):
        plan = plans[name]
        assert plan is not None
        model = planned(chain, plan)
        for _ in range(2):  # the second step is the steady state
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            step_loss(model(x), y).backward()
            chain.as_sequential().zero_grad(set_to_none=True)
        peaks[name] = torch.cuda.max_memory_allocated()
    assert peaks["split 4"] < peaks["recompute"], peaks
