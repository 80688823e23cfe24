"""The peers of a module model: which of the ways a user could train it in less memory apply to it, and how each is
applied (``memtune.tuner.measure.peer_measure`` measures them).

# NOTE [ Module peers ]
A peer is applied to the user's model as the user would apply it, with no profile and no search (NOTE [ Peers ] in
``memtune.tuner.measure._peers``), and runs uncapped, as users run it:

* ``compiler``: ``torch.compile`` of the whole model under ``activation_memory_budget`` = b, for each b of the sweep
  (``COMPILER_SWEEP``: 0, 0.1, ..., 1). Each budget has one backend object
  (``memtune.profiler.compiled.budget_backend``), so one compiled graph per budget lives in dynamo's cache for the
  process: the sweep compiles each budget once, and
  a memtune plan that later runs the whole model compiled at a budget of the sweep (``Plan.whole_compile``) reuses
  that graph. It does not apply to a model that writes its input in place (``CompiledStage`` would run it eagerly).
* ``hf_checkpointing``: Hugging Face's own gradient checkpointing (``activation_checkpointing_enable`` where the
  installed transformers has it, else ``gradient_checkpointing_enable``; non-reentrant), on the outermost module of
  the model that has it (the model itself, or the Hugging Face model inside a wrapper). It applies where that module
  says ``supports_gradient_checkpointing`` and the model is in training mode (Hugging Face checkpoints only then); it
  is turned off again after the measurement.
* ``checkpoint_sequential``: ``torch.utils.checkpoint.checkpoint_sequential`` (non-reentrant, sqrt(n) segments as
  Chen et al., at least 2) over, in this order of preference: the model itself where it is a plain ``nn.Sequential``;
  the model's stages (``memtune.profiler.module_stages.find_stages``) where they chain one tensor (the model's one input
  is the first stage's one argument, each stage's one argument is the tensor the stage before returned, unchanged or
  reshaped as a view, and the model returns the last stage's output: a traced forward checks identity, storage and
  version counters); else the plain ``nn.Sequential`` inside the model, called once per forward with one tensor,
  that holds the most parameters, swapped in place for the time of the measurement (the model's own code runs
  around it, as torchtitan wraps blocks in place). A sequence needs three modules or more: with one segment
  ``checkpoint_sequential`` checkpoints nothing.
* ``offload_activations``: ``memtune.tuner.measure._peers.OffloadActivations`` around the model's forward (the loss
outside,
  as torchtune places it). On the CPU there is nothing to offload, so it applies there only for tests.

A peer that does not apply carries its reason; one that fails (an out-of-memory, a compile error, an in-place write at
a segment boundary) carries its error as its result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from memtune.profiler import find_stages
from memtune.profiler.chain import may_write_input
from memtune.profiler.module_profile import as_inputs
from memtune.tuner.measure._peers import OffloadActivations, compiled_model
from memtune.tuner.measure._sequential_chain import (
    MIN_SEQUENCE,
    ChainLink,
    CheckpointChain,
    CheckpointSequential,
    default_segments,
    largest_sequential,
    plain_sequential,
    swapped,
    trace_chain,
)

__all__ = [
    "COMPILER_SWEEP",
    "ModulePeer",
    "PeerFamily",
    "applicable_peers",
    "applied",
    "buffers_kept",
]

#: the compiler's activation budgets a module's peers sweep by default: 0, 0.1, ..., 1
COMPILER_SWEEP: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))

PeerFamily = Literal["compiler", "hf_checkpointing", "checkpoint_sequential", "offload_activations"]


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
    with buffers_kept(model):  # a traced forward in training mode updates running statistics
        sequential = _sequential_peer(model, inputs, stages, segments)
    return [
        *_compiler_peers(model, compiler_budgets),
        _hf_peer(model),
        sequential,
        _offload_peer(model, offload_on_cpu),
    ]


@contextlib.contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
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


def _sequential_peer(
    model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]], stages: Sequence[str] | None, segments: int | None
) -> ModulePeer:
    name = "checkpoint_sequential"
    if isinstance(model, nn.Sequential) and plain_sequential(model):
        n = len(model)
        if n < MIN_SEQUENCE:
            why = f"the model is an nn.Sequential of {n} module(s); checkpoint_sequential needs {MIN_SEQUENCE} or more"
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
        chain, chain_why = trace_chain(model, inputs, names)
        if chain is not None and len(chain) >= MIN_SEQUENCE:
            segs = segments or default_segments(len(chain))
            reshaped = sum(1 for c in chain if c.reshape is not None)
            views = f", {reshaped} input(s) reshaped as the model does" if reshaped else ""
            return ModulePeer(
                f"{name} ({segs} segments)", "checkpoint_sequential", True,
                f"the model's {len(chain)} stages chain one tensor{views}: {segs} segments", segments=segs, target="",
                chain=tuple(chain),
            )  # fmt: skip
        if chain is not None:
            chain_why = f"its {len(chain)} stage(s) chain one tensor, fewer than {MIN_SEQUENCE}"
    inner, inner_why = largest_sequential(model, inputs)
    if inner is not None:
        where, n = inner
        segs = segments or default_segments(n)
        return ModulePeer(
            f"{name} ({segs} segments over {where})", "checkpoint_sequential", True,
            f"its stages do not chain one tensor ({chain_why}); over {where!r}, an nn.Sequential of {n} modules it "
            f"calls with one tensor, swapped in place: {segs} segments", segments=segs, target=where,
        )  # fmt: skip
    return ModulePeer(name, "checkpoint_sequential", False, f"{chain_why}, and {inner_why}")


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
            yield CheckpointChain(model, peer.chain, peer.segments)
        elif not peer.target:
            assert isinstance(model, nn.Sequential)
            yield CheckpointSequential(model, peer.segments)
        else:
            seq = model.get_submodule(peer.target)
            assert isinstance(seq, nn.Sequential)
            with swapped(model, peer.target, CheckpointSequential(seq, peer.segments)):
                yield model
