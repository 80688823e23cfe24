"""``buffers_kept``: a re-run's buffers put back bit for bit and in place (NOTE [ Buffers during recompute ]),
whatever their dtype, shape or layout, by error too."""

from __future__ import annotations

import pytest
import torch

from memtune.tuner.runtime._buffers import buffers_kept


def _buffers() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [
        torch.randn(8),  # a running mean
        torch.rand(8) + 1,  # a running variance
        torch.tensor(3, dtype=torch.int64),  # a batch count: 0-dimensional
        torch.randn(4, 6).t(),  # not contiguous
        torch.tensor([-0.0, float("nan"), float("inf")]),  # values a sum or a product would change
        torch.randn(3).half(),
        torch.tensor([True, False]),
        torch.empty(0),
        torch.randn(5).to_sparse(),  # not strided
    ]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes."""
    if a.layout != torch.strided:
        a, b = a.to_dense(), b.to_dense()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool((a.contiguous().view(-1).view(torch.uint8) == b.contiguous().view(-1).view(torch.uint8)).all())


def test_every_buffer_comes_back_bit_for_bit_after_the_block_writes_it() -> None:
    bufs = _buffers()
    before = [b.clone() for b in bufs]
    with buffers_kept(bufs):
        for b in bufs:
            if b.layout == torch.strided and b.numel():
                b.copy_(torch.ones_like(b))  # a re-run's second update
            elif b.layout != torch.strided:
                b.mul_(2)
    assert all(_same(b, old) for b, old in zip(bufs, before, strict=True))
    assert not bufs[3].is_contiguous()  # written back in place, its layout kept


def test_buffers_come_back_when_the_block_raises() -> None:
    bufs = _buffers()[:3]
    before = [b.clone() for b in bufs]
    with pytest.raises(RuntimeError, match="re-run stopped"), buffers_kept(bufs):
        for b in bufs:
            b.add_(1)
        raise RuntimeError("re-run stopped")
    assert all(_same(b, old) for b, old in zip(bufs, before, strict=True))
