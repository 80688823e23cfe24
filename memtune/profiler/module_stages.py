"""Stages of any ``nn.Module``: find them, and trace what flows between them in one forward.

# NOTE [ Module stages ]
A user's model is planned in place, the way torchtitan's ``apply_ac`` and Hugging Face's gradient checkpointing
treat it: its stages are submodules, each run once per step by the model's own ``forward``, and a plan wraps their
calls (``memtune.tuner.runtime._planned_module``). The model's code is neither rewritten nor flattened, so whatever it
does between stages (skip connections, concatenations, masks, rotary tables, its own loss) runs as written: a plan
cannot change that math.

Stages are found by tracing what runs, with module hooks. ``torch.fx`` symbolic tracing fails on data-dependent
Python (Hugging Face models branch on shapes and configs), and ``torch.export`` gives a functional graph of aten
operations, not the user's modules: a plan applied to it would run another program than the user's. Hooks see
the real call order, arguments and keyword arguments of any module, whatever its code.

By default (``find_stages``) the stages are the repeated blocks (two or more children of one class that have
submodules of their own: transformer layers, residual, dense and inverted-residual blocks) and the pieces between
them: the root is split into its children, and so is every plain container (``nn.Sequential`` without a
``forward`` of its own, ``nn.ModuleList``, ``nn.ModuleDict``; never a block itself) and every module with repeated
blocks below it; a block is split only where its own children are repeated blocks (a dense block of dense layers),
so the stages are the innermost repeated blocks. A module one of whose children runs more than once per forward (a
shared layer) is not split: it is planned whole, at a coarser granularity. Users may name the stages instead, with
``fnmatch`` patterns over qualified names (``["transformer.wte", "transformer.h.*", "lm_head"]``); a pattern names its
outermost matches.

An exported program (``memtune.profiler.exported``) is staged as the model it was exported from.
``torch.export.unflatten`` gives its modules back, but every one of them is an ``InterpreterModule``: by class alone
every module with children would be a repeated block (a GPT-2 layer split into its norms, attention and MLP) and no
``nn.Sequential`` a plain container (a stem of layers one stage). So ``load_exported`` records on each module the class
the program's ``nn_module_stack`` names (``mark_exported_classes``); blocks are grouped by that class
(``module_class``), a module exported from ``nn.Sequential``, ``nn.ModuleList`` or ``nn.ModuleDict`` is a plain
container (its forward is the program's calls of its children, in order), and so is one the program never called (an
iterated ``ModuleList``).

``trace_stages`` runs one forward with every stage hooked and records, by storage (each counted once, parameters
and buffers left out): who made it (a stage, the model's own code after stage k, or the caller: the model input),
which stages take it as an argument, which stage or the model's own code saves it for backward
(``saved_tensors_hooks``), and how long the model's code holds it: a weak reference to each tensor a stage takes
or returns is checked at every stage's start, so a skip connection lives until the stage that reads it, or longer
if the model keeps it. That is the forward lifetime the simulator uses (``SavedStorage.read_by``).

# NOTE [ State threaded between stages ]
A stage may be given, besides tensors, an object the model threads through its stages and that the stage changes:
a Hugging Face ``Cache`` (``DynamicCache``, ``EncoderDecoderCache``; on by default, ``use_cache=True``), whose
layer ``k`` grows by concatenation (``DynamicLayer.update``) when stage ``k`` runs, and whose cross-attention keys
are made once and flagged (``EncoderDecoderCache.is_updated``). Calling a stage twice on the same object is not
calling it twice on the same input: the second call reads what the first wrote (keys twice as long, or the
cross-attention of the first call, whose graph its backward already freed). Two callers run a stage more than once
per state: the profiler times a stage alone, again and again, on the inputs the model gave it once
(``memtune.profiler.module_profile``), and a ``recompute`` or ``selective`` stage runs again in backward
(``memtune.tuner.runtime._planned_module``). Hugging Face turns the cache off under gradient checkpointing; memtune
keeps
the model's math instead: each extra call gets a *structure copy* of the state the stage was given (``copy_structure``):
every Python object copied (containers, the cache, its list of layer objects, their flags), every tensor shared,
never copied. The cache's ``update`` rebinds ``keys``/``values`` to new tensors, so what the extra call writes
goes to its throwaway copy and it computes what the first call computed, while the model's own object sees one
call, as in the unplanned step. The profiler captures the state once (before the stage ran) and gives every timed
call a fresh copy of it; the runtime snapshots the state before the first run and gives the re-run a fresh copy of
the snapshot. Modules and streams are shared, not copied. A state that cannot be copied (``copy.deepcopy`` fails:
a lock, a handle) is refused with ``ProfilerError``/``PlanError`` naming the stage and the type: turn the state
off (``use_cache=False`` in a Hugging Face model's config) or keep that stage. Tensors inside the state are
shared, so a stage that writes into them in place (a ``StaticCache``) still sees its own writes; and a re-run's
snapshot keeps them (earlier layers' keys and values) alive until the stage's backward, as the model's output, which
holds the cache, does while it is held. Inputs the caller gives with state in them (a cache passed to the model) are
copied the same way for every forward the profiler runs (``call_model``), so each sees them as given.
"""

