"""Measured profiles of any ``nn.Module``, stage by stage (NOTE [ Module stages ] in
``memtune.profiler.module_stages``).

``profile_module`` finds the stages, traces what flows between them, then times each stage alone on the
arguments the model really gives it (NOTE [ Stage timing ] in ``memtune.profiler.measure``, generalised to several
inputs, keyword arguments and structured outputs) and one whole step, and returns a ``Profile`` with
``stages_from="modules"``. On CUDA every number is measured on the GPU (``source="measured"``); on the CPU every
time is the roofline's of ``gpu``, its ops counted on the CPU, and the copies are the spec's (``source="modeled"``,
NOTE [ Modeled module profiles ] in ``memtune.profiler.module_roofline``).

# NOTE [ Time outside stages ]
The model's own code between stages (an embedding sum, a concatenation, a loss computed inside the model) and
the loss function run in no stage. Their time is taken as one whole step's median less the stages' forward and
backward medians and stored as ``loss_ms``, which the simulator spends between the forward and the backward. A
stage timed alone can take longer than inside the step (on an H100, torchvision's ResNet-50, MobileNetV2 and
DenseNet-121 at batch 64-128 summed to 1.14-1.23x their whole step, each stage's launches no longer overlapping
the stage before); where the stages add up to more than the step, every stage's times are scaled down to it and
``loss_ms`` is 0, the factor written in ``compute_source``. Either way the profile adds up to the step that was
measured. On the CPU no clock reading is kept: ``loss_ms`` is the roofline of the ops counted outside the stages
(NOTE [ Modeled module profiles ] in ``memtune.profiler.module_roofline``).

# NOTE [ Profiles of compiled regions ]
With ``compile_budget`` the stages are regions (NOTE [ Regions ] in ``memtune.profiler.region_tree``) and every number
is measured with each region compiled by ``torch.compile`` under that activation budget
(``memtune.profiler.region_tree.CompiledRegions``): what a region saves for its backward is what its compiled graph
saves (the partitioner's choice at that budget, seen
by the trace's saved-tensor hooks), its times and transients are the compiled graph's, the whole step (``loss_ms``,
the step's peak) runs the regions compiled. A region written in place at its edges runs eager, its reason kept in
``model_params["eager_regions"]`` (NOTE [ In-place writes at region edges ]). One step runs first and compiles every
region; its seconds are ``compile_seconds`` (inductor's cache reused where warm). Each region is captured by a forward
with grad (the regions before it run their training graphs, so their outputs come with the strides the compiled step
hands on), not without, which would compile every region again for inference. Selective checkpointing works on eager
operations only, so a compiled region is never measured selective. On the CPU, for a GPU, the times are the roofline's
of the eager operations (counted with the regions paused): such a profile checks plan semantics and memory, not the
compiler's speed.

# NOTE [ Profiler hygiene ]
``profile_module`` leaves the model as it found it: training mode, buffers (batch-norm running statistics, which
the measurement updates) and the random number generators' states are restored, nothing it made stays referenced,
and on CUDA the caching allocator's cache is emptied, so a plan can run in the same process right after.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import torch
from torch import nn

from memtune.profiler._fused_attention import gpu_attention
from memtune.profiler._module_step import (
    _first_step_seconds,
    _loss_backward_bytes,
    _recompute_step_ms,
    _resident_bytes,
    _step_ms,
    _step_peak,
    modeled_resident_bytes,
)
from memtune.profiler._profile import DeviceIdentity, Profile, SavedStorage, SaveRule, StageProfile, StepPeak
from memtune.profiler._region_chain import chain_backward_bytes, with_chain_backward
from memtune.profiler._stage_run import GradStorage, _capture, _StageRun, _Timing
from memtune.profiler.chain import may_write_input
from memtune.profiler.devices import GPUSpec, get_gpu
from memtune.profiler.identity import cuda_identity, spec_identity, transfer_ms
from memtune.profiler.measure import ProgressFn, _autocast
from memtune.profiler.module_roofline import ModuleCount, count_module_step, modeled_compute_source, modeled_timings
from memtune.profiler.module_stages import (
    Inputs,
    StageTrace,
    find_stages,
    module_kind,
    tensor_leaves,
    trace_stages,
)
from memtune.profiler.profiler_errors import ProfilerError
from memtune.profiler.region_tree import CompiledRegions, edge_writes
from memtune.profiler.stagefacts import torch_dtype

__all__ = ["as_inputs", "default_loss", "left_as_found", "profile_module"]


def as_inputs(example_inputs: Any) -> Inputs:
    """``(args, kwargs)`` from what a user gives: a tensor, a tuple or list of positional arguments, a dict of
    keyword arguments, or an ``(args, kwargs)`` pair given as ``(tuple, dict)``."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if (
        isinstance(example_inputs, tuple)
        and len(example_inputs) == 2
        and isinstance(example_inputs[0], tuple)
        and isinstance(example_inputs[1], dict)
    ):
        return example_inputs[0], example_inputs[1]
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise ProfilerError(
        f"example_inputs must be a tensor, a tuple of arguments or a dict of keyword arguments, not "
        f"{type(example_inputs).__name__}"
    )


