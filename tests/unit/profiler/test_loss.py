"""The step loss: definition, roofline estimate, and the time the simulator adds for it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from memtune.profiler._profile import DeviceIdentity
from memtune.profiler.devices import get_gpu
from memtune.profiler.loss import loss_classes, measure_loss_ms, output_shape, step_loss
from memtune.profiler.loss_model import (
    LOSS_KERNELS,
    LOSS_LAUNCH_MS,
    LOSS_MEMORY_EFFICIENCY,
    loss_bytes_moved,
    modeled_loss_ms,
    profile_loss_ms,
    roofline_loss_ms,
)
from memtune.profiler.zoo import build
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import simulate
from tests.unit.tuner.profiles import conv_profile


def test_step_loss_is_fp32_cross_entropy_over_classes_and_over_tokens() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 10, generator=g, dtype=torch.bfloat16)
    labels = torch.randint(0, 10, (4,), generator=g)
    assert step_loss(logits, labels).dtype == torch.float32
    assert torch.equal(step_loss(logits, labels), F.cross_entropy(logits.float(), labels))
    tokens = torch.randn(2, 3, 7, generator=g)
    nxt = torch.randint(0, 7, (2, 3), generator=g)
    assert torch.equal(step_loss(tokens, nxt), F.cross_entropy(tokens.reshape(6, 7), nxt.reshape(6)))


def test_output_shape_and_classes_follow_the_chain() -> None:
    gpt = build("gpt", {"layers": 1, "width": 64, "heads": 2, "seq_len": 16, "vocab": 100})
    assert loss_classes(gpt) == 100
    assert output_shape(gpt, 4) == (4, 16, 100)
    alexnet = build("alexnet", {"num_classes": 10})
    assert output_shape(alexnet, 8) == (8, 10)


def test_bytes_moved_counts_the_casts_only_under_autocast() -> None:
    assert loss_bytes_moved(1000, 4) == 24 * 1000
    assert loss_bytes_moved(1000, 2) == (24 + 12) * 1000
    assert modeled_loss_ms(10**9, 4, 1e12) == pytest.approx(24.0)


def test_roofline_is_bandwidth_bound_for_big_logits_and_launch_bound_for_small_ones() -> None:
    h200 = get_gpu("h200")
    numel = 16 * 1024 * 50257
    big = roofline_loss_ms(numel * 2, "bfloat16", h200)
    assert big == pytest.approx(36 * numel / (h200.memory_bandwidth * LOSS_MEMORY_EFFICIENCY) * 1e3)
    assert roofline_loss_ms(256 * 1000 * 4, "float32", h200) == pytest.approx(LOSS_KERNELS * LOSS_LAUNCH_MS)


def test_the_simulator_adds_the_profiles_loss_time() -> None:
    prof = conv_profile().model_copy(update={"loss_ms": 0.0})
    plan = Plan.uniform(prof.n_stages)
    base = simulate(prof, plan)
    slower = simulate(prof.model_copy(update={"loss_ms": 7.5}), plan)
    assert slower.step_ms == pytest.approx(base.step_ms + 7.5)
    assert slower.peak_bytes == base.peak_bytes
    assert slower.backward_ms == pytest.approx(base.backward_ms)


def test_without_a_measurement_the_loss_is_estimated_on_known_gpus_only() -> None:
    prof = conv_profile()  # device "test": no roofline spec
    assert prof.loss_ms is None
    assert profile_loss_ms(prof) == 0.0
    h200 = get_gpu("h200")
    ident = DeviceIdentity(name=h200.name, key="h200", memory_bytes=1 << 30, d2h_gbps=50.0, h2d_gbps=50.0)
    on_h200 = prof.model_copy(update={"device": ident})
    assert profile_loss_ms(on_h200) == pytest.approx(roofline_loss_ms(prof.stages[-1].output_bytes, prof.dtype, h200))
    assert profile_loss_ms(prof.model_copy(update={"loss_ms": 3.0})) == 3.0


def test_measuring_the_loss_needs_cuda() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        measure_loss_ms((4, 10), 10, torch.float32, torch.device("cpu"))


def test_the_loss_model_keeps_its_old_names_and_the_rooflines_constants() -> None:
    from memtune.profiler import loss, loss_model, modeled

    for name in ("loss_bytes_moved", "modeled_loss_ms", "profile_loss_ms"):
        assert getattr(loss, name) is getattr(loss_model, name)
    for name in ("LOSS_KERNELS", "LOSS_LAUNCH_MS", "LOSS_MEMORY_EFFICIENCY", "roofline_loss_ms"):
        assert getattr(modeled, name) is getattr(loss_model, name)
    assert modeled.ROOFLINE.loss_memory_efficiency == LOSS_MEMORY_EFFICIENCY
    assert modeled.ROOFLINE.loss_launch_ms == LOSS_LAUNCH_MS
    h200 = get_gpu("h200")
    big = 16 * 1024 * 50257 * 2
    assert roofline_loss_ms(big, "bfloat16", h200, modeled.ROOFLINE) == roofline_loss_ms(big, "bfloat16", h200)
