"""``planned(model, plan)``: run a chain stage by stage with a memory plan applied.

Two lines in a training loop::

    plan = load_plan("plan.json")
    model = planned(model, plan)      # same parameters, no copy
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step(); opt.zero_grad()

Each stage runs as NOTE [ Plan semantics ] (``memtune.tuner.plan``) says: ``keep`` stages run as usual,
``offload`` stages run under the offload hooks of NOTE [ Offload runtime ] (``memtune.tuner.runtime.offload``),
each maximal run of ``recompute`` stages is one non-reentrant checkpoint
(``memtune.tuner.runtime._segments``), called under the offload hooks when the stage before it is ``offload``
so that its input is offloaded too (or, where the plan splits it, ``spatial_splits``, one autograd Function
run strip by strip along H: ``memtune.tuner.runtime._spatial_strips``), and a ``selective`` stage is a one-stage
checkpoint under PyTorch's selective checkpointing (NOTE [ Selective stages ] in ``memtune.profiler.selective``). The
plan never changes the math: loss, gradients and buffers are those of the unplanned model (tests check it for every zoo
model and policy).

Convolution algorithm choices (``conv_rule``, ``conv_algos``) are applied by
``memtune.tuner.runtime.conv.apply_conv_choices(model, plan, profile)``, which needs the profile's algorithm
tables; ``planned`` alone leaves convolutions to the framework and warns when the plan asks for more.
Stage modules are looked up in the chain at every forward, so convolutions swapped in by that context
manager run, and one ``PlannedChain`` (with its host pool) serves every step.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from torch import nn

from memtune.profiler import ModelChain
from memtune.profiler.chain import flatten
from memtune.profiler.compiled import CompiledStage
from memtune.profiler.region_layout import regions_channels_last
from memtune.tuner._spatial import parse_segment_key
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Action, Plan, PlanKind, segments
from memtune.tuner.runtime._planned_base import PlannedBase
from memtune.tuner.runtime._segments import Segment
from memtune.tuner.runtime._spatial_strips import SpatialSegment
from memtune.tuner.runtime.conv import ChosenConv2d
from memtune.tuner.runtime.offload import resident_storage_ptrs

__all__ = ["CompiledWhole", "PlannedBase", "PlannedChain", "load_plan", "planned"]


def load_plan(source: Plan | Mapping[str, Any] | str | Path) -> Plan:
    """Read a plan from a file path, a JSON string, a dict, or ``tune --json`` output.

    Args:
        source: a ``Plan``; a path to a JSON file; JSON text; or a mapping. A ``tune --json`` object
            (``{"best": {"plan": {...}}}``) or a candidate (``{"plan": {...}}``) gives its plan.

    Raises:
        PlanError: the file is missing, the JSON is invalid, or it is not a plan (names the field).
    """
    if isinstance(source, Plan):
        return source
    data: Any
    if isinstance(source, Mapping):
        data = source
    else:
        text = str(source)
        if not text.lstrip().startswith(("{", "[")):
            path = Path(text)
            if not path.is_file():
                raise PlanError(f"plan file {str(path)!r} does not exist; pass a path, JSON text or a dict")
            text = path.read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"plan is not valid JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise PlanError(f"a plan is a JSON object, got {type(data).__name__}")
    if "actions" not in data:
        best = data.get("best")
        if isinstance(best, Mapping) and isinstance(best.get("plan"), Mapping):
            data = best["plan"]
        elif isinstance(data.get("plan"), Mapping):
            data = data["plan"]
        elif "best" in data and best is None:
            raise PlanError("this tune result has no feasible plan ('best' is null); tune with a larger budget")
    try:
        return Plan.model_validate(dict(data))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "plan"
        raise PlanError(f"plan field {field!r}: {first['msg']}") from exc


def _stages_of(model: ModelChain | nn.Module) -> tuple[nn.Module, list[str], list[nn.Module]]:
    if isinstance(model, ModelChain):
        return model.as_sequential(), [s.name for s in model.stages], [s.module for s in model.stages]
    if isinstance(model, PlannedChain):
        raise PlanError("this model is already planned; pass the original model (PlannedChain.model)")
    if not isinstance(model, nn.Module):
        raise PlanError(f"planned() takes a ModelChain or an nn.Module, got {type(model).__name__}")
    stages = flatten(model)
    return model, [s.name for s in stages], [s.module for s in stages]


class PlannedChain(PlannedBase):
    """An ``nn.Module`` that runs a chain stage by stage with a plan applied (see module docstring).

    Shares the wrapped model's parameters and buffers (``self.model``); ``train()``/``eval()``, ``to()``
    and optimizers work as usual. Without grad (``torch.no_grad()``) it runs the chain plainly.

    Args:
        model: the chain, or an ``nn.Sequential`` (flattened into stages like ``memtune.profiler.chain``).
        plan: one action per stage.
        clone_segment_inputs: NOTE [ In-place at segment boundaries ]; None decides per segment.
        pool_bytes: host bytes to reserve up front for offloaded storages (0: grow in the first step).
    """

    def __init__(
        self,
        model: ModelChain | nn.Module,
        plan: Plan,
        *,
        clone_segment_inputs: bool | None = None,
        pool_bytes: int = 0,
    ) -> None:
        module, names, modules = _stages_of(model)
        super().__init__(module, plan, names, pool_bytes=pool_bytes)
        if len(plan.actions) != len(modules):
            raise PlanError(
                f"plan {plan.label or ''!r} has {len(plan.actions)} actions but the model has "
                f"{len(modules)} stages (nested nn.Sequential flattened); a plan is made for one chain. For a model "
                "that is not a plain nn.Sequential, profile and tune it with memtune.profile/memtune.tune: their plans "
                "name its module stages"
            )
        bad = [p for p in plan.sync_points if not 0 <= p < len(modules)]
        if bad:
            raise PlanError(f"sync_points {bad} are outside the stage range 0..{len(modules) - 1}")
        swapped = any(isinstance(sub, ChosenConv2d) for m in modules for sub in m.modules())
        if (plan.conv_rule != "default" or plan.conv_algos) and not swapped:
            warnings.warn(
                f"plan {plan.label!r}: conv_rule {plan.conv_rule!r}/conv_algos are not applied by planned() "
                "alone; run steps inside memtune.tuner.runtime.conv.apply_conv_choices(model, plan, profile) to use "
                "the plan's algorithms, else convolutions use the framework's own choice",
                stacklevel=3,
            )
        self._chain = model if isinstance(model, ModelChain) else None
        self._compiled: dict[int, CompiledStage] = {}  # by stage index; not submodules (the parameters are model's)
        # the forward as a program: ("stage", k, k) or ("segment", i, j)
        segs: dict[int, Segment | SpatialSegment] = {
            i: Segment(i, j, modules, names, clone_segment_inputs) for i, j in segments(plan.actions)
        }
        for key, strips in plan.spatial_splits.items():  # NOTE [ Spatial splitting ] (memtune.tuner._spatial)
            i, j = parse_segment_key(key)
            segs[i] = SpatialSegment(i, j, modules, names, strips)
        for k, a in enumerate(plan.actions):  # NOTE [ Selective stages ] (memtune.profiler.selective)
            if a is Action.SELECTIVE:
                segs[k] = Segment(k, k, modules, names, clone_segment_inputs, selective=True)
        self._segments = segs
        self._program: list[tuple[str, int, int]] = []
        k = 0
        while k < len(modules):
            if k in segs:
                self._program.append(("selective" if segs[k].selective else "segment", k, segs[k].last))
                k = segs[k].last + 1
            else:
                self._program.append(("stage", k, k))
                k += 1

    def stage_modules(self) -> list[nn.Module]:
        """The stage modules as the chain holds them now (a context manager may have swapped some); compiled by
        ``torch.compile`` under the plan's activation budget when it has one (NOTE [ Compiled stages ])."""
        if self._chain is not None:
            modules = [s.module for s in self._chain.stages]
        else:
            modules = [s.module for s in flatten(self.model)]
        if len(modules) != len(self.stage_names):
            raise PlanError(
                f"the model now has {len(modules)} stages but had {len(self.stage_names)} when planned; plan it again"
            )
        budget = self.plan.compile_budget
        if budget is None:
            return modules
        compiled = [self._compiled.get(k) for k in range(len(modules))]
        if any(c is None or c.inner is not m for m, c in zip(modules, compiled, strict=True)):
            # compiled once per module; a swapped module compiles anew, the layout decided again
            layout = regions_channels_last(modules)  # as compiled_chain profiled them
            for k, (m, c) in enumerate(zip(modules, compiled, strict=True)):
                if c is None or c.inner is not m or c.channels_last != layout:
                    self._compiled[k] = CompiledStage(m, budget, self.plan.compile_saves, layout)
        return [self._compiled[k] for k in range(len(modules))]

    # ---- forward ---------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        modules = self.stage_modules()
        if not torch.is_grad_enabled():
            for m in modules:
                x = m(x)
            return x
        exclude = resident_storage_ptrs((*self.model.parameters(), *self.model.buffers()))
        exclude.add(x.untyped_storage().data_ptr())  # the model input is always resident
        step = self._begin_step(x.device, exclude)
        actions = self.plan.actions

        def mark(k: int, y: torch.Tensor) -> None:
            node = y.grad_fn if isinstance(y, torch.Tensor) else None
            if node is not None:
                node.register_prehook(lambda _grads, k=k: step.on_backward(k))  # type: ignore[misc]

        def started(k: int) -> None:
            step.forward_stage = k

        try:
            for kind, i, j in self._program:
                step.forward_stage = i
                if kind == "segment":  # the segment input x_{i-1} follows stage i-1's action
                    offloading = i > 0 and actions[i - 1] is Action.OFFLOAD
                else:  # a selective stage holds its input and what it keeps on the GPU
                    offloading = actions[i] is Action.OFFLOAD
                # what is packed here is first needed by the backward of stage j
                with step.hooks(i, j) if offloading else contextlib.nullcontext():
                    if kind != "stage":
                        x = self._segments[i](x, modules, mark, started)
                    else:
                        x = modules[i](x)
                        mark(i, x)
                for k in range(i, j + 1):
                    step.forward_stage = k
                    step.end_stage(k, offloading=offloading and k == i)
        except torch.OutOfMemoryError as exc:
            del x
            raise self._oom(exc, "forward", step.forward_stage) from exc
        finally:
            step.end_forward()
        return x


