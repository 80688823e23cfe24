"""What a selective stage keeps, counted by storage (NOTE [ Selective stages ] in ``memtune.profiler.selective``)."""

from __future__ import annotations

import torch
from torch import nn

from memtune.profiler._meta import meta_chain, meta_input
from memtune.profiler.measure import profile
from memtune.profiler.selective import SAVED_OPS, selective_saved_bytes
from memtune.profiler.stagefacts import chain_facts
from memtune.profiler.zoo import build
from memtune.tuner.stage_choices import selective_gain_bytes


def test_an_mlp_keeps_its_two_matrix_products() -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    x = torch.randn(8, 16)
    assert selective_saved_bytes(mlp, x) == 4 * (8 * 64 + 8 * 16)
    assert torch.ops.aten.addmm.default in SAVED_OPS


def test_an_in_place_stage_keeps_nothing_and_leaves_its_input_alone() -> None:
    x = torch.randn(4, 8)
    before = x.clone()
    assert selective_saved_bytes(nn.ReLU(inplace=True), x) == 0
    assert torch.equal(x, before)


def test_cuda_semantics_on_meta_count_a_transformer_block() -> None:
    """On the meta device (the CPU path's storage table) a bf16 block keeps its bf16 matrix products and attention
    output: less than it saves, more than nothing."""
    chain = meta_chain(build("gpt", {"layers": 2, "width": 256, "heads": 4, "seq_len": 128, "vocab": 512}))
    facts = chain_facts(chain, meta_input(chain, 4), "bfloat16")
    block = facts.stages[1]
    tokens = 4 * 128
    matmuls = 2 * tokens * (3 * 256 + 256 + 4 * 256 + 256)  # qkv, proj, fc1, fc2 in bf16
    attention = 2 * tokens * 256  # its output; the log-sum-exp besides
    kept = block.count.selective_saved_bytes
    assert matmuls + attention < kept < matmuls + attention + (1 << 20)
    assert kept < block.saved_bytes


def test_a_cpu_profile_measures_selective_stages() -> None:
    chain = build("gpt", {"layers": 2, "width": 64, "heads": 4, "seq_len": 32, "vocab": 100})
    prof = profile(chain, 2, "float32", "cpu", warmup=0, repeats=1)
    block = prof.stages[1]
    assert block.selective_saved_bytes is not None and block.selective_backward_ms is not None
    assert block.selective_forward_ms is not None and block.selective_backward_bytes is None  # CUDA only
    assert selective_gain_bytes(prof, 1) > 0
    assert selective_gain_bytes(prof, prof.n_stages - 1) == 0  # the head keeps its logits
