"""Roofline device specs: peak compute, memory bandwidth and host-link bandwidth of known GPUs.

A ``GPUSpec`` is what ``memtune.profiler.modeled`` needs to price a stage on a GPU that is not present, and
what a CPU-measured profile borrows its D2H/H2D times from. Numbers are vendor datasheet figures
(dense, no sparsity), cited beside each entry; host-link figures are *effective* pinned-memory copy
bandwidths, not the PCIe line rate.

# NOTE [ Host-link model ]
A pinned copy of ``n`` bytes takes ``copy_latency_s + n / bandwidth``. On the H200 (docs/concepts.md, measured
facts) pinned copies run at 55 GB/s each way at >= 16 MiB and 38 GB/s at 1 MiB; a fixed
8.5 us per copy plus 55 GB/s reproduces both (1 MiB: 27.6 us = 38 GB/s). The other GPUs use the
same latency and the effective rate commonly measured by CUDA's ``bandwidthTest`` on their link:
about 12 GB/s on PCIe Gen3 x16 (10 GB/s on the K40's older hosts), 25 GB/s on Gen4 x16.

# NOTE [ fp32 convolutions and TF32 ]
PyTorch lets cuDNN use TF32 for fp32 convolutions by default (``torch.backends.cudnn.allow_tf32``)
but not cuBLAS for fp32 matmuls (``torch.backends.cuda.matmul.allow_tf32`` is False). So the roofline
prices fp32 convolution FLOPs at the ``tfloat32`` rate and other fp32 FLOPs at the ``float32`` rate.
GPUs without TF32 (before Ampere) list their fp32 rate under ``tfloat32``; GPUs without a fast
bf16/fp16 path list their fp32 rate there (noted per entry).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from memtune.profiler.profiler_errors import UnknownGPUError

__all__ = ["GPUS", "GPUSpec", "get_gpu", "gpu_key"]

GiB = 1 << 30
MiB = 1 << 20
TFLOPS = 1e12
GBPS = 1e9

#: fixed cost of one pinned copy, seconds. See NOTE [ Host-link model ].
COPY_LATENCY_S = 8.5e-6


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's roofline numbers.

    Attributes:
        key: stable short name (``h200``).
        name: product name.
        peak_flops: dense peak FLOP/s by math type: ``float32``, ``tfloat32``, ``bfloat16``, ``float16``.
        memory_bandwidth: device memory bandwidth, bytes/s.
        pcie_d2h: effective pinned device-to-host copy bandwidth, bytes/s.
        pcie_h2d: effective pinned host-to-device copy bandwidth, bytes/s.
        memory_bytes: device memory, bytes.
        compute_capability: ``"9.0"``.
        sm_count: streaming multiprocessors.
        pcie_gen: host-link PCIe generation.
        pcie_width: host-link lanes.
        copy_latency_s: fixed cost per pinned copy, seconds (NOTE [ Host-link model ]).
        aliases: other names ``get_gpu`` accepts.
        note: where the numbers came from and what was substituted.
    """

    key: str
    name: str
    peak_flops: Mapping[str, float] = field(hash=False)
    memory_bandwidth: float
    pcie_d2h: float
    pcie_h2d: float
    memory_bytes: int
    compute_capability: str
    sm_count: int
    pcie_gen: int
    pcie_width: int
    copy_latency_s: float = COPY_LATENCY_S
    aliases: tuple[str, ...] = ()
    note: str = ""

    def flops_rate(self, dtype: str, *, conv: bool = False) -> float:
        """Peak FLOP/s for ``dtype`` (``float32``/``bfloat16``/``float16``).

        fp32 convolutions use the TF32 rate (NOTE [ fp32 convolutions and TF32 ]).
        """
        if dtype == "float32":
            return self.peak_flops["tfloat32" if conv else "float32"]
        if dtype not in self.peak_flops:
            raise ValueError(f"dtype {dtype!r} is not one of float32, bfloat16, float16")
        return self.peak_flops[dtype]

    def transfer_ms(self, nbytes: int, direction: str = "d2h") -> float:
        """Milliseconds to copy ``nbytes`` through pinned memory (``d2h`` or ``h2d``); 0 for 0 bytes."""
        if nbytes <= 0:
            return 0.0
        bw = self.pcie_d2h if direction == "d2h" else self.pcie_h2d
        return (self.copy_latency_s + nbytes / bw) * 1e3


