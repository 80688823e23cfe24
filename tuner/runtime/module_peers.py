"""The peers of a module model: which of the ways a user could train it in less memory apply to it, and each measured.

# NOTE [ Module peers ]
A peer is applied to the user's model as the user would apply it, with no profile and no search (NOTE [ Peers ] in
``tuner.runtime.peers``), and runs uncapped, as users run it:

* ``compiler``: ``torch.compile`` of the whole model under ``activation_memory_budget`` = b, for each b of the sweep
  (``COMPILER_SWEEP``: 0, 0.1, ..., 1). Each budget has one backend object (``profiler.compiled.budget_backend``),
  so one compiled graph per budget lives in dynamo's cache for the process: the sweep compiles each budget once, and
  a memtune plan that later runs the whole model compiled at a budget of the sweep (``Plan.whole_compile``) reuses
  that graph. It does not apply to a model that writes its input in place (``CompiledStage`` would run it eagerly).
* ``hf_checkpointing``: Hugging Face's own gradient checkpointing (``activation_checkpointing_enable`` where the
  installed transformers has it, else ``gradient_checkpointing_enable``; non-reentrant), on the outermost module of
  the model that has it (the model itself, or the Hugging Face model inside a wrapper). It applies where that module
  says ``supports_gradient_checkpointing`` and the model is in training mode (Hugging Face checkpoints only then); it
  is turned off again after the measurement.
* ``checkpoint_sequential``: ``torch.utils.checkpoint.checkpoint_sequential`` (non-reentrant, sqrt(n) segments as
  Chen et al., at least 2) over, in this order of preference: the model itself where it is a plain ``nn.Sequential``;
  the model's stages (``profiler.modules.find_stages``) where they chain one tensor (the model's one input is the
  first stage's one argument, each stage's one argument is the tensor the stage before returned, unchanged or
  reshaped as a view, and the model returns the last stage's output: a traced forward checks identity, storage and
  version counters); else the plain ``nn.Sequential`` inside the model, called once per forward with one tensor,
  that holds the most parameters, swapped in place for the time of the measurement (the model's own code runs
  around it, as torchtitan wraps blocks in place). A sequence needs three modules or more: with one segment
  ``checkpoint_sequential`` checkpoints nothing.
* ``offload_activations``: ``tuner.runtime.peers.OffloadActivations`` around the model's forward (the loss outside,
  as torchtune places it). On the CPU there is nothing to offload, so it applies there only for tests.

A peer that does not apply carries its reason; one that fails (an out-of-memory, a compile error, an in-place write at
a segment boundary) carries its error as its result.

# NOTE [ Peer measurement ]
Each peer trains ``warmup`` + ``steps`` steps of the caller's batch in this process: forward, loss, backward and the
optimizer's update (SGD with momentum, or AdamW) at a learning rate of 0, so the update's kernels and state are there
and the parameters are left as they were; the buffers (running statistics) are restored after each peer. The first
step's wall seconds (``first_step_s``) include compiling. On CUDA: the median of the timed steps by CUDA events, the
peak bytes allocated and reserved (``max_memory_allocated``/``max_memory_reserved``, reset after the warm-up: the
whole process's, as ``tuner.runtime.module_bench.measure_step`` reports the unplanned step), and the allocator's
retries per step. On the CPU (tests): wall-clock ms and the peak the CPU allocator's events give above what was live
before the timed steps (``profiler.memory_meter.metered``); reserved equals allocated there.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

from profiler import find_stages
from profiler.chain import may_write_input
from profiler.memory_meter import metered
from profiler.module_profile import as_inputs, default_loss
from profiler.modules import call_model
from tuner.runtime.peers import OffloadActivations, compiled_model

__all__ = [
    "COMPILER_SWEEP",
    "ChainLink",
    "ModulePeer",
    "PeerFamily",
    "applicable_peers",
    "applied",
    "default_segments",
    "measure_peers",
]

#: the compiler's activation budgets a module's peers sweep by default: 0, 0.1, ..., 1
COMPILER_SWEEP: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))

PeerFamily = Literal["compiler", "hf_checkpointing", "checkpoint_sequential", "offload_activations"]
Loss = Callable[[Any], torch.Tensor]
Progress = Callable[[int, int, str], None]

_MIN_SEQUENCE = 3  # modules: checkpoint_sequential with one segment checkpoints nothing


@dataclass(frozen=True)
class ChainLink:
    """One module of a ``checkpoint_sequential`` chain: its qualified name in the model (``""`` the model itself) and
    the shape its input is reshaped to first (None: taken as it comes)."""

    module: str
    reshape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ModulePeer:
    """One peer of a module model (NOTE [ Module peers ]): whether it applies, and how or why not.

    Attributes:
        name: the row's name (``torch.compile budget 0.5``, ``HF gradient checkpointing``, ...).
        family: which kind of peer.
        applies: whether it can run on this model.
        note: how it is applied, or why it does not apply.
        activation_budget: a ``compiler`` peer's ``activation_memory_budget``, 0 to 1.
        segments: a ``checkpoint_sequential`` peer's number of segments.
        target: the module it is applied to (qualified name, ``""`` the model).
        chain: a ``checkpoint_sequential`` peer's modules, in order, where they are the model's stages.
    """

    name: str
    family: PeerFamily
    applies: bool
    note: str
    activation_budget: float | None = None
    segments: int | None = None
    target: str | None = None
    chain: tuple[ChainLink, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready fields (``chain`` as a list of ``[module, reshape]``, left out where empty)."""
        d = asdict(self)
        d["chain"] = [[c.module, list(c.reshape) if c.reshape else None] for c in self.chain] or None
        if d["chain"] is None:
            del d["chain"]
        return d


