"""Modeled profiles: a roofline estimate of every stage on a GPU that is not present.

The chain runs once on the ``meta`` device at the full batch with CUDA semantics (``memtune.profiler._meta``):
shapes, saved storages and FLOPs are exact for that batch, no memory is used and nothing is computed,
so VGG-16 at batch 256 is modeled in well under a second. Times come from a roofline.

# NOTE [ Roofline ]
A stage's time is what the profiler would measure (NOTE [ Stage timing ] in ``memtune.profiler.measure``): its forward,
then its backward, each timed alone in eager PyTorch. The meta forward lists the ATen ops of each stage in order
(``memtune.profiler._flops.OpCount``): kind, FLOPs, bytes read plus written (no fusion), dtype and channels. Each op is
priced on the GPU, and the host issues the ops one after another:

* GPU time of an op = max(compute, memory) + a batch norm's reduction.
  - compute = FLOPs / (peak x efficiency). A matrix product (attention included) in bf16/fp16 runs at the
    tensor-core peak x ``TENSOR_EFFICIENCY``, in fp32 at the fp32 peak x ``SIMT_EFFICIENCY`` (PyTorch does not
    let cuBLAS use TF32). A convolution runs at the tensor-core peak (TF32 for fp32, NOTE [ fp32 convolutions
    and TF32 ] in ``memtune.profiler.devices``) x ``CONV_EFFICIENCY`` x C / (C + ``CONV_HALF_CHANNELS``), C its input
    channels per group: convolutions with few channels use the tensor cores poorly (VGG-16 at batch 256 on the
    H200 in bf16: 0.14 of the peak at 64 channels, 0.54 at 512). One with fewer than ``FEW_CHANNELS`` (an RGB
    input) runs at the fp32 peak x ``FEW_CHANNEL_EFFICIENCY``.
  - memory = bytes / (bandwidth x ``MEMORY_EFFICIENCY``); pooling and reductions at ``POOL_EFFICIENCY``.
  - a batch norm over NCHW reduces each channel in one thread block, at most ``BATCH_NORM_BLOCKS_PER_SM`` per SM
    at once: ceil(C / (SMs x blocks)) x (elements per channel) x ``BATCH_NORM_NS`` ns (``BATCH_NORM_LOW_NS``
    for a bf16/fp16 input with fp32 weights, as under autocast: slower per element). ResNet's first batch norm
    (64 channels of 112x112, batch 256) takes 1.9 ms in fp32 and 3.1 ms in bf16 on the H200, where its bytes
    alone would take 0.35 and 0.17 ms.
* Host: eager PyTorch spends ``LAUNCH_MS`` of CPU per op (dispatch, autocast, the module call, the launch),
  and ``STAGE_FORWARD_MS`` per stage. The GPU starts an op when it is issued and the previous one is done, so
  the forward takes ``STAGE_FORWARD_MS`` + max over k of (k x ``LAUNCH_MS`` + GPU time of ops k..n): launch-bound
  for small ops, GPU-bound for large ones.
* Backward: the ops in reverse order, ``STAGE_BACKWARD_MS`` + the same queue with ``BACKWARD_LAUNCH_FACTOR`` x
  ``LAUNCH_MS`` per op (the autograd engine issues from C++). A convolution or matrix product costs its forward
  compute once per gradient it makes (dX when the stage's input needs one, dW when the stage has parameters),
  a memory-bound op ``BACKWARD_TRAFFIC_FACTOR`` x its forward GPU time. No backward when neither gradient is
  needed.
* Loss: bytes (``memtune.profiler.loss_model``) / (bandwidth x ``LOSS_MEMORY_EFFICIENCY``), at least ``LOSS_KERNELS`` x
  ``LOSS_LAUNCH_MS``. The loss's constants and ``roofline_loss_ms`` live in the torch-free
  ``memtune.profiler.loss_model`` (the simulator prices the loss of a profile without ``loss_ms`` by them); this module
  re-exports them.

The constants are global: GPUs differ only by their ``GPUSpec`` (peaks, bandwidth, SMs). They are fitted by
least squares to the measured H100 and H200 profiles of the zoo (``memtune/profiler/data``), stage by stage and step
by step: ``python -m benchmarks.fit_roofline`` prints them (and what fitting on one GPU type predicts for the
other); ``python -m benchmarks.modeled_vs_measured`` compares modeled and measured steps. The host constants are
those of the machines that measured them; a slower host makes small-batch steps slower than modeled.
D2H/H2D of S_i use the spec's host link (NOTE [ Host-link model ]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from memtune.profiler._flops import OpCount
from memtune.profiler._meta import meta_chain, meta_input
from memtune.profiler._profile import Profile, StageProfile
from memtune.profiler.chain import ModelChain
from memtune.profiler.devices import GPUSpec, get_gpu
from memtune.profiler.identity import spec_identity
from memtune.profiler.loss_model import (
    LOSS_KERNELS,
    LOSS_LAUNCH_MS,
    LOSS_MEMORY_EFFICIENCY,
    roofline_loss_ms,
)
from memtune.profiler.spatial_modules import chain_row_maps
from memtune.profiler.stagefacts import ChainFacts, StageFacts, chain_facts, torch_dtype

__all__ = [
    "BACKWARD_LAUNCH_FACTOR",
    "BACKWARD_TRAFFIC_FACTOR",
    "BATCH_NORM_BLOCKS_PER_SM",
    "BATCH_NORM_LOW_NS",
    "BATCH_NORM_NS",
    "CONV_EFFICIENCY",
    "CONV_HALF_CHANNELS",
    "FEW_CHANNELS",
    "FEW_CHANNEL_EFFICIENCY",
    "LAUNCH_MS",
    "LOSS_KERNELS",
    "LOSS_LAUNCH_MS",
    "LOSS_MEMORY_EFFICIENCY",
    "MEMORY_EFFICIENCY",
    "POOL_EFFICIENCY",
    "ROOFLINE",
    "SIMT_EFFICIENCY",
    "STAGE_BACKWARD_MS",
    "STAGE_FORWARD_MS",
    "TENSOR_EFFICIENCY",
    "Roofline",
    "meta_facts",
    "modeled_profile",
    "op_ms",
    "queue_ms",
    "roofline_loss_ms",
    "roofline_ms",
]

# Fitted by ``python -m benchmarks.fit_roofline`` (NOTE [ Roofline ]); paste what it prints (the two ``LOSS_``
# constants into ``memtune/profiler/loss_model.py``).
TENSOR_EFFICIENCY = 0.492
CONV_EFFICIENCY = 0.744
CONV_HALF_CHANNELS = 172.0
SIMT_EFFICIENCY = 0.728
FEW_CHANNEL_EFFICIENCY = 0.386
MEMORY_EFFICIENCY = 0.986
POOL_EFFICIENCY = 0.275
BATCH_NORM_NS = 0.603
BATCH_NORM_LOW_NS = 1.05
BACKWARD_TRAFFIC_FACTOR = 1.91
LAUNCH_MS = 0.0545
BACKWARD_LAUNCH_FACTOR = 0.519
STAGE_FORWARD_MS = 0.0165
STAGE_BACKWARD_MS = 0.146

# Structural, not fitted.
FEW_CHANNELS = 8  # input channels per group below which a convolution does not use the tensor cores
BATCH_NORM_BLOCKS_PER_SM = 2  # channel-reduction blocks one SM runs at once

_LOW = ("bfloat16", "float16")


@dataclass(frozen=True)
class Roofline:
    """The roofline's fitted constants (NOTE [ Roofline ]); ``ROOFLINE`` holds the committed ones.

    Attributes:
        tensor_efficiency: bf16/fp16 matrix products, fraction of the tensor-core peak.
        conv_efficiency: convolutions with many channels, fraction of the tensor-core (TF32/bf16/fp16) peak.
        conv_half_channels: input channels per group at which a convolution reaches half of ``conv_efficiency``.
        simt_efficiency: fp32 matrix products, fraction of the fp32 peak.
        few_channel_efficiency: convolutions with fewer than ``FEW_CHANNELS`` input channels, fraction of the
            fp32 peak.
        memory_efficiency: memory-bound ops, fraction of the memory bandwidth.
        pool_efficiency: pooling and reductions, fraction of the memory bandwidth.
        batch_norm_ns: ns per element one thread block takes to reduce a channel of an fp32 batch norm.
        batch_norm_low_ns: the same for a bf16/fp16 batch norm.
        backward_traffic_factor: a memory-bound op's backward GPU time over its forward's.
        launch_ms: host time per forward op, ms.
        backward_launch_factor: host time per backward op over ``launch_ms``.
        stage_forward_ms: host time per stage forward, ms.
        stage_backward_ms: host time per stage backward, ms.
        loss_memory_efficiency: the loss's kernels, fraction of the memory bandwidth.
        loss_launch_ms: the loss's time per kernel when its kernels are small, ms.
    """

    tensor_efficiency: float = TENSOR_EFFICIENCY
    conv_efficiency: float = CONV_EFFICIENCY
    conv_half_channels: float = CONV_HALF_CHANNELS
    simt_efficiency: float = SIMT_EFFICIENCY
    few_channel_efficiency: float = FEW_CHANNEL_EFFICIENCY
    memory_efficiency: float = MEMORY_EFFICIENCY
    pool_efficiency: float = POOL_EFFICIENCY
    batch_norm_ns: float = BATCH_NORM_NS
    batch_norm_low_ns: float = BATCH_NORM_LOW_NS
    backward_traffic_factor: float = BACKWARD_TRAFFIC_FACTOR
    launch_ms: float = LAUNCH_MS
    backward_launch_factor: float = BACKWARD_LAUNCH_FACTOR
    stage_forward_ms: float = STAGE_FORWARD_MS
    stage_backward_ms: float = STAGE_BACKWARD_MS
    loss_memory_efficiency: float = LOSS_MEMORY_EFFICIENCY
    loss_launch_ms: float = LOSS_LAUNCH_MS


ROOFLINE = Roofline()


def _compute_s(op: OpCount, spec: GPUSpec, rl: Roofline) -> float:
    """Seconds of an op's arithmetic (0 for ops that are not convolutions or matrix products)."""
    if op.flops <= 0 or op.kind not in ("conv", "matmul"):
        return 0.0
    math_dtype = op.dtype if op.dtype in _LOW else "float32"
    if op.kind == "matmul":
        if math_dtype in _LOW:
            return op.flops / (spec.flops_rate(math_dtype) * rl.tensor_efficiency)
        return op.flops / (spec.peak_flops["float32"] * rl.simt_efficiency)
    if 0 < op.channels < FEW_CHANNELS:
        return op.flops / (spec.peak_flops["float32"] * rl.few_channel_efficiency)
    fill = op.channels / (op.channels + rl.conv_half_channels) if op.channels > 0 else 1.0
    return op.flops / (spec.flops_rate(math_dtype, conv=True) * rl.conv_efficiency * fill)


