"""Roofline device specs, GPU keys and identities."""

from __future__ import annotations

import pytest

from memtune.profiler.devices import GPUS, get_gpu, gpu_key
from memtune.profiler.identity import spec_identity
from memtune.profiler.profiler_errors import ProfilerError, UnknownGPUError

MiB = 1 << 20
GiB = 1 << 30


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("h200", "h200"),
        ("H200", "h200"),
        ("nvidia-h200", "h200"),
        ("NVIDIA H200", "h200"),
        ("a100", "a100-80gb"),
        ("A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("Tesla K40c", "k40"),
        ("titan x", "titanx"),
        ("GeForce GTX TITAN X", "titanx"),
        ("Tesla V100-PCIE-32GB", "v100"),
        ("rtx4090", "rtx4090"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("L4", "l4"),
        ("p100", "p100"),
    ],
)
def test_get_gpu_accepts_aliases(name: str, key: str) -> None:
    assert get_gpu(name).key == key


def test_unknown_gpu_lists_the_known_keys() -> None:
    with pytest.raises(UnknownGPUError) as info:
        get_gpu("voodoo5")
    msg = str(info.value)
    assert "voodoo5" in msg
    assert all(k in msg for k in GPUS)
    assert isinstance(info.value, ProfilerError) and isinstance(info.value, KeyError)


@pytest.mark.parametrize(
    ("name", "memory", "key"),
    [
        ("NVIDIA H200", None, "h200"),
        ("NVIDIA H100 80GB HBM3", 80 * GiB, "h100"),
        ("NVIDIA H100 PCIe", 80 * GiB, "h100-pcie"),
        ("NVIDIA H100 NVL", 94 * GiB, "h100-nvl"),
        ("NVIDIA GeForce RTX 4090", 24 * GiB, "rtx4090"),
        ("NVIDIA A100-SXM4-40GB", 40 * GiB, "a100-40gb"),
        ("NVIDIA A100-PCIE", 80 * GiB, "a100-80gb"),
        ("NVIDIA L40S", None, "l40s"),
        ("NVIDIA L4", None, "l4"),
        ("NVIDIA GeForce GTX TITAN Xp", None, "gtx-titan-xp"),
        ("NVIDIA RTX A6000", None, "rtx-a6000"),
    ],
)
def test_gpu_key_from_product_names(name: str, memory: int | None, key: str) -> None:
    assert gpu_key(name, memory) == key


def test_every_spec_is_complete() -> None:
    assert {"k40", "titanx", "p100", "v100", "a100-80gb", "h100", "h200", "l4", "rtx4090"} <= set(GPUS)
    for spec in GPUS.values():
        assert set(spec.peak_flops) == {"float32", "tfloat32", "bfloat16", "float16"}
        assert all(v > 0 for v in spec.peak_flops.values())
        assert spec.memory_bandwidth > 1e11 and spec.pcie_d2h > 1e9 and spec.memory_bytes >= 12 * GiB
        assert spec.peak_flops["bfloat16"] >= spec.peak_flops["float32"]


def test_old_gpus_fall_back_to_fp32_rates() -> None:
    k40 = get_gpu("k40")
    assert k40.flops_rate("bfloat16") == k40.flops_rate("float32") == k40.flops_rate("float32", conv=True)
    h200 = get_gpu("h200")
    assert h200.flops_rate("float32", conv=True) > h200.flops_rate("float32")  # TF32 convolutions
    with pytest.raises(ValueError, match="float64"):
        h200.flops_rate("float64")


def test_h200_host_link_matches_design_measurements() -> None:
    h200 = get_gpu("h200")
    gbps = lambda n: n / (h200.transfer_ms(n) * 1e-3) / 1e9  # noqa: E731
    assert gbps(MiB) == pytest.approx(38, rel=0.05)
    assert gbps(16 * MiB) == pytest.approx(55, rel=0.05)
    assert gbps(64 * MiB) == pytest.approx(55, rel=0.02)
    assert h200.transfer_ms(0) == 0.0
    assert h200.memory_bytes >= 139 * GiB
    assert get_gpu("k40").transfer_ms(64 * MiB) > 4 * h200.transfer_ms(64 * MiB)


def test_spec_identity() -> None:
    ident = spec_identity(get_gpu("a100"))
    assert ident.key == "a100-80gb"
    assert ident.compute_capability == "8.0" and ident.sm_count == 108
    assert ident.pcie_gen == 4 and ident.pcie_width == 16
    assert 20 < ident.d2h_gbps < 25 and ident.driver is None