# ---- which peers apply --------------------------------------------------------------------------------------------


def applicable_peers(
    model: nn.Module,
    example_inputs: Any,
    *,
    compiler_budgets: Sequence[float] = COMPILER_SWEEP,
    stages: Sequence[str] | None = None,
    segments: int | None = None,
    offload_on_cpu: bool = False,
) -> list[ModulePeer]:
    """Every peer of ``model`` (NOTE [ Module peers ]), those that do not apply with their reason: the compiler's
    sweep, Hugging Face checkpointing, ``checkpoint_sequential`` and activation offload, in that order.

    Runs up to two forwards without grad on ``example_inputs`` (finding the stages and tracing whether they chain).

    Args:
        model: the model on its device.
        example_inputs: its batch, as ``memtune.profile`` takes it (a tensor, a tuple, a dict, or ``(args, kwargs)``).
        compiler_budgets: the compiler's activation budgets, each 0 to 1.
        stages: ``fnmatch`` patterns naming the stages (NOTE [ Module stages ]); None finds them.
        segments: ``checkpoint_sequential``'s segments (default sqrt(n) of its n modules, at least 2).
        offload_on_cpu: for tests: offload applies on the CPU too, copying CPU tensors through the same code.

    Raises:
        ValueError: a budget outside 0..1, or ``segments`` below 2.
    """
    bad = [b for b in compiler_budgets if not 0.0 <= b <= 1.0]
    if bad:
        raise ValueError(f"compiler_budgets: activation budgets are shares from 0 to 1, not {bad[0]:g}")
    if segments is not None and segments < 2:
        raise ValueError(f"segments: checkpoint_sequential needs at least 2 segments to checkpoint any, not {segments}")
    inputs = as_inputs(example_inputs)
    with _buffers_kept(model):  # a traced forward in training mode updates running statistics
        sequential = _sequential_peer(model, inputs, stages, segments)
    return [
        *_compiler_peers(model, compiler_budgets),
        _hf_peer(model),
        sequential,
        _offload_peer(model, offload_on_cpu),
    ]


@contextlib.contextmanager
def _buffers_kept(model: nn.Module) -> Iterator[None]:
    """The model's buffers (running statistics, step counters) as they were before the block, after it."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, was in saved:
                b.copy_(was)


def _compiler_peers(model: nn.Module, budgets: Sequence[float]) -> list[ModulePeer]:
    eager = may_write_input(model)
    note = (
        "the model writes its input in place (inplace=True on its first layer), which a compiled graph may not do to a "
        "tensor it saved; torch.compile of it is not measured"
        if eager
        else "the whole model compiled by torch.compile, partitioned under this activation_memory_budget"
    )
    return [
        ModulePeer(f"torch.compile budget {b:g}", "compiler", not eager, note, activation_budget=float(b), target="")
        for b in budgets
    ]


def _hf_module(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The outermost module of ``model`` with Hugging Face's checkpointing switch, and its qualified name."""
    for name, m in model.named_modules():
        if callable(getattr(m, "gradient_checkpointing_enable", None)) or callable(
            getattr(m, "activation_checkpointing_enable", None)
        ):
            return name, m
    return None


