"""memtune's save rules inside compiled regions on a CUDA GPU (NOTE [ Saved tensors chosen inside a compiled region ] in
``memtune.profiler.saved_tags``): the partitioner's tags reach inductor's CUDA compile; regions compiled under rule
``compute`` save fewer activation bytes than the compiler's default partition and give its gradients and buffers within
``max(1e-6, 10 x the noise of two unruled compiled runs)``; keep, offload (side stream, pinned pool, strides kept) and
recompute around the ruled regions give the ruled regions' unplanned gradients within the same bound; attention keeps
the fused kernel's outputs and its math. Skipped without CUDA (``pytest -m gpu tests/gpu/test_saved_tags_gpu.py``).
"""

from __future__ import annotations

import copy
import os
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic GEMMs

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memtune.profiler.compiled import CompiledStage
from memtune.profiler.region_tree import CompiledRegions, edge_writes, region_partitions
from memtune.tuner.plan import Plan
from memtune.tuner.runtime import planned
from memtune.tuner.runtime.verify import relative_error
from tests.unit.modules.region_models import TinyResNet, square, taken_grads

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _resnet() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyResNet(width=32, classes=10).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(16, 3, 64, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    return model, x.contiguous(memory_format=torch.channels_last)


def _step(model: nn.Module, names: tuple[str, ...], eager: list[int], x: torch.Tensor, saves: str | None) -> Any:
    """Gradients and buffers of one unplanned step with the regions compiled (budget 1, rule ``saves``), and the
    activation bytes the compiled regions saved; the model's state is restored after it."""
    state = copy.deepcopy(model.state_dict())
    params = {p.data_ptr() for p in model.parameters()}
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params:
            saved[0] += t.numel() * t.element_size()
        return t

    with CompiledRegions([model.get_submodule(n) for n in names], 1.0, eager, names, saves):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
        square(out).backward()
    got = {**taken_grads(model), **{f"buffer:{n}": b.detach().clone() for n, b in model.named_buffers()}}
    model.load_state_dict(state)
    return got, saved[0]


def _worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(relative_error(a[n], b[n]) for n in a)


def test_plans_around_regions_compiled_under_the_compute_rule_keep_its_math_on_cuda(deterministic: None) -> None:
    model, x = _resnet()
    names = region_partitions(model, ((x,), {}))[0].names
    eager = sorted(edge_writes(model, list(names), ((x,), {}), loss_fn=square))
    default, default_bytes = _step(model, names, eager, x, None)
    noise = _worst(default, _step(model, names, eager, x, None)[0])
    ruled, ruled_bytes = _step(model, names, eager, x, "compute")
    assert ruled_bytes < default_bytes, (ruled_bytes, default_bytes)
    assert _worst(ruled, default) <= max(1e-6, 10 * noise), (_worst(ruled, default), noise)
    state = copy.deepcopy(model.state_dict())
    n = len(names)
    for actions in ("k" * n, "o" * n, "r" * n, ("okr" * n)[:n]):
        model.load_state_dict(state)
        plan = Plan.from_actions(actions, stages=names, compile_budget=1.0, compile_saves="compute",
                                 eager_stages=tuple(eager))  # fmt: skip
        run = planned(model, plan)
        square(run(x)).backward()
        got = {**taken_grads(model), **{f"buffer:{k}": b.detach().clone() for k, b in model.named_buffers()}}
        assert _worst(got, ruled) <= max(1e-6, 10 * noise), (actions, _worst(got, ruled), noise)
        if "o" in actions:
            assert run.stats.d2h_copies > 0 and run.stats.prefetched + run.stats.on_demand > 0, run.stats
        run.release()
    model.load_state_dict(state)


class _Attention(nn.Module):
    def __init__(self, width: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(F.gelu(y.transpose(1, 2).reshape(b, s, w)))


def test_attention_under_the_compute_rule_keeps_the_fused_kernels_outputs_and_math_on_cuda(deterministic: None) -> None:
    torch.manual_seed(0)
    block = _Attention().cuda().to(torch.bfloat16)
    x = torch.randn(4, 512, 256, device="cuda", dtype=torch.bfloat16)
    grads: dict[str | None, dict[str, torch.Tensor]] = {}
    saved: dict[str | None, int] = {}
    for saves in (None, "compute"):
        kept = [0]

        def pack(t: torch.Tensor, kept: list[int] = kept) -> torch.Tensor:
            kept[0] += t.numel() * t.element_size()
            return t

        run = CompiledStage(block, 1.0, saves)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = run(x)
        square(out).backward()
        grads[saves], saved[saves] = taken_grads(block), kept[0]
    assert saved["compute"] < saved[None], saved
    for name, grad in grads["compute"].items():
        torch.testing.assert_close(grad, grads[None][name], rtol=2e-2, atol=2e-3, msg=name)


@pytest.mark.parametrize(("budget", "saves"), [(1.0, None), (0.5, None), (0.0, None), (1.0, "compute")])
def test_a_compiled_region_never_draws_its_random_numbers_again_on_cuda(budget: float, saves: str | None) -> None:
    # NOTE [ Random draws kept in a compiled region ]: stochastic depth and dropout on CUDA, at budgets the stock
    # partitioner re-made the draws under
    from tests.unit.modules.test_saved_tags import drawn_once

    drawn_once(budget, saves, "cuda")  # eager draws: the gradients are eager's
    drawn_once(budget, saves, "cuda", eager_draws=False)  # inductor's own draws: the forward's mask differentiated