def default_loss(out: Any) -> torch.Tensor:
    """The loss a step differentiates when the user gives none: the output's ``loss`` where it has one (Hugging Face
    models given labels), else the sum of the means of every floating-point output tensor that needs a gradient."""
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    parts = [t.float().mean() for t in tensor_leaves(out) if t.is_floating_point() and t.requires_grad]
    if not parts:
        raise ProfilerError("the model returns no floating-point tensor that needs a gradient; pass loss_fn")
    return torch.stack(parts).sum()


@contextmanager
def left_as_found(model: nn.Module, device: torch.device) -> Iterator[None]:
    """NOTE [ Profiler hygiene ]: training mode, buffers and random states restored; the CUDA cache emptied."""
    training = {m: m.training for m in model.modules()}
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    try:
        yield
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        for m, mode in training.items():
            m.training = mode
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        del buffers
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _device_of(model: nn.Module, inputs: Inputs) -> torch.device:
    tensors = [*model.parameters(), *model.buffers()]
    dev = tensors[0].device if tensors else torch.device("cpu")
    for t in tensor_leaves(inputs):
        if t.device != dev:
            raise ProfilerError(
                f"an input is on {t.device} but the model is on {dev}; move both to the device to measure on"
            )
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _stage_params(model: nn.Module, modules: list[nn.Module]) -> tuple[list[int], list[int], int]:
    """Per stage its parameters' bytes, per stage the bytes of parameters it shares with a later stage, and the bytes
    of the model's parameters outside every stage (NOTE [ Tied weights ]).

    # NOTE [ Tied weights ]
    A parameter two stages share (a language model's embedding tied to its output layer) has one gradient, made by
    the backward that runs first: the last stage's. It is counted there, so the simulator allocates its gradient
    when the backward reaches that stage, not at the first stage's backward near the end of the step. The earlier
    stage's backward makes a gradient of its own for it (an embedding's is dense, vocabulary x width) and adds it
    to the one that exists: measured alone, that stage made it as a gradient, which the simulator subtracts; in the
    step it is a transient of that stage, twice its bytes (the new gradient and the sum, while the old one lives):
    the CPU oracle's tied GPT-2 (``tests/unit/modules/test_peak_oracle.py``, an 8 MiB embedding at batch 1 x 16) is
    simulated at 29.04 MiB against the allocator's 28.55.
    """
    owner: dict[int, int] = {}
    for k, m in enumerate(modules):
        for p in m.parameters():
            owner[id(p)] = k  # the last stage that uses it
    per = [0] * len(modules)
    shared = [0] * len(modules)
    for k, m in enumerate(modules):
        for p in m.parameters():
            nbytes = p.numel() * p.element_size()
            if owner[id(p)] == k:
                per[k] += nbytes
            elif p.requires_grad:
                shared[k] += 2 * nbytes
    outside = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in owner)
    return per, shared, outside


