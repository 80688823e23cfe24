"""Regions: module stages compiled as one by ``torch.compile``, each a module of the model's own tree.

# NOTE [ Regions ]
The compiler's gain lies in fusions across layers, so a compiled stage should be large; memtune's default stages
(NOTE [ Module stages ] in ``memtune.profiler.module_stages``) are small (ResNet's stem is four of them). Compiled one
by one on an H100, torchvision's ResNet-50 stepped in 62.9 ms against 45.8 for the whole model compiled, and
EfficientNet-B0 failed (an in-place SiLU stage overwrote a compiled stage's output that the compiled backward had
saved).

A *region* is a module of the model's tree whose one call covers a run of consecutive stages (ResNet's ``layer1``,
BERT's ``bert.encoder``, EfficientNet's ``features.3``), or one stage. Compiling the region module compiles its
``forward`` with every stage below it inlined, so the fusions inside it are kept; between regions the model's own
code runs eagerly, as it does between stages. A region partition of a model is therefore a coarser list of module
stages, and everything the module-stage machinery does applies unchanged: the profiler measures the regions as stages
(``memtune.profiler.module_profile.profile_module(..., compile_budget=b)``, each region compiled under
``budget_backend(b)``), the simulator and the search price and choose keep, offload and recompute per region, and the
runtime (``memtune.tuner.runtime._planned_module.PlannedModule``) applies them around the compiled region: recompute is
a non-reentrant checkpoint around the compiled call, offload the saved-tensor hooks around it (they fire for the tensors
a compiled graph saves, and the offload runtime keeps strides, which the compiled backward asserts). Selective
checkpointing works on eager operations only, so a compiled plan never takes it (``Plan`` refuses it).

Candidate partitions (``region_partitions``) come from the tree: at depth d every default stage is replaced by its
ancestor d names deep (``layer1.0`` -> ``layer1`` at depth 1), and a run of consecutive stages with one ancestor is one
region, provided that ancestor runs exactly once per forward and its call covers exactly that run (checked by the
calls' order); otherwise the run is split one level deeper. A container the model iterates but never calls
(``nn.ModuleList``) is not a module call, so it is never a region. The deepest partition is the default stages
themselves (each compiled alone, the old per-stage compile); the whole model compiled is measured apart, as compiler
points (NOTE [ Whole-model compile ] in ``memtune.tuner._whole``). Each partition is measured against the whole model
compiled at the same budget: a partition that loses fusion shows it as a slower step.

# NOTE [ Candidate depths ]
Every partition costs a compile and a measured profile per activation budget and save rule, and a finer one loses
more of the compiler's fusion: on an H100 ResNet-50's 10 regions at depth 1 stepped 1.19–1.30× the whole model
compiled and its 22 at depth 2 1.49–1.63×; EfficientNet-B0's 3 regions 1.03× and its 12 1.50×. So
``candidate_partitions`` measures two of a model's partitions, not all: the coarsest with at least two regions (one
region is the whole model, measured apart as compiler points), which keeps most fusions, and the first finer one with
at least eight regions (about a region per block: ResNet-50's bottlenecks, BERT's and ViT-B/16's encoder layers, the
Llama decoder's layers), which lets a plan keep, offload or recompute block by block. Finer partitions are left out.
The GPU runs of users' models so far measured these two depths only (ResNet-50 1 and 2, BERT and ViT-B/16 the
coarsest and their layers), so a finer partition has not been measured against them.

# NOTE [ In-place writes at region edges ]
A compiled graph saves for its backward what the partitioner chooses, its own outputs and inputs among them, so a
write in place to a region's output or input after the region returned (an in-place activation that begins the next
stage, ``x += y`` in the model's code) changes a tensor the compiled backward reads. Autograd's version check catches
it without hooks; under saved-tensor hooks (offload, the profiler's trace) there is no check and the math would be
wrong. A region that writes its own input in place is no better: its graph mutates the input after saving it. So
before a compiled profile is measured, one eager forward and the loss run with every stage hooked
(``edge_writes``): a region that declares an in-place first layer (``memtune.profiler.chain.may_write_input``), whose
inputs' version counters move during its call, or whose inputs' or outputs' counters move after it returned, runs eager
in that profile and in every plan made of it (``Profile.eager_stages``, ``Plan.eager_stages``), with the reason in the
profile (``model_params["eager_regions"]``). Eager, it is what the unplanned model runs, which autograd checks and the
planned runtime handles (NOTE [ In-place at segment boundaries ]). A partition whose regions are coarser keeps more of
these writes inside one compiled graph, where the compiler handles them; the search prefers the faster.

# NOTE [ Regions are wrapped once ]
A region module is compiled once, by ``torch.compile`` of its own forward, and wrapped once: its ``forward`` becomes a
``RegionForward`` (an instance attribute, set once, never re-patched per call; the model's ``state_dict`` keys and
submodule names are unchanged, since no module is inserted). A ``RegionForward`` runs the module's own forward unless a
*runner* that was attached to it is running a step: the profiler's ``CompiledRegions`` while it measures, or a planned
model (``memtune.tuner.runtime._planned_module.PlannedModule``) while its forward runs; the runner then calls the
region, compiled under its budget or eager as its plan says, with the plan's action around it. So the user's model
called directly runs as written, eagerly, and two planned models of one model each run their own plan. Dynamo's guards
see one stable ``forward`` attribute, so calling twice compiles once; the compiled callables are kept per budget on the
``RegionForward``. Runners are held by weak references; the profiler detaches on exit and, with no runner left, the
module's own ``forward`` is restored. A planned model leaves the ``RegionForward`` installed (``PlannedModule.release``
restores it). A planned model's eager stage modules are wrapped the same way (NOTE [ Stage modules are wrapped once ]
in ``memtune.tuner.runtime._planned_module``). Module hooks still run eagerly around the call (``nn.Module._call_impl``
calls ``forward``), as do the profiler's trace hooks. Compiling the whole model again while a ``RegionForward`` is
installed would trace through it: release the planned model first.
"""

