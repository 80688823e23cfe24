"""Compiled regions in the whole model's layout on a CUDA GPU (NOTE [ Regions in the whole model's layout ] in
``memtune.profiler.region_layout``): a model and input in the default layout, whose convolutions together the compiler
runs channels-last, get regions whose outputs are channels-last, and keep / offload / recompute around them give the
unplanned compiled run's gradients and buffers within ``max(1e-6, 10 x the noise of two unplanned compiled runs)``.
Skipped without CUDA (``pytest -m gpu tests/gpu/test_region_layout_gpu.py``)."""

from __future__ import annotations

import copy
import os
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic GEMMs

import pytest
import torch
from torch import nn

from memtune.profiler.region_tree import CompiledRegions, edge_writes, region_partitions
from memtune.tuner.plan import Plan
from memtune.tuner.runtime import planned
from memtune.tuner.runtime.verify import relative_error
from tests.unit.modules.region_models import TinyResNet, square, taken_grads

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

WIDE = 72  # channels: the compiler runs the whole model channels-last, and its stem alone would not be


def _step(model: nn.Module, run: Any, x: torch.Tensor) -> dict[str, torch.Tensor]:
    square(run(x)).backward()
    return {**taken_grads(model), **{f"buffer:{n}": b.detach().clone() for n, b in model.named_buffers()}}


def test_regions_of_a_default_layout_model_run_channels_last_and_keep_the_compiled_math_on_cuda(
    deterministic: None,
) -> None:
    torch.manual_seed(0)
    model = TinyResNet(width=WIDE, classes=10).cuda()
    x = torch.randn(16, 3, 64, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    names = region_partitions(model, ((x,), {}))[1].names  # a region per block
    eager = sorted(edge_writes(model, list(names), ((x,), {}), loss_fn=square))
    state = copy.deepcopy(model.state_dict())
    outputs: list[torch.Tensor] = []
    hook = model.layer1[1].register_forward_hook(lambda _m, _a, out: outputs.append(out))
    runs = []
    for _ in range(2):
        model.load_state_dict(state)
        with CompiledRegions([model.get_submodule(n) for n in names], 0.5, eager, names) as regions:
            assert regions.channels_last
            runs.append(_step(model, model, x))
    hook.remove()
    assert outputs[0].is_contiguous(memory_format=torch.channels_last) and not outputs[0].is_contiguous()
    reference, noise = runs[0], max(relative_error(runs[0][n], runs[1][n]) for n in runs[0])
    n = len(names)
    for actions in ("k" * n, "o" * n, "r" * n, ("okr" * n)[:n]):
        model.load_state_dict(state)
        run = planned(model, Plan.from_actions(actions, stages=names, compile_budget=0.5, eager_stages=tuple(eager)))
        got = _step(model, run, x)
        worst = max(relative_error(got[k], reference[k]) for k in reference)
        assert worst <= max(1e-6, 10 * noise), (actions, worst, noise)
        run.release()
    model.load_state_dict(state)