def _gradient_storages(trace: StageTrace, input_grads: Sequence[Sequence[GradStorage | None]]) -> None:
    """Record where an input's gradient holds a larger storage than its own bytes (NOTE [ Gradient storages ]).

    # NOTE [ Gradient storages ]
    A stage's backward may make its input's gradient as a view of a larger storage: the U-Net's decoder block
    concatenates the upsampled tensor with the encoder's output (the skip), and the backward of ``torch.cat`` makes
    one gradient for both and hands each input a slice. The skip's gradient then holds the whole storage, twice its
    own bytes, from the decoder block's backward to the encoder's, five stages later. The traced forward sees only
    the skip (its bytes); the stage's measured backward sees the storage (``_StageRun._grad_storages``).

    The part of the storage that is no input's view is recorded on the input, among those whose gradients share
    it, that lives longest (the earliest producer's), where this stage makes that gradient (its last reader, NOTE
    [ Gradients between stages ] in ``memtune.tuner.simulator``), as ``SavedStorage.grad_storage_bytes``. The simulator
    holds it from the end of that backward (during it, the stage's measured transient holds it: the transients
    are measured above the gradients' own bytes) until autograd sums the next gradient into it, out of place: at
    the end of the backward of the latest earlier stage that reads another tensor of the same producer (the
    skip's max-pooled copy), else the producer's. Views of one storage that are all inputs (a dense layer given
    its block's features) record nothing.

    The transients are measured with the stage's outputs dropped before its backward, as in a step: an output that
    only the stage saves (a block ending in an in-place ReLU) is freed by its first backward node, and holding it
    in the measurement counted it once more than the step does.

    Measured against the CPU allocator's events (U-Net of width 16, batch 2 at 64 x 64; simulated / measured peak):
    with the selective decoder block alone, 0.953 before and 1.000 after; every stage kept, 1.000 and 1.000;
    ``roororsk``, 0.992 and 0.999. On an H100 (batch 16, width 64, 256 x 256) the selective block's backward ran
    268 MiB, one skip, above its prediction before, and the plan chosen at 60% of the peak ran out of memory
    there (``tests/unit/modules/test_peak_oracle.py`` holds the CPU case).
    """
    for k, grads in enumerate(input_grads):
        groups: dict[int, dict[int, int]] = {}  # group -> storage index -> its view's bytes
        whole: dict[int, int] = {}
        for sid, g in zip(trace.leaf_storages[k], grads, strict=False):
            if sid is None or g is None:
                continue
            views = groups.setdefault(g.group, {})
            views[sid] = max(views.get(sid, 0), g.tensor_bytes)
            whole[g.group] = g.storage_bytes
        for group, views in groups.items():
            rest = whole[group] - sum(views.values())
            made_here = [sid for sid in views if max(j for j, ins in enumerate(trace.inputs) if sid in ins) == k]
            if rest <= 0 or not made_here:
                continue
            entry = trace.storages[min(made_here, key=lambda i: trace.storages[i].producer)]
            entry.grad_storage_bytes = max(entry.grad_storage_bytes or 0, entry.grad_bytes + rest)


def _table(trace: StageTrace) -> tuple[list[SavedStorage], dict[int, int], int]:
    """The profile's storage table from the trace: every storage that is saved, flows between stages or is returned;
    with the map from trace indices and the bytes made before the first stage (the model input)."""
    used = set(trace.model_outputs)
    for k in range(len(trace.names)):
        used.update(trace.inputs[k])
        if trace.outputs[k] is not None:
            used.add(trace.outputs[k])  # type: ignore[arg-type]
    remap: dict[int, int] = {}
    table: list[SavedStorage] = []
    input_bytes = 0
    for sid, s in enumerate(trace.storages):
        if not (s.saved_by or s.outside_after is not None or sid in used):
            continue
        if s.producer < 0:
            input_bytes += s.nbytes
        saved_by = set(s.saved_by)
        if s.outside_after is not None:
            saved_by.add(max(s.outside_after, 0))
        remap[sid] = len(table)
        table.append(
            SavedStorage(
                bytes=s.nbytes,
                saved_by=tuple(sorted(saved_by)),
                producer=s.producer,
                read_by=tuple(sorted(s.readers)),
                grad_bytes=s.grad_bytes if sid in used else 0,  # gradients that flow between stages
                grad_storage_bytes=s.grad_storage_bytes if sid in used else None,
                outside=s.outside_after is not None,
            )
        )
    return table, remap, input_bytes