from __future__ import annotations

import copy
import enum
import fnmatch
import gc
import types
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from memtune.profiler.profiler_errors import ProfilerError
from memtune.profiler.selective import selective_context

__all__ = [
    "StageTrace",
    "TracedStorage",
    "call_model",
    "checkpointed_call",
    "copy_structure",
    "find_stages",
    "held_objects",
    "held_tensors",
    "mark_exported_classes",
    "module_calls",
    "module_class",
    "module_kind",
    "rebuild",
    "tensor_leaves",
    "trace_stages",
]

#: ``(args, kwargs)`` a model is called with
Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def tensor_leaves(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside ``obj``: a tensor, or tensors nested in tuples, lists, dicts and mappings (Hugging Face
    ``ModelOutput`` is one); other objects (a cache, a config) hold none as far as memtune is concerned."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from tensor_leaves(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensor_leaves(v)


def rebuild(obj: Any, it: Iterator[torch.Tensor]) -> Any:
    """``obj`` with its tensors replaced, in ``tensor_leaves`` order, by those of ``it``; its tuples, lists and dicts
    are new objects, so a later change to the caller's containers does not reach it."""
    if isinstance(obj, torch.Tensor):
        return next(it)
    if isinstance(obj, Mapping):
        return {k: rebuild(v, it) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(rebuild(v, it) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(rebuild(v, it) for v in obj)
    return obj


#: values ``copy_structure`` keeps as they are: immutable, or handles no call changes
_ATOMIC: tuple[type, ...] = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    enum.Enum,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    torch.finfo,
    torch.iinfo,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.ModuleType,
)
#: objects ``copy_structure`` shares wherever they sit: the model's modules, devices' streams and events
_SHARED: tuple[type, ...] = (torch.Tensor, nn.Module, torch.Stream, torch.Event, torch.cuda.Stream, torch.cuda.Event)
#: objects whose references are not followed when looking for what to share (``copy.deepcopy`` keeps them as well)
_OPAQUE: tuple[type, ...] = (*_ATOMIC, types.CodeType, types.FrameType, weakref.ref, property)


def _shared_memo(obj: Any) -> dict[int, Any]:
    """A ``copy.deepcopy`` memo mapping every tensor, module, stream and event reachable from ``obj`` to itself, so
    that deepcopy shares them; references are followed as the garbage collector sees them (``gc.get_referents``:
    containers' items, objects' attributes and slots), whatever an object's ``__reduce__`` does."""
    memo: dict[int, Any] = {}
    seen: set[int] = set()
    stack = [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, _SHARED):
            memo[id(o)] = o
        elif not isinstance(o, _OPAQUE):
            stack.extend(gc.get_referents(o))
    return memo


def held_tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor reachable from ``obj`` through objects other than tuples, lists and dicts (a Hugging Face
    ``Cache`` in a model's output holding each layer's keys and values), found as ``copy_structure`` finds what to
    share (``gc.get_referents``); modules are not entered. NOTE [ Held output ] in ``memtune.tuner.simulator``."""
    leaves = {id(t) for t in tensor_leaves(obj)}
    return [t for t in _shared_memo(obj).values() if isinstance(t, torch.Tensor) and id(t) not in leaves]


def held_objects(out: Any) -> list[tuple[str, int]]:
    """Per object a model's output holds besides its tensors (a Hugging Face ``Cache``), its name (the key, index or
    type it is found at, with its type) and the bytes of the distinct storages of the tensors it holds
    (``held_tensors``); objects that hold none are left out. NOTE [ Held output ] in ``memtune.tuner.simulator``."""
    items: list[tuple[str, Any]]
    if isinstance(out, Mapping):
        items = [(str(k), v) for k, v in out.items()]
    elif isinstance(out, tuple | list):
        items = [(f"[{i}]", v) for i, v in enumerate(out)]
    else:
        items = [(type(out).__name__, out)]
    found = []
    for key, value in items:
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in held_tensors(value)
            if t.device.type != "meta" and t.layout == torch.strided
        }
        if sum(storages.values()):
            found.append((f"{key} ({type(value).__name__})", sum(storages.values())))
    return found


def copy_structure(obj: Any, leaves: Iterator[torch.Tensor] | None = None) -> Any:
    """A structure copy of ``obj`` (NOTE [ State threaded between stages ]): every Python object in it copied, its
    tensors shared, never copied.

    Tuples, lists, dicts and mappings are walked as ``rebuild`` walks them (new objects; a mapping becomes a dict),
    their tensor leaves taken from ``leaves`` in ``tensor_leaves`` order (None: the same tensors). Any other object
    (a Hugging Face ``Cache``, a config) is ``copy.deepcopy``'d with every tensor, module, stream and event inside it
    shared, so a tensor that needs a gradient and has a graph is fine; an object reached twice is copied once.

    Args:
        obj: what a stage is called with, usually its ``(args, kwargs)``.
        leaves: the tensors to put at ``obj``'s tensor leaves, in ``tensor_leaves`` order; None keeps them.

    Returns:
        The copy. Copying costs only Python time (no tensor memory).

    Raises:
        ProfilerError: an object cannot be copied (its ``copy.deepcopy`` fails: a lock, an open handle); the message
            names its type. Callers name the stage and say what to do.
    """
    return _StructureCopy(obj, leaves).walk(obj)


class _StructureCopy:
    """One ``copy_structure`` walk. A class, not a recursive closure: a nested function that calls itself refers to
    itself through its own cell, a reference cycle that kept the walked structure's tensors (a recomputed stage's
    inputs) alive until the garbage collector ran: 1.05 GiB of ResNet-50's activations past the end of a step on the
    H200, freed only by ``gc.collect()``."""

    def __init__(self, root: Any, leaves: Iterator[torch.Tensor] | None) -> None:
        self.root = root
        self.leaves = leaves
        self.memo: dict[int, Any] | None = None

    def walk(self, o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return o if self.leaves is None else next(self.leaves)
        if isinstance(o, Mapping):
            return {k: self.walk(v) for k, v in o.items()}
        if isinstance(o, tuple) and hasattr(o, "_fields"):
            return type(o)(*(self.walk(v) for v in o))
        if isinstance(o, (list, tuple)):
            return type(o)(self.walk(v) for v in o)
        if isinstance(o, (_ATOMIC, _SHARED)):
            return o
        if self.memo is None:
            self.memo = _shared_memo(self.root)  # only where there is an object to copy
        try:
            return copy.deepcopy(o, self.memo)
        except Exception as exc:  # whatever an object's own __deepcopy__ or __reduce__ raises
            t = type(o)
            raise ProfilerError(f"a {t.__module__}.{t.__qualname__} object cannot be copied ({exc})") from exc


def checkpointed_call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    clone: bool,
    selective: bool,
    rerun: Callable[[Callable[[], Any]], Any] | None = None,
) -> Any:
    """``fn(*args, **kwargs)`` under a non-reentrant checkpoint, as a ``recompute`` stage runs (or a ``selective``
    one, under selective checkpointing, NOTE [ Selective stages ] in ``memtune.profiler.selective``): every tensor
    passed positionally, keyword arguments' too, so that checkpoint saves them and infers the autocast device from them;
    with ``clone``, the positional tensors cloned inside (NOTE [ In-place at segment boundaries ]); the re-run in
    backward given a structure copy of the arguments as they are now (a list the model appends to later, a cache it
    updates: NOTE [ State threaded between stages ]) and called through ``rerun`` where given (the runtime replays
    random state and restores buffers there); with ``rerun``, checkpoint stashes no random state of its own.

    Raises:
        ProfilerError: the arguments hold state that cannot be copied.
    """
    tensors = list(tensor_leaves((args, kwargs)))
    positional = sum(1 for _ in tensor_leaves(args))
    structure = rebuild((args, kwargs), iter(tensors))
    state = copy_structure(structure)
    calls = 0

    def body(*ts: torch.Tensor) -> Any:
        nonlocal calls
        calls += 1
        if clone:
            ts = tuple(t.clone() if i < positional else t for i, t in enumerate(ts))
        if calls == 1:
            a, kw = rebuild(structure, iter(ts))
            return fn(*a, **kw)
        a, kw = copy_structure(state, iter(ts))
        return fn(*a, **kw) if rerun is None else rerun(lambda: fn(*a, **kw))

    extra: dict[str, Any] = {"context_fn": selective_context} if selective else {}
    return checkpoint(body, *tensors, use_reentrant=False, preserve_rng_state=rerun is None, **extra)


def _holds_state(obj: Any) -> bool:
    """Whether ``obj`` holds, besides tensors, containers and atomic values, an object ``copy_structure`` copies."""
    if isinstance(obj, Mapping):
        return any(_holds_state(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_holds_state(v) for v in obj)
    return not isinstance(obj, (_ATOMIC, _SHARED))


def call_model(model: nn.Module, inputs: Inputs) -> Any:
    """``model(*args, **kwargs)``; where the inputs hold state besides tensors (a cache the caller passes), on a
    structure copy of them, so that every call sees it as the caller gave it (NOTE [ State threaded between stages ])
    and the caller's object is left as found."""
    if not _holds_state(inputs):
        args, kwargs = inputs
        return model(*args, **kwargs)
    try:
        args, kwargs = copy_structure(inputs)
    except ProfilerError as exc:
        raise ProfilerError(
            f"the example inputs hold state that memtune must copy so that every forward it runs sees it as given, "
            f"and {exc} (NOTE [ State threaded between stages ]); pass inputs without it"
        ) from exc
    return model(*args, **kwargs)


