"""Inference facts measured on a device: each layer's forward, the host link, what one more partition costs.

``measure_facts`` times a chain's layers (``memtune.tuner.runtime.inference_facts`` reads their shapes) on the CPU or a
CUDA GPU for plans priced where they run (NOTE [ Inference plans ] in ``memtune.tuner.inference._inference_plan``);
``partition_ms`` times the runner itself (``memtune.tuner.runtime._inference_runner``) on a probe layer.
"""

from __future__ import annotations

import copy
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict

import torch
from torch import nn

from memtune.profiler import ModelChain
from memtune.tuner.inference import InferenceFacts, InferencePlan, LayerFacts, LayerPlan
from memtune.tuner.inference._facts import ConvWorkspace
from memtune.tuner.runtime._inference_runner import InferenceRunner
from memtune.tuner.runtime.inference_facts import chain_layers, layer_shapes, weighted_forward

__all__ = ["PROBE_UNITS", "measure_facts", "partition_ms", "runner_median_ms"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()  # warm-up: first calls pick kernels and fill caches
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def runner_median_ms(run: InferenceRunner, x: torch.Tensor, repeats: int) -> float:
    """Median wall ms of ``repeats`` calls of ``run`` on fresh clones of ``x`` (the clone outside the timing; CUDA
    synchronised around each call on a CUDA runner)."""
    times = []
    for _ in range(repeats):
        inp = x.clone()
        _sync(run.device)
        t0 = time.perf_counter()
        run(inp)
        _sync(run.device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _link(device: torch.device, repeats: int) -> tuple[float, float, float]:
    """(h2d GB/s, d2h GB/s, latency ms) from copies of 64 KiB and 16 MiB: pinned copies on CUDA, clones on the CPU
    (which stand for the copies there, NOTE [ Inference plans ])."""
    small, large = 64 << 10, 16 << 20
    rates: list[float] = []
    latencies: list[float] = []
    for direction in ("h2d", "d2h"):
        ms = []
        for nbytes in (small, large):
            if device.type == "cuda":
                host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
                dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
                src, dst = (host, dev) if direction == "h2d" else (dev, host)
                ms.append(_median_ms(functools.partial(dst.copy_, src, non_blocking=True), device, repeats))
            else:
                buf = torch.empty(nbytes, dtype=torch.uint8)
                ms.append(_median_ms(buf.clone, device, repeats))
        per_byte = max((ms[1] - ms[0]) / (large - small), 1e-15)  # ms per byte
        rates.append(1.0 / per_byte / 1e6)
        latencies.append(max(ms[0] - small * per_byte, 0.0))
    return rates[0], rates[1], statistics.fmean(latencies)


PROBE_UNITS = 128
"""Output channels of the probe layer whose split times one more partition (``partition_ms``)."""


def partition_ms(device: torch.device, repeats: int) -> float:
    """What one more partition costs the runner on ``device``, ms: a probe Linear(64, ``PROBE_UNITS``), its weights
    prefetched, run whole and split one channel per partition; the difference per extra partition. It is the host's
    work of a partition (taking its weights, launching it, waiting for the one before, issuing the next copy), which
    a GPU's tiny partitions wait for (NOTE [ Inference plans ])."""
    probe = nn.Sequential(nn.Linear(64, PROBE_UNITS))
    x = torch.zeros(1, 64, device=device)
    times = []
    for parts in (1, PROBE_UNITS):
        plan = InferencePlan(layers=(LayerPlan(name="0", channel_parts=parts, weights="host_prefetch"),))
        times.append(_median_ms(functools.partial(InferenceRunner(probe, plan, device=device), x), device, repeats))
    return max(times[1] - times[0], 0.0) / (PROBE_UNITS - 1)


def measure_facts(
    model: nn.Module | ModelChain,
    x: torch.Tensor,
    device: str | torch.device,
    *,
    repeats: int = 5,
    name: str | None = None,
    conv_workspace: ConvWorkspace = "framework",
) -> InferenceFacts:
    """Facts of ``model`` (called ``name``) on input ``x`` measured on ``device``: each layer's forward (its weights
    on the device, median of ``repeats``) and that of one output channel's partition, the host link, and the least a
    partition costs (``partition_ms``). The model is not changed: each layer runs as a copy on the device.
    Convolutions run as ``conv_workspace`` says (``weighted_forward``), as the plan will run them.

    Raises:
        PlanError: the model is not a chain of supported layers (``chain_layers``).
    """
    dev = torch.device(device)
    shapes = layer_shapes(model, tuple(x.shape), x.dtype)
    layers = []
    with torch.no_grad():
        h = x.to(dev)
        for (_, module), shape in zip(chain_layers(model), shapes, strict=True):
            on_dev = copy.deepcopy(module).to(dev).eval()
            run: Callable[[torch.Tensor], torch.Tensor] = on_dev
            one: float | None = None
            if isinstance(on_dev, (nn.Conv2d, nn.Linear)):
                run = functools.partial(weighted_forward, on_dev, weight=on_dev.weight, bias=on_dev.bias,
                                        conv_workspace=conv_workspace)  # fmt: skip
                if shape.units > 1:  # one output channel's partition (NOTE [ Inference plans ])
                    bias = None if on_dev.bias is None else on_dev.bias[:1]
                    one_channel = functools.partial(weighted_forward, on_dev, h, on_dev.weight[:1], bias,
                                                    conv_workspace)  # fmt: skip
                    one = _median_ms(one_channel, dev, repeats)
            ms = _median_ms(functools.partial(run, h), dev, repeats)  # in place: the same work each time
            h = run(h)
            layers.append(LayerFacts(**{**asdict(shape), "forward_ms": ms, "one_channel_ms": one}))
            del on_dev
    h2d, d2h, latency = _link(dev, repeats)
    floor = partition_ms(dev, repeats)
    return InferenceFacts(
        model=name or (model.name if isinstance(model, ModelChain) else type(model).__name__.lower()),
        batch=int(x.shape[0]),
        dtype=str(x.dtype).removeprefix("torch."),
        device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        source="measured",
        layers=tuple(layers),
        h2d_gbps=h2d,
        d2h_gbps=d2h,
        copy_latency_ms=latency,
        copies_overlap=dev.type == "cuda",
        partition_floor_ms=floor,
        conv_workspace=conv_workspace,
    )