def _flops(fp32: float, tf32: float | None, bf16: float | None, fp16: float | None) -> Mapping[str, float]:
    """Peak table in TFLOP/s -> FLOP/s; a missing rate falls back to the fp32 rate."""
    return MappingProxyType(
        {
            "float32": fp32 * TFLOPS,
            "tfloat32": (tf32 if tf32 is not None else fp32) * TFLOPS,
            "bfloat16": (bf16 if bf16 is not None else fp32) * TFLOPS,
            "float16": (fp16 if fp16 is not None else fp32) * TFLOPS,
        }
    )


_SPECS: tuple[GPUSpec, ...] = (
    # NVIDIA Tesla K40 datasheet (2013): 4.29 TFLOPS fp32 (5.04 with GPU Boost), 288 GB/s GDDR5,
    # 12 GB, 15 SMX, PCIe Gen3 x16. No fast fp16/bf16 and no TF32: fp32 rate used for all.
    GPUSpec(
        key="k40",
        name="Tesla K40",
        peak_flops=_flops(4.29, None, None, None),
        memory_bandwidth=288 * GBPS,
        pcie_d2h=10 * GBPS,
        pcie_h2d=10 * GBPS,
        memory_bytes=12 * GiB,
        compute_capability="3.5",
        sm_count=15,
        pcie_gen=3,
        pcie_width=16,
        aliases=("tesla k40", "k40c", "k40m"),
        note="bf16/fp16/tf32 fall back to the fp32 rate (Kepler has no fast path)",
    ),
    # NVIDIA GeForce GTX TITAN X (Maxwell GM200) spec page: 3072 CUDA cores at 1075 MHz boost = 6.6 TFLOPS
    # fp32, 336.5 GB/s, 12 GB, 24 SMs, PCIe Gen3 x16. GM200 has no fp16x2: fp32 rate for all types.
    GPUSpec(
        key="titanx",
        name="GeForce GTX TITAN X",
        peak_flops=_flops(6.6, None, None, None),
        memory_bandwidth=336.5 * GBPS,
        pcie_d2h=12 * GBPS,
        pcie_h2d=12 * GBPS,
        memory_bytes=12 * GiB,
        compute_capability="5.2",
        sm_count=24,
        pcie_gen=3,
        pcie_width=16,
        aliases=("titan x", "gtx titan x", "titanx-maxwell", "maxwell titan x"),
        note="vDNN's GPU; bf16/fp16/tf32 fall back to the fp32 rate",
    ),
    # NVIDIA Tesla P100 PCIe 16 GB datasheet: 9.3 TFLOPS fp32, 18.7 TFLOPS fp16, 732 GB/s HBM2, 56 SMs,
    # PCIe Gen3 x16. No bf16 and no TF32: bf16 and tf32 fall back to the fp32 rate.
    GPUSpec(
        key="p100",
        name="Tesla P100-PCIE-16GB",
        peak_flops=_flops(9.3, None, None, 18.7),
        memory_bandwidth=732 * GBPS,
        pcie_d2h=12 * GBPS,
        pcie_h2d=12 * GBPS,
        memory_bytes=16 * GiB,
        compute_capability="6.0",
        sm_count=56,
        pcie_gen=3,
        pcie_width=16,
        aliases=("tesla p100", "p100-pcie"),
        note="bf16/tf32 fall back to the fp32 rate",
    ),
    # NVIDIA V100 PCIe 32 GB datasheet: 14 TFLOPS fp32, 112 TFLOPS fp16 tensor, 900 GB/s HBM2, 80 SMs,
    # PCIe Gen3 x16. No bf16 tensor cores and no TF32: those fall back to the fp32 rate.
    GPUSpec(
        key="v100",
        name="Tesla V100-PCIE-32GB",
        peak_flops=_flops(14.0, None, None, 112.0),
        memory_bandwidth=900 * GBPS,
        pcie_d2h=12 * GBPS,
        pcie_h2d=12 * GBPS,
        memory_bytes=32 * GiB,
        compute_capability="7.0",
        sm_count=80,
        pcie_gen=3,
        pcie_width=16,
        aliases=("tesla v100", "v100-pcie"),
        note="bf16/tf32 fall back to the fp32 rate (Volta has neither)",
    ),
    # NVIDIA A100 80GB SXM datasheet: 19.5 TFLOPS fp32, 156 TFLOPS TF32, 312 TFLOPS bf16/fp16 (dense),
    # 2,039 GB/s HBM2e, 108 SMs, PCIe Gen4 x16 host link.
    GPUSpec(
        key="a100-80gb",
        name="NVIDIA A100-SXM4-80GB",
        peak_flops=_flops(19.5, 156.0, 312.0, 312.0),
        memory_bandwidth=2039 * GBPS,
        pcie_d2h=25 * GBPS,
        pcie_h2d=25 * GBPS,
        memory_bytes=80 * GiB,
        compute_capability="8.0",
        sm_count=108,
        pcie_gen=4,
        pcie_width=16,
        aliases=("a100", "a100-sxm4-80gb", "a100 80gb", "a100-80g"),
    ),
    # NVIDIA H100 SXM5 80GB datasheet: 67 TFLOPS fp32, 494.7 TFLOPS TF32, 989.4 TFLOPS bf16/fp16 (dense;
    # the datasheet's 989/1979 figures are with sparsity), 3.35 TB/s HBM3, 132 SMs, PCIe Gen5 x16.
    # Host link: assumed equal to the H200's measured Gen5 x16 rate.
    GPUSpec(
        key="h100",
        name="NVIDIA H100 80GB HBM3",
        peak_flops=_flops(67.0, 494.7, 989.4, 989.4),
        memory_bandwidth=3350 * GBPS,
        pcie_d2h=55 * GBPS,
        pcie_h2d=55 * GBPS,
        memory_bytes=80 * GiB,
        compute_capability="9.0",
        sm_count=132,
        pcie_gen=5,
        pcie_width=16,
        aliases=("h100-sxm", "h100 sxm5", "h100-80gb"),
        note="host link assumed equal to the H200's measured rate",
    ),
    # NVIDIA H200 SXM 141GB datasheet: same SMs as the H100 SXM (67 / 494.7 / 989.4 TFLOPS dense),
    # 4.8 TB/s HBM3e. Memory: 143,771 MiB as nvidia-smi reports it. Host link: measured (docs/concepts.md,
    # measured facts: PCIe Gen5 x16, 55 GB/s pinned each way at >= 16 MiB).
    GPUSpec(
        key="h200",
        name="NVIDIA H200",
        peak_flops=_flops(67.0, 494.7, 989.4, 989.4),
        memory_bandwidth=4800 * GBPS,
        pcie_d2h=55 * GBPS,
        pcie_h2d=55 * GBPS,
        memory_bytes=143771 * MiB,
        compute_capability="9.0",
        sm_count=132,
        pcie_gen=5,
        pcie_width=16,
        aliases=("h200-sxm", "h200 141gb", "h200-141gb"),
        note="host link measured (docs/concepts.md, measured facts)",
    ),
    # NVIDIA L4 datasheet: 30.3 TFLOPS fp32, 60 TFLOPS TF32, 121 TFLOPS bf16/fp16 (dense; half the
    # datasheet's sparsity figures), 300 GB/s GDDR6, 24 GB, 58 SMs, PCIe Gen4 x16.
    GPUSpec(
        key="l4",
        name="NVIDIA L4",
        peak_flops=_flops(30.3, 60.0, 121.0, 121.0),
        memory_bandwidth=300 * GBPS,
        pcie_d2h=25 * GBPS,
        pcie_h2d=25 * GBPS,
        memory_bytes=24 * GiB,
        compute_capability="8.9",
        sm_count=58,
        pcie_gen=4,
        pcie_width=16,
    ),
    # NVIDIA Ada whitepaper (GeForce RTX 4090): 82.6 TFLOPS fp32, 82.6 TFLOPS TF32, 165.2 TFLOPS bf16/fp16
    # with fp32 accumulate (dense), 1,008 GB/s GDDR6X, 24 GB, 128 SMs, PCIe Gen4 x16.
    GPUSpec(
        key="rtx4090",
        name="NVIDIA GeForce RTX 4090",
        peak_flops=_flops(82.6, 82.6, 165.2, 165.2),
        memory_bandwidth=1008 * GBPS,
        pcie_d2h=25 * GBPS,
        pcie_h2d=25 * GBPS,
        memory_bytes=24 * GiB,
        compute_capability="8.9",
        sm_count=128,
        pcie_gen=4,
        pcie_width=16,
        aliases=("geforce rtx 4090", "4090", "rtx-4090"),
    ),
)

