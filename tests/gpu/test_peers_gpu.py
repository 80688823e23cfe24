"""The bench's offload peer on a CUDA GPU, around a compiled model: same gradients, less memory after forward.

Skipped without CUDA (run on the H200 with ``pytest -m gpu tests/gpu``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic GEMMs

import pytest
import torch
from torch import nn

from memtune.tuner.measure._peers import OffloadActivations, compiled_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _step(model: nn.Module, params: list[nn.Parameter], x: torch.Tensor, ctx: Any) -> tuple[int, torch.Tensor, list]:
    """Bytes allocated at the end of the forward (above before it), the loss and the gradients."""
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with ctx:
        loss = model(x).float().square().mean()
    after_forward = torch.cuda.memory_allocated() - before
    loss.backward()
    torch.cuda.synchronize()
    return after_forward, loss.detach(), [p.grad.clone() for p in params if p.grad is not None]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "eager"])
def test_offload_keeps_gradients_and_frees_activations(deterministic: None, compiled: bool) -> None:
    torch.manual_seed(0)
    width = 1024
    mlp = nn.Sequential(
        nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, 16),
    ).cuda()  # fmt: skip
    model = compiled_model(mlp, 1.0) if compiled else mlp
    params = list(mlp.parameters())
    x = torch.randn(4096, width, device="cuda")  # 16 MiB activations
    _step(model, params, x, contextlib.nullcontext())  # compiles; warms the allocator
    plain_bytes, plain_loss, plain_grads = _step(model, params, x, contextlib.nullcontext())
    off = OffloadActivations(module=mlp)
    off_bytes, off_loss, off_grads = _step(model, params, x, off)
    offloaded = off.stats.offloaded_bytes
    again_bytes, _, again_grads = _step(model, params, x, off)  # a second step reuses the context manager
    print(f"after forward: {plain_bytes} B plain, {off_bytes} B offloaded ({offloaded} B to the host); {off.stats}")

    assert torch.equal(off_loss, plain_loss)
    assert len(off_grads) == len(plain_grads) == len(params)
    for a, b, c in zip(plain_grads, off_grads, again_grads, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(a, c)
    s = off.stats
    assert s.copies > 0 and s.restored_bytes > 0 and s.passed_through > 0
    # everything offloaded but the input (the caller holds it) is gone from the device after the forward
    assert off_bytes <= plain_bytes - (offloaded - x.nbytes), (off_bytes, plain_bytes, offloaded)
    assert again_bytes == off_bytes
