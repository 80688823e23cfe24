"""Measured profiles: time every stage of a chain on this machine, forward and backward, in isolation.

On CUDA every number is measured on the GPU: stage times with CUDA events, transient workspaces from
the caching allocator's peak, the saved-storage table from a real forward, and the D2H/H2D time of
each S_i through pinned memory on a side stream. The profile is ``source="measured"``.

On the CPU the stage times are measured on the CPU (``compute_source="measured:cpu <model>"``) while
everything that describes the GPU comes from its spec: the saved-storage table and FLOPs from a meta
forward with CUDA semantics (``memtune.profiler._meta``), transfers from the spec's host link
(``transfer_source="modeled:<key>"``). Since not every number was measured on that GPU the profile is
``source="modeled"`` and its device is the spec's identity. This path exists for tests and for
development without a GPU; its times are the CPU's, not the GPU's.

# NOTE [ Stage timing ]
Each stage is timed alone on the input the chain really feeds it. Its input is detached and, unless it
is the model input, made to require grad; every repeat runs on a fresh clone (untimed) so in-place
stages never see their own output. Forward is timed under autocast when ``dtype`` is bf16/fp16
(parameters stay fp32, as in the bf16 measured facts of docs/concepts.md); backward is
``torch.autograd.grad`` of the output with a random output gradient, with respect to the input and the
stage's parameters. ``warmup`` untimed rounds, then the median of ``repeats``.
"""

from __future__ import annotations

import dataclasses
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import torch

from memtune.profiler._profile import ConvProfile, DeviceIdentity, Profile, StageProfile, StepPeak
from memtune.profiler._spatial_rows import RowMap
from memtune.profiler.chain import ModelChain, Stage, may_write_input
from memtune.profiler.compiled import CompiledStage, compiled_chain, eager_module
from memtune.profiler.devices import GPUSpec, get_gpu
from memtune.profiler.identity import cuda_identity, spec_identity, transfer_ms
from memtune.profiler.loss import measure_loss_ms, step_loss
from memtune.profiler.loss_model import roofline_loss_ms
from memtune.profiler.memory_meter import metered
from memtune.profiler.modeled import meta_facts
from memtune.profiler.profiler_errors import ProfilerError
from memtune.profiler.selective import selective_checkpoint
from memtune.profiler.spatial_modules import chain_row_maps
from memtune.profiler.stagefacts import ChainFacts, chain_facts, torch_dtype

__all__ = [
    "ProgressFn",
    "StageTiming",
    "chain_inline_backward_bytes",
    "chained_backward_bytes",
    "cpu_model_name",
    "inline_backward_bytes",
    "model_input",
    "profile",
    "selective_backward_bytes",
    "selective_held_bytes",
    "stage_workspaces",
    "time_stage",
]

_R = TypeVar("_R")

ProgressFn = Callable[[str, int, int], None]
"""``progress(stage_name, done, total)``: called after each stage with the number of stages done."""


def cpu_model_name() -> str:
    """The CPU's model name (from ``/proc/cpuinfo`` where present)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def model_input(chain: ModelChain, batch: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The batch's input: random float images, or random int64 token ids in ``[0, vocab_size)``."""
    shape = (batch, *chain.input_shape)
    if chain.input_kind == "tokens":
        if chain.vocab_size <= 0:
            raise ProfilerError(f"model {chain.name!r} takes tokens but has vocab_size {chain.vocab_size}; set it")
        return torch.randint(0, chain.vocab_size, shape, dtype=torch.int64, device=device)
    return torch.randn(shape, device=device)