def profile_module(
    model: nn.Module,
    example_inputs: Any,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    stages: list[str] | None = None,
    dtype: str = "float32",
    gpu: str | None = None,
    name: str | None = None,
    warmup: int = 2,
    repeats: int = 5,
    progress: ProgressFn | None = None,
    output_held: bool = True,
    transients: Literal["gpu", "cpu"] = "gpu",
    compile_budget: float | None = None,
    compile_saves: SaveRule | None = None,
) -> Profile:
    """Measure a profile of any ``nn.Module`` on the device its parameters are on (NOTE [ Module stages ]).

    Args:
        model: the model, on ``cpu`` or a CUDA device; it is left as found (NOTE [ Profiler hygiene ]).
        example_inputs: one batch: a tensor, a tuple of arguments, a dict of keyword arguments, or ``(args, kwargs)``.
            The first tensor's first dimension is the batch.
        loss_fn: ``loss_fn(model_output) -> scalar``; None: ``default_loss``.
        stages: ``fnmatch`` patterns naming the stages; None finds the repeated blocks and the pieces between them.
        dtype: ``float32``, or ``bfloat16``/``float16`` for autocast (parameters stay as they are).
        gpu: on the CPU, the GPU type the profile describes (default ``h200``); on CUDA None or the present GPU's.
        name: the profile's model name (default: the model's class name).
        warmup, repeats: untimed and timed rounds per stage and for the whole step; medians are kept. A profile made
            on the CPU for a GPU takes its times from the roofline and runs each pass once.
        progress: ``progress(stage_name, done, total)`` after each stage.
        output_held: whether the training loop holds the model's output until its backward ends (``out = model(x);
            loss(out).backward()``): the worst case, and the default. False when it drops it first
            (``model(x).loss.backward()``); NOTE [ Held output ] in ``memtune.tuner.simulator``.
        transients: on the CPU, whose memory the transients and the step's peak describe: ``gpu``, the GPU's (the
            CPU allocator's events with each convolution's own allocations replaced by the GPU's modeled workspace,
            NOTE [ GPU transients from the CPU's allocator ] in ``memtune.profiler.memory_meter``), or ``cpu``, the
            CPU's own (to check the simulator against the CPU's allocator). On CUDA every transient is measured:
            ``gpu``.
        compile_budget: measure every stage as a region compiled by ``torch.compile`` under this activation budget (0
            to 1; NOTE [ Profiles of compiled regions ]); ``stages`` then names the regions
            (``memtune.profiler.region_tree.region_partitions`` gives candidates). None: eager stages.
        compile_saves: with ``compile_budget``, memtune's save rule in each region (NOTE [ Saved tensors chosen
            inside a compiled region ]); None: the compiler's own choice.

    Returns:
        A ``Profile`` with ``stages_from="modules"``: stage names are the modules' qualified names.

    Raises:
        ProfilerError: inputs on another device than the model, a stage that does not run exactly once per forward,
            a pattern matching nothing, a loss that is not a scalar, a ``gpu`` that is not this CUDA device, or a
            ``compile_budget`` outside 0..1 or whose one region is the whole model, or a bad ``compile_saves``.
    """
    inputs, first, dev, identity, spec, gpu_workspaces = _checked_arguments(
        model, example_inputs, dtype, gpu, warmup, repeats, transients, compile_budget, compile_saves
    )
    loss = loss_fn or default_loss
    with left_as_found(model, dev), ExitStack() as stack:
        if gpu_workspaces:  # a profile made on the CPU for a GPU: NOTE [ Fused attention on the CPU ]
            stack.enter_context(gpu_attention())
        run = _measure_stages(
            model, inputs, stack, loss, stages, dtype, dev, spec, warmup, repeats, progress, output_held,
            gpu_workspaces, compile_budget, compile_saves,
        )  # fmt: skip
    trace, timings, names = run.trace, run.timings, run.names
    _gradient_storages(trace, [t.input_grads for t in timings])
    table, remap, input_bytes = _table(trace)
    first_saver, copies = _first_saver_copies(table, len(names), spec, dev, warmup, repeats)
    params, shared, outside_params = _stage_params(model, run.modules)
    timings, staged_ms, scale = _scaled_to_step(timings, run.step_ms)
    stage_profiles = _stage_profiles(run, timings, remap, first_saver, params, shared, copies, scale)
    return Profile(
        model=name or type(model).__name__,
        model_params=_model_params(names, stages, run.coarse, run.eager_regions, trace.held),
        batch=first.shape[0],
        dtype=dtype,  # type: ignore[arg-type]
        input_shape=tuple(first.shape[1:]),
        input_bytes=input_bytes,
        device=identity,
        source="measured" if spec is None else "modeled",
        compute_source=(f"measured:{identity.key}" if spec is None else modeled_compute_source(spec))
        + (f" (stages scaled x{scale:.3f} to the whole step)" if scale < 1.0 else ""),
        transfer_source=f"measured:{identity.key}" if spec is None else f"modeled:{identity.key}",
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        stages=stage_profiles,
        storages=tuple(table),
        loss_ms=max(0.0, run.step_ms - staged_ms * scale),  # NOTE [ Time outside stages ]
        stages_from="modules",
        outside_param_bytes=outside_params,
        loss_saved_bytes=trace.loss_saved_bytes,
        loss_backward_bytes=run.tail,
        output_held_bytes=_held_bytes(trace, table, remap) if output_held else 0,
        step_peak=run.step_peak,
        resident_bytes=run.resident,
        recompute_step_ms=run.recompute_step_ms,
        compile_budget=compile_budget,
        compile_saves=compile_saves,
        compile_seconds=run.compile_seconds,
        eager_stages=tuple(sorted(run.eager_regions)),
    )


