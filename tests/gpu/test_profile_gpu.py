"""Measured profiles on a real CUDA GPU (skipped without one; the lead runs them on the H200)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memtune.profiler._meta import meta_chain, meta_input
from memtune.profiler._storages import saved_storage_table
from memtune.profiler.chain import ModelChain, flatten

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def small_chain() -> ModelChain:
    return ModelChain(
        "small",
        flatten(
            nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1),
                nn.BatchNorm2d(16),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Flatten(),
                nn.Dropout(),
                nn.Linear(32 * 16 * 16, 10),
            )
        ),
        (3, 32, 32),
    )


def test_cuda_profile_is_measured() -> None:
    from memtune.profiler.measure import profile

    p = profile(small_chain(), 8, device="cuda")
    assert p.source == "measured"
    assert p.compute_source == p.transfer_source == f"measured:{p.device.key}"
    assert p.device.torch_version == torch.__version__
    assert all(s.forward_ms > 0 for s in p.stages)
    assert all(s.backward_ms > 0 for s in p.stages)
    saving = [s for s in p.stages if s.saved_bytes > 0]
    assert saving and all(s.d2h_ms > 0 and s.h2d_ms > 0 for s in saving)
    assert all(s.d2h_ms == 0 for s in p.stages if s.saved_bytes == 0)


def test_inline_backward_is_measured_for_every_stage() -> None:
    """NOTE [ Inline fetches ]: the max-pool fetches its input and indices on demand and makes its input's
    gradient; a ReLU fetches its output back (a copy: the chain still holds the original)."""
    from memtune.profiler.measure import profile

    p = profile(small_chain(), 64, device="cuda")
    inline = [s.backward_inline_bytes for s in p.stages]
    assert all(v is not None and v >= 0 for v in inline), inline
    pool = next(s for s in p.stages if s.kind == "maxpool2d")
    relu = next(s for s in p.stages if s.kind == "relu")
    assert (pool.backward_inline_bytes or 0) >= p.stages[pool.index - 1].output_bytes  # its input, fetched
    assert (relu.backward_inline_bytes or 0) >= relu.output_bytes
    # NOTE [ Backward transient ]: measured as a chain runs it too; the incoming gradient is made inside and counted
    # while it lives, so every stage's is at least what it makes besides, and the max-pool's is its output's gradient
    chained = [s.chained_backward_bytes for s in p.stages]
    assert all(v is not None and v >= 0 for v in chained), chained
    assert (pool.chained_backward_bytes or 0) >= pool.output_bytes


def test_cuda_profile_bfloat16() -> None:
    from memtune.profiler.measure import profile

    p = profile(small_chain(), 8, "bfloat16", device="cuda")
    assert p.dtype == "bfloat16" and p.source == "measured"


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_meta_emulation_matches_cuda(dtype: torch.dtype | None) -> None:
    """NOTE [ CUDA semantics on meta ]: the meta table is the GPU's table."""
    ch = small_chain()
    mch = meta_chain(ch)
    meta = saved_storage_table(mch, meta_input(mch, 4), autocast_dtype=dtype)
    for stage in ch.stages:
        stage.module.cuda()
    cuda = saved_storage_table(ch, torch.randn(4, 3, 32, 32, device="cuda"), autocast_dtype=dtype)
    assert [(s.bytes, s.saved_by, s.producer) for s in cuda[0]] == [(s.bytes, s.saved_by, s.producer) for s in meta[0]]
    assert cuda[1:] == meta[1:]


def test_cuda_identity() -> None:
    from memtune.profiler.identity import cuda_identity

    ident = cuda_identity()
    props = torch.cuda.get_device_properties(0)
    assert ident.name == props.name and ident.memory_bytes == props.total_memory
    assert ident.sm_count == props.multi_processor_count
    assert ident.d2h_gbps > 1 and ident.h2d_gbps > 1
    if ident.key == "h200":
        assert ident.d2h_gbps > 40  # docs/concepts.md, measured facts: 55 GB/s pinned at >= 16 MiB


def test_cuda_profile_measures_the_loss_at_the_output_shape() -> None:
    from memtune.profiler.loss import measure_loss_ms
    from memtune.profiler.measure import profile

    p = profile(small_chain(), 8, device="cuda")
    assert p.loss_ms is not None and p.loss_ms > 0
    # a language model's logits take milliseconds, far above a 10-class output's launch-bound time
    big = measure_loss_ms((8, 1024, 50304), 50304, torch.bfloat16, torch.device("cuda"))
    assert big > 10 * p.loss_ms


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_selective_bytes_are_what_the_allocator_holds(dtype: str) -> None:
    """A transformer block and a bottleneck at realistic sizes (NOTE [ Selective stages ] in
    ``memtune.profiler.selective``): the storages counted are the bytes allocated (within 1 MiB), and the selective
    passes and the selective backward's
    transient are measured."""
    from memtune.profiler import zoo
    from memtune.profiler.measure import selective_held_bytes, time_stage
    from memtune.profiler.selective import selective_saved_bytes

    device = torch.device("cuda")
    gpt = zoo.build("gpt", {"layers": 1, "width": 1024, "heads": 16, "seq_len": 1024, "vocab": 1024})
    resnet = zoo.build("resnet50", {})
    low = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    cases = [(gpt.stages[1], (8, 1024, 1024)), (resnet.stages[5], (64, 256, 56, 56))]
    for stage, shape in cases:
        stage.module.to(device).train()
        x = torch.randn(*shape, device=device)

        def autocast() -> torch.autocast:
            return torch.autocast("cuda", dtype=low, enabled=dtype != "float32")

        counted = selective_saved_bytes(stage.module, x, autocast=autocast)
        held = selective_held_bytes(stage, x, input_needs_grad=True, dtype=dtype)
        assert abs(counted - held) <= 1 << 20, (stage.name, counted, held)
        t = time_stage(stage, x, input_needs_grad=True, dtype=dtype, warmup=2, repeats=5)
        assert t.selective_backward_ms is not None and t.selective_forward_ms is not None, (stage.name, t)
        assert t.selective_backward_bytes is not None and t.selective_backward_bytes > 0
        stage.module.cpu()
