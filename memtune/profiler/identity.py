"""GPU identity: the structured description of a device a profile was measured on (or modeled for).

A GPU identity is structured (name, compute capability, SM count, memory, PCIe gen x width, driver, cuDNN),
never only a product string (docs/concepts.md, measured facts). ``cuda_identity`` reads a live CUDA device and measures
its pinned-copy bandwidth each way; ``spec_identity`` describes a roofline ``GPUSpec``.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess

import torch

from memtune.profiler._profile import DeviceIdentity
from memtune.profiler.devices import GPUSpec, gpu_key
from memtune.profiler.profiler_errors import ProfilerError

__all__ = ["cuda_identity", "measure_pinned_gbps", "spec_identity", "transfer_ms"]

_COPY_BYTES = 64 << 20  # DeviceIdentity documents its bandwidths at 64 MiB


def spec_identity(spec: GPUSpec) -> DeviceIdentity:
    """The identity of a roofline spec: datasheet numbers, no driver/torch/cuDNN versions."""
    return DeviceIdentity(
        name=spec.name,
        key=spec.key,
        compute_capability=spec.compute_capability,
        sm_count=spec.sm_count,
        memory_bytes=spec.memory_bytes,
        pcie_gen=spec.pcie_gen,
        pcie_width=spec.pcie_width,
        d2h_gbps=round(_COPY_BYTES / (spec.transfer_ms(_COPY_BYTES, "d2h") * 1e-3) / 1e9, 3),
        h2d_gbps=round(_COPY_BYTES / (spec.transfer_ms(_COPY_BYTES, "h2d") * 1e-3) / 1e9, 3),
    )


def _nvidia_smi(index: int, fields: str) -> list[str] | None:
    """One row of ``nvidia-smi --query-gpu=<fields>`` for GPU ``index``; None if unavailable."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", f"--id={index}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return [v.strip() for v in lines[0].split(",")] if lines else None


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def measure_pinned_gbps(
    nbytes: int = _COPY_BYTES, *, device_index: int = 0, warmup: int = 2, repeats: int = 5
) -> tuple[float, float]:
    """Measured pinned-memory copy bandwidth ``(d2h, h2d)`` in GB/s (1e9 bytes/s), by ``transfer_ms``."""
    d2h, h2d = transfer_ms([nbytes], torch.device("cuda", device_index), warmup=warmup, repeats=repeats)[nbytes]
    return nbytes / (d2h * 1e-3) / 1e9, nbytes / (h2d * 1e-3) / 1e9


def transfer_ms(
    sizes: list[int], device: torch.device, *, warmup: int = 2, repeats: int = 5
) -> dict[int, tuple[float, float]]:
    """Measured ``{bytes: (d2h_ms, h2d_ms)}`` of pinned copies of each distinct size (CUDA only).

    One device buffer and one pinned host buffer of the largest size are allocated once; each size
    copies a prefix of them with ``non_blocking=True`` on a side stream, timed with CUDA events on that
    stream: ``warmup`` untimed copies, then the median of ``repeats``.
    """
    distinct = sorted({s for s in sizes if s > 0})
    if not distinct:
        return {}
    biggest = distinct[-1]
    gpu_buf = torch.empty(biggest, dtype=torch.uint8, device=device)
    host_buf = torch.empty(biggest, dtype=torch.uint8, pin_memory=True)
    stream = torch.cuda.Stream(device=device)
    torch.cuda.synchronize(device)

    def median(dst: torch.Tensor, src: torch.Tensor) -> float:
        times: list[float] = []
        for k in range(warmup + repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                start.record(stream)
                dst.copy_(src, non_blocking=True)
                end.record(stream)
            end.synchronize()
            if k >= warmup:
                times.append(float(start.elapsed_time(end)))
        return statistics.median(times)

    out = {n: (median(host_buf[:n], gpu_buf[:n]), median(gpu_buf[:n], host_buf[:n])) for n in distinct}
    del gpu_buf, host_buf
    return out


def cuda_identity(device_index: int = 0) -> DeviceIdentity:
    """Read and measure the identity of CUDA device ``device_index``.

    Name, compute capability, SM count and memory come from ``torch.cuda.get_device_properties``;
    PCIe generation and width and the driver from ``nvidia-smi`` when it is present (else None, and the
    driver falls back to torch's CUDA version); pinned bandwidths are measured with 64 MiB copies
    (``measure_pinned_gbps``).

    Raises:
        ProfilerError: CUDA is not available or the index is out of range.
    """
    if not torch.cuda.is_available():
        raise ProfilerError(
            "CUDA is not available: cuda_identity needs a GPU. "
            "On a CPU machine use memtune.profiler.identity.spec_identity(get_gpu(name)) instead."
        )
    count = torch.cuda.device_count()
    if not 0 <= device_index < count:
        raise ProfilerError(f"CUDA device index {device_index} is out of range 0..{count - 1}")
    props = torch.cuda.get_device_properties(device_index)
    d2h, h2d = measure_pinned_gbps(device_index=device_index)
    # queried right after the copies: an idle link may have trained down to a lower generation
    smi = _nvidia_smi(device_index, "pcie.link.gen.current,pcie.link.width.current,driver_version")
    gen = _int_or_none(smi[0]) if smi else None
    width = _int_or_none(smi[1]) if smi else None
    driver = smi[2] if smi and len(smi) > 2 else None
    if driver is None and torch.version.cuda is not None:
        driver = f"cuda {torch.version.cuda}"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return DeviceIdentity(
        name=props.name,
        key=gpu_key(props.name, props.total_memory),
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count,
        memory_bytes=props.total_memory,
        pcie_gen=gen,
        pcie_width=width,
        d2h_gbps=round(d2h, 3),
        h2d_gbps=round(h2d, 3),
        driver=driver,
        torch_version=torch.__version__,
        cudnn_version=str(cudnn) if cudnn is not None else None,
    )