def _reduce_s(op: OpCount, spec: GPUSpec, rl: Roofline) -> float:
    """Seconds of a batch norm's per-channel reduction (0 for other ops)."""
    if op.kind != "batch_norm" or op.channels <= 0:
        return 0.0
    waves = math.ceil(op.channels / (spec.sm_count * BATCH_NORM_BLOCKS_PER_SM))
    ns = rl.batch_norm_low_ns if op.dtype in _LOW else rl.batch_norm_ns
    return waves * op.per_channel * ns * 1e-9


def op_ms(op: OpCount, spec: GPUSpec, grads: int, rl: Roofline = ROOFLINE) -> tuple[float, float]:
    """``(forward, backward)`` GPU ms of one op by NOTE [ Roofline ]; ``grads`` is how many gradients (dX, dW) the
    op's stage makes, 0 to 2."""
    compute = _compute_s(op, spec, rl)
    eff = rl.pool_efficiency if op.kind == "pool" else rl.memory_efficiency
    memory = op.bytes_moved / (spec.memory_bandwidth * eff)
    reduce = _reduce_s(op, spec, rl)
    fwd = max(compute, memory) + reduce
    if compute > 0:
        bwd = max(compute * grads, memory * rl.backward_traffic_factor)
    else:
        bwd = (memory + reduce) * rl.backward_traffic_factor
    return fwd * 1e3, bwd * 1e3


