"""An out-of-memory error in a planned step names where the step was: the stage in forward and in backward, and the
model's own code outside the stages (before the first stage; the loss and the code after the last stage)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from memtune.tuner.plan import Action, Plan
from memtune.tuner.runtime import PlanOutOfMemoryError, planned


class _OomIn(torch.autograd.Function):
    """Identity whose forward or backward raises ``torch.OutOfMemoryError``, as the allocator would."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, phase: str) -> torch.Tensor:
        ctx.phase = phase
        if phase == "forward":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.phase == "backward":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return grad, None


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.fail: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x).relu()
        return _OomIn.apply(y, self.fail) if self.fail else y


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head_fail: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.head_fail == "before":
            _OomIn.apply(x, "forward")
        for b in self.blocks:
            x = b(x)
        out = x.sum()  # the model's own code after its last stage: its loss
        return _OomIn.apply(out, "backward") if self.head_fail == "after" else out


def run(net: Net, action: Action) -> PlanOutOfMemoryError:
    plan = Plan.uniform(3, action).model_copy(update={"stages": ("blocks.0", "blocks.1", "blocks.2")})
    model = planned(net, plan)
    with pytest.raises(PlanOutOfMemoryError) as got, model.oom_guard():
        model(torch.randn(4, 8, requires_grad=True)).backward()
    return got.value


@pytest.mark.parametrize("action", [Action.KEEP, Action.RECOMPUTE], ids=lambda a: a.value)
@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_the_stage_is_named_in_forward_and_backward(phase: str, action: Action) -> None:
    net = Net()
    net.blocks[1].fail = phase
    err = run(net, action)
    assert (err.phase, err.stage, err.stage_name) == (phase, 1, "blocks.1")
    assert f"the {phase} of stage 1 (blocks.1)" in str(err)


def test_code_before_the_first_stage_is_named() -> None:
    net = Net()
    net.head_fail = "before"
    err = run(net, Action.KEEP)
    assert err.stage is None and err.phase == "forward"
    assert "before its first stage, stage 0 (blocks.0)" in str(err)


def test_the_loss_after_the_last_stage_is_named_not_an_unknown_stage() -> None:
    net = Net()
    net.head_fail = "after"
    err = run(net, Action.OFFLOAD)
    assert err.stage is None and err.phase == "backward"
    assert "after its last stage, stage 2 (blocks.2)" in str(err)
    assert "unknown" not in str(err)
