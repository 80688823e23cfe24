"""Modeled profiles: a roofline estimate of every stage on a GPU that is not present.

The chain runs once on the ``meta`` device at the full batch with CUDA semantics (``profiler.meta``):
shapes, saved storages and FLOPs are exact for that batch, no memory is used and nothing is computed,
so VGG-16 at batch 256 is modeled in well under a second. Times come from a roofline.

# NOTE [ Roofline ]
Per stage, forward ms = max(compute, memory, launch):

* compute = convolution FLOPs / (conv rate x eff) + other FLOPs / (rate x eff), the rates from the
  ``GPUSpec`` for the dtype (fp32 convolutions at the TF32 rate: NOTE [ fp32 convolutions and TF32 ] in
  ``profiler.devices``). ``eff`` is ``TENSOR_EFFICIENCY`` (0.30) on tensor-core rates and
  ``SIMT_EFFICIENCY`` (0.65) on the plain fp32 rate. Calibration, DESIGN.md's H200 facts: VGG-16 fp32
  batch 256 (181.7 ms, ~23.8 TFLOP per step) runs at 0.27 of the TF32 peak and at bf16 at 0.23 of the
  bf16 peak; the GPT stack (fp32 matmuls, 820 ms, ~35 TFLOP) at 0.63 of the fp32 peak.
* memory = bytes moved (every ATen op's inputs plus outputs, no fusion) / (bandwidth x
  ``MEMORY_EFFICIENCY`` 0.70).
* launch = ops x ``LAUNCH_MS`` (5 us): eager PyTorch cannot issue kernels faster than that.

Backward: the FLOPs are the forward's times (1 if the stage's input needs a gradient) + (1 if it has
parameters) (dX and dW each cost one forward), the bytes moved 2x the forward's (it reads the output
gradient and the saved tensors and writes input and weight gradients), the ops 2x; no backward at all
when neither gradient is needed. D2H/H2D of S_i use the spec's host link (NOTE [ Host-link model ]).
"""

from __future__ import annotations

from datetime import UTC, datetime

from profiler.chain import ModelChain
from profiler.devices import GPUSpec, get_gpu
from profiler.identity import spec_identity
from profiler.loss import modeled_loss_ms
from profiler.meta import meta_chain, meta_input
from profiler.profile import Profile, StageProfile
from profiler.stagefacts import ChainFacts, StageFacts, chain_facts, torch_dtype

__all__ = [
    "BACKWARD_TRAFFIC_FACTOR",
    "LAUNCH_MS",
    "MEMORY_EFFICIENCY",
    "SIMT_EFFICIENCY",
    "TENSOR_EFFICIENCY",
    "meta_facts",
    "modeled_profile",
    "roofline_ms",
]

TENSOR_EFFICIENCY = 0.30
SIMT_EFFICIENCY = 0.65
MEMORY_EFFICIENCY = 0.70
LAUNCH_MS = 0.005
BACKWARD_TRAFFIC_FACTOR = 2.0
LOSS_KERNELS = 10  # casts, log-softmax, NLL and their backwards (profiler.loss)


def _rate(spec: GPUSpec, dtype: str, *, conv: bool) -> float:
    """Achievable FLOP/s: the peak times the efficiency of its kind (NOTE [ Roofline ])."""
    rate = spec.flops_rate(dtype, conv=conv)
    eff = SIMT_EFFICIENCY if rate == spec.peak_flops["float32"] else TENSOR_EFFICIENCY
    return rate * eff


def roofline_ms(facts: StageFacts, spec: GPUSpec, dtype: str) -> tuple[float, float]:
    """``(forward_ms, backward_ms)`` of one stage on ``spec`` by NOTE [ Roofline ]."""
    c = facts.count
    conv_rate = _rate(spec, dtype, conv=True)
    other_rate = _rate(spec, dtype, conv=False)
    compute_s = c.conv_flops / conv_rate + (c.flops - c.conv_flops) / other_rate
    memory_s = c.bytes_moved / (spec.memory_bandwidth * MEMORY_EFFICIENCY)
    fwd = max(compute_s * 1e3, memory_s * 1e3, c.ops * LAUNCH_MS)
    factor = int(facts.input_needs_grad) + int(facts.has_params)
    if factor == 0:
        return fwd, 0.0
    bwd = max(
        compute_s * factor * 1e3,
        memory_s * BACKWARD_TRAFFIC_FACTOR * 1e3,
        c.ops * BACKWARD_TRAFFIC_FACTOR * LAUNCH_MS,
    )
    return fwd, bwd


def roofline_loss_ms(output_bytes: int, dtype: str, spec: GPUSpec) -> float:
    """The step loss's forward + backward over an output of ``output_bytes`` on ``spec``, ms: bytes moved
    (``profiler.loss``) at the achievable memory bandwidth of NOTE [ Roofline ], at least its kernel launches.
    Measured on the H200 (``scripts/measure_loss.py``): GPT b16 bf16 10.67 ms against 8.83 estimated; 1000-class
    losses 0.13-0.37 ms against the 0.05 ms launch floor."""
    itemsize = 4 if dtype == "float32" else 2
    memory_ms = modeled_loss_ms(output_bytes // itemsize, itemsize, spec.memory_bandwidth * MEMORY_EFFICIENCY)
    return max(memory_ms, LOSS_KERNELS * LAUNCH_MS)


def meta_facts(chain: ModelChain, batch: int, dtype: str) -> ChainFacts:
    """``chain_facts`` of ``chain`` at ``batch`` on the meta device (CUDA semantics, nothing computed)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    torch_dtype(dtype)  # validates
    mchain = meta_chain(chain)
    return chain_facts(mchain, meta_input(mchain, batch), dtype)


def modeled_profile(chain: ModelChain, batch: int, dtype: str, gpu: str | GPUSpec) -> Profile:
    """A roofline profile of ``chain`` at ``batch`` on ``gpu`` (no GPU needed, nothing computed).

    Args:
        chain: the model (its parameters are not copied or changed).
        batch: samples per step.
        dtype: ``float32``, or ``bfloat16``/``float16`` for autocast.
        gpu: a ``GPUSpec`` or a name ``get_gpu`` accepts.

    Returns:
        A ``Profile`` with ``source="modeled"`` and compute/transfer sources ``modeled:<key>``.

    Raises:
        UnknownGPUError: ``gpu`` is not a known GPU.
        ValueError: ``dtype`` or ``batch`` is not valid.
    """
    spec = gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)
    facts = meta_facts(chain, batch, dtype)
    stages = []
    for i, (stage, f) in enumerate(zip(chain.stages, facts.stages, strict=True)):
        fwd, bwd = roofline_ms(f, spec, dtype)
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
        loss_ms=roofline_loss_ms(stages[-1].output_bytes, dtype, spec),
    )
