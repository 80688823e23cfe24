"""Module profiles made on the CPU for a GPU: every time from that GPU's roofline, the ops counted on the CPU.

``profile_module`` on a CPU model with ``gpu="h100"`` describes an H100 (``source="modeled"``); this module gives it
the H100's compute times (NOTE [ Modeled module profiles ]). ``count_module_step`` runs one forward and loss of the
model on the CPU and counts each stage's ATen ops (``memtune.profiler._flops.count_stage``) and the ops outside the
stages; ``modeled_stage_ms`` and ``outside_ms`` price them by NOTE [ Roofline ] in ``memtune.profiler.modeled``.

# NOTE [ Modeled module profiles ]
A CPU measures its own clock, not a GPU's: on a laptop a stage of a small CNN takes milliseconds where an H100
takes tens of microseconds, while the copies of what the stage saves are the H100's (``GPUSpec.transfer_ms``).
Priced together, every offload looked free beside its stage and plans were almost all offload; and the step shown
"on NVIDIA H100" was the CPU's. So a module profile made on the CPU for a GPU takes no time from the CPU's clock:

* Stages: one forward of the whole model and its loss runs on the CPU under ``count_stage`` (with the profile's
  autocast); each stage's forward pre-hook and hook mark where its ops begin and end in the op list, so a stage's
  ops are exactly those it runs inside the step. Each stage is priced by ``roofline_ms`` with ``input_needs_grad``
  from the trace (an input leaf of the stage needs a gradient) and ``has_params`` (it has a parameter that needs
  one). The times do not depend on the CPU's speed: the same model profiled twice gets the same times.
* Attention: the CPU runs its own kernels. Where PyTorch picks its CPU flash kernel
  (``_scaled_dot_product_flash_attention_for_cpu``, which PyTorch's flop counter does not know), the op is priced
  as a matrix product with the FLOPs of ``sdpa_flop_count``, as the CUDA flash and efficient kernels are; where it
  picks the math path (attention dropout in training), the separate matrix products, softmax and dropout are
  priced as counted, more memory traffic than a fused GPU kernel moves: an upper bound.
* CPU ops the GPU fuses (NOTE [ CPU ops the GPU fuses ]): ``_unsafe_view`` moves no data and launches nothing; the
  CPU's dropout is three ops (``bernoulli_`` draws a float mask, ``div_`` scales it, ``mul`` applies it) where CUDA
  runs one fused kernel (``native_dropout``: read the input, write the output and a one-byte mask). Counted as the
  CPU runs them, GPT-2 124M (8 x 1,024) was modeled at 1.32x its measured H100 step, BERT-base (32 x 512) at 1.16x
  and T5-small (16 x 512) at 1.23x; priced as the GPU runs them, 1.13x, 1.02x and 0.93x
  (``python -m benchmarks.modeled_modules --count-only``). The CPU's attention with dropout runs unfused (matrix
  products, softmax, dropout), where the GPU runs one kernel: still priced as counted, an upper bound.
* Selective stages (NOTE [ Selective stages ]): the forward runs the same ops as a plain one, so
  ``selective_forward_ms`` is the plain forward; the backward first re-runs every op whose output the policy does
  not keep (all but convolutions and matrix products, ``SAVED_OPS``), so ``selective_backward_ms`` is the plain
  backward plus those ops' forward queue (``queue_ms`` at ``LAUNCH_MS`` per op, as the re-run is issued from Python)
  and one ``STAGE_FORWARD_MS``. A ratio of the CPU's measured selective and plain times would carry the CPU's
  balance between arithmetic and memory traffic, which is not the GPU's.
* Outside stages (NOTE [ Time outside stages ]): the model's own code between stages and the loss function are
  counted in the same forward. The ops before the first stage (the input's own processing: position ids, masks)
  have a backward only where the model has parameters outside every stage; every later op has one (the loss's
  gradient flows through it). They are priced by the same roofline without the per-stage host times (they run
  inline in the step, not as a module called alone) and their sum is ``loss_ms``. The modeled step is the stages
  plus ``loss_ms``, so nothing is scaled; ``compute_source`` says ``modeled:<gpu> roofline (ops counted on the
  CPU)``.
* The CPU still runs each stage plain and selectively, and the whole step, as on CUDA: that decides whether a stage
  can run selectively and what it keeps. Its clock readings are dropped.

The copies stay ``GPUSpec.transfer_ms`` of each stage's saved bytes; bytes (saved, outputs, parameters) are the
CPU's, the same as a GPU's for the same dtype except where a kernel saves differently on CUDA (NOTE [ Saved
storages ]). The transients (each stage's workspace, the loss's backward, the unplanned step's peak) are the CPU
allocator's read as the GPU would allocate them: each convolution's own scratch replaced by the GPU's modeled
cuDNN workspace (NOTE [ GPU transients from the CPU's allocator ] in ``memtune.profiler.memory_meter``). The roofline's
host constants are those of the machines it was fitted on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import sdpa_flop_count

from memtune.profiler._flops import OpCount, StageCount, count_stage
from memtune.profiler.devices import GPUSpec
from memtune.profiler.measure import _autocast
from memtune.profiler.modeled import ROOFLINE, Roofline, op_ms, queue_ms, roofline_ms
from memtune.profiler.module_stages import Inputs, call_model
from memtune.profiler.profiler_errors import ProfilerError
from memtune.profiler.stagefacts import StageFacts, param_bytes, torch_dtype

__all__ = [
    "ModuleCount",
    "StageTimes",
    "count_module_step",
    "modeled_compute_source",
    "modeled_stage_ms",
    "modeled_timings",
    "outside_ms",
]

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    _Timing = TypeVar("_Timing", bound=DataclassInstance)

_CPU_FLASH = "_scaled_dot_product_flash_attention_for_cpu"
_KEPT_KINDS = ("conv", "matmul")  # what the selective policy keeps (memtune.profiler.selective.SAVED_OPS)


@dataclass(frozen=True)
class ModuleCount:
    """What one forward and loss of a model did, counted on the CPU.

    Attributes:
        stages: each stage's ops and gradients, in stage order (``StageFacts``; ``saved_bytes`` and ``convs`` are
            not filled: 0 and ``()``).
        prologue: the ops before the first stage (no stage's input needs a gradient from them).
        outside: the ops after the first stage began that ran in no stage: the model's code between and after its
            stages, and the loss function.
    """

    stages: tuple[StageFacts, ...]
    prologue: StageFacts
    outside: StageFacts


@dataclass(frozen=True)
class StageTimes:
    """A stage's modeled times, ms (NOTE [ Modeled module profiles ]); the selective ones None where not offered."""

    forward_ms: float
    backward_ms: float
    selective_forward_ms: float | None = None
    selective_backward_ms: float | None = None
    recompute_backward_ms: float | None = None


#: ops the CPU runs where the GPU runs fewer (NOTE [ CPU ops the GPU fuses ])
_CPU_ONLY = frozenset({"_unsafe_view", "bernoulli_", "div_", "mul"})


class _OpNames(TorchDispatchMode):
    """Names each ``OpCount`` that ``count_stage`` appends while it is active (entered inside ``count_stage``, so it
    sees every op first), and prices the CPU flash attention kernel as a matrix product."""

    def __init__(self, count: StageCount) -> None:
        super().__init__()
        self.count = count
        self.masks: dict[int, torch.Tensor] = {}  # dropout masks being made: NOTE [ CPU ops the GPU fuses ]

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        before = len(self.count.kernels)
        out = func(*args, **(kwargs or {}))
        name = getattr(getattr(func, "_overloadpacket", None), "__name__", "")
        counted = len(self.count.kernels) == before + 1
        if name == _CPU_FLASH and counted:
            q, k, v = args[:3]
            flops = float(sdpa_flop_count(tuple(q.shape), tuple(k.shape), tuple(v.shape)))
            self.count.kernels[before] = dataclasses.replace(self.count.kernels[before], kind="matmul", flops=flops)
        elif counted and name in _CPU_ONLY:
            self._fuse(name, args, before)
        return out

    def _fuse(self, name: str, args: tuple[Any, ...], at: int) -> None:
        """NOTE [ CPU ops the GPU fuses ]: the op counted at ``at`` re-priced as the GPU runs it."""
        if name == "_unsafe_view":  # a view: no kernel
            del self.count.kernels[at]
        elif name == "bernoulli_":  # a dropout mask being drawn: folded into the multiply that applies it
            self.masks[id(args[0])] = args[0]
            del self.count.kernels[at]
        elif name == "div_" and id(args[0]) in self.masks:  # the mask scaled by 1 / (1 - p)
            del self.count.kernels[at]
        elif name == "mul" and any(id(a) in self.masks for a in args):
            mask = next(a for a in args if id(a) in self.masks)
            self.masks.pop(id(mask))
            x = next(a for a in args if a is not mask)
            moved = 2 * x.numel() * x.element_size() + x.numel()  # read x, write y and a one-byte mask
            self.count.kernels[at] = dataclasses.replace(self.count.kernels[at], kind="memory", bytes_moved=moved)


def _stage_count(kernels: Sequence[OpCount]) -> StageCount:
    return StageCount(
        flops=sum(k.flops for k in kernels),
        conv_flops=sum(k.flops for k in kernels if k.kind == "conv"),
        bytes_moved=sum(k.bytes_moved for k in kernels),
        ops=len(kernels),
        kernels=list(kernels),
    )


def _facts(kernels: Sequence[OpCount], *, input_needs_grad: bool, has_params: bool, params: int = 0) -> StageFacts:
    return StageFacts(
        output_bytes=0,
        saved_bytes=0,
        param_bytes=params,
        count=_stage_count(kernels),
        input_needs_grad=input_needs_grad,
        has_params=has_params,
        convs=(),
    )


def count_module_step(
    model: nn.Module,
    inputs: Inputs,
    modules: Sequence[nn.Module],
    input_grad: Sequence[Sequence[bool]],
    loss_fn: Callable[[Any], torch.Tensor],
    dtype: str = "float32",
) -> ModuleCount:
    """Count one forward and loss of ``model`` on the CPU, stage by stage (NOTE [ Modeled module profiles ]).

    The forward runs as in training (dropout, batch-norm statistics updated: call it where the model's state is
    restored afterwards, as inside ``profile_module``).

    Args:
        model: the model, on the CPU.
        inputs: ``(args, kwargs)`` of one batch.
        modules: the stages' modules, in the order they run; each must run exactly once.
        input_grad: per stage, which of its input leaves need a gradient (``StageTrace.input_grad``).
        loss_fn: ``loss_fn(model_output) -> scalar``.
        dtype: ``float32``, or ``bfloat16``/``float16`` for autocast.

    Returns:
        A ``ModuleCount``: each stage's ops, and those before and outside the stages.

    Raises:
        ProfilerError: a stage ran other than once in the forward.
    """
    torch_dtype(dtype)  # validates
    ranges: list[list[int]] = [[] for _ in modules]
    handles = []
    with count_stage() as count:

        def at(k: int) -> Callable[..., None]:
            def hook(*_: Any) -> None:
                ranges[k].append(len(count.kernels))

            return hook

        for k, m in enumerate(modules):
            handles.append(m.register_forward_pre_hook(at(k), prepend=True))
            handles.append(m.register_forward_hook(at(k)))
        try:
            with _OpNames(count), _autocast(torch.device("cpu"), dtype):
                out = call_model(model, inputs)
            with _OpNames(count):
                loss_fn(out)
        finally:
            for h in handles:
                h.remove()
    del out
    if any(len(r) != 2 for r in ranges):
        bad = [k for k, r in enumerate(ranges) if len(r) != 2]
        raise ProfilerError(
            f"stages {bad} did not run exactly once in the counting forward; name stages that run once per step"
        )
    kernels = count.kernels
    inside = [False] * len(kernels)
    for start, end in ranges:
        inside[start:end] = [True] * (end - start)
    first = min((r[0] for r in ranges), default=len(kernels))
    owned = {id(p) for m in modules for p in m.parameters()}
    outside_params = [p for p in model.parameters() if id(p) not in owned]
    outside_grad = any(p.requires_grad for p in outside_params)
    outside_bytes = sum(p.numel() * p.element_size() for p in outside_params)
    stages = tuple(
        _facts(
            kernels[start:end],
            input_needs_grad=any(flags),
            has_params=any(p.requires_grad for p in m.parameters()),
            params=param_bytes(m),
        )
        for (start, end), flags, m in zip(ranges, input_grad, modules, strict=True)
    )
    return ModuleCount(
        stages=stages,
        prologue=_facts(
            [o for i, o in enumerate(kernels[:first]) if not inside[i]],
            input_needs_grad=False,
            has_params=outside_grad,
            params=outside_bytes,
        ),
        outside=_facts(
            [o for i, o in enumerate(kernels) if i >= first and not inside[i]],
            input_needs_grad=True,
            has_params=outside_grad,
        ),
    )


def modeled_stage_ms(
    facts: StageFacts, spec: GPUSpec, dtype: str = "float32", *, selective: bool = False, rl: Roofline = ROOFLINE
) -> StageTimes:
    """A stage's times on ``spec`` (NOTE [ Modeled module profiles ]), ms.

    Args:
        facts: the stage's counted ops (``count_module_step``).
        spec: the GPU the profile describes.
        dtype: the profile's dtype.
        selective: also model its ``selective`` run (where the profiler offers one for this stage).
        rl: the roofline's constants.
    """
    fwd, bwd = roofline_ms(facts, spec, dtype, rl)
    if not selective or bwd == 0.0:
        return StageTimes(fwd, bwd)
    grads = int(facts.input_needs_grad) + int(facts.has_params)
    rerun = [op_ms(op, spec, grads, rl)[0] for op in facts.count.kernels if op.kind not in _KEPT_KINDS]
    extra = rl.stage_forward_ms + queue_ms(rl.launch_ms, rerun) if rerun else 0.0
    return StageTimes(fwd, bwd, fwd, bwd + extra)


def outside_ms(count: ModuleCount, spec: GPUSpec, dtype: str = "float32", rl: Roofline = ROOFLINE) -> float:
    """``loss_ms`` of a modeled module profile: the ops before and outside its stages, forward and backward, on
    ``spec`` without per-stage host times (NOTE [ Modeled module profiles ]), ms."""
    inline = dataclasses.replace(rl, stage_forward_ms=0.0, stage_backward_ms=0.0)
    total = 0.0
    for part in (count.prologue, count.outside):
        if part.count.kernels:
            total += sum(roofline_ms(part, spec, dtype, inline))
    return total


def modeled_compute_source(spec: GPUSpec) -> str:
    """``Profile.compute_source`` of a module profile made on the CPU for ``spec``."""
    return f"modeled:{spec.key} roofline (ops counted on the CPU)"


def modeled_timings(
    timings: Sequence[_Timing], count: ModuleCount, spec: GPUSpec, dtype: str = "float32"
) -> tuple[list[_Timing], float]:
    """The stages' timings with their CPU-measured ms replaced by ``spec``'s roofline, and the modeled whole step
    (stages plus ``outside_ms``), ms (NOTE [ Modeled module profiles ]).

    Each timing is a dataclass with ``forward_ms``, ``backward_ms``, ``selective_forward_ms``,
    ``selective_backward_ms`` and ``recompute_backward_ms`` (``memtune.profiler.module_profile``'s); a selective or
    recompute time is modeled where one was measured (the stage can run so) and stays None elsewhere.
    """
    if len(timings) != len(count.stages):
        raise ProfilerError(
            f"{len(timings)} stage timings for {len(count.stages)} counted stages; count the same stages"
        )
    modeled = [
        modeled_stage_ms(facts, spec, dtype, selective=getattr(t, "selective_forward_ms", None) is not None)
        for t, facts in zip(timings, count.stages, strict=True)
    ]
    # a recomputed stage's backward re-runs its forward first: the roofline's two passes, where one was measured
    modeled = [
        dataclasses.replace(m, recompute_backward_ms=m.backward_ms + m.forward_ms)
        if getattr(t, "recompute_backward_ms", None) is not None
        else m
        for t, m in zip(timings, modeled, strict=True)
    ]
    out = [dataclasses.replace(t, **dataclasses.asdict(m)) for t, m in zip(timings, modeled, strict=True)]
    # summed as profile_module sums the stages, so that its scale is exactly 1 (NOTE [ Time outside stages ])
    step_ms = sum(m.forward_ms + m.backward_ms for m in modeled) + outside_ms(count, spec, dtype)
    return out, step_ms