# ---- discovery -----------------------------------------------------------------------------------------


def _run_counts(model: nn.Module, inputs: Inputs) -> tuple[dict[str, int], list[str]]:
    """How many times each named module runs in one forward (no grad), and the order of first runs."""
    counts, order, _ = module_calls(model, inputs)
    return counts, order


def module_calls(model: nn.Module, inputs: Inputs) -> tuple[dict[str, int], list[str], dict[str, tuple[int, int]]]:
    """One forward without grad with every named module hooked: how many times each runs, the order of first runs,
    and the (start, end) event numbers of each one's first call (a module's call covers the calls numbered between:
    NOTE [ Regions ] in ``memtune.profiler.region_tree``). The model's buffers are left as found."""
    counts: dict[str, int] = {}
    order: list[str] = []
    spans: dict[str, list[int]] = {}
    clock = [0]  # events so far: every call's start and end
    handles = []
    for name, m in model.named_modules():

        def pre(_m: nn.Module, _a: Any, name: str = name) -> None:
            clock[0] += 1
            if name not in counts:
                order.append(name)
                spans[name] = [clock[0], -1]
            counts[name] = counts.get(name, 0) + 1

        def post(_m: nn.Module, _a: Any, _o: Any, name: str = name) -> None:
            clock[0] += 1
            if spans[name][1] < 0:
                spans[name][1] = clock[0]

        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post, always_call=True))
    buffers = [(b, b.clone()) for b in model.buffers()]  # a forward in train mode moves batch-norm statistics
    try:
        with torch.no_grad():
            call_model(model, inputs)
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    return counts, order, {n: (s, e) for n, (s, e) in spans.items()}