from __future__ import annotations

import contextlib
import inspect
import types
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from memtune.profiler.chain import may_write_input
from memtune.profiler.compiled import budget_backend, configure_dynamo
from memtune.profiler.module_stages import (
    Inputs,
    _plain_container,
    call_model,
    find_stages,
    module_calls,
    tensor_leaves,
)
from memtune.profiler.profiler_errors import ProfilerError
from memtune.profiler.region_layout import regions_channels_last

__all__ = [
    "CompiledRegions",
    "RegionForward",
    "RegionPartition",
    "RegionRunner",
    "candidate_partitions",
    "edge_writes",
    "first_line",
    "install_region",
    "region_partitions",
]


# ---- discovery -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegionPartition:
    """One candidate partition of a model's stages into regions (NOTE [ Regions ]).

    Attributes:
        depth: the module-tree depth its regions were taken at (1: the root's children); the deepest partition is
            the default stages themselves.
        names: the regions' qualified module names, in run order: the ``stages`` of a compiled profile.
        covers: per region, the default stages it covers.
    """

    depth: int
    names: tuple[str, ...]
    covers: tuple[tuple[str, ...], ...] = field(default=(), compare=False)

    @property
    def label(self) -> str:
        """A short name: the depth and the number of regions, with the first few names."""
        shown = ", ".join(self.names[:4]) + (", …" if len(self.names) > 4 else "")
        return f"depth {self.depth}: {len(self.names)} regions ({shown})"


def candidate_partitions(partitions: Sequence[RegionPartition]) -> list[RegionPartition]:
    """Of a model's ``partitions`` (``region_partitions``, coarsest first), the ones worth measuring (NOTE [ Candidate
    depths ]): the coarsest with at least two regions and the first finer one with at least eight; empty where no
    partition has two regions."""
    coarse = next((p for p in partitions if len(p.names) >= 2), None)
    if coarse is None:
        return []
    fine = next((p for p in partitions if p.depth > coarse.depth and len(p.names) >= 8), None)
    return [coarse] + ([fine] if fine is not None else [])


def _ancestor(name: str, depth: int) -> str:
    atoms = name.split(".")
    return ".".join(atoms[:depth]) if len(atoms) > depth else name


def region_partitions(model: nn.Module, inputs: Inputs, stages: Sequence[str] | None = None) -> list[RegionPartition]:
    """The candidate region partitions of ``model``, coarsest first (NOTE [ Regions ]).

    Args:
        model: any module; two forwards on ``inputs`` run without grad.
        inputs: ``(args, kwargs)`` to call it with.
        stages: ``fnmatch`` patterns naming the finest stages (as ``profile_module`` takes them); None: the default
            stages (NOTE [ Module stages ]).

    Returns:
        One partition per depth that gives a distinct one, from depth 1 to the default stages' own (the last). A
        model whose stages are the root's children has that one partition.

    Raises:
        ProfilerError: as ``memtune.profiler.module_stages.find_stages``.
    """
    finest, _ = find_stages(model, inputs, stages)
    counts, _, spans = module_calls(model, inputs)
    starts = {n: spans[n][0] for n in finest}
    depth_max = max(len(n.split(".")) for n in finest)
    out: list[RegionPartition] = []
    seen: set[tuple[str, ...]] = set()
    for depth in range(1, depth_max + 1):
        regions: list[tuple[str, tuple[str, ...]]] = []
        for run in _runs(finest, depth):
            regions.extend(_resolve(run, depth, finest, counts, spans, starts, model))
        names = tuple(r for r, _ in regions)
        if names not in seen:
            seen.add(names)
            out.append(RegionPartition(depth, names, tuple(c for _, c in regions)))
    return out


