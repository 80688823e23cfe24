"""Attention with dropout as a GPU's fused kernel runs it, on the CPU: what a profile made on a CPU for a GPU saves.

# NOTE [ Fused attention on the CPU ]
On a GPU, ``torch.nn.functional.scaled_dot_product_attention`` with dropout runs a fused kernel (memory-efficient
attention in fp32, flash attention in bf16 and fp16) that saves its inputs, its output, one float per row (the
softmax's log-sum-exp) and the random generator's seed and offset, and recomputes the attention matrix in its
backward. The CPU's fused kernels do not take dropout, so on the CPU the same call runs the math backend, which saves
the batch x heads x queries x keys probabilities and the dropout mask: on GPT-2 (8 x 1,024, fp32) a CPU-made block
saved 1,848 MiB against the H100's 684.5.

``gpu_attention()`` replaces the function, for a profile made on the CPU for a GPU (``transients="gpu"``), by
``fused_attention`` (one operation, ``memtune::gpu_attention``, as the GPU's is one kernel) wherever the GPU would run
a fused kernel with dropout (a dropout probability above 0, a graph being recorded, no ``enable_gqa``): it saves what
the fused kernel saves (query, key, value, the mask if one is given, the output and a float32 log-sum-exp of batch x
heads x queries) and computes the same attention, the dropout mask drawn from a seed it keeps. Its forward and
backward work through blocks of heads so that at most ``BLOCK_BYTES`` of scores are live at once, as the fused kernel
keeps its tiles on chip; the backward recomputes the scores from the log-sum-exp (five matrix products, the fused
kernel's count). Being one operation, a selective stage keeps its outputs as it keeps the GPU kernel's
(NOTE [ Selective stages ]), and the roofline prices it by the FLOPs of ``sdpa_flop_count`` as a matrix product
(NOTE [ Modeled module profiles ]). Without dropout the call is left alone: the CPU's own fused kernel saves what the
GPU's does. The values are those of attention with a dropout mask of probability p, so the profile's losses and
gradients are a training step's, not the math backend's bit for bit (a profile keeps none of them).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["BLOCK_BYTES", "FUSED_OPS", "fused_attention", "gpu_attention"]

#: the most bytes of one block's scores (float32, queries x keys per head) the emulation holds at once
BLOCK_BYTES = 16 * 2**20


def _heads_per_block(q: torch.Tensor, k: torch.Tensor) -> int:
    return max(1, BLOCK_BYTES // max(1, q.shape[-2] * k.shape[-2] * 4))


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, causal: bool, scale: float) -> torch.Tensor:
    """float32 scores of one block (..., queries, keys), masked as ``scaled_dot_product_attention`` masks them."""
    s = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
    return s


def _drop(shape: torch.Size, p: float, seed: int, block: int) -> torch.Tensor:
    """The dropout multiplier of one block: 0 with probability ``p``, else ``1 / (1 - p)``; the same for a seed and
    block every time it is drawn."""
    gen = torch.Generator().manual_seed(seed + block)
    return (torch.rand(shape, generator=gen) >= p).float() / (1.0 - p)


def _blocks(q: torch.Tensor, k: torch.Tensor) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """``(block index, index)`` over the leading dimensions of ``q``: one batch element, a block of heads."""
    lead = q.shape[:-3]
    heads, step = q.shape[-3], _heads_per_block(q, k)
    n = 0
    for outer in itertools.product(*(range(d) for d in lead)):
        for h in range(0, heads, step):
            yield n, (*outer, slice(h, h + step))
            n += 1


def _mask_block(mask: torch.Tensor | None, q: torch.Tensor, index: tuple[Any, ...]) -> torch.Tensor | None:
    if mask is None:
        return None
    full = mask.expand(*q.shape[:-2], q.shape[-2], mask.shape[-1])
    return full[index]


@torch.library.custom_op("memtune::gpu_attention", mutates_args=())
def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    p: float,
    causal: bool,
    scale: float,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The output and the float32 log-sum-exp of every row, block by block."""
    with torch.autocast(q.device.type, enabled=False):
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        for n, index in _blocks(q, k):
            s = _scores(q[index], k[index], _mask_block(mask, q, index), causal, scale)
            lse[index] = torch.logsumexp(s, dim=-1)
            probs = torch.exp(s - lse[index].unsqueeze(-1)) * _drop(s.shape, p, seed, n)
            out[index] = torch.matmul(probs, v[index].float()).to(q.dtype)
            del s, probs
        return out, lse