#: the attribute ``memtune.profiler.exported.load_exported`` sets on every module of an unflattened exported program:
# the
#: qualified name of the class it was exported from, ``""`` for a container the program never called (NOTE [ Module
#: stages ], exported programs)
EXPORTED_CLASS = "_memtune_exported_class"
_CONTAINERS = frozenset(f"torch.nn.modules.container.{c}" for c in ("Sequential", "ModuleList", "ModuleDict"))


def mark_exported_classes(model: nn.Module, classes: Mapping[str, str]) -> None:
    """Record on each module of an unflattened exported program the class it was exported from (``classes``: qualified
    module name → qualified class name, as the program's ``nn_module_stack`` says; a module it lacks was never called,
    a container), so its stages are found as the original model's are (NOTE [ Module stages ], exported programs)."""
    for name, m in model.named_modules():
        setattr(m, EXPORTED_CLASS, classes.get(name, ""))


def module_class(m: nn.Module) -> type | str:
    """The class ``m`` stands for: its own, or the one a module of an exported program was exported from."""
    exported: str | None = getattr(m, EXPORTED_CLASS, None)
    return type(m) if exported is None else exported


def module_kind(m: nn.Module) -> str:
    """The lower-case name of ``module_class(m)`` (``linear``, ``gpt2block``): a stage's ``kind``."""
    cls = module_class(m)
    return (cls.__name__ if isinstance(cls, type) else cls.rsplit(".", 1)[-1] or "container").lower()