def _scaled_to_step(timings: list[_Timing], step_ms: float) -> tuple[list[_Timing], float, float]:
    """The stages' timings scaled down to the whole step where they sum above it (NOTE [ Time outside stages ]), with
    their unscaled sum (ms) and the scale (at most 1)."""
    staged_ms = sum(t.forward_ms + t.backward_ms for t in timings)
    scale = min(1.0, step_ms / staged_ms) if staged_ms > 0 else 1.0
    scaled = [
        dataclasses.replace(t, forward_ms=t.forward_ms * scale, backward_ms=t.backward_ms * scale) for t in timings
    ]
    return scaled, staged_ms, scale


def _first_saver_copies(
    table: list[SavedStorage], n: int, spec: GPUSpec | None, dev: torch.device, warmup: int, repeats: int
) -> tuple[list[int], list[tuple[float, float]]]:
    """Per stage, the bytes of the storages it saves first (not outside the stages), and the ms to copy them to the
    host and back: measured on ``dev``, or the GPU spec's when the profile is modeled."""
    first_saver = [
        sum(s.bytes for s in table if s.saved_by and min(s.saved_by) == k and not s.outside) for k in range(n)
    ]
    if spec is None:
        measured = transfer_ms(first_saver, dev, warmup=warmup, repeats=repeats)
        copies = [measured.get(b, (0.0, 0.0)) for b in first_saver]
    else:
        copies = [(spec.transfer_ms(b, "d2h"), spec.transfer_ms(b, "h2d")) for b in first_saver]
    return first_saver, copies