def _hf_peer(model: nn.Module) -> ModulePeer:
    name = "HF gradient checkpointing"
    found = _hf_module(model)
    if found is None:
        why = f"no gradient checkpointing in this model class ({type(model).__name__} is no Hugging Face model)"
        return ModulePeer(name, "hf_checkpointing", False, why)
    where, hf = found
    cls = type(hf).__name__
    if not getattr(hf, "supports_gradient_checkpointing", False):
        return ModulePeer(
            name, "hf_checkpointing", False, f"no gradient checkpointing in {cls} (supports_gradient_checkpointing is "
            "False)", target=where,
        )  # fmt: skip
    if not (model.training and hf.training):
        return ModulePeer(
            name, "hf_checkpointing", False, "the model is in eval mode, where Hugging Face checkpoints nothing: call "
            "model.train() first", target=where,
        )  # fmt: skip
    inside = f" (the {cls} at {where!r})" if where else ""
    note = f"{cls}'s own gradient checkpointing{inside}, non-reentrant"
    return ModulePeer(name, "hf_checkpointing", True, note, target=where)


def default_segments(n: int) -> int:
    """``checkpoint_sequential``'s segments over ``n`` modules: round(sqrt(n)), at least 2 (Chen et al.)."""
    return max(2, round(math.sqrt(n)))


def _plain_sequential(m: nn.Module) -> bool:
    return isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward


def _sequential_peer(
    model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]], stages: Sequence[str] | None, segments: int | None
) -> ModulePeer:
    name = "checkpoint_sequential"
    if isinstance(model, nn.Sequential) and _plain_sequential(model):
        n = len(model)
        if n < _MIN_SEQUENCE:
            why = f"the model is an nn.Sequential of {n} module(s); checkpoint_sequential needs {_MIN_SEQUENCE} or more"
            return ModulePeer(name, "checkpoint_sequential", False, why)
        segs = segments or default_segments(n)
        return ModulePeer(
            f"{name} ({segs} segments)", "checkpoint_sequential", True,
            f"the model is an nn.Sequential of {n} modules: {segs} segments", segments=segs, target="",
        )  # fmt: skip
    try:
        names, _coarse = find_stages(model, inputs, stages)
    except Exception as exc:  # the stages cannot be found: look for a sequence inside the model only
        names, chain_why = [], f"its stages cannot be found ({exc})"
    else:
        chain, chain_why = _trace_chain(model, inputs, names)
        if chain is not None and len(chain) >= _MIN_SEQUENCE:
            segs = segments or default_segments(len(chain))
            reshaped = sum(1 for c in chain if c.reshape is not None)
            views = f", {reshaped} input(s) reshaped as the model does" if reshaped else ""
            return ModulePeer(
                f"{name} ({segs} segments)", "checkpoint_sequential", True,
                f"the model's {len(chain)} stages chain one tensor{views}: {segs} segments", segments=segs, target="",
                chain=tuple(chain),
            )  # fmt: skip
        if chain is not None:
            chain_why = f"its {len(chain)} stage(s) chain one tensor, fewer than {_MIN_SEQUENCE}"
    inner, inner_why = _largest_sequential(model, inputs)
    if inner is not None:
        where, n = inner
        segs = segments or default_segments(n)
        return ModulePeer(
            f"{name} ({segs} segments over {where})", "checkpoint_sequential", True,
            f"its stages do not chain one tensor ({chain_why}); over {where!r}, an nn.Sequential of {n} modules it "
            f"calls with one tensor, swapped in place: {segs} segments", segments=segs, target=where,
        )  # fmt: skip
    return ModulePeer(name, "checkpoint_sequential", False, f"{chain_why}, and {inner_why}")