class _Timer:
    """Milliseconds of a region: CUDA events on the current stream, else ``perf_counter``."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def run(self, fn: Callable[..., _R], *args: Any) -> tuple[_R, float]:
        """``(fn(*args), milliseconds it took)``; on CUDA waits for the work to finish."""
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args)
            end.record()
            end.synchronize()
            return out, float(start.elapsed_time(end))
        t0 = time.perf_counter()
        out = fn(*args)
        return out, (time.perf_counter() - t0) * 1e3


@dataclass(frozen=True)
class StageTiming:
    """Measured costs of one stage: medians in ms, transient workspaces in bytes (CUDA only, else 0 or None)."""

    forward_ms: float
    backward_ms: float
    forward_workspace_bytes: int = 0
    backward_workspace_bytes: int = 0
    backward_inline_bytes: int | None = None
    chained_backward_bytes: int | None = None
    selective_forward_ms: float | None = None
    selective_backward_ms: float | None = None
    selective_backward_bytes: int | None = None


def _autocast(device: torch.device, dtype: str) -> AbstractContextManager[Any]:
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch_dtype(dtype))


def time_stage(
    stage: Stage,
    x: torch.Tensor,
    *,
    input_needs_grad: bool,
    dtype: str = "float32",
    warmup: int = 2,
    repeats: int = 5,
    selective: bool = True,
) -> StageTiming:
    """Time one stage's forward and backward on input ``x`` by NOTE [ Stage timing ].

    On CUDA also measures the transient workspace of forward and backward: the allocator's peak during
    the pass minus the larger of what was allocated before and after it (bytes). ``selective=False`` leaves out
    the stage under selective checkpointing (a compiled stage cannot take it: NOTE [ Compiled stages ]).
    """
    device = x.device
    timer = _Timer(device)
    leaf, wrt = _grad_leaf(stage, x, input_needs_grad)
    forward = _stage_forward(stage, device, dtype)
    fwd_times: list[float] = []
    bwd_times: list[float] = []
    sel_fwd_times: list[float] = []
    sel_times: list[float] = []
    sel_forward = _selective_forward(stage, forward)
    for k in range(warmup + repeats):
        inp = leaf.clone()  # a non-leaf when it needs a gradient: in-place stages may modify it
        y, f_ms = timer.run(forward, inp)
        b_ms = sf_ms = s_ms = 0.0
        if y.requires_grad and y.is_floating_point() and wrt:
            g = torch.randn_like(y)
            _, b_ms = timer.run(_backward, y, wrt, g)
            # NOTE [ Selective stages ]: the forward under the caching mode, the backward re-running the cheap
            # operations first
            if selective:
                del y
                y, sf_ms = timer.run(sel_forward, leaf.clone())
                _, s_ms = timer.run(_backward, y, wrt, g)
        del y, inp
        if k >= warmup:
            fwd_times.append(f_ms)
            bwd_times.append(b_ms)
            sel_fwd_times.append(sf_ms)
            sel_times.append(s_ms)
    fwd_ws = bwd_ws = 0
    inline: int | None = None
    chained: int | None = None
    sel_bytes: int | None = None
    if device.type == "cuda":
        fwd_ws, bwd_ws = stage_workspaces(stage, x, input_needs_grad=input_needs_grad, dtype=dtype)
        inline = inline_backward_bytes(stage, x, input_needs_grad=input_needs_grad, dtype=dtype)
        chained = chained_backward_bytes(stage, x, input_needs_grad=input_needs_grad, dtype=dtype)
        if selective:
            sel_bytes = selective_backward_bytes(stage, x, input_needs_grad=input_needs_grad, dtype=dtype)
    return StageTiming(
        statistics.median(fwd_times),
        statistics.median(bwd_times),
        fwd_ws,
        bwd_ws,
        inline,
        chained,
        statistics.median(sel_fwd_times) if selective else None,
        statistics.median(sel_times) if selective else None,
        sel_bytes,
    )


def _selective_forward(
    stage: Stage, forward: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``forward`` under selective checkpointing as the runtime runs a ``selective`` stage: on a clone of its input
    when the stage writes its input in place (``memtune.tuner.runtime._segments``), so that the checkpoint's copy stays
    intact."""
    clone = may_write_input(stage.module)

    def run(inp: torch.Tensor) -> torch.Tensor:
        return forward(inp.clone() if clone else inp)

    return lambda inp: selective_checkpoint(run, inp)


