"""Modeled (roofline) profiles: exact bytes and FLOPs from a meta forward, times from the roofline."""

from __future__ import annotations

import time

import pytest
from small_chains import small_chain
from torch import nn

from memtune.profiler._flops import OpCount, StageCount
from memtune.profiler._meta import meta_chain, meta_input
from memtune.profiler._profile import Profile
from memtune.profiler._storages import saved_storage_table
from memtune.profiler.chain import ModelChain, flatten
from memtune.profiler.devices import get_gpu
from memtune.profiler.modeled import (
    BACKWARD_LAUNCH_FACTOR,
    BACKWARD_TRAFFIC_FACTOR,
    BATCH_NORM_BLOCKS_PER_SM,
    BATCH_NORM_LOW_NS,
    BATCH_NORM_NS,
    CONV_EFFICIENCY,
    CONV_HALF_CHANNELS,
    FEW_CHANNEL_EFFICIENCY,
    FEW_CHANNELS,
    LAUNCH_MS,
    MEMORY_EFFICIENCY,
    POOL_EFFICIENCY,
    SIMT_EFFICIENCY,
    STAGE_BACKWARD_MS,
    STAGE_FORWARD_MS,
    TENSOR_EFFICIENCY,
    modeled_profile,
    op_ms,
    queue_ms,
    roofline_ms,
)
from memtune.profiler.profiler_errors import UnknownGPUError
from memtune.profiler.stagefacts import StageFacts