class CompiledWhole(PlannedBase):
    """The whole model compiled by ``torch.compile`` under the plan's activation budget (NOTE [ Whole-model
    compile ] in ``memtune.tuner._whole``): the compiler decides what the backward recomputes; nothing is offloaded.

    Args:
        model: a ``ModelChain`` (run as its ``nn.Sequential``) or any ``nn.Module``, called with what it takes.
        plan: a plan with ``whole_compile`` set.

    Raises:
        PlanError: the plan does not compile the whole model, or its stage count differs from the chain's.
    """

    def __init__(self, model: ModelChain | nn.Module, plan: Plan) -> None:
        if plan.whole_compile is None:
            raise PlanError("CompiledWhole runs plans with whole_compile set; planned() runs the others")
        if isinstance(model, ModelChain) or plan.stages is None:
            module, names, _ = _stages_of(model)
            if len(names) != len(plan.actions):
                raise PlanError(
                    f"plan {plan.label or ''!r} has {len(plan.actions)} actions but the model has {len(names)} "
                    "stages; a plan is made for one model"
                )
        else:
            module, names = model, list(plan.stages)
        super().__init__(module, plan, names)
        # not a submodule: the parameters are the model's, listed once (state_dict, optimizers)
        object.__setattr__(self, "_compiled", CompiledStage(module, plan.whole_compile))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        compiled: CompiledStage = self.__dict__["_compiled"]
        return compiled(*args, **kwargs)