def stage_workspaces(
    stage: Stage, x: torch.Tensor, *, input_needs_grad: bool, dtype: str = "float32"
) -> tuple[int, int]:
    """One stage's transient workspace of forward and of backward on CUDA input ``x``: the allocator's peak during
    the pass minus the larger of what was allocated before and after it, bytes (NOTE [ Backward transient ] in
    ``memtune.tuner.simulator`` reads the backward's)."""
    device = x.device
    if device.type != "cuda":
        raise ProfilerError("stage_workspaces measures the CUDA allocator: give it a CUDA input")
    leaf, wrt = _grad_leaf(stage, x, input_needs_grad)
    return _workspaces(_stage_forward(stage, device, dtype), leaf.clone, wrt, device)


def _grad_leaf(stage: Stage, x: torch.Tensor, input_needs_grad: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``x`` detached (requiring a gradient when the stage's input needs one), and what a backward of the stage
    differentiates: that leaf where it needs a gradient, and the stage's trainable parameters."""
    leaf = x.detach()
    needs_grad = input_needs_grad and leaf.is_floating_point()
    if needs_grad:
        leaf.requires_grad_(True)
    params: list[torch.Tensor] = [p for p in stage.module.parameters() if p.requires_grad]
    return leaf, ([leaf] if needs_grad else []) + params


def _stage_forward(stage: Stage, device: torch.device, dtype: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The stage's forward under the dtype's autocast; raises ``ProfilerError`` when it returns no tensor."""

    def forward(inp: torch.Tensor) -> torch.Tensor:
        with _autocast(device, dtype):
            out = stage.module(inp)
        if not isinstance(out, torch.Tensor):
            raise ProfilerError(f"stage {stage.name} returned {type(out).__name__}, not a tensor")
        return out

    return forward


def inline_backward_bytes(stage: Stage, x: torch.Tensor, *, input_needs_grad: bool, dtype: str = "float32") -> int:
    """The transient of one stage's backward when every activation it saves went to host memory in forward
    and comes back at its first use (NOTE [ Inline fetches ] in ``memtune.tuner.simulator``), bytes, CUDA only.

    It is the allocator's peak during the backward minus what was allocated before it and the gradients the
    backward makes (input and parameter gradients). The output's gradient is made inside the backward (by a
    ``* 1.0`` after the stage), so, as in a whole step, autograd frees it once the stage's last node has used it;
    the peak includes it only while it lives. Parameters and buffers stay on the device, as in
    ``memtune.tuner.runtime.offload``; PyTorch's ``save_on_cpu`` fetches the same way.
    """
    return _chained_backward_bytes(stage, x, input_needs_grad=input_needs_grad, dtype=dtype, fetch=True)


def chained_backward_bytes(stage: Stage, x: torch.Tensor, *, input_needs_grad: bool, dtype: str = "float32") -> int:
    """The transient of one stage's backward as it runs inside a chain, bytes, CUDA only: the allocator's peak
    during the backward minus what was allocated before it and the gradients it makes, with the output's gradient
    made inside the backward so that autograd frees it once used (as ``inline_backward_bytes``, activations kept
    on the device). A bottleneck block's in-place ReLU backward frees the incoming gradient as it makes its own,
    which a gradient held by the caller (``stage_workspaces``) counts once too often (NOTE [ Lean transients ] in
    ``memtune.tuner.simulator``)."""
    return _chained_backward_bytes(stage, x, input_needs_grad=input_needs_grad, dtype=dtype, fetch=False)


def selective_backward_bytes(stage: Stage, x: torch.Tensor, *, input_needs_grad: bool, dtype: str = "float32") -> int:
    """``chained_backward_bytes`` of the stage run under selective checkpointing (NOTE [ Selective stages ] in
    ``memtune.profiler.selective``): what its backward holds above what was live before it and the gradients it makes,
    the tensors it re-makes included, bytes, CUDA only."""
    return _chained_backward_bytes(
        stage, x, input_needs_grad=input_needs_grad, dtype=dtype, fetch=False, selective=True
    )


def selective_held_bytes(stage: Stage, x: torch.Tensor, *, input_needs_grad: bool, dtype: str = "float32") -> int:
    """What one forward of the stage under selective checkpointing leaves allocated besides its input and output,
    bytes, CUDA only: the allocator's count, against which ``memtune.profiler.selective.selective_saved_bytes`` (which
    counts storages) is checked."""
    device = x.device
    if device.type != "cuda":
        raise ProfilerError("selective_held_bytes reads the CUDA allocator: give it a CUDA input")
    leaf, _ = _grad_leaf(stage, x, input_needs_grad)
    inp = leaf.clone()
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    y = _selective_forward(stage, _stage_forward(stage, device, dtype))(inp)
    torch.cuda.synchronize(device)
    after = torch.cuda.memory_allocated(device)
    out = y.untyped_storage().nbytes() if y.untyped_storage().data_ptr() != inp.untyped_storage().data_ptr() else 0
    del y, inp
    return max(0, after - before - out)


def _chained_backward_bytes(
    stage: Stage, x: torch.Tensor, *, input_needs_grad: bool, dtype: str, fetch: bool, selective: bool = False
) -> int:
    device = x.device
    if device.type != "cuda":
        raise ProfilerError("a stage's backward transient is measured on the CUDA allocator: give it a CUDA input")
    leaf, wrt = _grad_leaf(stage, x, input_needs_grad)
    resident = {t.untyped_storage().data_ptr() for t in (*stage.module.parameters(), *stage.module.buffers())}

    def pack(t: torch.Tensor) -> torch.Tensor:
        return t if t.untyped_storage().data_ptr() in resident else _strided_copy(t, "cpu")

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t if t.device == device else _strided_copy(t, device)

    inp = leaf.clone()
    hooks: AbstractContextManager[Any] = (
        torch.autograd.graph.saved_tensors_hooks(pack, unpack) if fetch else nullcontext()
    )
    if selective:
        y = _selective_forward(stage, _stage_forward(stage, device, dtype))(inp)
    else:
        with hooks, _autocast(device, dtype):
            y = stage.module(inp)
    if not (isinstance(y, torch.Tensor) and y.requires_grad and y.is_floating_point() and wrt):
        return 0
    total = (y * 1.0).sum()  # its backward makes the output's gradient, which autograd then owns
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    grads = torch.autograd.grad(total, wrt, allow_unused=True)
    torch.cuda.synchronize(device)
    made = sum(t.untyped_storage().nbytes() for t in grads if t is not None)
    peak = torch.cuda.max_memory_allocated(device)
    del grads, total, y, inp
    return max(0, peak - before - made)


def _strided_copy(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device`` with its size and strides: ``Tensor.to`` makes a padded layout dense, and a compiled
    backward asserts the strides it saved (NOTE [ Compiled stages ])."""
    out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
    out.copy_(t)
    return out


def _backward(y: torch.Tensor, wrt: list[torch.Tensor], g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    return torch.autograd.grad(y, wrt, g, allow_unused=True)


def _workspaces(
    forward: Callable[[torch.Tensor], torch.Tensor],
    fresh_input: Callable[[], torch.Tensor],
    wrt: list[torch.Tensor],
    device: torch.device,
) -> tuple[int, int]:
    """Transient bytes above what is live before/after one forward and one backward (CUDA only)."""
    inp = fresh_input()
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    y = forward(inp)
    torch.cuda.synchronize(device)
    fwd_ws = torch.cuda.max_memory_allocated(device) - max(before, torch.cuda.memory_allocated(device))
    bwd_ws = 0
    if y.requires_grad and y.is_floating_point() and wrt:
        g = torch.randn_like(y)
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        grads = _backward(y, wrt, g)
        torch.cuda.synchronize(device)
        bwd_ws = torch.cuda.max_memory_allocated(device) - max(before, torch.cuda.memory_allocated(device))
        del grads, g
    del y, inp
    return max(0, fwd_ws), max(0, bwd_ws)


def profile(
    chain: ModelChain,
    batch: int,
    dtype: str = "float32",
    device: str = "cpu",
    gpu: str | None = None,
    warmup: int = 2,
    repeats: int = 5,
    progress: ProgressFn | None = None,
    conv_algos: bool = False,
    compile_budget: float | None = None,
) -> Profile:
    """Measure a profile of ``chain`` at ``batch`` on this machine.

    Args:
        chain: the model. Its modules are moved to ``device`` and put in training mode (batch-norm
            running statistics are updated by the measurement).
        batch: samples per step.
        dtype: ``float32``, or ``bfloat16``/``float16`` for autocast (parameters stay fp32).
        device: ``cuda`` / ``cuda:N`` (everything measured) or ``cpu`` (compute measured on the CPU,
            the rest from the spec of ``gpu``).
        gpu: on the CPU, the GPU the profile describes (default ``h200``); on CUDA, None or the present
            GPU's key (a check against mislabeled profiles).
        warmup: untimed rounds per stage.
        repeats: timed rounds per stage; the median is kept.
        progress: ``progress(stage_name, done, total)`` after each stage.
        conv_algos: on CUDA, also enumerate and time every cuDNN algorithm of every convolution
            (``memtune.profiler._conv_enumerate.enumerate_stage_convs``) into ``StageProfile.convs``; CUDA only.
        compile_budget: measure every stage compiled by ``torch.compile`` under this activation-memory budget
            (0 to 1; NOTE [ Compiled stages ] in ``memtune.profiler.compiled``): times, transients and the saved-storage
            table are the compiled stages', FLOPs and convolution shapes the eager ones'; no algorithm tables and
            no selective measurements. None: eager stages.

    Returns:
        The ``Profile``; ``source`` is ``measured`` only on CUDA (see the module docstring).

    Raises:
        ProfilerError: no CUDA device, an unsupported device, ``gpu`` does not match the device,
            ``conv_algos`` on the CPU, or libcudnn cannot be loaded for ``conv_algos``.
        UnknownGPUError: ``gpu`` is not a known GPU (CPU path).
        ValueError: ``dtype``, ``batch``, ``warmup`` or ``repeats`` is not valid.
    """
    _check_profile_arguments(chain, batch, dtype, warmup, repeats, conv_algos, compile_budget)
    on = _set_up_device(chain, batch, dtype, device, gpu, conv_algos)
    dev, facts, spec = on.dev, on.facts, on.spec
    compile_seconds: float | None = None
    if compile_budget is not None:  # NOTE [ Compiled stages ]
        chain, facts, compile_seconds = _compiled_facts(chain, batch, dtype, dev, facts, compile_budget)
    timings, out_shape = _time_chain(chain, batch, dtype, dev, facts, warmup, repeats, progress)
    convs = [f.convs for f in facts.stages]
    if conv_algos:
        convs = _enumerate_chain_convs(chain, batch, dtype, dev, warmup, repeats)
    saved = [f.saved_bytes for f in facts.stages]
    loss_ms: float | None = None
    if spec is None:
        out_dtype = torch.float32 if dtype == "float32" else torch_dtype(dtype)
        loss_ms = measure_loss_ms(out_shape, out_shape[-1], out_dtype, dev, warmup=warmup, repeats=repeats)
        measured = transfer_ms(saved, dev, warmup=warmup, repeats=repeats)
        copies = [measured.get(s, (0.0, 0.0)) for s in saved]
    else:
        copies = [(spec.transfer_ms(s, "d2h"), spec.transfer_ms(s, "h2d")) for s in saved]
        loss_ms = roofline_loss_ms(facts.stages[-1].output_bytes, dtype, spec)

    step_peak = _chain_step_peak(chain, batch, dtype, dev) if compile_budget is None else None
    rows = chain_row_maps([s.module for s in chain.stages], facts.input_shape, facts.output_shapes)
    return Profile(
        model=chain.name,
        model_params=dict(chain.params),
        batch=batch,
        dtype=dtype,  # type: ignore[arg-type]
        input_shape=tuple(chain.input_shape),
        input_bytes=facts.input_bytes,
        device=on.identity,
        source=on.source,  # type: ignore[arg-type]
        compute_source=on.compute_source,
        transfer_source=on.transfer_source,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        stages=_chain_stage_profiles(chain, facts, timings, copies, convs, rows),
        storages=facts.storages,
        loss_ms=loss_ms,
        compile_budget=compile_budget,
        compile_seconds=compile_seconds,
        step_peak=step_peak,
    )


def _check_profile_arguments(
    chain: ModelChain,
    batch: int,
    dtype: str,
    warmup: int,
    repeats: int,
    conv_algos: bool,
    compile_budget: float | None,
) -> None:
    """``profile``'s checks that need no device, in its order.

    Raises:
        ProfilerError: ``chain`` is not a ``ModelChain``, or ``conv_algos`` with ``compile_budget``.
        ValueError: ``dtype``, ``batch``, ``warmup`` or ``repeats`` is not valid.
    """
    if not isinstance(chain, ModelChain):
        raise ProfilerError(
            f"memtune.profiler.measure.profile takes a ModelChain (a zoo model or a JSON spec), not "
            f"{type(chain).__name__}; "
            "profile any nn.Module with memtune.profile(model, example_inputs)"
        )
    if compile_budget is not None and conv_algos:
        raise ProfilerError(
            "conv_algos and compile_budget exclude each other: a compiled stage's convolutions are the compiler's, "
            "memtune cannot choose their cuDNN algorithms"
        )
    torch_dtype(dtype)
    if batch < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need batch >= 1, repeats >= 1, warmup >= 0; got {batch}, {repeats}, {warmup}")


@dataclass(frozen=True)
class _Device:
    """Where ``profile`` measures: the device, its identity, the chain's facts (bytes, shapes, counts) there, the
    profile's sources, and the GPU spec a CPU profile is modeled for (None on CUDA)."""

    dev: torch.device
    identity: DeviceIdentity
    facts: ChainFacts
    compute_source: str
    transfer_source: str
    source: str
    spec: GPUSpec | None


def _set_up_device(
    chain: ModelChain, batch: int, dtype: str, device: str, gpu: str | None, conv_algos: bool
) -> _Device:
    """Move ``chain``'s modules to ``device`` and read its facts there (``profile``'s device step).

    Raises:
        ProfilerError: as ``profile``.
        UnknownGPUError: ``gpu`` is not a known GPU (CPU path).
    """
    dev = torch.device(device)
    identity: DeviceIdentity
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ProfilerError("device 'cuda' asked for but CUDA is not available; use device='cpu' or 'model'")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
        identity = cuda_identity(dev.index or 0)
        if gpu is not None and get_gpu(gpu).key != identity.key:
            raise ProfilerError(
                f"gpu {gpu!r} was given but this device is {identity.name!r} ({identity.key}); "
                "leave gpu unset when measuring on CUDA"
            )
        for stage in chain.stages:
            stage.module.to(dev)
        facts = chain_facts(chain, model_input(chain, batch, dev), dtype)
        torch.cuda.empty_cache()
        compute_source = transfer_source = f"measured:{identity.key}"
        source = "measured"
        spec = None
    elif dev.type == "cpu":
        if conv_algos:
            raise ProfilerError(
                "conv_algos needs a CUDA device: cuDNN algorithms cannot be enumerated on the CPU; "
                "measure with device='cuda' or leave conv_algos off"
            )
        spec = get_gpu(gpu or "h200")
        identity = spec_identity(spec)
        for stage in chain.stages:
            stage.module.to(dev)
        facts = meta_facts(chain, batch, dtype)
        compute_source = f"measured:cpu {cpu_model_name()}"
        transfer_source = f"modeled:{spec.key}"
        source = "modeled"
    else:
        raise ProfilerError(f"device {device!r} is not supported; use 'cuda', 'cuda:N' or 'cpu'")
    return _Device(dev, identity, facts, compute_source, transfer_source, source, spec)


def _compiled_facts(
    chain: ModelChain, batch: int, dtype: str, dev: torch.device, facts: ChainFacts, compile_budget: float
) -> tuple[ModelChain, ChainFacts, float]:
    """The chain compiled under ``compile_budget``, its facts (the compiled stages' bytes and shapes, the eager ones'
    FLOPs and convolutions) and the seconds compiling took (NOTE [ Compiled stages ] in
    ``memtune.profiler.compiled``)."""
    eager_facts = facts
    chain = compiled_chain(chain, compile_budget)
    compile_seconds = _compile_stages(chain, batch, dtype, dev, eager_facts)
    traced = chain_facts(chain, model_input(chain, batch, dev), dtype, eager=False)
    facts = dataclasses.replace(
        traced,
        stages=tuple(
            dataclasses.replace(c, count=e.count, convs=e.convs)
            for c, e in zip(traced.stages, eager_facts.stages, strict=True)
        ),
    )
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return chain, facts, compile_seconds


def _chain_stage_profiles(
    chain: ModelChain,
    facts: ChainFacts,
    timings: Sequence[StageTiming],
    copies: Sequence[tuple[float, float]],
    convs: Sequence[tuple[ConvProfile, ...]],
    rows: Sequence[RowMap | None],
) -> tuple[StageProfile, ...]:
    """Each stage's ``StageProfile`` from its facts (bytes, FLOPs), its timings (ms, bytes), its copies' ms
    (device to host, host to device), its convolutions and its row map."""
    return tuple(
        StageProfile(
            index=i,
            name=stage.name,
            kind=stage.kind,
            forward_ms=t.forward_ms,
            backward_ms=t.backward_ms,
            output_bytes=f.output_bytes,
            inplace=facts.inplace[i],
            output_storage=facts.output_storage[i],
            saved_bytes=f.saved_bytes,
            param_bytes=f.param_bytes,
            d2h_ms=copies[i][0],
            h2d_ms=copies[i][1],
            forward_workspace_bytes=t.forward_workspace_bytes,
            backward_workspace_bytes=t.backward_workspace_bytes,
            backward_inline_bytes=t.backward_inline_bytes,
            chained_backward_bytes=t.chained_backward_bytes,
            selective_saved_bytes=f.count.selective_saved_bytes if t.selective_backward_ms is not None else None,
            selective_forward_ms=t.selective_forward_ms,
            selective_backward_ms=t.selective_backward_ms,
            selective_backward_bytes=t.selective_backward_bytes,
            flops=f.count.flops,
            convs=convs[i],
            rows=rows[i],
        )
        for i, (stage, f, t) in enumerate(zip(chain.stages, facts.stages, timings, strict=True))
    )


def _chain_step_peak(chain: ModelChain, batch: int, dtype: str, dev: torch.device) -> StepPeak:
    """The unplanned step's peak off the allocator (NOTE [ Allocator meters ] in ``memtune.profiler.memory_meter``): the
    stages in order, the step loss (NOTE [ Bench step ]) on random targets, the parameters' gradients kept to the
    end; the output is dropped before the backward, as the bench step drops it."""
    import gc

    x = model_input(chain, batch, dev)
    params = [p for s in chain.stages for p in s.module.parameters() if p.requires_grad]
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # the reserved peak is this step's, not an earlier cache's
    with metered(dev) as reading:
        y = x
        with _autocast(dev, dtype):
            for stage in chain.stages:
                y = stage.module(y)
        target = torch.randint(0, y.shape[-1], tuple(y.shape[:-1]), device=dev)
        loss = step_loss(y, target)
        del y
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        del grads, loss, target
    return StepPeak(allocated_bytes=reading.peak_bytes, reserved_bytes=reading.peak_reserved_bytes, output_held=False)


def _compile_stages(chain: ModelChain, batch: int, dtype: str, dev: torch.device, facts: ChainFacts) -> float:
    """Run every compiled stage's forward and backward once on the input the chain feeds it, so that each compiles
    before it is traced or timed; returns the seconds that took (NOTE [ Compiled stages ])."""
    x = model_input(chain, batch, dev)
    start = time.perf_counter()
    for i, stage in enumerate(chain.stages):
        leaf, wrt = _grad_leaf(stage, x, facts.stages[i].input_needs_grad)
        y = _stage_forward(stage, dev, dtype)(leaf.clone())
        if y.requires_grad and y.is_floating_point() and wrt:
            _backward(y, wrt, torch.ones_like(y))
        del y
        with torch.no_grad(), _autocast(dev, dtype):
            x = eager_module(stage.module)(x)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() - start


def _time_chain(
    chain: ModelChain,
    batch: int,
    dtype: str,
    dev: torch.device,
    facts: ChainFacts,
    warmup: int,
    repeats: int,
    progress: ProgressFn | None,
) -> tuple[list[StageTiming], tuple[int, ...]]:
    """Time every stage on the input the chain feeds it, one stage's activations live at a time; also
    returns the shape of the chain's output."""
    n = len(chain)
    x = model_input(chain, batch, dev)
    out: list[StageTiming] = []
    for i, stage in enumerate(chain.stages):
        compiled = isinstance(stage.module, CompiledStage)
        needs_grad = facts.stages[i].input_needs_grad
        out.append(
            time_stage(
                stage,
                x,
                input_needs_grad=needs_grad,
                dtype=dtype,
                warmup=warmup,
                repeats=repeats,
                selective=not compiled,
            )
        )
        with torch.no_grad(), _autocast(dev, dtype):  # the eager module: no inference graph to compile
            x = eager_module(stage.module)(x)
        if progress is not None:
            progress(stage.name, i + 1, n)
    return out, tuple(x.shape)


def chain_inline_backward_bytes(chain: ModelChain, batch: int, dtype: str, dev: torch.device) -> list[int]:
    """``inline_backward_bytes`` of every stage, each fed the input the chain gives it (CUDA only), bytes."""
    x = model_input(chain, batch, dev)
    out: list[int] = []
    for i, stage in enumerate(chain.stages):
        out.append(inline_backward_bytes(stage, x, input_needs_grad=i > 0, dtype=dtype))
        with torch.no_grad(), _autocast(dev, dtype):
            x = stage.module(x)
    torch.cuda.empty_cache()
    return out


def _enumerate_chain_convs(
    chain: ModelChain, batch: int, dtype: str, dev: torch.device, warmup: int, repeats: int
) -> list[tuple[ConvProfile, ...]]:
    """Every stage's cuDNN algorithm tables with their batch-split runs (NOTE [ Batch split ]), each stage fed the
    input the chain gives it."""
    from memtune.profiler._conv_enumerate import enumerate_stage_convs  # ctypes binding: loaded only when asked for
    from memtune.profiler.conv_split import enumerate_splits

    x = model_input(chain, batch, dev)
    out: list[tuple[ConvProfile, ...]] = []
    for stage in chain.stages:
        convs = enumerate_stage_convs(stage, x, dtype=dtype, warmup=warmup, repeats=repeats)
        out.append(tuple(enumerate_splits(c, device=dev) for c in convs))
        with torch.no_grad(), _autocast(dev, dtype):
            x = stage.module(x)
        torch.cuda.empty_cache()
    return out