def _checked_arguments(
    model: nn.Module,
    example_inputs: Any,
    dtype: str,
    gpu: str | None,
    warmup: int,
    repeats: int,
    transients: str,
    compile_budget: float | None,
    compile_saves: str | None = None,
) -> tuple[Inputs, torch.Tensor, torch.device, DeviceIdentity, GPUSpec | None, bool]:
    """``profile_module``'s arguments checked, in its order: the inputs, their first tensor (whose first dimension is
    the batch), the device, the profile's identity, the GPU spec a CPU profile is modeled for (None on CUDA), and
    whether transients are read as the GPU would allocate them.

    Raises:
        ValueError: ``repeats`` < 1 or ``warmup`` < 0.
        ProfilerError: as ``profile_module``.
    """
    torch_dtype(dtype)
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0; got {repeats}, {warmup}")
    inputs = as_inputs(example_inputs)
    first = next(tensor_leaves(inputs), None)
    if first is None or first.dim() == 0:
        raise ProfilerError("example_inputs hold no batched tensor; the first tensor's first dimension is the batch")
    dev = _device_of(model, inputs)
    identity, spec = _identity(dev, gpu)
    if transients not in ("gpu", "cpu") or (transients == "cpu" and dev.type != "cpu"):
        raise ProfilerError(
            f"transients={transients!r}: a profile keeps the GPU's transients ('gpu'), or on the CPU the CPU's own "
            "('cpu')"
        )
    gpu_workspaces = dev.type == "cpu" and transients == "gpu"
    if compile_budget is not None and not 0.0 <= compile_budget <= 1.0:
        raise ProfilerError(f"compile_budget is an activation budget from 0 to 1, not {compile_budget}")
    if compile_saves is not None:
        from memtune.profiler.saved_tags import SAVE_RULES

        if compile_budget is None or compile_saves not in SAVE_RULES:
            raise ProfilerError(
                f"compile_saves={compile_saves!r}: a save rule ({', '.join(SAVE_RULES)}) of regions compiled under a "
                "compile_budget"
            )
    return inputs, first, dev, identity, spec, gpu_workspaces


@dataclass
class _StagesRun:
    """What ``_measure_stages`` measured: stage names and modules, the trace, per-stage timings (ms, not yet scaled
    to the step), the step's time (ms) and peak, the loss backward's transient (bytes), and the compiled regions'
    facts."""

    names: list[str]
    coarse: list[str]
    modules: list[nn.Module]
    eager_regions: dict[int, str]
    compile_seconds: float | None
    trace: StageTrace
    timings: list[_Timing]
    step_ms: float
    recompute_step_ms: float | None
    step_peak: StepPeak
    tail: int
    resident: int


def _measure_stages(
    model: nn.Module,
    inputs: Inputs,
    stack: ExitStack,
    loss: Callable[[Any], torch.Tensor],
    stages: list[str] | None,
    dtype: str,
    dev: torch.device,
    spec: GPUSpec | None,
    warmup: int,
    repeats: int,
    progress: ProgressFn | None,
    output_held: bool,
    gpu_workspaces: bool,
    compile_budget: float | None,
    compile_saves: str | None = None,
) -> _StagesRun:
    """Find the stages, trace them, time each (compiled as regions under ``compile_budget`` when given, their
    contexts entered on ``stack``), and measure the whole step: ``profile_module``'s measuring, inside its
    ``left_as_found``."""
    model.train()
    names, coarse = find_stages(model, inputs, stages)
    modules = [model.get_submodule(n) if n else model for n in names]
    regions: CompiledRegions | None = None
    eager_regions: dict[int, str] = {}
    compile_seconds: float | None = None
    if compile_budget is not None:  # NOTE [ Profiles of compiled regions ]
        if names == [""]:
            raise ProfilerError(
                "the one region is the whole model: measure it compiled whole (compiler points, "
                "memtune.tuner.measure.compiler_points.measure_module_points), or name smaller regions (stages=[...])"
            )
        eager_regions = edge_writes(model, names, inputs, loss_fn=loss, autocast=_autocast(dev, dtype))
        regions = stack.enter_context(
            CompiledRegions(modules, compile_budget, sorted(eager_regions), names, compile_saves)
        )
        compile_seconds = _first_step_seconds(model, inputs, loss, dtype, dev)
    trace = trace_stages(model, names, inputs, loss_fn=loss, autocast=_autocast(dev, dtype), output_held=output_held)
    # a profile for a GPU made on the CPU keeps the roofline's times, not the CPU's: one untimed round of each
    # pass is all it needs of them (which stages run selective, what they keep, their transients)
    rounds = (warmup, repeats) if spec is None else (0, 1)
    timings = _time_stages(
        model, names, modules, inputs, trace, dtype, dev, rounds, progress, gpu_workspaces, compiled=regions is not None
    )
    if regions is not None:  # NOTE [ Region backward measured in the chain ] (memtune.profiler._region_chain)
        compiled = [k not in eager_regions for k in range(len(modules))]
        chain = chain_backward_bytes(model, modules, compiled, inputs, loss, dtype, dev)
        timings = [with_chain_backward(t, c) for t, c in zip(timings, chain, strict=True)]
    step_ms = _step_ms(model, inputs, loss, dtype, dev, *rounds)
    # a modeled profile keeps no clock reading (NOTE [ Modeled module profiles ])
    recompute_step_ms = None if spec else _recompute_step_ms(model, inputs, loss, dtype, dev, rounds, modules)
    if spec is not None:  # the GPU's roofline, not the CPU's clock (NOTE [ Modeled module profiles ])
        with regions.paused() if regions is not None else nullcontext():  # the eager operations' roofline
            counted = count_module_step(model, inputs, modules, trace.input_grad, loss, dtype)
        timings, step_ms = modeled_timings(timings, counted, spec, dtype)
    step_peak = _step_peak(model, inputs, loss, dtype, dev, output_held, gpu_workspaces)
    resident = (  # NOTE [ Memory held before the step ]
        _resident_bytes(dev, lambda: _step_peak(model, inputs, loss, dtype, dev, output_held, gpu_workspaces))
        if spec is None
        else modeled_resident_bytes(spec.compute_capability, _runs_matmul(counted))
    )
    tail = _loss_backward_bytes(model, modules[-1], inputs, loss, dtype, dev, gpu_workspaces)
    return _StagesRun(
        names, coarse, modules, eager_regions, compile_seconds, trace, timings, step_ms, recompute_step_ms, step_peak,
        tail, resident,
    )  # fmt: skip