def planned(
    model: ModelChain | nn.Module,
    plan: Plan | Mapping[str, Any] | str | Path,
    *,
    clone_segment_inputs: bool | None = None,
    pool_bytes: int = 0,
) -> PlannedBase:
    """Wrap ``model`` so that every training step follows ``plan``.

    Args:
        model: a ``ModelChain`` or an ``nn.Module``: with a plan that names module stages (``Plan.stages``, made by
            ``memtune.tune``) any module (``memtune.tuner.runtime._planned_module.PlannedModule``), else a chain (nested
            plain ``nn.Sequential`` are flattened into stages).
        plan: a ``Plan`` or anything ``load_plan`` reads.
        clone_segment_inputs: see NOTE [ In-place at segment boundaries ]; None decides per segment.
        pool_bytes: host bytes to reserve for offloaded storages up front (0: grow during step one).

    Returns:
        A ``CompiledWhole`` (a plan that compiles the whole model), ``PlannedModule`` or ``PlannedChain``,
        sharing ``model``'s parameters.

    Raises:
        PlanError: the plan's length or sync points do not match the model's stages.

    Example::

        model = planned(model, load_plan("plan.json"))
    """
    the_plan = load_plan(plan)
    if the_plan.kind is PlanKind.WHOLE_COMPILE:  # NOTE [ Whole-model compile ] (memtune.tuner._whole)
        return CompiledWhole(model, the_plan)
    if the_plan.stages is not None:  # NOTE [ Module stages ] (memtune.profiler.module_stages)
        from memtune.tuner.runtime._planned_module import PlannedModule

        if isinstance(model, ModelChain):
            raise PlanError("this plan names module stages; apply it to the nn.Module it was tuned for")
        return PlannedModule(model, the_plan, clone_stage_inputs=clone_segment_inputs, pool_bytes=pool_bytes)
    return PlannedChain(model, the_plan, clone_segment_inputs=clone_segment_inputs, pool_bytes=pool_bytes)
