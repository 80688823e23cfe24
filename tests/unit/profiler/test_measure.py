"""Measured profiles on the CPU: compute measured here, bytes and transfers from the GPU's spec."""

from __future__ import annotations

import pytest
import torch
from small_chains import small_chain
from torch import nn

from memtune.profiler._profile import Profile
from memtune.profiler.chain import ModelChain, flatten
from memtune.profiler.measure import model_input, profile, time_stage
from memtune.profiler.modeled import modeled_profile
from memtune.profiler.profiler_errors import ProfilerError


@pytest.fixture(scope="module")
def cpu_profile() -> tuple[Profile, list[tuple[str, int, int]]]:
    calls: list[tuple[str, int, int]] = []
    p = profile(small_chain(), 2, warmup=1, repeats=3, progress=lambda *a: calls.append(a))
    return p, calls


def test_cpu_profile_has_positive_times(cpu_profile: tuple[Profile, list[tuple[str, int, int]]]) -> None:
    p, _ = cpu_profile
    assert p.n_stages == 8
    assert all(s.forward_ms > 0 for s in p.stages)
    assert all(s.backward_ms > 0 for s in p.stages)  # stage 0 has weights; the others an input gradient
    assert all(s.forward_workspace_bytes == 0 for s in p.stages)  # only measured on CUDA


def test_cpu_profile_labels(cpu_profile: tuple[Profile, list[tuple[str, int, int]]]) -> None:
    p, _ = cpu_profile
    assert p.source == "modeled"  # compute measured on the CPU, not on the GPU it describes
    assert p.compute_source.startswith("measured:cpu ")
    assert p.transfer_source == "modeled:h200"
    assert p.device.key == "h200"


def test_cpu_profile_bytes_are_the_gpus(cpu_profile: tuple[Profile, list[tuple[str, int, int]]]) -> None:
    p, _ = cpu_profile
    m = modeled_profile(small_chain(), 2, "float32", "h200")
    assert p.storages == m.storages
    assert [s.saved_bytes for s in p.stages] == [s.saved_bytes for s in m.stages]
    assert [s.d2h_ms for s in p.stages] == [s.d2h_ms for s in m.stages]
    assert [s.flops for s in p.stages] == [s.flops for s in m.stages]
    assert sum(s.saved_bytes for s in p.stages) == sum(s.bytes for s in p.storages if s.saved_by)
    assert p.stages[6].saved_bytes == 2 * 128  # dropout's bool mask, as on CUDA
    assert all((s.d2h_ms > 0) == (s.saved_bytes > 0) for s in p.stages)


def test_progress_is_called_per_stage(cpu_profile: tuple[Profile, list[tuple[str, int, int]]]) -> None:
    p, calls = cpu_profile
    assert calls == [(s.name, s.index + 1, 8) for s in p.stages]


def test_json_round_trip(cpu_profile: tuple[Profile, list[tuple[str, int, int]]]) -> None:
    p, _ = cpu_profile
    assert Profile.from_json(p.to_json()) == p


def test_transfers_come_from_the_named_gpu() -> None:
    p = profile(small_chain(), 2, gpu="k40", warmup=0, repeats=1)
    assert p.transfer_source == "modeled:k40" and p.device.key == "k40"
    h = modeled_profile(small_chain(), 2, "float32", "h200")
    assert all(a.d2h_ms > b.d2h_ms for a, b in zip(p.stages, h.stages, strict=True) if a.saved_bytes)


def test_stage_zero_without_parameters_has_no_backward() -> None:
    ch = ModelChain("flat", flatten(nn.Sequential(nn.Flatten(), nn.Linear(12, 3))), (3, 2, 2))
    p = profile(ch, 2, warmup=0, repeats=1)
    assert p.stages[0].backward_ms == 0.0
    assert p.stages[0].inplace  # a view of the input
    assert p.stages[1].backward_ms > 0


def test_token_models_and_autocast() -> None:
    from memtune.profiler.zoo import build

    gpt = build("gpt", {"layers": 1, "width": 32, "heads": 2, "seq_len": 8, "vocab": 64})
    x = model_input(gpt, 2)
    assert x.dtype == torch.int64 and int(x.max()) < 64
    p = profile(gpt, 2, "bfloat16", warmup=0, repeats=1)
    assert p.dtype == "bfloat16"
    assert all(s.forward_ms > 0 for s in p.stages)
    assert p.input_bytes == 2 * 8 * 8


def test_time_stage_leaves_an_inplace_stage_input_intact() -> None:
    x = torch.randn(4, 8)
    before = x.clone()
    (stage,) = flatten(nn.ReLU(inplace=True))
    t = time_stage(stage, x, input_needs_grad=True, warmup=1, repeats=2)
    assert torch.equal(x, before)
    assert t.forward_ms > 0 and t.backward_ms > 0


def test_bad_devices() -> None:
    with pytest.raises(ProfilerError, match="not supported"):
        profile(small_chain(), 2, device="mps")
    if not torch.cuda.is_available():
        with pytest.raises(ProfilerError, match="CUDA is not available"):
            profile(small_chain(), 2, device="cuda")
    with pytest.raises(ValueError, match="repeats"):
        profile(small_chain(), 2, repeats=0)
