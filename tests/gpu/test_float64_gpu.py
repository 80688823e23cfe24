"""The float64 step draws its random numbers as float32 does on CUDA (NOTE [ Float32 draws in the float64 step ] in
``memtune.tuner.runtime.float64``): a model with dropout, a stochastic depth's per-sample draw and ``torch.bernoulli``
is judged against float64, its float64 loss within ``COMPARABLE_LOSS_ERROR`` of the float32 step's. On an H200
EfficientNet-B0's float64 step drew other masks before (its loss 6.0e-4 off), and none of its plans could be judged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memtune.tuner.runtime import float64_step, judge_against_float64, reference_step

pytestmark = pytest.mark.gpu


class _Dropping(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(256, 1024), nn.Linear(1024, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.dropout(torch.relu(self.a(x)), 0.3, self.training)
        keep = torch.empty(x.shape[0], 1, dtype=x.dtype, device=x.device).bernoulli_(0.8)
        gate = torch.bernoulli(torch.full_like(y, 0.6))
        return self.b(y * keep / 0.8 * gate)


def test_a_model_with_dropout_is_judged_against_float64_on_cuda() -> None:
    torch.manual_seed(0)
    model = _Dropping().cuda()
    names = [n for n, _ in model.named_parameters()]
    inputs = torch.randn(512, 256, device="cuda")
    loss = lambda out: out.square().mean()  # noqa: E731
    truth = float64_step(model, inputs, loss_fn=loss)
    ref = reference_step(model, inputs, loss_fn=loss)
    judged = judge_against_float64(ref.grads, ref, truth, names)
    assert judged.comparable, judged.summary()