def queue_ms(launch_ms: float, gpu_ms: Sequence[float]) -> float:
    """ms from the first launch until the last of ``gpu_ms`` ends when the host issues one op every ``launch_ms``
    and the GPU runs them in order, each once issued and once the one before is done."""
    end = tail = 0.0
    for k in range(len(gpu_ms) - 1, -1, -1):
        tail += gpu_ms[k]
        end = max(end, (k + 1) * launch_ms + tail)
    return end


def roofline_ms(
    facts: StageFacts, spec: GPUSpec, dtype: str = "float32", rl: Roofline = ROOFLINE
) -> tuple[float, float]:
    """``(forward_ms, backward_ms)`` of one stage on ``spec`` by NOTE [ Roofline ].

    ``dtype`` is the profile's (``float32`` or an autocast dtype); each op is priced by its own output dtype
    (``OpCount.dtype``), which the meta forward already made what autocast makes, so it only validates.
    """
    torch_dtype(dtype)  # validates
    grads = int(facts.input_needs_grad) + int(facts.has_params)
    times = [op_ms(op, spec, grads, rl) for op in facts.count.kernels]
    fwd = rl.stage_forward_ms + queue_ms(rl.launch_ms, [f for f, _ in times])
    if grads == 0:
        return fwd, 0.0
    backward_gpu = [b for _, b in reversed(times)]
    bwd = rl.stage_backward_ms + queue_ms(rl.launch_ms * rl.backward_launch_factor, backward_gpu)
    return fwd, bwd


