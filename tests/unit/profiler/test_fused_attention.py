"""Attention with dropout as a GPU's fused kernel runs it, on the CPU (NOTE [ Fused attention on the CPU ] in
``memtune.profiler._fused_attention``): the same values as attention with the same dropout mask, what the fused kernel
saves (no queries x keys matrix), one operation for the selective policy and the flop counter, and a CPU-made profile
of a Hugging Face model with attention dropout that saves per block what the GPU's kernel saves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from memtune.profiler._fused_attention import _blocks, _drop, fused_attention, gpu_attention
from memtune.profiler.module_profile import profile_module
from memtune.profiler.selective import SAVED_OPS

B, H, S, D = 2, 3, 40, 8


def _qkv() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(B, H, S, D, dtype=torch.float64, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_values_and_gradients_are_attentions_with_the_same_dropout_mask(p: float) -> None:
    q, k, v = _qkv()
    g = torch.randn(B, H, S, D, dtype=torch.float64)
    torch.manual_seed(1)
    out = fused_attention(q, k, v, None, p, True, D**-0.5)
    grads = torch.autograd.grad(out, (q, k, v), g)
    torch.manual_seed(1)
    seed = int(torch.randint(0, 2**62, (1,)).item())  # the seed fused_attention drew
    scores = (q @ k.transpose(-2, -1)) * D**-0.5
    probs = torch.softmax(scores.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf")), -1)
    mask = torch.empty_like(probs)
    for n, index in _blocks(q, k):
        mask[index] = _drop(probs[index].shape, p, seed, n).double()
    ref = (probs * mask) @ v
    assert torch.allclose(out, ref, atol=1e-5)  # computed in float32 blocks
    for got, want in zip(grads, torch.autograd.grad(ref, (q, k, v), g), strict=True):
        assert torch.allclose(got, want, atol=1e-5)


def test_a_boolean_mask_is_applied_as_the_framework_applies_it() -> None:
    q, k, v = _qkv()
    keep = torch.rand(B, 1, S, S) > 0.2
    keep[..., 0] = True
    ours = fused_attention(q, k, v, keep, 1e-9, False, D**-0.5)  # a dropout this small drops nothing here
    assert torch.allclose(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=keep), atol=1e-5)


def _saved(fn: object) -> list[tuple[tuple[int, ...], torch.dtype]]:
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()  # type: ignore[operator]
    return saved


def test_within_the_block_dropout_attention_saves_what_the_fused_kernel_saves() -> None:
    q, k, v = (t.detach().float().requires_grad_() for t in _qkv())

    def attend() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)

    original = F.scaled_dot_product_attention
    unfused = _saved(attend)
    assert any(shape == (B, H, S, S) for shape, _ in unfused)  # the CPU's math backend saves the probabilities
    with gpu_attention():
        fused = _saved(attend)
        out = attend()
    assert sorted(fused) == sorted([((B, H, S, D), torch.float32)] * 4 + [((B, H, S), torch.float32)])
    assert "memtune_gpu_attention" in type(out.grad_fn).__name__
    assert F.scaled_dot_product_attention is original  # restored on exit
    with gpu_attention():  # without dropout, or without a graph, the call is the framework's
        assert "memtune" not in type(F.scaled_dot_product_attention(q, k, v).grad_fn).__name__
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        with pytest.raises(RuntimeError, match="attn_mask should not be set when is_causal"):  # the framework's error
            F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(S, S, dtype=torch.bool), dropout_p=0.1,
                                           is_causal=True)  # fmt: skip


def test_it_is_one_operation_to_the_flop_counter_and_the_selective_policy() -> None:
    q, k, v = (t.detach().float().requires_grad_() for t in _qkv())
    with FlopCounterMode(display=False) as counter, gpu_attention():
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.1).sum().backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert counts["memtune.gpu_attention"] == sdpa_flop_count(q.shape, k.shape, v.shape)
    assert set(counts) == {"memtune.gpu_attention", "memtune.gpu_attention_backward"}
    assert torch.ops.memtune.gpu_attention.default in SAVED_OPS


@pytest.mark.slow
def test_a_cpu_made_profile_of_a_model_with_attention_dropout_saves_no_attention_matrix() -> None:
    """A small GPT-2 with its default attention dropout: a block of the profile made for the H100 saves less than the
    one read as the CPU runs, by at least the probabilities and the dropout mask the math backend keeps."""
    import transformers as hf

    cfg = hf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=256)
    torch.manual_seed(0)
    model = hf.GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, 256, (2, 128))
    batch = {"input_ids": ids, "labels": ids}
    made = {t: profile_module(model, batch, gpu="h100", warmup=0, repeats=1, transients=t) for t in ("gpu", "cpu")}
    probs = 2 * 4 * 128 * 128 * 4  # batch x heads x queries x keys, float32
    for name in ("transformer.h.0", "transformer.h.1"):
        gpu, cpu = (next(s for s in made[t].stages if s.name == name) for t in ("gpu", "cpu"))
        assert gpu.saved_bytes <= cpu.saved_bytes - probs
