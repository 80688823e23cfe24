"""The bench's peers on CPU: ``OffloadActivations`` keeps the math, strides and sharing; ``compiled_model``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memtune.tuner.measure._peers import OffloadActivations, compiled_model


class StridedNet(nn.Module):
    """Conv, ReLU, a permuted (non-contiguous) linear, a transposed intermediate and chunks with offsets."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.lin = nn.Linear(8, 16)
        self.head = nn.Linear(8, 4)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).permute(0, 2, 3, 1)  # (B, H, W, 8), channels-last strides
        h = self.lin(h) * self.scale  # (B, H, W, 16)
        t = h.transpose(1, 2)  # non-contiguous: sin and tanh save it as a view
        t = torch.sin(t) * torch.tanh(t)
        a, b = t.chunk(2, dim=-1)  # views at storage offsets 0 and 8 of one storage
        return self.head(a * b).mean(dim=(1, 2))


def _step(model: nn.Module, x: torch.Tensor, ctx: OffloadActivations | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    if ctx is None:
        out = model(x)
    else:
        with ctx:
            out = model(x)
    out.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert x.grad is not None
    return out.detach(), [x.grad.clone(), *grads]


def test_offload_is_a_copy_bitwise() -> None:
    torch.manual_seed(0)
    model = StridedNet()
    x = torch.randn(2, 3, 6, 6)
    ref_out, ref_grads = _step(model, x, None)
    off = OffloadActivations(min_offload_bytes=0, force_host_copy_on_cpu=True, module=model)
    out, grads = _step(model, x, off)
    assert torch.equal(out, ref_out)
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads, strict=True):
        assert torch.equal(g, r)
    s = off.stats
    assert s.copies > 0 and s.offloaded_bytes > 0 and s.restored_bytes > 0
    assert s.deduped > 0  # the chunks share one storage; sin and tanh save the same transposed view
    assert s.offloaded_tensors == s.copies + s.deduped
    assert s.passed_through > 0  # the weights, the buffer


def test_cpu_tensors_pass_through_by_default() -> None:
    torch.manual_seed(0)
    model = StridedNet()
    x = torch.randn(2, 3, 6, 6)
    ref_out, ref_grads = _step(model, x, None)
    off = OffloadActivations(min_offload_bytes=0)
    out, grads = _step(model, x, off)
    assert torch.equal(out, ref_out)
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads, strict=True))
    assert off.stats.copies == 0 and off.stats.offloaded_tensors == 0 and off.stats.passed_through > 0


class _SaveView(torch.autograd.Function):
    """Saves its input as given and checks in backward that it comes back with the same layout and values."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(x)
        ctx.layout = (x.shape, x.stride(), x.storage_offset(), x.clone())
        return x * 2

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def, override]
        (x,) = ctx.saved_tensors
        shape, stride, offset, value = ctx.layout
        assert (x.shape, x.stride(), x.storage_offset()) == (shape, stride, offset)
        assert torch.equal(x, value)
        return g * 2


def test_unpack_keeps_size_stride_and_offset() -> None:
    base = torch.randn(6, 10).requires_grad_(True)
    view = (base * 1).t()[2:7, 1:4]  # transposed, sliced: offset 12, strides (1, 10)
    assert not view.is_contiguous() and view.storage_offset() > 0
    off = OffloadActivations(min_offload_bytes=0, force_host_copy_on_cpu=True)
    with off:
        y = _SaveView.apply(view)
    y.sum().backward()
    assert off.stats.copies == 1 and off.stats.restored_bytes == 6 * 10 * 4


def test_views_of_one_storage_are_copied_once() -> None:
    y = torch.randn(4, 16, requires_grad=True)
    off = OffloadActivations(min_offload_bytes=0, force_host_copy_on_cpu=True)
    with off:
        a, b = y.chunk(2, dim=1)
        z = (a * b).sum()  # saves a and b, two views of y's storage
    z.backward()
    assert off.stats.offloaded_tensors == 2
    assert off.stats.copies == 1 and off.stats.deduped == 1
    assert off.stats.offloaded_bytes == y.untyped_storage().nbytes()
    assert y.grad is not None and torch.equal(y.grad, torch.cat([b, a], dim=1).detach())


def test_parameters_and_small_tensors_are_not_offloaded() -> None:
    lin = nn.Linear(8, 8, bias=False)
    x = torch.randn(4, 8, requires_grad=True)
    off = OffloadActivations(min_offload_bytes=0, force_host_copy_on_cpu=True)
    with off:
        y = lin(x * 1)  # saves the input (an activation) and the weight (a view of a Parameter)
    y.sum().backward()
    assert off.stats.copies == 1 and off.stats.offloaded_bytes == 4 * 8 * 4
    assert off.stats.passed_through >= 1
    big = OffloadActivations(min_offload_bytes=1 << 20, force_host_copy_on_cpu=True)
    with big:
        y = lin(x * 1)
    y.sum().backward()
    assert big.stats.copies == 0 and big.stats.passed_through >= 2


def test_module_buffers_pass_through() -> None:
    model = StridedNet()
    x = torch.randn(1, 3, 4, 4)
    with_module = OffloadActivations(min_offload_bytes=0, force_host_copy_on_cpu=True, module=model)
    without = OffloadActivations(min_offload_bytes=0, force_host_copy_on_cpu=True)
    for off in (with_module, without):
        with off:
            out = model(x)
        out.sum().backward()
    # the buffer ``scale`` is saved by the multiply: offloaded only when the module is not named
    assert without.stats.copies == with_module.stats.copies + 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="-1"):
        OffloadActivations(min_offload_bytes=-1)
    with pytest.raises(ValueError, match="0"):
        OffloadActivations(max_fwd_stash=0)


def test_compiled_model_matches_eager_and_checks_budget() -> None:
    with pytest.raises(ValueError, match=r"1\.5"):
        compiled_model(nn.Linear(2, 2), 1.5)
    with pytest.raises(ValueError, match=r"-0\.1"):
        compiled_model(nn.Linear(2, 2), -0.1)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    ref_out, ref_grads = _step(mlp, x, None)
    compiled = compiled_model(mlp, 0.3)
    assert {id(p) for p in compiled.parameters()} == {id(p) for p in mlp.parameters()}
    out, grads = _step(compiled, x, None)
    torch.testing.assert_close(out, ref_out)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)