def meta_facts(chain: ModelChain, batch: int, dtype: str) -> ChainFacts:
    """``chain_facts`` of ``chain`` at ``batch`` on the meta device (CUDA semantics, nothing computed)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    torch_dtype(dtype)  # validates
    mchain = meta_chain(chain)
    return chain_facts(mchain, meta_input(mchain, batch), dtype)


def modeled_profile(chain: ModelChain, batch: int, dtype: str, gpu: str | GPUSpec, rl: Roofline = ROOFLINE) -> Profile:
    """A roofline profile of ``chain`` at ``batch`` on ``gpu`` (no GPU needed, nothing computed).

    Args:
        chain: the model (its parameters are not copied or changed).
        batch: samples per step.
        dtype: ``float32``, or ``bfloat16``/``float16`` for autocast.
        gpu: a ``GPUSpec`` or a name ``get_gpu`` accepts.
        rl: the roofline's constants (``ROOFLINE``, the committed ones, unless fitting them).

    Returns:
        A ``Profile`` with ``source="modeled"`` and compute/transfer sources ``modeled:<key>``.

    Raises:
        UnknownGPUError: ``gpu`` is not a known GPU.
        ValueError: ``dtype`` or ``batch`` is not valid.
    """
    spec = gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)
    facts = meta_facts(chain, batch, dtype)
    rows = chain_row_maps([s.module for s in chain.stages], facts.input_shape, facts.output_shapes)
    stages = []
    for i, (stage, f) in enumerate(zip(chain.stages, facts.stages, strict=True)):
        fwd, bwd = roofline_ms(f, spec, dtype, rl)
        stages.append(
            StageProfile(
                index=i,
                name=stage.name,
                kind=stage.kind,
                forward_ms=fwd,
                backward_ms=bwd,
                output_bytes=f.output_bytes,
                inplace=facts.inplace[i],
                output_storage=facts.output_storage[i],
                saved_bytes=f.saved_bytes,
                param_bytes=f.param_bytes,
                d2h_ms=spec.transfer_ms(f.saved_bytes, "d2h"),
                h2d_ms=spec.transfer_ms(f.saved_bytes, "h2d"),
                flops=f.count.flops,
                convs=f.convs,
                rows=rows[i],
            )
        )
    return Profile(
        model=chain.name,
        model_params=dict(chain.params),
        batch=batch,
        dtype=dtype,  # type: ignore[arg-type]
        input_shape=tuple(chain.input_shape),
        input_bytes=facts.input_bytes,
        device=spec_identity(spec),
        source="modeled",
        compute_source=f"modeled:{spec.key}",
        transfer_source=f"modeled:{spec.key}",
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        stages=tuple(stages),
        storages=facts.storages,
        loss_ms=roofline_loss_ms(stages[-1].output_bytes, dtype, spec, rl),
    )
