"""The float64 step draws its random numbers as float32 does on CUDA (NOTE [ Float32 draws in the float64 step ] in
``memtune.tuner.runtime.float64``): a model with dropout, a stochastic depth's per-sample draw and ``torch.bernoulli``
is judged against float64, its float64 loss within ``COMPARABLE_LOSS_ERROR`` of the float32 step's. On an H200
EfficientNet-B0's float64 step drew other masks before (its loss 6.0e-4 off), and none of its plans could be judged."""

from __future__ import annotations

import pytest
import torch

from memtune.tuner.runtime import float64_step, judge_against_float64, reference_step
from tests.unit.runtime.test_float64 import Dropping

pytestmark = pytest.mark.gpu


def test_a_model_with_dropout_is_judged_against_float64_on_cuda() -> None:
    torch.manual_seed(0)
    model = Dropping(256, 1024).cuda()
    names = [n for n, _ in model.named_parameters()]
    inputs = torch.randn(512, 256, device="cuda")
    loss = lambda out: out.square().mean()  # noqa: E731
    truth = float64_step(model, inputs, loss_fn=loss)
    ref = reference_step(model, inputs, loss_fn=loss)
    judged = judge_against_float64(ref.grads, ref, truth, names)
    assert judged.comparable, judged.summary()