def _plain_container(m: nn.Module) -> bool:
    exported: str | None = getattr(m, EXPORTED_CLASS, None)
    if exported is not None:  # its forward is the program's calls of its children, in order
        return exported in _CONTAINERS or not exported
    if isinstance(m, (nn.ModuleList, nn.ModuleDict)):
        return type(m).forward is nn.Module.forward
    return isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class _Finder:
    """The default stages of NOTE [ Module stages ]."""

    def __init__(self, model: nn.Module, counts: Mapping[str, int]) -> None:
        self.counts = counts
        self.ran = {n for n, m in model.named_modules() if any(counts.get(d, 0) for d in self._names_below(n, m))}
        self.coarse: list[str] = []

    @staticmethod
    def _names_below(name: str, m: nn.Module) -> Iterator[str]:
        for sub, _ in m.named_modules():
            yield _join(name, sub) if sub else name

    def _children(self, name: str, m: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(_join(name, c), child) for c, child in m.named_children() if _join(name, c) in self.ran]

    def _blocks(self, children: list[tuple[str, nn.Module]]) -> set[str]:
        by_class: dict[type | str, list[str]] = {}
        for n, c in children:
            if any(True for _ in c.children()) and not _plain_container(c):  # containers are split, never blocks
                by_class.setdefault(module_class(c), []).append(n)
        return {n for names in by_class.values() if len(names) >= 2 for n in names}

    def _repeats_below(self, name: str, m: nn.Module) -> bool:
        children = self._children(name, m)
        return bool(self._blocks(children)) or any(self._repeats_below(n, c) for n, c in children)

    def split(self, name: str, m: nn.Module, *, root: bool = False) -> list[str]:
        children = self._children(name, m)
        if not children:
            return [name]
        if not (root or _plain_container(m) or self._repeats_below(name, m)):
            return [name]
        # a child that runs itself must run exactly once; a container that never runs (a ModuleList) is iterated
        bad = [n for n, _ in children if self.counts.get(n, 0) > 1]
        if bad:
            self.coarse.append(f"{name or 'the model'} (its child {bad[0]} runs {self.counts[bad[0]]} times)")
            return [name]
        blocks = self._blocks(children)
        out: list[str] = []
        for n, c in children:
            if n not in blocks:
                out.extend(self.split(n, c))
            elif self._blocks(self._children(n, c)) and self.counts.get(n, 0) <= 1:
                out.extend(self.split(n, c, root=True))  # blocks of blocks: the inner ones (a dense block's layers)
            else:
                out.append(n)
        return out