class _ChainCheck:
    """Checks, stage by stage in a traced forward, that the stages chain one tensor; holds only the last output."""

    def __init__(self, x: torch.Tensor, names: list[str]) -> None:
        self.order = {n: i for i, n in enumerate(names)}
        self.names = names
        self.next = 0  # the stage expected next
        self.prev: torch.Tensor | None = x
        self.prev_version = x._version
        self.links: list[ChainLink] = []
        self.why = ""

    def fail(self, why: str) -> None:
        if not self.why:
            self.why = why
        self.prev = None

    def before(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.why:
            return
        if self.order[name] != self.next:
            self.fail(f"stage {name!r} runs again or out of order")
            return
        if kwargs or len(args) != 1:
            self.fail(f"stage {name!r} is called with {len(args)} positional and {len(kwargs)} keyword arguments")
            return
        assert self.prev is not None
        ok, shape = _link(self.prev, args[0], self.prev_version)
        if not ok:
            before = f"stage {self.links[-1].module!r}" if self.links else "the model's input"
            self.fail(f"stage {name!r} does not take the tensor {before} handed on, as it was")
            return
        self.links.append(ChainLink(name, shape))

    def after(self, name: str, out: Any) -> None:
        if self.why:
            return
        if not isinstance(out, torch.Tensor):
            self.fail(f"stage {name!r} returns {type(out).__name__}, not one tensor")
            return
        self.prev, self.prev_version = out, out._version
        self.next += 1

    def result(self, out: Any) -> tuple[list[ChainLink] | None, str]:
        if not self.why and self.next != len(self.names):
            self.fail(f"stage {self.names[self.next]!r} did not run")
        if not self.why and not isinstance(out, torch.Tensor):
            self.fail(f"the model returns {type(out).__name__}, not one tensor")
        if not self.why:
            assert self.prev is not None
            ok, shape = _link(self.prev, out, self.prev_version)
            if not ok or shape is not None:
                self.fail("the model does not return its last stage's output as it was")
        self.prev = None
        return (None, self.why) if self.why else (self.links, "")


def _same_data(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``b`` is ``a`` reshaped as a view: the same storage from the same offset, both contiguous, as many elements."""
    return (
        a.dtype == b.dtype
        and a.numel() == b.numel()
        and a.is_contiguous()
        and b.is_contiguous()
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.storage_offset() == b.storage_offset()
    )


def _link(prev: torch.Tensor, got: Any, prev_version: int) -> tuple[bool, tuple[int, ...] | None]:
    """Whether ``got`` is ``prev`` handed on unchanged since it was made (and the shape it was reshaped to, if so)."""
    if not isinstance(got, torch.Tensor) or got._version != prev_version:
        return False, None
    if got is prev:
        return True, None
    if _same_data(prev, got):
        return True, tuple(got.shape)
    return False, None


def _trace_chain(
    model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]], names: list[str]
) -> tuple[list[ChainLink] | None, str]:
    """The model's stages as a chain of one tensor (NOTE [ Module peers ]), or None and the first reason they are
    not."""
    args, kwargs = inputs
    if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor):
        return None, "the model is not called with one tensor"
    if names == [""]:
        return None, "the model has no stages below itself"
    check = _ChainCheck(args[0], names)
    handles = []
    for n in names:
        m = model.get_submodule(n)

        def pre(_m: nn.Module, a: tuple[Any, ...], kw: dict[str, Any], n: str = n) -> None:
            check.before(n, a, kw)

        def post(_m: nn.Module, _a: tuple[Any, ...], _kw: dict[str, Any], out: Any, n: str = n) -> None:
            check.after(n, out)

        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            out = call_model(model, inputs)
    finally:
        for h in handles:
            h.remove()
    return check.result(out)


def _largest_sequential(
    model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]]
) -> tuple[tuple[str, int] | None, str]:
    """The plain ``nn.Sequential`` of three or more modules inside ``model`` that it calls once with one tensor and
    that holds the most parameters (qualified name, length), or None and why there is none."""
    candidates = {n: m for n, m in model.named_modules() if n and _plain_sequential(m) and len(m) >= _MIN_SEQUENCE}
    if not candidates:
        return None, f"it holds no nn.Sequential of {_MIN_SEQUENCE} or more modules"
    seen: dict[str, list[int]] = {n: [0, 0] for n in candidates}  # calls, calls with one tensor and nothing else
    handles = []
    for n, m in candidates.items():

        def hook(_m: nn.Module, a: tuple[Any, ...], kw: dict[str, Any], n: str = n) -> None:
            seen[n][0] += 1
            seen[n][1] += int(not kw and len(a) == 1 and isinstance(a[0], torch.Tensor))

        handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            call_model(model, inputs)
    finally:
        for h in handles:
            h.remove()
    fit = [n for n, (calls, one) in seen.items() if calls == 1 and one == 1]
    fit = [n for n in fit if not any(n.startswith(o + ".") for o in fit)]  # the outermost
    if not fit:
        return None, f"no nn.Sequential of {_MIN_SEQUENCE} or more modules inside it runs once with one tensor"
    size = {n: sum(p.numel() for p in candidates[n].parameters()) for n in fit}
    best = max(fit, key=lambda n: (size[n], len(candidates[n])))
    return (best, len(candidates[best])), ""


def _offload_peer(model: nn.Module, on_cpu: bool) -> ModulePeer:
    name = "offload activations (side stream)"
    cuda = any(p.is_cuda for p in model.parameters())
    if not cuda and not on_cpu:
        why = "it moves CUDA tensors to host memory; the model is not on a CUDA device"
        return ModulePeer(name, "offload_activations", False, why)
    note = "every saved activation of 1 MiB or more to pinned host memory in the forward, on a side stream"
    return ModulePeer(name, "offload_activations", True, note, target="")


# ---- applying one peer ---------------------------------------------------------------------------------------------


class _Within(nn.Module):
    """``model``'s forward inside a fresh context of ``ctx`` (the model is held, not registered: its parameters are
    its own)."""

    def __init__(self, model: nn.Module, ctx: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        super().__init__()
        object.__setattr__(self, "_model", model)
        self._ctx = ctx

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self._ctx():
            return self.__dict__["_model"](*args, **kwargs)


class _CheckpointChain(nn.Module):
    """``checkpoint_sequential`` over the modules of a chain (each input reshaped as the model reshapes it)."""

    def __init__(self, model: nn.Module, chain: Sequence[ChainLink], segments: int) -> None:
        super().__init__()
        steps: list[Callable[[torch.Tensor], torch.Tensor]] = []
        for link in chain:
            m = model.get_submodule(link.module)
            steps.append(m if link.reshape is None else _reshaped(m, link.reshape))
        object.__setattr__(self, "_steps", steps)
        self.segments = segments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = checkpoint_sequential(self.__dict__["_steps"], self.segments, x, use_reentrant=False)
        return out


def _reshaped(m: nn.Module, shape: tuple[int, ...]) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = m(x.reshape(shape))
        return out

    return run


class _CheckpointSequential(nn.Module):
    """An ``nn.Sequential`` run by ``checkpoint_sequential``, swapped in for it."""

    def __init__(self, seq: nn.Sequential, segments: int) -> None:
        super().__init__()
        self.seq = seq
        self.segments = segments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = checkpoint_sequential(self.seq, self.segments, x, use_reentrant=False)
        return out


@contextlib.contextmanager
def _swapped(model: nn.Module, where: str, replacement: nn.Module) -> Iterator[None]:
    parent_name, _, attr = where.rpartition(".")
    parent = model.get_submodule(parent_name)
    original = getattr(parent, attr)
    setattr(parent, attr, replacement)
    try:
        yield
    finally:
        setattr(parent, attr, original)


@contextlib.contextmanager
def _hf_checkpointing(model: nn.Module) -> Iterator[nn.Module]:
    found = _hf_module(model)
    assert found is not None
    hf: Any = found[1]  # a transformers PreTrainedModel: its switches are not in nn.Module's stubs
    off: Callable[[], None]
    if callable(getattr(hf, "activation_checkpointing_enable", None)):  # transformers that renamed the switch
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        off = hf.activation_checkpointing_disable
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        off = hf.gradient_checkpointing_disable
    try:
        yield model
    finally:
        off()


@contextlib.contextmanager
def applied(model: nn.Module, peer: ModulePeer) -> Iterator[nn.Module]:
    """The module a step calls to train ``model`` as ``peer`` does (sharing its parameters); the model is as it was
    after the block. ValueError for a peer that does not apply."""
    if not peer.applies:
        raise ValueError(f"peer {peer.name!r} does not apply: {peer.note}")
    if peer.family == "compiler":
        assert peer.activation_budget is not None
        yield compiled_model(model, peer.activation_budget)
    elif peer.family == "hf_checkpointing":
        with _hf_checkpointing(model) as run:
            yield run
    elif peer.family == "offload_activations":
        cpu = not any(p.is_cuda for p in model.parameters())
        yield _Within(model, lambda: OffloadActivations(module=model, force_host_copy_on_cpu=cpu))
    else:
        assert peer.segments is not None
        if peer.chain:
            yield _CheckpointChain(model, peer.chain, peer.segments)
        elif not peer.target:
            assert isinstance(model, nn.Sequential)
            yield _CheckpointSequential(model, peer.segments)
        else:
            seq = model.get_submodule(peer.target)
            assert isinstance(seq, nn.Sequential)
            with _swapped(model, peer.target, _CheckpointSequential(seq, peer.segments)):
                yield model


# ---- measuring them ------------------------------------------------------------------------------------------------


def measure_peers(
    model: nn.Module,
    example_inputs: Any,
    *,
    loss_fn: Loss | None = None,
    peers: Sequence[ModulePeer] | None = None,
    compiler_budgets: Sequence[float] = COMPILER_SWEEP,
    optimizer: Literal["sgd", "adam"] = "sgd",
    warmup: int = 3,
    steps: int = 10,
    output_held: bool = False,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Measure each peer of ``model`` that applies (NOTE [ Peer measurement ]): one JSON-ready dict per peer, in the
    order of ``peers``, with its ``ModulePeer`` fields and, where it ran, ``step_ms``, ``peak_bytes``,
    ``reserved_bytes``, ``alloc_retries_per_step`` (CUDA) and ``first_step_s``, or ``error`` (``out of memory: ...``
    for an out-of-memory); a peer that does not apply is listed with its reason and no measurement.

    Args:
        model: the model on its device (CUDA; the CPU for tests), in the mode it trains in.
        example_inputs: its batch (a tensor, a tuple, a dict, or ``(args, kwargs)``).
        loss_fn: the loss over the model's output (default ``profiler.module_profile.default_loss``).
        peers: the peers (default ``applicable_peers(model, example_inputs, compiler_budgets=...)``).
        compiler_budgets: the compiler's sweep when ``peers`` is None.
        optimizer: ``sgd`` (momentum) or ``adam`` (AdamW), at a learning rate of 0.
        warmup, steps: untimed steps (the first compiles) and timed steps per peer.
        output_held: the loop holds the model's output until its backward ends.
        progress: called with (peers done, peers to run, name) before each peer that runs, and at the end.

    Raises:
        ValueError: ``steps`` below 1, ``warmup`` below 0, or an unknown optimizer.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be at least 1 and warmup at least 0, not {steps} and {warmup}")
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', not {optimizer!r}")
    chosen = (
        list(peers) if peers is not None else applicable_peers(model, example_inputs, compiler_budgets=compiler_budgets)
    )
    loss = loss_fn or default_loss
    args = as_inputs(example_inputs)
    runs = [p for p in chosen if p.applies]
    rows: list[dict[str, Any]] = []
    done = 0
    for peer in chosen:
        row = peer.to_dict()
        if peer.applies:
            if progress is not None:
                progress(done, len(runs), peer.name)
            row.update(_measure_one(model, peer, args, loss, optimizer, warmup, steps, output_held))
            done += 1
        rows.append(row)
    if progress is not None:
        progress(done, len(runs), "done")
    return rows


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, torch.OutOfMemoryError):
        return "out of memory: " + str(exc).split(" If reserved but unallocated")[0].strip()[:400]
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


def _measure_one(
    model: nn.Module,
    peer: ModulePeer,
    args: tuple[tuple[Any, ...], dict[str, Any]],
    loss: Loss,
    optimizer: str,
    warmup: int,
    steps: int,
    output_held: bool,
) -> dict[str, Any]:
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt: torch.optim.Optimizer = (
        torch.optim.AdamW(params, lr=0.0) if optimizer == "adam" else torch.optim.SGD(params, lr=0.0, momentum=0.9)
    )
    try:
        with _buffers_kept(model), applied(model, peer) as run:

            def step() -> None:
                opt.zero_grad(set_to_none=True)
                out = call_model(run, args)
                value = loss(out)
                if not output_held:
                    del out
                value.backward()
                opt.step()

            return _timed(step, device, warmup, steps)
    except Exception as exc:  # an out-of-memory, a compile error, an in-place write at a segment edge: the result
        return {"error": _error_text(exc)}
    finally:
        opt.zero_grad(set_to_none=True)
        opt.state.clear()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()


def _timed(step: Callable[[], None], device: torch.device, warmup: int, steps: int) -> dict[str, Any]:
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    retries = torch.cuda.memory_stats(device).get("num_alloc_retries", 0) if cuda else 0
    began = time.perf_counter()
    step()
    sync()
    first_s = time.perf_counter() - began
    for _ in range(max(0, warmup - 1)):
        step()
    sync()
    times: list[float] = []
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        peak, reserved = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
        total = max(1, warmup) + steps
        retried = (torch.cuda.memory_stats(device).get("num_alloc_retries", 0) - retries) / total
        return {
            "step_ms": statistics.median(times),
            "peak_bytes": peak,
            "reserved_bytes": reserved,
            "alloc_retries_per_step": retried,
            "first_step_s": round(first_s, 3),
        }
    with metered(device) as reading:
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    return {
        "step_ms": statistics.median(times),
        "peak_bytes": reading.peak_bytes,
        "reserved_bytes": reading.peak_reserved_bytes,
        "first_step_s": round(first_s, 3),
    }