#: Known GPUs by key.
GPUS: Mapping[str, GPUSpec] = MappingProxyType({s.key: s for s in _SPECS})

# (pattern on a lower-cased product name, key); first match wins.
_NAME_KEYS: tuple[tuple[str, str], ...] = (
    (r"\bh200\b", "h200"),
    (r"\bh100\b.*\bpcie\b", "h100-pcie"),  # 114 SMs and HBM2e: another type than the SXM part
    (r"\bh100\b.*\bnvl\b", "h100-nvl"),
    (r"\bh100\b", "h100"),
    (r"\ba100\b.*\b80\s*gb\b", "a100-80gb"),
    (r"\ba100\b.*\b40\s*gb\b", "a100-40gb"),
    (r"\ba100\b", "a100"),
    (r"\bl40s\b", "l40s"),
    (r"\bl40\b", "l40"),
    (r"\bl4\b", "l4"),
    (r"\brtx\s*4090\b", "rtx4090"),
    (r"\bv100\b", "v100"),
    (r"\bp100\b", "p100"),
    (r"\bk40", "k40"),
    (r"\btitan\s*x\b(?!p)", "titanx"),
)


def _norm(name: str) -> str:
    s = name.lower()
    for word in ("nvidia", "tesla", "geforce"):
        s = s.replace(word, " ")
    return re.sub(r"[^a-z0-9]+", "", s)


