"""One stage of a module profile run alone (``memtune.profiler.module_profile.profile_module``): the arguments the
model really gives it, captured from one step (``_capture``), and ``_StageRun``, which times its forward and backward
(ms, medians) eager, selective and recomputed and reads their transients and the gradients' storages (bytes) off the
allocator.

NOTE [ Incoming gradients as the chain makes them ]
A stage's backward is measured alone, its output's gradient made inside the backward (``_StageRun._transients``) or
given (``_StageRun._medians``). In a step that gradient is what the next stage's backward made for its input, in the
layout that backward chose, and a backward given another layout than it expects may copy it first. So
``profile_module`` measures the stages last to first and gives each the gradient in the layout its consumer's measured
backward made (``GradStorage.shape`` and ``stride``; the consumer that runs backward first, for a tensor several stages
read). On the CPU a stage that makes its incoming gradient contiguous is then measured with the copy a transposing
consumer causes (``tests/unit/profiler/test_incoming_layout.py``). For compiled regions on CUDA the layout alone does
not reproduce the step: ResNet-50's ``layer1.2`` compiled at budget 1, given the channels-last gradient ``layer2.0``'s
compiled backward makes, held 498 MiB alone and 890 MiB in the step (H100, torch 2.11), so their backward is also read
where it runs (NOTE [ Region backward measured in the chain ] in ``memtune.profiler._region_chain``).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from memtune.profiler._storages import storage_key
from memtune.profiler.chain import may_write_input
from memtune.profiler.measure import _autocast, _Timer
from memtune.profiler.memory_meter import metered
from memtune.profiler.module_stages import Inputs, call_model, checkpointed_call, copy_structure, tensor_leaves
from memtune.profiler.profiler_errors import ProfilerError
from memtune.profiler.selective import KeptOutputs

# the pieces ``profile_module`` measures a stage with; private to the profiler
__all__ = ["GradStorage", "_StageRun", "_Timing", "_capture"]


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
    (NOTE [ State threaded between stages ] in ``memtune.profiler.module_stages``); and the autocast dtype on ``device``
    at that call, None where autocast was off there.

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
        shape / stride: the gradient's size and strides, in elements: the layout a producer of this input is given
            its output's gradient in (NOTE [ Incoming gradients as the chain makes them ]).
    """

    group: int
    storage_bytes: int
    tensor_bytes: int
    shape: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()


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
        out_layout: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
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
        #: (shape, strides) of the gradient the chain gives the first output (NOTE [ Incoming gradients as the chain
        #: makes them ]); None: laid out as the output
        self.out_layout = out_layout

    def incoming(self, outs: list[torch.Tensor], fill: float | None) -> list[torch.Tensor]:
        """What the outputs' gradients are made from: per output, a tensor in the layout the chain gives it (the
        first output, where ``out_layout`` differs from its own), filled with ``fill`` (None: normal noise); else a
        0-dimensional ``fill`` (a product with it makes the gradient laid out as the output) or noise laid out as
        the output."""
        made: list[torch.Tensor] = []
        for i, t in enumerate(outs):
            layout = self.out_layout if i == 0 else None
            if layout is not None and layout[0] == tuple(t.shape) and layout[1] != t.stride():
                g = torch.empty_strided(t.shape, layout[1], dtype=t.dtype, device=t.device)
                made.append(g.normal_() if fill is None else g.fill_(fill))
            else:
                made.append(
                    torch.randn_like(t) if fill is None else torch.full((), fill, dtype=t.dtype, device=t.device)
                )
        return made

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
            grads = self.incoming(outs, None)
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
        # the inputs are made before the meter starts: in a step they are live before the stage runs, and the
        # simulator counts them there (made inside, a stage that does not save its input showed them as transient)
        inputs = self.fresh()
        with metered(self.device, gpu_workspaces=self.gpu_workspaces) as fwd:
            outs = self.forward(inputs, mode=mode)
        fwd_ws = max(0, fwd.peak_bytes - max(0, fwd.end_bytes))
        if not (outs and self.wrt):
            return fwd_ws, 0
        # the outputs' gradients made inside the backward, in the chain's layout (a ones tensor so laid out lives
        # from before to after it, so the peak above ``before`` does not count it)
        ones = self.incoming(outs, 1.0)
        total = torch.stack([(t * w).sum().float() for t, w in zip(outs, ones, strict=True)]).sum()
        # in a step nothing else holds the outputs through the backward: one that only the stage saves (an in-place
        # ReLU's) is freed by its first backward node (NOTE [ Gradient storages ])
        del outs
        # ``inputs`` and ``ones`` were made outside every meter and are held past it: freed inside, the CPU meter
        # would read them at whatever size its table last held for their addresses (NOTE [ Allocator meters ])
        with metered(self.device, gpu_workspaces=self.gpu_workspaces) as bwd:
            grads = torch.autograd.grad(total, self.wrt, allow_unused=True)
        # the gradients' own bytes, as the simulator makes them; the rest of a storage they are views of is the
        # backward's transient (NOTE [ Gradient storages ])
        made = sum(g.numel() * g.element_size() for g in grads if g is not None)
        if mode == "plain":
            self.input_grads = self._grad_storages(grads)
        del grads, total, ones, inputs
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
            nbytes = g.numel() * g.element_size()
            out.append(GradStorage(group, g.untyped_storage().nbytes(), nbytes, tuple(g.shape), g.stride()))
        return tuple(out)