def _runs(names: Sequence[str], depth: int) -> list[list[str]]:
    """Consecutive stages grouped by their ancestor ``depth`` names deep."""
    runs: list[list[str]] = []
    for n in names:
        if runs and _ancestor(runs[-1][0], depth) == _ancestor(n, depth):
            runs[-1].append(n)
        else:
            runs.append([n])
    return runs


def _resolve(
    run: list[str],
    depth: int,
    finest: Sequence[str],
    counts: Mapping[str, int],
    spans: Mapping[str, tuple[int, int]],
    starts: Mapping[str, int],
    model: nn.Module,
) -> list[tuple[str, tuple[str, ...]]]:
    """``run`` as regions: its common ancestor where that module may be one (runs once, its call covers exactly the
    run), else each part one level deeper; a single stage is its own region."""
    if len(run) == 1:
        return [(run[0], (run[0],))]
    key = _ancestor(run[0], depth)
    below = [n for n in finest if n.startswith(key + ".")]
    span = spans.get(key)
    ok = (
        counts.get(key, 0) == 1
        and span is not None
        and below == run
        and all(span[0] < starts[n] < span[1] for n in run)
        and not _plain_container_iterated(model, key, counts)
    )
    if ok:
        return [(key, tuple(run))]
    out: list[tuple[str, tuple[str, ...]]] = []
    for part in _runs(run, depth + 1):
        out.extend(_resolve(part, depth + 1, finest, counts, spans, starts, model))
    return out


def _plain_container_iterated(model: nn.Module, name: str, counts: Mapping[str, int]) -> bool:
    """A ``ModuleList``/``ModuleDict`` (iterated, never called): not a module call, never a region."""
    m = model.get_submodule(name)
    return _plain_container(m) and not isinstance(m, nn.Sequential) and counts.get(name, 0) == 0


# ---- in-place writes at region edges -------------------------------------------------------------------


@dataclass
class _Watched:
    stage: int
    role: str  # "input" or "output"
    alias: torch.Tensor  # a detached alias: shares the version counter, holds the storage until the check ends
    version: int
    writer: str | None = None