def _time_stages(
    model: nn.Module,
    names: list[str],
    modules: list[nn.Module],
    inputs: Inputs,
    trace: StageTrace,
    dtype: str,
    dev: torch.device,
    rounds: tuple[int, int],
    progress: ProgressFn | None,
    gpu_workspaces: bool,
    *,
    compiled: bool,
) -> list[_Timing]:
    """Each stage run alone on the arguments the model gives it (``_StageRun``), in stage order: last stage first, each
    given its output's gradient in the layout its consumer's backward made (NOTE [ Incoming gradients as the chain makes
    them ] in ``memtune.profiler._stage_run``); ``compiled``: the stages are compiled regions (never selective)."""
    timings: list[_Timing] = [_Timing(0.0, 0.0)] * len(modules)
    layouts: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # by storage: its gradient's shape and strides
    for done, k in enumerate(reversed(range(len(modules))), start=1):
        m = modules[k]
        captured, autocast_dtype = _capture(model, m, inputs, _autocast(dev, dtype), dev, grad=compiled)
        out_sid = trace.outputs[k]
        run = _StageRun(
            m, captured, trace.input_grad[k], dtype, dev, autocast_dtype, gpu_workspaces, selective=not compiled,
            out_layout=layouts.get(out_sid) if out_sid is not None else None,
        )  # fmt: skip
        timings[k] = run.time(*rounds)
        for sid, grad in zip(trace.leaf_storages[k], timings[k].input_grads, strict=False):
            if sid is not None and grad is not None:
                layouts.setdefault(sid, (grad.shape, grad.stride))
        del captured, run
        if progress is not None:
            progress(names[k] or type(model).__name__, done, len(modules))
    return timings


def _runs_matmul(counted: ModuleCount) -> bool:
    """Whether the counted step ran a matrix product (in a stage or outside them)."""
    facts = (*counted.stages, counted.prologue, counted.outside)
    return any(k.kind == "matmul" for f in facts for k in f.count.kernels)