def wide_chain() -> ModelChain:
    """A conv net with enough work per stage, at large batches, that the roofline is GPU-bound, not launch-bound."""
    return ModelChain(
        "wide",
        flatten(
            nn.Sequential(
                nn.Conv2d(3, 64, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(64, 64, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(64 * 16 * 16, 10),
            )
        ),
        (3, 32, 32),
    )


def test_h200_is_faster_than_k40() -> None:
    ch = wide_chain()
    k40 = modeled_profile(ch, 64, "float32", "k40")
    h200 = modeled_profile(ch, 64, "float32", "h200")
    assert h200.forward_ms + h200.backward_ms < k40.forward_ms + k40.backward_ms
    assert all(a.d2h_ms <= b.d2h_ms for a, b in zip(h200.stages, k40.stages, strict=True))
    assert h200.storages == k40.storages  # bytes do not depend on the GPU
    for p, key in ((k40, "k40"), (h200, "h200")):
        assert p.source == "modeled"
        assert p.compute_source == p.transfer_source == f"modeled:{key}"
        assert p.device.key == key


def test_bytes_and_flops_are_exact() -> None:
    ch = small_chain()
    p = modeled_profile(ch, 2, "float32", "h200")
    conv0 = p.stages[0]
    assert conv0.flops == 2 * (2 * 4 * 8 * 8) * (3 * 3 * 3)  # 2 FLOPs per multiply-accumulate
    assert conv0.output_bytes == 2 * 4 * 64 * 4
    assert conv0.param_bytes == (4 * 3 * 9 + 4) * 4
    assert conv0.saved_bytes == 2 * 3 * 64 * 4  # the model input
    assert p.stages[7].flops == 2 * 2 * 128 * 10
    assert p.input_bytes == 2 * 3 * 64 * 4
    assert p.stages[6].saved_bytes == 2 * 128  # dropout's bool mask, as on CUDA
    (c,) = p.stages[3].convs
    assert (c.name, c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding, c.input_hw) == (
        "",
        4,
        8,
        (3, 3),
        (1, 1),
        (1, 1),
        (4, 4),
    )
    mch = meta_chain(ch)
    storages, out, inplace = saved_storage_table(mch, meta_input(mch, 2))
    assert list(p.storages) == storages
    assert [s.output_storage for s in p.stages] == out
    assert [s.inplace for s in p.stages] == inplace
    assert p.saved_bytes == sum(s.saved_bytes for s in p.stages)  # the last output is listed, not saved


def test_activations_scale_with_batch_parameters_do_not() -> None:
    ch = small_chain()
    a = modeled_profile(ch, 8, "float32", "h200")
    b = modeled_profile(ch, 32, "float32", "h200")
    assert [4 * s.saved_bytes for s in a.stages] == [s.saved_bytes for s in b.stages]
    assert [4 * s.flops for s in a.stages] == [s.flops for s in b.stages]
    assert a.param_bytes == b.param_bytes


def test_bfloat16_is_faster_and_smaller() -> None:
    ch = wide_chain()
    # at a batch where the GPU, not the host's launches, is the bound (bf16 launches more ops: the casts)
    f32 = modeled_profile(ch, 4096, "float32", "h200")
    bf16 = modeled_profile(ch, 4096, "bfloat16", "h200")
    assert bf16.dtype == "bfloat16"
    assert bf16.stages[1].saved_bytes == f32.stages[1].saved_bytes // 2  # conv output kept in bf16
    assert bf16.forward_ms + bf16.backward_ms < f32.forward_ms + f32.backward_ms


def _facts(*ops: OpCount, grad_in: bool = True, params: bool = True) -> StageFacts:
    count = StageCount(ops=len(ops), kernels=list(ops))
    return StageFacts(0, 0, 0, count, grad_in, params, ())


def test_roofline_terms() -> None:
    h200 = get_gpu("h200")
    fixed_f = STAGE_FORWARD_MS + LAUNCH_MS  # one op: its launch, then its GPU time
    fixed_b = STAGE_BACKWARD_MS + LAUNCH_MS * BACKWARD_LAUNCH_FACTOR

    fwd, bwd = roofline_ms(_facts(OpCount("matmul", 1e12, 10)), h200, "float32")
    compute = 1e12 / (67e12 * SIMT_EFFICIENCY) * 1e3  # fp32 matmuls get no TF32
    assert fwd == pytest.approx(fixed_f + compute)
    assert bwd == pytest.approx(fixed_b + 2 * compute)  # dX and dW
    fwd, bwd = roofline_ms(_facts(OpCount("matmul", 1e12, 10, "bfloat16")), h200, "bfloat16")
    assert fwd == pytest.approx(fixed_f + 1e12 / (989.4e12 * TENSOR_EFFICIENCY) * 1e3)

    fwd, bwd = roofline_ms(_facts(OpCount("memory", 0.0, 10**9), params=False), h200, "float32")
    memory = 1e9 / (4.8e12 * MEMORY_EFFICIENCY) * 1e3
    assert fwd == pytest.approx(fixed_f + memory)
    assert bwd == pytest.approx(fixed_b + BACKWARD_TRAFFIC_FACTOR * memory)
    pool, _ = roofline_ms(_facts(OpCount("pool", 0.0, 10**9)), h200, "float32")
    assert pool == pytest.approx(fixed_f + 1e9 / (4.8e12 * POOL_EFFICIENCY) * 1e3)

    tiny = [OpCount("memory", 0.0, 10)] * 10
    fwd, _ = roofline_ms(_facts(*tiny), h200, "float32")
    assert fwd == pytest.approx(STAGE_FORWARD_MS + 10 * LAUNCH_MS, rel=1e-6)  # launch-bound
    assert roofline_ms(_facts(OpCount("matmul", 1e9, 10), grad_in=False, params=False), h200, "float32")[1] == 0.0
    assert roofline_ms(_facts(), h200, "float32") == (STAGE_FORWARD_MS, STAGE_BACKWARD_MS)


def test_convolutions_need_channels_to_use_the_tensor_cores() -> None:
    h200 = get_gpu("h200")

    def conv_ms(channels: int, dtype: str) -> float:
        return op_ms(OpCount("conv", 1e12, 10, dtype, channels=channels), h200, 2)[0]

    full = 1e12 / (989.4e12 * CONV_EFFICIENCY) * 1e3
    assert conv_ms(64, "bfloat16") == pytest.approx(full * (64 + CONV_HALF_CHANNELS) / 64)
    assert conv_ms(64, "bfloat16") > conv_ms(128, "bfloat16") > conv_ms(512, "bfloat16") > full
    assert conv_ms(512, "float32") == pytest.approx(conv_ms(512, "bfloat16") * 2)  # TF32: half the bf16 peak
    rgb = 1e12 / (67e12 * FEW_CHANNEL_EFFICIENCY) * 1e3  # an RGB input: CUDA cores, whatever the dtype
    assert conv_ms(3, "bfloat16") == pytest.approx(rgb) == conv_ms(3, "float32")
    assert FEW_CHANNELS > 3


def test_batch_norm_reduces_a_channel_per_block() -> None:
    h200 = get_gpu("h200")
    per_wave = h200.sm_count * BATCH_NORM_BLOCKS_PER_SM
    n = 256 * 112 * 112

    def bn_ms(channels: int, dtype: str) -> float:
        op = OpCount("batch_norm", 0.0, 0, dtype, channels=channels, per_channel=n)
        return op_ms(op, h200, 2)[0]

    assert bn_ms(64, "float32") == pytest.approx(n * BATCH_NORM_NS * 1e-6)
    assert bn_ms(per_wave, "float32") == bn_ms(64, "float32")  # one wave of blocks either way
    assert bn_ms(per_wave + 1, "float32") == pytest.approx(2 * bn_ms(64, "float32"))
    assert bn_ms(64, "bfloat16") == pytest.approx(n * BATCH_NORM_LOW_NS * 1e-6)


def test_the_host_issues_ops_in_order() -> None:
    assert queue_ms(1.0, []) == 0.0
    assert queue_ms(1.0, [5.0, 0.0, 0.0]) == 6.0  # the GPU is busy while the host issues the rest
    assert queue_ms(1.0, [0.0, 0.0, 5.0]) == 8.0  # the big op starts only once issued
    assert queue_ms(0.0, [1.0, 2.0]) == 3.0


def test_backward_runs_the_ops_in_reverse() -> None:
    h200 = get_gpu("h200")
    big = OpCount("matmul", 1e12, 10)
    small = OpCount("memory", 0.0, 10)
    a = roofline_ms(_facts(big, small), h200, "float32")
    b = roofline_ms(_facts(small, big), h200, "float32")
    assert a[0] < b[0]  # forward: the big op first hides the small one's launch
    assert a[1] > b[1]  # backward: it comes last


def test_json_round_trip() -> None:
    p = modeled_profile(small_chain(), 4, "float32", "v100")
    assert Profile.from_json(p.to_json()) == p


def test_bad_inputs() -> None:
    with pytest.raises(UnknownGPUError):
        modeled_profile(small_chain(), 4, "float32", "voodoo5")
    with pytest.raises(ValueError, match="float64"):
        modeled_profile(small_chain(), 4, "float64", "h200")
    with pytest.raises(ValueError, match="batch"):
        modeled_profile(small_chain(), 0, "float32", "h200")


def test_vgg16_batch_256_is_modeled_quickly() -> None:
    from memtune.profiler.zoo import build

    ch = build("vgg16")
    t0 = time.perf_counter()
    p = modeled_profile(ch, 256, "float32", "h200")
    assert time.perf_counter() - t0 < 3.0
    # measured facts (docs/concepts.md): 181.7 ms per step and a 19.56 GiB peak on the H200; the roofline is within 15 %
    assert p.forward_ms + p.backward_ms == pytest.approx(181.7, rel=0.15)
    assert 15 * 2**30 < p.saved_bytes < 19.56 * 2**30


def test_attention_uses_the_fused_kernels_saved_set() -> None:
    from memtune.profiler.zoo import build

    b, heads, seq = 2, 4, 64
    gpt = build("gpt", {"layers": 1, "width": 32, "heads": heads, "seq_len": seq, "vocab": 48})
    p = modeled_profile(gpt, b, "float32", "h200")
    # memory-efficient attention keeps a log-sum-exp, never the (seq x seq) attention matrix
    assert all(s.bytes != b * heads * seq * seq * 4 for s in p.storages)
    assert any(s.bytes == b * heads * seq * 4 for s in p.storages)
