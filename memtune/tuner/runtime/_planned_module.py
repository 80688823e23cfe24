"""``PlannedModule``: any ``nn.Module`` run by its own forward, its stage modules' calls wrapped by a plan.

NOTE [ Module stages ] (``memtune.profiler.module_stages``) says why stages are the model's own submodules. Each stage
module's ``forward`` is wrapped once, when the planned model is made (NOTE [ Stage modules are wrapped once ]); while
this planned model's forward runs, the wrapper applies the stage's action (NOTE [ Plan semantics ] in
``memtune.tuner.plan``):

* ``keep``: the stage runs as usual;
* ``offload``: it runs under the offload hooks of NOTE [ Offload runtime ] (``memtune.tuner.runtime.offload``): what it
  saves goes to pinned host memory on a side stream, whole storages, so strides are kept;
* ``recompute``: it runs under a non-reentrant ``torch.utils.checkpoint`` of its own call, arguments and keyword
  arguments included, which keeps its inputs and re-runs it in backward with the random state of its first run
  (NOTE [ Random state under recompute ] in ``memtune.tuner.runtime._rng``); buffers are restored after the re-run
  (NOTE [ Buffers during recompute ] in ``memtune.tuner.runtime._segments``) and a stage that declares it writes its
  input in place runs on a clone of it (NOTE [ In-place at segment boundaries ]);
* ``selective``: the same checkpoint under PyTorch's selective checkpointing (NOTE [ Selective stages ]).

A recompute or selective stage given state the model threads through its stages (a Hugging Face cache, which the
stage updates) re-runs on a structure copy of that state as it was before its first run, so the re-run's updates
go to a throwaway copy and it computes what the first run computed (NOTE [ State threaded between stages ] in
``memtune.profiler.module_stages``); state that cannot be copied is refused with ``PlanError``.

The model's code between stages runs untouched. Outputs may be tensors, tuples, dicts or ``ModelOutput``s.

A plan whose module stages run compiled (``Plan.compile_budget`` set: the stages are regions, NOTE [ Regions ] in
``memtune.profiler.region_tree``) is applied the same way around each region's compiled call: the stage's wrapper runs
the region compiled under the plan's activation budget (eager for ``Plan.eager_stages``), with the stage's action
around it. Each region compiles once, on its first planned call.

NOTE [ Stage modules are wrapped once ]
A planned model wraps each of its stage modules once, when it is made, the way regions are wrapped (NOTE [ Regions are
wrapped once ] in ``memtune.profiler.region_tree``, whose ``RegionForward`` is the wrapper, eager stages and compiled
regions alike): the module's ``forward`` becomes an instance attribute set once and never re-patched per call, which
applies the stage's action while this planned model steps (``in_step``: its forward is running) and otherwise calls the
module's own forward. Replacing ``forward`` on the instance around each planned forward, and putting the previous one
back after, is not re-entrant (a planned forward run inside another over the same modules wraps the outer step's
wrapper in a second one, so a stage runs under both plans' actions) and fights anything else that sets ``forward`` (a
user's wrapper, accelerate's hooks, a distributed wrapper): one set during a step is thrown away when the step puts
the attribute back, and one that keeps what it found during a step later restores the wrapper of a step long over.
Wrapped once, a wrapper installed later wraps memtune's and runs outside the stage's action, as module hooks do
(``nn.Module.__call__`` runs them around ``forward``); one installed before is the module's own forward, which the
action wraps; two planned models of one model share the wrapper, which applies the plan of the one stepping. The model
called directly runs as written; ``state_dict`` keys and module names are unchanged (no module is inserted); a deep
copy or a pickle of the model gets wrappers of its own that run eagerly (the planned model belongs to the original).
``PlannedModule.release`` gives the modules their own ``forward`` back (once no other planned model runs them); a
released planned model refuses to train. A wrapper that replaces memtune's without calling it takes its stage out of
the plan; compiling the whole model while a planned model is live traces through the wrappers: release it first.

NOTE [ Regions compile at their first call ]
A planned model of compiled regions compiles each region (dynamo's trace, the partitioner, inductor) at its first
planned call, and inductor tunes its kernels when they first run: the autotuner times each candidate configuration
on the real arguments, allocating on the GPU what no plan accounts for (copies of arguments it mutates, and a buffer
of the GPU's L2 size, 50 MiB on an H100, that it writes to flush the cache between timings;
``torch._inductor.runtime.benchmarking``). Under ``budget_guard``'s cap that first step can run out of memory where
the plan fits. So run one step before the cap (``memtune bench``'s warm-up steps and the compiled-region benchmark do),
then cap the steps that follow: a region compiles once (NOTE [ Regions are wrapped once ]), and later steps allocate
only what the plan does. Memory held before the cap counts against it too (the cap is on everything the process's
caching allocator reserves; cuBLAS keeps its workspace there once a matrix product ran).

NOTE [ Sharded parameters ]
Under FSDP2 (``torch.distributed.fsdp.fully_shard`` on the stage modules and the root) a parameter outside its
module's forward is a ``DTensor`` shard, and the module's pre-forward hook, which runs before the stage's wrapper,
gathers the whole parameter into a plain tensor of its own storage and registers it on the module for that call.
The offload runtime must leave parameters on the device (it would copy weights to the host and back each step, and
FSDP2 frees the gathered storage after the forward and gathers it again for the backward), so a stage's
parameters are taken as the stage runs them, gathered ones included, and added to what the pack hook passes
through, in a step whose forward began with sharded parameters; otherwise the model's own parameters, taken when its
forward began, are all there are. A recompute re-runs the stage inside the backward, after FSDP2's pre-backward hook
has gathered its parameters again, so it reads the same values. FSDP2 averages gradients over the ranks; a plan
changes none of them (``tests/unit/runtime/test_fsdp_plans.py``, gloo on CPU).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from memtune.profiler import ProfilerError
from memtune.profiler.chain import may_write_input
from memtune.profiler.module_stages import checkpointed_call, tensor_leaves
from memtune.profiler.region_layout import regions_channels_last
from memtune.profiler.region_tree import RegionForward, install_region
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Action, Plan, PlanKind
from memtune.tuner.runtime._buffers import buffers_kept
from memtune.tuner.runtime._module_tensors import ModuleTensors
from memtune.tuner.runtime._planned_base import PlannedBase
from memtune.tuner.runtime._rng import RandomState
from memtune.tuner.runtime.offload import StepState, resident_storage_ptrs

__all__ = ["PlannedModule"]


def _module_named(model: nn.Module, name: str) -> nn.Module:
    if not name:
        return model
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise PlanError(
            f"plan stage {name!r} is not a submodule of {type(model).__name__}; a plan applies to the model it was "
            "tuned for (memtune.profile / memtune.tune)"
        ) from None


def _on_backward(out: Any, call: Callable[[], None]) -> None:
    """Call ``call`` when the backward reaches the first tensor of ``out`` that has a gradient function."""
    first = next((t for t in tensor_leaves(out) if t.grad_fn is not None), None)
    if first is not None and first.grad_fn is not None:
        first.grad_fn.register_prehook(lambda _grads: call())  # type: ignore[misc]


class PlannedModule(PlannedBase):
    """A module whose training steps follow a plan made for its module stages (see the module docstring).

    Shares the wrapped model's parameters and buffers (``self.model``). Without grad it runs the model plainly.

    Args:
        model: the model the plan was tuned for.
        plan: a plan whose ``stages`` name the stage modules (``memtune.tune`` makes such plans).
        clone_stage_inputs: clone a recompute or selective stage's tensor arguments inside its checkpoint; None:
            where the stage module declares it writes its input in place (``inplace=True``).
        pool_bytes: host bytes to reserve up front for offloaded storages (0: grow in the first step).

    Raises:
        PlanError: the plan names no stages, a name that is not a submodule, or sync points outside the stages.
    """

    def __init__(
        self, model: nn.Module, plan: Plan, *, clone_stage_inputs: bool | None = None, pool_bytes: int = 0
    ) -> None:
        if plan.stages is None:
            raise PlanError(
                f"plan {plan.label or ''!r} names no stages; plans for a model's module stages come from "
                "memtune.tune (or tune a chain and plan that)"
            )
        modules = [_module_named(model, n) for n in plan.stages]
        if "" in plan.stages and len(plan.stages) > 1:
            raise PlanError("plan stage '' (the whole model) cannot sit beside other stages")
        bad = [p for p in plan.sync_points if not 0 <= p < len(modules)]
        if bad:
            raise PlanError(f"sync_points {bad} are outside the stage range 0..{len(modules) - 1}")
        super().__init__(model, plan, plan.stages, pool_bytes=pool_bytes)
        self._stages = modules
        #: the model's and each stage's tensors, the module tree walked once (NOTE [ Module tensors read from the
        #: modules' tables ])
        self._tensors = ModuleTensors(model)
        self._stage_tensors = [ModuleTensors(m) for m in modules]
        self._clone = [may_write_input(m) if clone_stage_inputs is None else clone_stage_inputs for m in modules]
        self._step_now: StepState | None = None
        #: whether the model's parameters were sharded (FSDP2's ``DTensor``) when this step's forward began
        self._sharded = False
        #: each stage module's wrapper, installed once (NOTE [ Stage modules are wrapped once ]); empty once released
        self._forwards: list[RegionForward] = []
        #: per wrapper (by id): its stage index and the call that runs the stage (eager, or the compiled region)
        self._calls: dict[int, tuple[int, Callable[..., Any]]] = {}
        #: inputs and outputs of the compiled regions run so far in this forward, with their versions (weakly held)
        self._edges: list[tuple[int, weakref.ref[torch.Tensor], int]] = []
        if plan.kind is PlanKind.COMPILED_REGIONS and plan.stages == ("",):
            raise PlanError(
                "a compiled plan whose one stage is the whole model is a whole-model compile: use whole_compile "
                "(NOTE [ Whole-model compile ])"
            )
        self._wrap_stages()

    def _wrap_stages(self) -> None:
        """Install each stage module's wrapper (or join the one there) and attach this planned model to it (NOTE [
        Stage modules are wrapped once ]); a compiled plan's regions get their compiled callables, made once per
        budget and save rule (NOTE [ Regions are wrapped once ] in ``memtune.profiler.region_tree``)."""
        budget = self.plan.compile_budget
        # the layout the regions were profiled in (NOTE [ Regions in the whole model's layout ])
        channels_last = budget is not None and regions_channels_last(self._stages)
        for k, m in enumerate(self._stages):
            wrapper = install_region(m)
            call = (
                wrapper.eager
                if budget is None or k in self.plan.eager_stages
                else wrapper.compiled(budget, self.plan.compile_saves, channels_last)
            )
            wrapper.attach(self)
            self._forwards.append(wrapper)
            self._calls[id(wrapper)] = (k, call)

    @property
    def in_step(self) -> bool:
        """Whether a planned forward is running now (its stage modules' wrappers then apply the plan: NOTE [ Stage
        modules are wrapped once ])."""
        return self._step_now is not None

    def run_region(self, region: RegionForward, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Stage module ``region`` called inside a planned forward: its call (eager, or its region compiled) under its
        action.

        Raises:
            PlanError: a compiled region's input or output was written in place (NOTE [ In-place writes at region
                edges ]): the plan was not made from a profile of this model's regions, which runs such a region eager.
        """
        k, call = self._calls[id(region)]
        assert self._step_now is not None
        compiled = self.plan.kind is PlanKind.COMPILED_REGIONS and k not in self.plan.eager_stages
        self._check_edges(f"before region {k} ({self.stage_names[k]})")
        leaves = [t for t in tensor_leaves((args, kwargs))] if compiled else []
        versions = [t._version for t in leaves]
        out = self._stage(k, call, self._step_now)(*args, **kwargs)
        if compiled:
            if any(t._version != v for t, v in zip(leaves, versions, strict=True)):
                raise self._edge_error(k, "writes its input in place")
            self._edges.extend((k, weakref.ref(t), t._version) for t in (*leaves, *tensor_leaves(out)))
        return out

    def _check_edges(self, where: str) -> None:
        """Raise ``PlanError`` where a compiled region's input or output still alive was written in place since."""
        for k, ref, version in self._edges:
            t = ref()
            if t is not None and t._version != version:
                self._edges.clear()
                raise self._edge_error(k, f"has its input or output written in place after it returned ({where})")

    def _edge_error(self, k: int, what: str) -> PlanError:
        return PlanError(
            f"region {k} ({self.stage_names[k]}) runs compiled but {what}: its compiled backward may read the "
            "written tensor (NOTE [ In-place writes at region edges ]). Plan the model from a profile of its regions "
            "(memtune.tune(..., compile=True) runs such a region eager: Plan.eager_stages), or keep it eager by "
            "adding it to eager_stages"
        )

    def release(self) -> None:
        """Give the stage modules their own ``forward`` back (where no other planned model runs them): the model then
        runs as written, and this planned model no longer applies its plan and refuses to train (NOTE [ Stage modules
        are wrapped once ])."""
        for wrapper in self._forwards:
            wrapper.detach(self)
        self._forwards.clear()
        self._calls.clear()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.model(*args, **kwargs)
        tensors = [*self._tensors.parameters(), *self._tensors.buffers()]
        # NOTE [ Sharded parameters ]: only a sharded model gathers parameters a stage's call alone shows
        self._sharded = any(isinstance(t, DTensor) for t in tensors)
        device = tensors[0].device if tensors else torch.device("cpu")
        exclude = resident_storage_ptrs([*tensors, *tensor_leaves((args, kwargs))])  # the inputs: always resident
        if not self._forwards:
            raise PlanError("this planned model was released (release()); plan the model again to train with it")
        step = self._begin_step(device, exclude)
        try:
            self._step_now = step  # the stages' wrappers apply the plan now (NOTE [ Stage modules are wrapped once ])
            self._edges.clear()
            out = self.model(*args, **kwargs)
            self._check_edges("by the end of the forward")
            self._edges.clear()
            return out
        except torch.OutOfMemoryError as exc:
            raise self._oom(exc, "forward", step.forward_stage) from exc
        finally:
            self._step_now = None
            step.end_forward()

    def _stage(self, k: int, fn: Callable[..., Any], step: StepState) -> Callable[..., Any]:
        action = self.plan.actions[k]
        checkpointed = action is Action.RECOMPUTE or action is Action.SELECTIVE
        if Action.OFFLOAD not in self.plan.actions:  # nothing to copy, wait for or prefetch: the call alone

            def plain(*args: Any, **kwargs: Any) -> Any:
                step.forward_stage = k
                if checkpointed:
                    out = self._checkpointed(k, fn, args, kwargs, selective=action is Action.SELECTIVE)
                else:
                    out = fn(*args, **kwargs)
                _on_backward(out, lambda: setattr(step, "backward_stage", k))  # where an out-of-memory happened
                return out

            return plain

        def run(*args: Any, **kwargs: Any) -> Any:
            step.forward_stage = k
            offloading = action is Action.OFFLOAD
            if self._sharded:  # NOTE [ Sharded parameters ]: the parameters as the stage runs them, gathered ones
                step.exclude_ptrs.update(resident_storage_ptrs(self._stage_tensors[k].parameters()))
            with step.hooks(k, k) if offloading else contextlib.nullcontext():
                if checkpointed:
                    out = self._checkpointed(k, fn, args, kwargs, selective=action is Action.SELECTIVE)
                else:
                    out = fn(*args, **kwargs)
            step.end_stage(k, offloading=offloading)
            # backward reaching the stage's output: prefetch what stages up to ``lookahead`` later need
            _on_backward(out, lambda: step.on_backward(k))
            return out

        return run

    def _checkpointed(
        self, k: int, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, selective: bool
    ) -> Any:
        """Stage ``k`` under a non-reentrant checkpoint of its own call; its re-run replays the random state of
        every device it touches (NOTE [ Random state under recompute ]) and runs on a structure copy of the state
        the first run was given (NOTE [ State threaded between stages ]).

        Raises:
            PlanError: the stage is given state that cannot be copied, or it writes an input in place undeclared.
        """
        own = self._stage_tensors[k]
        clone = self._clone[k]
        inputs = list(tensor_leaves((args, kwargs)))
        rng = RandomState.capture([*inputs, *own.parameters(), *own.buffers()])

        def rerun(call: Callable[[], Any]) -> Any:
            with buffers_kept(own.buffers()), rng.replayed():  # NOTE [ Buffers during recompute ]
                return call()

        versions = [t._version for t in inputs]
        try:  # NOTE [ State threaded between stages ]: the re-run gets a copy of the state as the first run got it
            out = checkpointed_call(fn, args, kwargs, clone=clone, selective=selective, rerun=rerun)
        except ProfilerError as exc:
            raise PlanError(
                f"stage {k} ({self.stage_names[k]}) is given state that its re-run in backward must see as the first "
                f"run saw it, and {exc} (NOTE [ State threaded between stages ]); turn that state off "
                "(use_cache=False in a Hugging Face model's config) or keep or offload this stage"
            ) from exc
        if not clone and any(t._version != v for t, v in zip(inputs, versions, strict=True)):
            raise PlanError(
                f"stage {k} ({self.stage_names[k]}) modified an input in place under a checkpoint, which corrupts "
                "what the re-run reads (NOTE [ In-place at segment boundaries ]); pass clone_stage_inputs=True to "
                "planned() or keep this stage"
            )
        return out