def _stage_profiles(
    run: _StagesRun,
    timings: list[_Timing],
    remap: dict[int, int],
    first_saver: list[int],
    params: list[int],
    shared: list[int],
    copies: list[tuple[float, float]],
    scale: float,
) -> tuple[StageProfile, ...]:
    """Each stage's ``StageProfile`` from its scaled ``timings`` (ms), the storages it saves first (bytes), its
    parameters' bytes (``shared``: those it shares with another stage) and its copies' ms; ``scale`` also scales the
    selective and recompute times (NOTE [ Time outside stages ])."""
    names, trace = run.names, run.trace
    return tuple(
        StageProfile(
            index=k,
            name=names[k],
            kind=module_kind(m),
            forward_ms=t.forward_ms,
            backward_ms=t.backward_ms,
            output_bytes=trace.output_bytes[k],
            inplace=may_write_input(m),
            output_storage=remap.get(trace.outputs[k]) if trace.outputs[k] is not None else None,  # type: ignore[arg-type]
            saved_bytes=first_saver[k],
            param_bytes=params[k],
            d2h_ms=copies[k][0],
            h2d_ms=copies[k][1],
            forward_workspace_bytes=t.forward_workspace_bytes,
            chained_backward_bytes=None  # NOTE [ Tied weights ]
            if t.chained_backward_bytes is None
            else t.chained_backward_bytes + shared[k],
            selective_saved_bytes=t.selective_saved_bytes,
            selective_forward_ms=None if t.selective_forward_ms is None else t.selective_forward_ms * scale,
            selective_backward_ms=None if t.selective_backward_ms is None else t.selective_backward_ms * scale,
            selective_backward_bytes=t.selective_backward_bytes,
            recompute_backward_ms=None if t.recompute_backward_ms is None else t.recompute_backward_ms * scale,
            recompute_backward_bytes=t.recompute_backward_bytes,
            input_storages=tuple(remap[s] for s in trace.inputs[k]),
        )
        for k, (m, t) in enumerate(zip(run.modules, timings, strict=True))
    )


def _model_params(
    names: list[str],
    stages: list[str] | None,
    coarse: list[str],
    eager_regions: dict[int, str],
    held: list[tuple[str, int]],
) -> dict[str, int | float | str | bool]:
    """``Profile.model_params`` of a module profile: the stage count, the patterns asked for, where stages were found
    coarser than asked, the regions left eager (NOTE [ In-place writes at region edges ]), and the objects the
    model's output holds besides its tensors with their bytes (``held_objects``, ``held_object_bytes``: a cache a
    loop that keeps the output holds, NOTE [ Held output ] in ``memtune.tuner.simulator``)."""
    model_params: dict[str, int | float | str | bool] = {"stages": len(names)}
    if stages is not None:
        model_params["stage_patterns"] = ",".join(stages)
    if coarse:
        model_params["coarser"] = "; ".join(coarse)
    if eager_regions:  # NOTE [ In-place writes at region edges ]
        model_params["eager_regions"] = "; ".join(f"{names[k]}: {why}" for k, why in sorted(eager_regions.items()))
    if held:
        model_params["held_objects"] = ", ".join(name for name, _ in held)
        model_params["held_object_bytes"] = sum(nbytes for _, nbytes in held)
    return model_params


def _held_bytes(trace: StageTrace, table: list[SavedStorage], remap: dict[int, int]) -> int:
    """``Profile.output_held_bytes``: bytes of the storages the model returns that no stage saves and the model's own
    code does not save (NOTE [ Held output ] in ``memtune.tuner.simulator``)."""
    returned = {remap[sid] for sid in trace.model_outputs if sid in remap}
    return sum(table[i].bytes for i in returned if not table[i].saved_by and table[i].producer >= 0)


def _identity(dev: torch.device, gpu: str | None) -> tuple[DeviceIdentity, GPUSpec | None]:
    """The device identity, and the roofline spec whose copies a CPU profile takes (None on CUDA)."""
    if dev.type == "cuda":
        identity = cuda_identity(dev.index or 0)
        if gpu is not None and get_gpu(gpu).key != identity.key:
            raise ProfilerError(
                f"gpu {gpu!r} was given but this device is {identity.name!r} ({identity.key}); leave gpu unset when "
                "measuring on CUDA"
            )
        return identity, None
    if dev.type != "cpu":
        raise ProfilerError(f"device {dev} is not supported; put the model on 'cpu' or a CUDA device")
    spec = get_gpu(gpu or "h200")
    return spec_identity(spec), spec
