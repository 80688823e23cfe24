"""Measured profiles of any ``nn.Module``, stage by stage (NOTE [ Module stages ] in ``memtune.profiler.modules``).

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
With ``compile_budget`` the stages are regions (NOTE [ Regions ] in ``memtune.profiler.regions``) and every number is
measured with each region compiled by ``torch.compile`` under that activation budget
(``memtune.profiler.regions.CompiledRegions``): what a region saves for its backward is what its compiled graph saves
(the partitioner's choice at that budget, seen
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
import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import torch
from torch import nn

from memtune.profiler.chain import may_write_input
from memtune.profiler.devices import GPUSpec, get_gpu
from memtune.profiler.errors import ProfilerError
from memtune.profiler.identity import cuda_identity, spec_identity, transfer_ms
from memtune.profiler.measure import ProgressFn, _autocast, _Timer
from memtune.profiler.memory_meter import metered
from memtune.profiler.module_roofline import count_module_step, modeled_compute_source, modeled_timings
from memtune.profiler.modules import (
    Inputs,
    StageTrace,
    call_model,
    checkpointed_call,
    copy_structure,
    find_stages,
    module_kind,
    tensor_leaves,
    trace_stages,
)
from memtune.profiler.profile import DeviceIdentity, Profile, SavedStorage, StageProfile, StepPeak
from memtune.profiler.regions import CompiledRegions, edge_writes
from memtune.profiler.selective import KeptOutputs
from memtune.profiler.stagefacts import torch_dtype
from memtune.profiler.storages import storage_key

__all__ = ["as_inputs", "default_loss", "profile_module"]


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


class _Captured(Exception):
    def __init__(self, inputs: Inputs, autocast_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.inputs = inputs
        self.autocast_dtype = autocast_dtype


def _capture(
    model: nn.Module,
    module: nn.Module,
    inputs: Inputs,
    autocast: AbstractContextManager[Any],
    device: torch.device,
    grad: bool = False,
) -> tuple[Inputs, torch.dtype | None]:
    """The ``(args, kwargs)`` ``model``'s forward gives ``module`` (the forward stops there): its tensor leaves
    detached copies, every other object in it (a Hugging Face cache) a structure copy of the state it was in
    (NOTE [ State threaded between stages ] in ``memtune.profiler.modules``); and the autocast dtype on ``device`` at
    that call, None where autocast was off there.

    # NOTE [ A stage runs under the autocast it was called in ]
    A model may turn autocast on itself (a wrapper whose forward enters ``torch.autocast``, as the promises' Llama
    does), so a stage timed alone under the profile's own ``dtype`` (``float32``: none) ran in fp32 while the step
    runs it in bf16: on an H100 its selective stage was said to keep 737 MiB, twice the bf16 outputs it keeps, and
    its times and transients were fp32's. The stage's lone runs take the autocast state of its call in the step.

    Raises:
        ProfilerError: the stage is given state that cannot be copied, or it did not run.
    """

    def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        copies = (t.detach().clone() for t in tensor_leaves((args, kwargs)))
        on = torch.is_autocast_enabled(device.type)
        dtype = torch.get_autocast_dtype(device.type) if on else None
        try:
            raise _Captured(copy_structure((args, kwargs), copies), dtype)
        except ProfilerError as exc:
            name = next((n for n, m in model.named_modules() if m is module), "") or type(model).__name__
            raise ProfilerError(
                f"stage {name!r} is given state that memtune must copy to time the stage alone on what the model "
                f"gave it, and {exc} (NOTE [ State threaded between stages ]); turn that state off (use_cache=False "
                "in a Hugging Face model's config) or name stages that are not given it (stages=[...])"
            ) from exc

    handle = module.register_forward_pre_hook(hook, with_kwargs=True, prepend=True)
    try:
        # with grad where regions run compiled (NOTE [ Profiles of compiled regions ])
        with torch.enable_grad() if grad else torch.no_grad(), autocast:
            call_model(model, inputs)
    except _Captured as got:
        return got.inputs, got.autocast_dtype
    finally:
        handle.remove()
    raise ProfilerError("a stage did not run in the capture forward; the model's forward is not deterministic")


@dataclass(frozen=True)
class _Timing:
    forward_ms: float
    backward_ms: float
    forward_workspace_bytes: int = 0
    chained_backward_bytes: int | None = None
    selective_forward_ms: float | None = None
    selective_backward_ms: float | None = None
    selective_saved_bytes: int | None = None
    selective_backward_bytes: int | None = None
    recompute_backward_ms: float | None = None
    recompute_backward_bytes: int | None = None
    input_grads: tuple[GradStorage | None, ...] = ()


@dataclass(frozen=True)
class GradStorage:
    """The gradient a stage's backward made for one tensor leaf of its inputs (NOTE [ Gradient storages ]).

    Attributes:
        group: the first leaf whose gradient shares this one's storage (its own index where none before does).
        storage_bytes: bytes of the storage the gradient is a view of.
        tensor_bytes: bytes of the gradient tensor itself.
    """

    group: int
    storage_bytes: int
    tensor_bytes: int


_Mode = Literal["plain", "recompute", "selective"]


class _StageRun:
    """One stage called alone on captured inputs: forward, and backward with respect to its inputs that need a
    gradient and its parameters."""

    def __init__(
        self,
        module: nn.Module,
        inputs: Inputs,
        grad: list[bool],
        dtype: str,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
        gpu_workspaces: bool = False,
        selective: bool = True,
    ) -> None:
        self.module = module
        self.inputs = inputs
        leaves = list(tensor_leaves(inputs))
        self.leaves = [
            t.detach().requires_grad_(bool(g) and t.is_floating_point())
            for t, g in zip(leaves, grad + [False] * (len(leaves) - len(grad)), strict=True)
        ]
        params: list[torch.Tensor] = [p for p in module.parameters() if p.requires_grad]
        self.wrt = [t for t in self.leaves if t.requires_grad] + params
        self.dtype = dtype
        self.device = device
        self.autocast_dtype = autocast_dtype  # NOTE [ A stage runs under the autocast it was called in ]
        self.gpu_workspaces = gpu_workspaces  # NOTE [ GPU transients from the CPU's allocator ]
        self.clone = may_write_input(module)
        self.selective = selective  # a compiled region never is (NOTE [ Profiles of compiled regions ])
        self.input_grads: tuple[GradStorage | None, ...] = ()

    def fresh(self) -> Inputs:
        """The stage's inputs for one call: copies of its tensor leaves (those with a gradient are graph leaves'
        copies), a fresh structure copy of every other object (NOTE [ State threaded between stages ])."""
        return copy_structure(self.inputs, (t.clone() for t in self.leaves))  # type: ignore[no-any-return]

    def forward(self, inputs: Inputs | None = None, mode: _Mode = "plain") -> list[torch.Tensor]:
        """The stage's forward on ``inputs`` (from ``fresh``; None: made here), as the runtime runs it under the
        plan action ``mode``: ``plain`` (keep), ``recompute`` (a non-reentrant checkpoint of its call: every tensor
        passed positionally, the re-run in backward given a fresh structure copy of the captured state) or
        ``selective`` (the same under selective checkpointing, NOTE [ Selective stages ])."""
        args, kwargs = self.fresh() if inputs is None else inputs
        if mode == "plain":
            with self.autocast():
                out = self.module(*args, **kwargs)
            return [t for t in tensor_leaves(out) if t.requires_grad and t.is_floating_point()]

        def call(*a: Any, **kw: Any) -> Any:
            with self.autocast():
                return self.module(*a, **kw)

        out = checkpointed_call(call, args, kwargs, clone=self.clone, selective=mode == "selective")
        return [t for t in tensor_leaves(out) if t.requires_grad and t.is_floating_point()]

    def autocast(self) -> AbstractContextManager[Any]:
        """The autocast the stage was called under in the step, else the profile's ``dtype``'s (NOTE [ A stage runs
        under the autocast it was called in ])."""
        if self.autocast_dtype is not None:
            return torch.autocast(self.device.type, dtype=self.autocast_dtype)
        return _autocast(self.device, self.dtype)

    def kept_bytes(self) -> int:
        """What a ``selective`` run of the stage keeps besides its inputs: the outputs of its costly operations
        (``memtune.profiler.selective.KeptOutputs``), bytes."""
        inputs = self.fresh()
        rec = KeptOutputs()
        with rec:
            outs = self.forward(inputs)
        del outs, inputs
        return rec.kept_bytes

    def backward(self, outs: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        if outs and self.wrt:
            torch.autograd.grad(outs, self.wrt, grads, allow_unused=True)

    def _medians(self, warmup: int, repeats: int, mode: _Mode) -> tuple[float, float]:
        timer = _Timer(self.device)
        fwd: list[float] = []
        bwd: list[float] = []
        for k in range(warmup + repeats):
            inputs = self.fresh()  # outside the timed call: the model makes no copies
            outs, f_ms = timer.run(self.forward, inputs, mode)
            grads = [torch.randn_like(t) for t in outs]
            _, b_ms = timer.run(self.backward, outs, grads)
            del outs, grads, inputs
            if k >= warmup:
                fwd.append(f_ms)
                bwd.append(b_ms if self.wrt else 0.0)
        return statistics.median(fwd), statistics.median(bwd)

    def time(self, warmup: int, repeats: int) -> _Timing:
        """Medians of its passes, plain, recomputed and selective (where it has a backward), and their transients."""
        timing = self._time(warmup, repeats)
        return dataclasses.replace(timing, input_grads=self.input_grads)

    def _time(self, warmup: int, repeats: int) -> _Timing:
        fwd, bwd = self._medians(warmup, repeats, "plain")
        plain = self._transients("plain")
        if not self.wrt:
            return _Timing(fwd, bwd, *plain)
        try:  # NOTE [ Recompute priced as measured ] in memtune.tuner.simulator
            _, rec_bwd = self._medians(warmup, repeats, "recompute")
            _, rec_bytes = self._transients("recompute")
        except (RuntimeError, ProfilerError):  # autograd refuses it (an in-place write): priced as its forward
            rec_bwd, rec_bytes = None, None
        if not self.selective:
            return _Timing(fwd, bwd, *plain, recompute_backward_ms=rec_bwd, recompute_backward_bytes=rec_bytes)
        try:
            sel_fwd, sel_bwd = self._medians(warmup, repeats, "selective")
        except RuntimeError:  # autograd refuses it (an in-place write to a re-made tensor): never offered
            return _Timing(fwd, bwd, *plain, recompute_backward_ms=rec_bwd, recompute_backward_bytes=rec_bytes)
        kept = self.kept_bytes()
        _, sel_bytes = self._transients("selective")
        return _Timing(fwd, bwd, *plain, sel_fwd, sel_bwd, kept, sel_bytes, rec_bwd, rec_bytes)

    def _transients(self, mode: _Mode) -> tuple[int, int]:
        """Forward transient above what was live before and after it; backward's peak above what was live before it
        and the gradients it makes, the outputs' gradients made inside it (as ``chained_backward_bytes``). Read off
        the allocator on CUDA and on the CPU alike (NOTE [ Allocator meters ]); on the CPU for a GPU, with the GPU's
        convolution workspaces (NOTE [ GPU transients from the CPU's allocator ])."""
        with metered(self.device, gpu_workspaces=self.gpu_workspaces) as fwd:
            outs = self.forward(mode=mode)
        fwd_ws = max(0, fwd.peak_bytes - max(0, fwd.end_bytes))
        if not (outs and self.wrt):
            return fwd_ws, 0
        total = torch.stack([(t * 1.0).sum().float() for t in outs]).sum()
        # in a step nothing else holds the outputs through the backward: one that only the stage saves (an in-place
        # ReLU's) is freed by its first backward node (NOTE [ Gradient storages ])
        del outs
        with metered(self.device, gpu_workspaces=self.gpu_workspaces) as bwd:
            grads = torch.autograd.grad(total, self.wrt, allow_unused=True)
        # the gradients' own bytes, as the simulator makes them; the rest of a storage they are views of is the
        # backward's transient (NOTE [ Gradient storages ])
        made = sum(g.numel() * g.element_size() for g in grads if g is not None)
        if mode == "plain":
            self.input_grads = self._grad_storages(grads)
        del grads, total
        return fwd_ws, max(0, bwd.peak_bytes - made)

    def _grad_storages(self, grads: Sequence[torch.Tensor | None]) -> tuple[GradStorage | None, ...]:
        """Per tensor leaf of the inputs, the gradient the backward made for it (NOTE [ Gradient storages ])."""
        by_leaf = dict(zip((id(t) for t in self.wrt), grads, strict=False))
        first: dict[int | tuple[str, int], int] = {}
        out: list[GradStorage | None] = []
        for i, leaf in enumerate(self.leaves):
            g = by_leaf.get(id(leaf)) if leaf.requires_grad else None
            if g is None:
                out.append(None)
                continue
            group = first.setdefault(storage_key(g), i)
            out.append(GradStorage(group, g.untyped_storage().nbytes(), g.numel() * g.element_size()))
        return tuple(out)


@contextmanager
def _left_as_found(model: nn.Module, device: torch.device) -> Iterator[None]:
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
            (``memtune.profiler.regions.region_partitions`` gives candidates). None: eager stages.

    Returns:
        A ``Profile`` with ``stages_from="modules"``: stage names are the modules' qualified names.

    Raises:
        ProfilerError: inputs on another device than the model, a stage that does not run exactly once per forward,
            a pattern matching nothing, a loss that is not a scalar, a ``gpu`` that is not this CUDA device, or a
            ``compile_budget`` outside 0..1 or whose one region is the whole model.
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
    loss = loss_fn or default_loss
    with _left_as_found(model, dev), ExitStack() as stack:
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
                    "memtune.tuner.runtime.whole.measure_module_points), or name smaller regions (stages=[...])"
                )
            eager_regions = edge_writes(model, names, inputs, loss_fn=loss, autocast=_autocast(dev, dtype))
            regions = stack.enter_context(CompiledRegions(modules, compile_budget, sorted(eager_regions), names))
            compile_seconds = _first_step_seconds(model, inputs, loss, dtype, dev)
        trace = trace_stages(
            model, names, inputs, loss_fn=loss, autocast=_autocast(dev, dtype), output_held=output_held
        )
        # a profile for a GPU made on the CPU keeps the roofline's times, not the CPU's: one untimed round of each
        # pass is all it needs of them (which stages run selective, what they keep, their transients)
        rounds = (warmup, repeats) if spec is None else (0, 1)
        timings: list[_Timing] = []
        for k, m in enumerate(modules):
            captured, autocast_dtype = _capture(model, m, inputs, _autocast(dev, dtype), dev, grad=regions is not None)
            run = _StageRun(
                m, captured, trace.input_grad[k], dtype, dev, autocast_dtype, gpu_workspaces, selective=regions is None
            )
            timings.append(run.time(*rounds))
            del captured, run
            if progress is not None:
                progress(names[k] or type(model).__name__, k + 1, len(modules))
        step_ms = _step_ms(model, inputs, loss, dtype, dev, *rounds)
        # a modeled profile keeps no clock reading (NOTE [ Modeled module profiles ])
        recompute_step_ms = None if spec else _recompute_step_ms(model, inputs, loss, dtype, dev, rounds, modules)
        if spec is not None:  # the GPU's roofline, not the CPU's clock (NOTE [ Modeled module profiles ])
            with regions.paused() if regions is not None else nullcontext():  # the eager operations' roofline
                counted = count_module_step(model, inputs, modules, trace.input_grad, loss, dtype)
            timings, step_ms = modeled_timings(timings, counted, spec, dtype)
        step_peak = _step_peak(model, inputs, loss, dtype, dev, output_held, gpu_workspaces)
        tail = _loss_backward_bytes(model, modules[-1], inputs, loss, dtype, dev, gpu_workspaces)
    _gradient_storages(trace, [t.input_grads for t in timings])
    table, remap, input_bytes = _table(trace)
    first_saver = [
        sum(s.bytes for s in table if s.saved_by and min(s.saved_by) == k and not s.outside) for k in range(len(names))
    ]
    if spec is None:
        measured = transfer_ms(first_saver, dev, warmup=warmup, repeats=repeats)
        copies = [measured.get(b, (0.0, 0.0)) for b in first_saver]
    else:
        copies = [(spec.transfer_ms(b, "d2h"), spec.transfer_ms(b, "h2d")) for b in first_saver]
    params, shared, outside_params = _stage_params(model, modules)
    staged_ms = sum(t.forward_ms + t.backward_ms for t in timings)
    scale = min(1.0, step_ms / staged_ms) if staged_ms > 0 else 1.0  # NOTE [ Time outside stages ]
    timings = [
        dataclasses.replace(t, forward_ms=t.forward_ms * scale, backward_ms=t.backward_ms * scale) for t in timings
    ]
    stage_profiles = tuple(
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
        for k, (m, t) in enumerate(zip(modules, timings, strict=True))
    )
    model_params: dict[str, int | float | str | bool] = {"stages": len(names)}
    if stages is not None:
        model_params["stage_patterns"] = ",".join(stages)
    if coarse:
        model_params["coarser"] = "; ".join(coarse)
    if eager_regions:  # NOTE [ In-place writes at region edges ]
        model_params["eager_regions"] = "; ".join(f"{names[k]}: {why}" for k, why in sorted(eager_regions.items()))
    return Profile(
        model=name or type(model).__name__,
        model_params=model_params,
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
        loss_ms=max(0.0, step_ms - staged_ms * scale),  # NOTE [ Time outside stages ]
        stages_from="modules",
        outside_param_bytes=outside_params,
        loss_saved_bytes=trace.loss_saved_bytes,
        loss_backward_bytes=tail,
        output_held_bytes=_held_bytes(trace, table, remap) if output_held else 0,
        step_peak=step_peak,
        recompute_step_ms=recompute_step_ms,
        compile_budget=compile_budget,
        compile_seconds=compile_seconds,
        eager_stages=tuple(sorted(eager_regions)),
    )


def _first_step_seconds(
    model: nn.Module, inputs: Inputs, loss_fn: Callable[[Any], torch.Tensor], dtype: str, dev: torch.device
) -> float:
    """Wall seconds of one step (forward, loss, backward; gradients dropped): with regions compiled, the first step
    compiles them (NOTE [ Profiles of compiled regions ])."""
    began = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    with _autocast(dev, dtype):
        out = call_model(model, inputs)
    grads = torch.autograd.grad(loss_fn(out), params, allow_unused=True)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    del grads, out
    return time.perf_counter() - began


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


def _step_ms(
    model: nn.Module,
    inputs: Inputs,
    loss_fn: Callable[[Any], torch.Tensor],
    dtype: str,
    dev: torch.device,
    warmup: int,
    repeats: int,
    recomputed: Sequence[nn.Module] = (),
) -> float:
    """Median ms of one whole step: forward, loss and backward (gradients dropped after each), unplanned or with
    every module of ``recomputed`` run under a non-reentrant checkpoint of its call."""
    timer = _Timer(dev)
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        with _autocast(dev, dtype):
            out = call_model(model, inputs)
        torch.autograd.grad(loss_fn(out), params, allow_unused=True)

    times = []
    with _checkpointed(recomputed):
        for k in range(warmup + repeats):
            _, ms = timer.run(step)
            if k >= warmup:
                times.append(ms)
    return statistics.median(times)


@contextmanager
def _checkpointed(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Each of ``modules`` called under a non-reentrant checkpoint of its own call while inside (its instance's
    ``forward`` replaced, then restored)."""
    own = [m.__dict__.get("forward") for m in modules]
    for m in modules:
        m.forward = functools.partial(_checkpointed_forward, m.forward, may_write_input(m))  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m, f in zip(modules, own, strict=True):
            if f is None:
                del m.forward
            else:
                m.forward = f  # type: ignore[method-assign]


def _checkpointed_forward(fn: Callable[..., Any], clone: bool, *args: Any, **kwargs: Any) -> Any:
    return checkpointed_call(fn, args, kwargs, clone=clone, selective=False)


def _recompute_step_ms(
    model: nn.Module,
    inputs: Inputs,
    loss_fn: Callable[[Any], torch.Tensor],
    dtype: str,
    dev: torch.device,
    rounds: tuple[int, int],
    modules: Sequence[nn.Module],
) -> float | None:
    """The whole step with every stage recomputed (NOTE [ Recompute priced as measured ] in
    ``memtune.tuner.simulator``),
    median ms; None where autograd refuses it or a stage's state cannot be copied."""
    try:
        return _step_ms(model, inputs, loss_fn, dtype, dev, *rounds, recomputed=modules)
    except (RuntimeError, ProfilerError):
        return None


def _step_peak(
    model: nn.Module,
    inputs: Inputs,
    loss_fn: Callable[[Any], torch.Tensor],
    dtype: str,
    dev: torch.device,
    output_held: bool,
    gpu_workspaces: bool = False,
) -> StepPeak:
    """The unplanned step's peak read off the allocator (NOTE [ Allocator meters ]): forward, loss and ``backward()``
    as a training loop runs them (gradients accumulated into ``.grad``, a tied weight's in place, NOTE [ Tied
    weights ]), the output held through the backward or dropped before it as ``output_held`` says. The parameters'
    ``.grad`` are restored after. ``gpu_workspaces``: on the CPU, read as the GPU would allocate it (NOTE [ GPU
    transients from the CPU's allocator ])."""
    params = [p for p in model.parameters() if p.requires_grad]
    kept = [p.grad for p in params]
    for p in params:
        p.grad = None
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # the reserved peak is this step's, not an earlier cache's
    try:
        with metered(dev, gpu_workspaces=gpu_workspaces) as reading:
            with _autocast(dev, dtype):
                out = call_model(model, inputs)
            loss = loss_fn(out)
            if not output_held:
                del out
            loss.backward()
            del loss
            out = None
            for p in params:
                p.grad = None
    finally:
        for p, g in zip(params, kept, strict=True):
            p.grad = g
    return StepPeak(
        allocated_bytes=reading.peak_bytes, reserved_bytes=reading.peak_reserved_bytes, output_held=output_held
    )


def _loss_backward_bytes(
    model: nn.Module,
    last: nn.Module,
    inputs: Inputs,
    loss_fn: Callable[[Any], torch.Tensor],
    dtype: str,
    dev: torch.device,
    gpu_workspaces: bool = False,
) -> int:
    """``Profile.loss_backward_bytes``: the peak of the backward from the loss to the last stage's output above what
    was live before it and that output's gradient, bytes, read off the allocator (NOTE [ Allocator meters ])."""
    got: list[torch.Tensor] = []

    def hook(_m: nn.Module, _a: Any, out: Any) -> None:
        got.extend(t for t in tensor_leaves(out) if t.requires_grad and t.is_floating_point())

    handle = last.register_forward_hook(hook)
    try:
        with _autocast(dev, dtype):
            out = call_model(model, inputs)
    finally:
        handle.remove()
    loss = loss_fn(out)
    if not got:
        return 0
    with metered(dev, gpu_workspaces=gpu_workspaces) as reading:
        grads = torch.autograd.grad(loss, got[:1], allow_unused=True)
    made = sum(g.untyped_storage().nbytes() for g in grads if g is not None)
    got.clear()
    del grads, loss, out
    return max(0, reading.peak_bytes - made)