def edge_writes(
    model: nn.Module,
    names: Sequence[str],
    inputs: Inputs,
    *,
    loss_fn: Callable[[Any], torch.Tensor],
    autocast: contextlib.AbstractContextManager[Any] | None = None,
) -> dict[int, str]:
    """Per stage index that may not run compiled, why (NOTE [ In-place writes at region edges ]).

    One eager forward with grad and the loss run with every stage hooked; the graph is dropped (no backward). Buffers
    the forward updates are updated once and random numbers drawn: call it where the model is restored afterwards (as
    inside ``profile_module``).

    Returns:
        Stage index -> the reason, in words: it declares an in-place first layer, it writes its input in place, or
        one of its inputs or outputs is written in place after it returned (by which stage, or by the model's own
        code).
    """
    modules = [model.get_submodule(n) if n else model for n in names]
    reasons: dict[int, str] = {}
    for k, m in enumerate(modules):
        if may_write_input(m):
            reasons[k] = "it declares an in-place first layer (inplace=True), which writes its input"
    watched: list[_Watched] = []
    entered: dict[int, list[_Watched]] = {}

    def check(writer: str) -> None:
        for w in watched:
            if w.writer is None and w.alias._version != w.version:
                w.writer = writer

    def pre(k: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        check(f"the model's own code before stage {names[k]!r}")
        mine = [_Watched(k, "input", t.detach(), t._version) for t in tensor_leaves((args, kwargs))]
        entered[k] = mine

    def post(k: int, out: Any) -> None:
        check(f"stage {names[k]!r}")
        for w in entered.pop(k, []):
            if w.alias._version != w.version:
                reasons.setdefault(k, "it writes its input in place")
            watched.append(_Watched(k, "input", w.alias, w.alias._version))
        watched.extend(_Watched(k, "output", t.detach(), t._version) for t in tensor_leaves(out))

    handles = []
    for k, m in enumerate(modules):
        handles.append(m.register_forward_pre_hook(lambda _m, a, kw, k=k: pre(k, a, kw), with_kwargs=True))
        handles.append(m.register_forward_hook(lambda _m, _a, out, k=k: post(k, out)))
    try:
        with autocast or contextlib.nullcontext():
            out = call_model(model, inputs)
        check("the model's own code after its last stage")
        loss = loss_fn(out)
        check("the loss")
    finally:
        for h in handles:
            h.remove()
    for w in watched:
        if w.writer is not None and w.stage not in reasons:
            reasons[w.stage] = f"its {w.role} is written in place after it returned, by {w.writer}"
    watched.clear()  # the aliases hold storages
    del out, loss
    return reasons


# ---- wrapped once --------------------------------------------------------------------------------------


class RegionRunner(Protocol):
    """What runs regions while it steps (NOTE [ Regions are wrapped once ]): the profiler's ``CompiledRegions`` or a
    planned model."""

    @property
    def in_step(self) -> bool:
        """Whether it is running a step now (its regions then go through ``run_region``)."""
        ...

    def run_region(self, region: RegionForward, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``region`` as the runner's plan says."""
        ...


class RegionForward:
    """A region module's ``forward``, installed once (NOTE [ Regions are wrapped once ]): the module's own forward
    unless an attached runner is running, which then calls the region its way. A planned model's eager stage modules
    are wrapped by it too (NOTE [ Stage modules are wrapped once ] in ``memtune.tuner.runtime._planned_module``).

    Attributes:
        previous: the instance ``forward`` it replaced (None: the class's).
    """

    def __init__(self, module: nn.Module) -> None:
        self._module = weakref.ref(module)
        self.previous: Callable[..., Any] | None = module.__dict__.get("forward")
        self._runners: list[weakref.ref[Any]] = []
        self._compiled: dict[tuple[float, str | None, bool], Callable[..., Any]] = {}
        _sign(self, module)

    @property
    def module(self) -> nn.Module:
        m = self._module()
        if m is None:
            raise ProfilerError("the region's module no longer exists")
        return m

    def eager(self, *args: Any, **kwargs: Any) -> Any:
        """The module's own forward."""
        if self.previous is not None:
            return self.previous(*args, **kwargs)
        m = self.module
        return type(m).forward(m, *args, **kwargs)

    def compiled(self, budget: float, saves: str | None = None, channels_last: bool = False) -> Callable[..., Any]:
        """The module's forward compiled by ``torch.compile`` under activation budget ``budget`` and save rule
        ``saves``, its convolutions channels-last where ``channels_last``, made once per policy (NOTE [ Compiled
        stages ] in ``memtune.profiler.compiled``, NOTE [ Saved tensors chosen inside a compiled region ] in
        ``memtune.profiler.saved_tags``, NOTE [ Regions in the whole model's layout ] in
        ``memtune.profiler.region_layout``)."""
        key = (budget, saves, channels_last)
        fn = self._compiled.get(key)
        if fn is None:
            configure_dynamo()
            m = self.module
            own = self.previous if self.previous is not None else types.MethodType(type(m).forward, m)
            fn = torch.compile(own, dynamic=False, backend=budget_backend(budget, saves, channels_last))
            self._compiled[key] = fn
        return fn

    def attach(self, runner: RegionRunner) -> None:
        """Let ``runner`` call the region while it steps; runners that no longer exist are forgotten."""
        self._runners = [r for r in self._runners if r() is not None]
        if not any(r() is runner for r in self._runners):
            self._runners.append(weakref.ref(runner))

    def detach(self, runner: RegionRunner) -> None:
        """Forget ``runner``; with no live runner left, the module's own ``forward`` comes back."""
        self._runners = [r for r in self._runners if r() is not None and r() is not runner]
        if not self._runners:
            m = self._module()
            if m is not None and m.__dict__.get("forward") is self:
                if self.previous is None:
                    del m.forward
                else:
                    m.forward = self.previous  # type: ignore[method-assign]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for ref in self._runners:
            runner = ref()
            if runner is not None and runner.in_step:
                return runner.run_region(self, args, kwargs)
        return self.eager(*args, **kwargs)

    # a copied or pickled model gets its modules' own forward back: the runners belong to the original
    def __deepcopy__(self, memo: dict[int, Any]) -> RegionForward | Callable[..., Any]:
        m = self._module()
        copy_of = memo.get(id(m)) if m is not None else None
        if copy_of is None:
            raise ProfilerError("a region's forward is copied only with its module")
        return _fresh_region_forward(copy_of)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_fresh_region_forward, (self.module,))

    def __repr__(self) -> str:
        policies = sorted(f"{b:g}" + (f" saves {r}" if r else "") + (" channels-last" if c else "")
                          for b, r, c in self._compiled)  # fmt: skip
        return f"RegionForward({type(self.module).__name__}, compiled at {policies})"


def _fresh_region_forward(module: nn.Module) -> RegionForward:
    fresh = RegionForward.__new__(RegionForward)
    fresh._module = weakref.ref(module)
    fresh.previous = None
    fresh._runners = []
    fresh._compiled = {}
    _sign(fresh, module)
    return fresh


def _sign(region: RegionForward, module: nn.Module) -> None:
    """Give ``region`` the signature of the forward it stands for: code that inspects a module's ``forward`` (a
    library choosing which keyword arguments to pass) sees the module's own parameters."""
    own = region.previous if region.previous is not None else types.MethodType(type(module).forward, module)
    with contextlib.suppress(TypeError, ValueError):  # a forward without one: the wrapper's own is shown then
        region.__signature__ = inspect.signature(own)  # type: ignore[attr-defined]


def install_region(module: nn.Module) -> RegionForward:
    """The ``RegionForward`` of ``module``, installed as its ``forward`` if it has none yet (NOTE [ Regions are
    wrapped once ])."""
    current = module.__dict__.get("forward")
    if isinstance(current, RegionForward):
        return current
    region = RegionForward(module)
    module.forward = region  # type: ignore[method-assign]
    return region


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters): what a report says of a compiler's error. A
    first line that only introduces the next (dynamo's ``backend='inductor' raised:``) is joined with it."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return f"{type(exc).__name__}: {text[:300]}"


#: modules whose exceptions are the compiler's own (dynamo's and inductor's), named with their region when raised
_COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "torch._functorch")