def find_stages(model: nn.Module, inputs: Inputs, stages: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """The stages of ``model``, as qualified module names in the order they first run, and notes on where it was
    planned coarser than asked.

    Args:
        model: any module; one forward on ``inputs`` is run without grad.
        inputs: ``(args, kwargs)`` to call it with.
        stages: ``fnmatch`` patterns naming the stages (NOTE [ Module stages ]); None finds them.

    Raises:
        ProfilerError: a pattern matches no module that runs; a named module runs other than once per forward; two
            named stages nest; the model has no stage (it runs no submodule).
    """
    counts, order = _run_counts(model, inputs)
    rank = {n: i for i, n in enumerate(order)}
    finder = _Finder(model, counts)
    if stages is None:
        names = finder.split("", model, root=True)
        names = [n for n in names if n]  # the root itself is one stage only when it has no children
        if not names:
            names = [""]
    else:
        names = _named(stages, counts, order)
    bad = [n for n in names if n and counts.get(n, 0) != 1 and not _plain_container(model.get_submodule(n))]
    if bad:
        raise ProfilerError(
            f"stage {bad[0]!r} runs {counts.get(bad[0], 0)} times in one forward; a stage must run once per step: "
            "name its parent (stages=[...]) or a module inside it"
        )
    unit = [n for n in names if n and counts.get(n, 0) == 0]
    if unit:
        raise ProfilerError(
            f"stage {unit[0]!r} is a container the model iterates, not a module it calls; name its children "
            f"(e.g. '{unit[0]}.*')"
        )
    names.sort(key=lambda n: rank.get(n, -1))
    return names, finder.coarse


def _named(patterns: Sequence[str], counts: Mapping[str, int], order: list[str]) -> list[str]:
    ran = [n for n in order if n]
    chosen: list[str] = []
    for pat in patterns:
        hits = [n for n in ran if fnmatch.fnmatchcase(n, pat)]
        if not hits:
            shown = ", ".join(ran[:12]) + (" …" if len(ran) > 12 else "")
            raise ProfilerError(f"stages pattern {pat!r} matches no module that runs in forward (modules: {shown})")
        # fnmatch's * crosses dots: a pattern names its outermost matches ("h.*" gives h.0, not h.0.attn)
        outer = [h for h in hits if not any(h.startswith(o + ".") for o in hits if o != h)]
        chosen.extend(h for h in outer if h not in chosen)
    for a in chosen:
        for b in chosen:
            if a != b and b.startswith(a + "."):
                raise ProfilerError(f"stage {b!r} lies inside stage {a!r}; name one or the other")
    return chosen


# ---- trace ---------------------------------------------------------------------------------------------


@dataclass
class TracedStorage:
    """One storage seen in the traced forward (NOTE [ Module stages ]). Sizes are bytes.

    Attributes:
        nbytes: the storage's bytes.
        producer: the stage that made it; for the model's own code, the last stage whose forward had ended
            before it (-1: before any stage: the model input or what the model makes before its first stage).
        grad_bytes: bytes of the gradient that flows back into it (the largest view seen), 0 when none.
        grad_storage_bytes: bytes of the storage that gradient is a view of, where the backward of its last
            reader makes it larger (NOTE [ Gradient storages ] in ``memtune.profiler.module_profile``); None: its own.
        readers: stages whose forward takes it, or at whose start the model's code still holds it.
        saved_by: stages that save it for backward.
        outside_after: saved by the model's own code after this stage's forward (-1: before the first), or None.
    """

    nbytes: int
    producer: int
    grad_bytes: int = 0
    grad_storage_bytes: int | None = None
    readers: set[int] = field(default_factory=set)
    saved_by: set[int] = field(default_factory=set)
    outside_after: int | None = None
    refs: list[weakref.ref[torch.Tensor]] = field(default_factory=list, repr=False)

    def alive(self) -> bool:
        return any(r() is not None for r in self.refs)


@dataclass
class StageTrace:
    """What one traced forward shows of a model's stages.

    Attributes:
        names: the stages' qualified names, in run order.
        storages: every storage that flows between stages or is saved for backward.
        inputs: per stage, indices into ``storages`` of the tensors it takes (each once, in argument order).
        input_grad: per stage, per tensor leaf of its ``(args, kwargs)``, whether it required a gradient.
        leaf_storages: per stage, per tensor leaf of its ``(args, kwargs)``, the index into ``storages`` of its
            storage (None: a parameter, a buffer or an empty tensor).
        outputs: per stage, its main output (the first floating-point tensor it returns) or None.
        output_bytes: per stage, bytes of that tensor.
        model_outputs: indices of the storages the model returns.
        loss_saved_bytes: what the loss function saved for backward, bytes (storages not already listed).
        held: with ``output_held``, the objects in the model's output that hold tensors besides it (``held_objects``):
            name and bytes.
    """

    names: list[str]
    storages: list[TracedStorage]
    inputs: list[list[int]]
    input_grad: list[list[bool]]
    leaf_storages: list[list[int | None]]
    outputs: list[int | None]
    output_bytes: list[int]
    model_outputs: list[int]
    loss_saved_bytes: int
    held: list[tuple[str, int]] = field(default_factory=list)


class _Tracer:
    def __init__(self, model: nn.Module, names: list[str]) -> None:
        self.model = model
        self.names = names
        self.storages: list[TracedStorage] = []
        self.by_ptr: dict[int, int] = {}
        self.current: int | None = None
        self.last_done = -1
        self.resident = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
        n = len(names)
        self.inputs: list[list[int]] = [[] for _ in range(n)]
        self.input_grad: list[list[bool]] = [[] for _ in range(n)]
        self.leaf_storages: list[list[int | None]] = [[] for _ in range(n)]
        self.outputs: list[int | None] = [None] * n
        self.output_bytes = [0] * n
        self.calls = [0] * n
        self.loss_saved = 0
        self.in_loss = False

    def sight(self, t: torch.Tensor, producer: int, *, saved: bool = False) -> int | None:
        """The storage index of ``t`` (a new entry made by ``producer`` when unseen or its storage was freed)."""
        if t.device.type == "meta" or t.layout != torch.strided:
            return None
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if storage.nbytes() == 0 or ptr in self.resident:
            return None
        sid = self.by_ptr.get(ptr)
        if sid is not None:
            old = self.storages[sid]
            if not (old.alive() or old.saved_by or old.outside_after is not None):
                sid = None  # freed, and its address handed out again
        if sid is None:
            sid = len(self.storages)
            self.storages.append(TracedStorage(nbytes=storage.nbytes(), producer=producer))
            self.by_ptr[ptr] = sid
        entry = self.storages[sid]
        if not saved:
            entry.refs.append(weakref.ref(t))
        if t.requires_grad and t.is_floating_point():
            entry.grad_bytes = max(entry.grad_bytes, t.numel() * t.element_size())
        return sid

    def check_alive(self, k: int) -> None:
        for s in self.storages:
            if s.alive():
                s.readers.add(k)

    def pre(self, k: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls[k] += 1
        if self.calls[k] > 1:
            return
        self.check_alive(k)
        leaves = list(tensor_leaves((args, kwargs)))
        for t in leaves:
            sid = self.sight(t, self.last_done)
            self.leaf_storages[k].append(sid)
            if sid is not None and sid not in self.inputs[k]:
                self.inputs[k].append(sid)
                self.storages[sid].readers.add(k)
        self.input_grad[k] = [t.requires_grad for t in leaves]
        self.current = k

    def post(self, k: int, out: Any) -> None:
        if self.calls[k] > 1:
            return
        for t in tensor_leaves(out):
            sid = self.sight(t, k)
            if sid is not None and self.outputs[k] is None and t.is_floating_point():
                self.outputs[k] = sid
                self.output_bytes[k] = t.numel() * t.element_size()
        self.current = None
        self.last_done = k

    def pack(self, t: torch.Tensor) -> Any:
        if self.in_loss:
            storage = t.untyped_storage()
            if storage.data_ptr() not in self.resident and storage.data_ptr() not in self.by_ptr:
                self.loss_saved += storage.nbytes()
            return t.detach()
        k = self.current
        sid = self.sight(t, self.last_done if k is None else k, saved=True)
        if sid is not None:
            if k is None:
                prev = self.storages[sid].outside_after
                self.storages[sid].outside_after = self.last_done if prev is None else max(prev, self.last_done)
            else:
                self.storages[sid].saved_by.add(k)
        return t.detach()  # a new tensor object: the model's own references decide what the weak refs see


def trace_stages(
    model: nn.Module,
    names: list[str],
    inputs: Inputs,
    *,
    loss_fn: Callable[[Any], torch.Tensor],
    autocast: AbstractContextManager[Any] | None = None,
    output_held: bool = False,
) -> StageTrace:
    """Run one forward and the loss of ``model`` on ``inputs`` with its stages hooked; see NOTE [ Module stages ].

    With ``output_held`` the storages that objects in the model's output hold (``held_tensors``: a cache's keys and
    values) are marked as saved by the model's own code from the start: a training loop that holds the output keeps
    them on the GPU until its backward ends, whatever a plan does with the stages that saved them (NOTE [ Held
    output ] in ``memtune.tuner.simulator``).

    The graph is dropped afterwards (no backward runs). Buffers the forward updates (batch-norm statistics) are
    updated once; callers that must leave the model as found restore them.

    Raises:
        ProfilerError: a stage ran other than once, or the loss is not a scalar tensor.
    """
    tracer = _Tracer(model, names)
    modules = [model.get_submodule(n) if n else model for n in names]
    with ExitStack() as stack:
        for k, m in enumerate(modules):
            pre = m.register_forward_pre_hook(
                lambda _m, a, kw, k=k: tracer.pre(k, a, kw), with_kwargs=True, prepend=True
            )
            post = m.register_forward_hook(lambda _m, _a, out, k=k: tracer.post(k, out), always_call=True)
            stack.callback(pre.remove)
            stack.callback(post.remove)
        for t in tensor_leaves(inputs):
            tracer.sight(t, -1)
        with torch.autograd.graph.saved_tensors_hooks(tracer.pack, lambda t: t):
            with autocast or nullcontext():
                out = call_model(model, inputs)
            tracer.check_alive(len(names) - 1)
            model_outputs = [
                s for s in (tracer.sight(t, tracer.last_done) for t in tensor_leaves(out)) if s is not None
            ]
            for sid in model_outputs:
                tracer.storages[sid].readers.add(len(names) - 1)
            for t in held_tensors(out) if output_held else ():
                held = tracer.sight(t, tracer.last_done, saved=True)
                if held is not None:
                    tracer.storages[held].outside_after = -1  # held to the end: saved_by gains stage 0
            tracer.in_loss = True
            loss = loss_fn(out)
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
            raise ProfilerError(f"the loss function must return a scalar tensor, got {type(loss).__name__}")
    ran = [names[k] for k, c in enumerate(tracer.calls) if c != 1]
    if ran:
        k = names.index(ran[0])
        raise ProfilerError(
            f"stage {ran[0]!r} ran {tracer.calls[k]} times in one forward; a stage must run once per step: name its "
            "parent or the modules inside it (stages=[...])"
        )
    trace = StageTrace(
        names=names,
        storages=tracer.storages,
        inputs=tracer.inputs,
        input_grad=tracer.input_grad,
        leaf_storages=tracer.leaf_storages,
        outputs=tracer.outputs,
        output_bytes=tracer.output_bytes,
        model_outputs=model_outputs,
        loss_saved_bytes=tracer.loss_saved,
        held=held_objects(out) if output_held else [],
    )
    for s in trace.storages:
        s.refs = []
    del out, loss
    return trace