@_attention.register_fake
def _attention_fake(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(*q.shape[:-1], v.shape[-1]), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("memtune::gpu_attention_backward", mutates_args=())
def _attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None,
    p: float,
    causal: bool,
    scale: float,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of query, key and value, the scores recomputed block by block from the log-sum-exp."""
    with torch.autocast(q.device.type, enabled=False):
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (grad_out.float() * out.float()).sum(-1)  # rowsum(dO * O) = rowsum(P * dP)
        for n, index in _blocks(q, k):
            qb, kb, vb, go = q[index].float(), k[index].float(), v[index].float(), grad_out[index].float()
            s = _scores(q[index], k[index], _mask_block(mask, q, index), causal, scale)
            probs = torch.exp(s - lse[index].unsqueeze(-1))
            drop = _drop(s.shape, p, seed, n)
            dv[index] = torch.matmul((probs * drop).transpose(-2, -1), go).to(v.dtype)
            dp = torch.matmul(go, vb.transpose(-2, -1)) * drop
            ds = probs * (dp - delta[index].unsqueeze(-1)) * scale
            dq[index] = torch.matmul(ds, kb).to(q.dtype)
            dk[index] = torch.matmul(ds.transpose(-2, -1), qb).to(k.dtype)
            del s, probs, drop, dp, ds
        return dq, dk, dv


@_attention_backward.register_fake
def _attention_backward_fake(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, mask, p, causal, scale, seed = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, *([] if mask is None else [mask]))
    ctx.p, ctx.causal, ctx.scale, ctx.seed = p, causal, scale, seed


def _grads(ctx: Any, grad_out: torch.Tensor, _grad_lse: torch.Tensor | None) -> tuple[Any, ...]:
    q, k, v, out, lse, *rest = ctx.saved_tensors
    dq, dk, dv = _attention_backward(
        grad_out, q, k, v, out, lse, rest[0] if rest else None, ctx.p, ctx.causal, ctx.scale, ctx.seed
    )
    return dq, dk, dv, None, None, None, None, None


_attention.register_autograd(_grads, setup_context=_setup_context)


@register_flop_formula(torch.ops.memtune.gpu_attention)
def _attention_flops(q: Any, k: Any, v: Any, *_: Any, **__: Any) -> int:
    return int(sdpa_flop_count(q, k, v))


@register_flop_formula(torch.ops.memtune.gpu_attention_backward)
def _attention_backward_flops(grad_out: Any, q: Any, k: Any, v: Any, *_: Any, **__: Any) -> int:
    return int(sdpa_backward_flop_count(grad_out, q, k, v))


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    p: float,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """Attention with dropout probability ``p`` as a GPU's fused kernel runs it (NOTE [ Fused attention on the CPU ]):
    one operation, ``memtune::gpu_attention``, saving query, key, value, the mask, the output and the log-sum-exp. The
    dropout mask's seed is drawn from the CPU's generator, so a checkpoint that restores it draws the same mask."""
    seed = int(torch.randint(0, 2**62, (1,)).item())
    out, _lse = _attention(q, k, v, mask, p, causal, scale, seed)
    return out


#: the operations ``fused_attention`` runs, for the selective policy (NOTE [ Selective stages ]) and the roofline
FUSED_OPS = frozenset({torch.ops.memtune.gpu_attention.default, torch.ops.memtune.gpu_attention_backward.default})


def _fused_applies(q: torch.Tensor, mask: torch.Tensor | None, dropout_p: float, causal: bool, gqa: bool) -> bool:
    """Whether a call is one the GPU runs fused with dropout; every other call (a mask with ``is_causal``, which the
    framework refuses with its own error, included) goes to the framework's function."""
    return dropout_p > 0 and torch.is_grad_enabled() and not gqa and q.dim() >= 3 and not (causal and mask is not None)


@contextmanager
def gpu_attention() -> Iterator[None]:
    """Within the block, ``torch.nn.functional.scaled_dot_product_attention`` with dropout saves what a GPU's fused
    kernel saves (NOTE [ Fused attention on the CPU ]); every other call runs as before."""
    original = F.scaled_dot_product_attention

    def attention(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if not _fused_applies(query, attn_mask, dropout_p, is_causal, enable_gqa):
            return original(  # type: ignore[call-arg]
                query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                enable_gqa=enable_gqa,
            )  # fmt: skip
        s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
        return fused_attention(query, key, value, attn_mask, dropout_p, is_causal, s)

    F.scaled_dot_product_attention = attention  # type: ignore[assignment]
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
