"""Where ``torch.utils.checkpoint.checkpoint_sequential`` applies to a module, and the modules that run it so (NOTE
[ Module peers ] in ``memtune.tuner.measure.module_peers``, its ``checkpoint_sequential`` item): a plain
``nn.Sequential``, the model's stages where a traced forward shows that they chain one tensor, or an ``nn.Sequential``
inside the model swapped in place.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

from memtune.profiler.module_stages import call_model

__all__ = [
    "MIN_SEQUENCE",
    "ChainLink",
    "CheckpointChain",
    "CheckpointSequential",
    "default_segments",
    "largest_sequential",
    "plain_sequential",
    "swapped",
    "trace_chain",
]

MIN_SEQUENCE = 3
"""modules a sequence needs: ``checkpoint_sequential`` with one segment checkpoints nothing"""

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class ChainLink:
    """One module of a ``checkpoint_sequential`` chain: its qualified name in the model (``""`` the model itself) and
    the shape its input is reshaped to first (None: taken as it comes)."""

    module: str
    reshape: tuple[int, ...] | None = None


def default_segments(n: int) -> int:
    """``checkpoint_sequential``'s segments over ``n`` modules: round(sqrt(n)), at least 2 (Chen et al.)."""
    return max(2, round(math.sqrt(n)))


def plain_sequential(m: nn.Module) -> bool:
    """Whether ``m`` is an ``nn.Sequential`` that runs its children in order (no ``forward`` of its own)."""
    return isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward


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


def trace_chain(
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


def largest_sequential(
    model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any]]
) -> tuple[tuple[str, int] | None, str]:
    """The plain ``nn.Sequential`` of three or more modules inside ``model`` that it calls once with one tensor and
    that holds the most parameters (qualified name, length), or None and why there is none."""
    candidates = {n: m for n, m in model.named_modules() if n and plain_sequential(m) and len(m) >= MIN_SEQUENCE}
    if not candidates:
        return None, f"it holds no nn.Sequential of {MIN_SEQUENCE} or more modules"
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
        return None, f"no nn.Sequential of {MIN_SEQUENCE} or more modules inside it runs once with one tensor"
    size = {n: sum(p.numel() for p in candidates[n].parameters()) for n in fit}
    best = max(fit, key=lambda n: (size[n], len(candidates[n])))
    return (best, len(candidates[best])), ""


class CheckpointChain(nn.Module):
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


class CheckpointSequential(nn.Module):
    """An ``nn.Sequential`` run by ``checkpoint_sequential``, swapped in for it."""

    def __init__(self, seq: nn.Sequential, segments: int) -> None:
        super().__init__()
        self.seq = seq
        self.segments = segments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = checkpoint_sequential(self.seq, self.segments, x, use_reentrant=False)
        return out


@contextlib.contextmanager
def swapped(model: nn.Module, where: str, replacement: nn.Module) -> Iterator[None]:
    parent_name, _, attr = where.rpartition(".")
    parent = model.get_submodule(parent_name)
    original = getattr(parent, attr)
    setattr(parent, attr, replacement)
    try:
        yield
    finally:
        setattr(parent, attr, original)
