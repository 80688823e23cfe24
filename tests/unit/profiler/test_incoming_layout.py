"""NOTE [ Incoming gradients as the chain makes them ] (memtune.profiler._stage_run): a stage's backward is measured
with its output's gradient in the layout its consumer's backward makes, as a compiled region's is in a step."""

from __future__ import annotations

import torch
from torch import nn

from memtune.profiler.module_profile import profile_module

SCALARS = 64  # bytes: the losses' and sums' scalars the allocator also counts
ROUNDS = 5


class _Contiguous(torch.autograd.Function):
    """Doubles its input; its backward first makes the incoming gradient contiguous, as AOTAutograd does for a
    compiled region given a gradient in another layout than it traced."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        return g.contiguous() * 2.0


class Coerces(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Contiguous.apply(x)  # type: ignore[no-any-return]


class Transposed(nn.Module):
    """Its backward gives its input's gradient transposed: not contiguous."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2) * 2.0


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, 64), Coerces(), Transposed(), nn.Linear(128, 4))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()


def _transients(model: nn.Module, x: torch.Tensor, stages: tuple[int, ...]) -> list[list[int]]:
    """Each stage's backward transient over ``ROUNDS`` profiles. The CPU allocator's events read one tensor's lifetime
    in this small step differently from profile to profile (of 20 profiles of ``_model``, stage 1 read the copy in 18
    and stage 2 its incoming gradient in 12), so a test takes the largest reading: what the backward can hold."""
    readings = []
    for _ in range(ROUNDS):
        torch.manual_seed(0)
        prof = profile_module(model, x, loss_fn=_loss, warmup=0, repeats=1, transients="cpu")
        readings.append([prof.stages[k].chained_backward_bytes or 0 for k in stages])
    return [list(col) for col in zip(*readings, strict=True)]


def test_a_stage_is_measured_with_the_gradient_layout_its_consumer_makes() -> None:
    torch.manual_seed(0)
    x = torch.randn(16, 128, 64)
    out = x.numel() * 4
    coerces, transposed = _transients(_model(), x, (1, 2))
    # the consumer hands it a transposed gradient, which its backward copies before it makes its own: the incoming
    # gradient, its contiguous copy and the gradient made live at once (less the gradient made, 1x)
    assert abs(max(coerces) - 2 * out) <= SCALARS
    # the transposing stage itself is given its gradient as the last Linear makes it (contiguous): no copy
    assert abs(max(transposed) - out) <= SCALARS


def test_a_contiguous_consumer_changes_nothing() -> None:
    torch.manual_seed(0)
    x = torch.randn(16, 128, 64)
    model = nn.Sequential(nn.Linear(64, 64), Coerces(), nn.Linear(64, 4))
    (coerces,) = _transients(model, x, (1,))
    assert abs(max(coerces) - x.numel() * 4) <= SCALARS