class CompiledRegions:
    """While inside, the regions of ``modules`` run compiled under ``budget`` and save rule ``saves`` (those in
    ``eager`` run eagerly), as the profiler measures them; ``paused()`` runs them all eagerly. Leaves each module's
    ``forward`` as found. An error of the compiler's in a region's call becomes a ``ProfilerError`` naming the region,
    the budget and the first line of the compiler's message.

    Args:
        modules: the region modules, in run order.
        budget: the activation budget they are compiled under (0 to 1).
        eager: indices of regions that run eagerly (NOTE [ In-place writes at region edges ]).
        names: the regions' qualified names, for errors (default: their indices).
        saves: memtune's save rule inside each region, None for the compiler's own choice (NOTE [ Saved tensors chosen
            inside a compiled region ] in ``memtune.profiler.saved_tags``).
    """

    def __init__(
        self,
        modules: Sequence[nn.Module],
        budget: float,
        eager: Sequence[int] = (),
        names: Sequence[str] | None = None,
        saves: str | None = None,
    ) -> None:
        if not 0.0 <= budget <= 1.0:
            raise ValueError(f"a region's activation budget is a share from 0 to 1, not {budget}")
        self.names = list(names) if names is not None else [str(k) for k in range(len(modules))]
        self.modules = list(modules)
        self.budget = float(budget)
        self.saves = saves
        self.eager = frozenset(eager)
        #: NOTE [ Regions in the whole model's layout ] (memtune.profiler.region_layout)
        self.channels_last = regions_channels_last(self.modules)
        self._regions: list[RegionForward] = []
        self._calls: dict[int, tuple[int, Callable[..., Any]]] = {}
        self._paused = False

    @property
    def in_step(self) -> bool:
        return not self._paused

    def run_region(self, region: RegionForward, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        k, call = self._calls[id(region)]
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            if not type(exc).__module__.startswith(_COMPILER_MODULES):
                raise
            raise ProfilerError(
                f"region {self.names[k]!r} failed under torch.compile at activation budget {self.budget:g}"
                f"{f' saving by rule {self.saves!r}' if self.saves else ''}: "
                f"{first_line(exc)}"
            ) from exc

    def __enter__(self) -> CompiledRegions:
        try:
            for k, m in enumerate(self.modules):
                region = install_region(m)
                region.attach(self)
                self._regions.append(region)
                self._calls[id(region)] = (
                    k,
                    region.eager if k in self.eager else region.compiled(self.budget, self.saves, self.channels_last),
                )
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        for region in self._regions:
            region.detach(self)
        self._regions.clear()
        self._calls.clear()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Every region runs its eager forward inside."""
        before = self._paused
        self._paused = True
        try:
            yield
        finally:
            self._paused = before
