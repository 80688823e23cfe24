"""A stage's forward transient is measured above its inputs, which a step holds before the stage runs: a stage that
saves only its output (a ReLU) has none, where counting its inputs' copies inside the meter showed one input."""

from __future__ import annotations

import torch
from torch import nn

from memtune.profiler.module_profile import profile_module


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()


def test_a_stage_that_saves_only_its_output_has_no_forward_transient() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    prof = profile_module(model, torch.randn(4096, 256), loss_fn=_loss, warmup=0, repeats=1, transients="cpu")
    assert [s.forward_workspace_bytes for s in prof.stages] == [0, 0, 0]