def gpu_key(name: str, memory_bytes: int | None = None) -> str:
    """A stable short key for a GPU product name (``"NVIDIA H200"`` -> ``"h200"``).

    Known families map to the keys of ``GPUS``; an A100 with ``memory_bytes`` above 60 GiB is
    ``a100-80gb``. Unknown names become a slug of the name (``"nvidia rtx a6000"`` -> ``"rtx-a6000"``).
    """
    low = name.lower().replace("_", " ").replace("-", " ")
    for pattern, key in _NAME_KEYS:
        if re.search(pattern, low):
            if key == "a100" and memory_bytes is not None:
                return "a100-80gb" if memory_bytes > 60 * GiB else "a100-40gb"
            return key
    words = [w for w in re.split(r"[^a-z0-9]+", low) if w and w not in ("nvidia", "tesla", "geforce")]
    return "-".join(words) or "unknown-gpu"


_ALIASES: dict[str, str] = {}
for _spec in _SPECS:
    for _alias in (_spec.key, _spec.name, *_spec.aliases):
        _ALIASES[_norm(_alias)] = _spec.key


def get_gpu(name: str) -> GPUSpec:
    """The roofline spec for ``name``; case-, punctuation- and vendor-prefix-tolerant.

    Accepts keys (``h200``), product names (``NVIDIA H200``), lease kinds (``nvidia-h200``) and
    aliases (``a100``, ``titan x``).

    Raises:
        UnknownGPUError: the name matches no known GPU; the message lists the known keys.
    """
    norm = _norm(name)
    key = _ALIASES.get(norm)
    if key is None:
        guess = gpu_key(name)
        key = guess if guess in GPUS else _ALIASES.get(_norm(guess))
    if key is None:
        known = ", ".join(sorted(GPUS))
        raise UnknownGPUError(
            f"unknown GPU {name!r}; known GPUs are: {known}. "
            "Pick one of them, or profile on the real device with device='cuda'."
        )
    return GPUS[key]
