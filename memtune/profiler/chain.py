"""Chains: every model is presented as a list of stages ``x_i = s_i(x_{i-1})``.

# NOTE [ Which containers are flattened ]
``flatten`` splits a module into its children only where running the children one after another *is*
the module's forward: an ``nn.Sequential`` whose class does not override ``forward``
(``type(m).forward is nn.Sequential.forward``), a plain one or a subclass that only adds attributes.
Every other module is one stage: a residual block, a transformer block, and also an ``nn.Sequential``
subclass with its own ``forward`` (``return x + super().forward(x)`` adds a skip connection that the
children alone do not compute). Splitting that would silently change the loss; keeping it whole only
makes the stage coarser. The rule is the one module stages use for plain containers
(``memtune.profiler.module_stages``). Convolutions inside a stage still get their own algorithm choice, found by
``conv_modules``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from torch import nn

__all__ = ["ModelChain", "Stage", "conv_modules", "flatten", "may_write_input"]


@dataclass(frozen=True)
class Stage:
    """One element of the chain: a display name, a kind (``conv2d``, ``relu``, ``residual`` …) and the module."""

    name: str
    kind: str
    module: nn.Module


@dataclass
class ModelChain:
    """A model as a chain of stages, plus what is needed to feed it.

    Attributes:
        name: zoo name or ``spec:<hash>``.
        stages: the chain, in forward order.
        input_shape: one sample's shape, without the batch dimension.
        input_kind: ``image`` (float tensor) or ``tokens`` (int64 token ids).
        vocab_size: for ``tokens`` inputs, the id range.
        params: the parameters it was built with (for display and storage).
    """

    name: str
    stages: list[Stage]
    input_shape: tuple[int, ...]
    input_kind: str = "image"
    vocab_size: int = 0
    params: dict[str, int | float | str | bool] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.stages)

    def as_sequential(self) -> nn.Sequential:
        """The chain as one ``nn.Sequential`` (shares the stage modules, no copy)."""
        return nn.Sequential(*(s.module for s in self.stages))


def _kind(m: nn.Module) -> str:
    explicit = getattr(m, "stage_kind", None)
    if isinstance(explicit, str):
        return explicit
    return type(m).__name__.lower()


def _plain_sequential(module: nn.Module) -> bool:
    """True when ``module``'s forward is ``nn.Sequential``'s: its children run in order and nothing else.

    A subclass of ``nn.Sequential`` that overrides ``forward`` is not plain (NOTE [ Which containers are
    flattened ]).
    """
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


def flatten(module: nn.Module, prefix: str = "") -> list[Stage]:
    """Split ``module`` into chain stages, recursing into plain ``nn.Sequential`` containers only.

    A container is split only when ``_plain_sequential`` holds (NOTE [ Which containers are flattened ]);
    any other module, an ``nn.Sequential`` subclass with its own ``forward`` included, stays one stage, so the
    stages run in order compute exactly what ``module`` does.

    Args:
        module: the model or a part of it.
        prefix: dotted path of ``module`` inside the model, ending in ``.`` (``""`` for the root); stage
            names are ``prefix`` plus the child path, or the class name in lower case for a bare root.

    Returns:
        The stages in forward order.
    """
    if _plain_sequential(module):
        out: list[Stage] = []
        for name, child in module.named_children():
            out.extend(flatten(child, f"{prefix}{name}."))
        return out
    return [Stage(name=prefix.rstrip(".") or type(module).__name__.lower(), kind=_kind(module), module=module)]


def conv_modules(stage: Stage) -> Iterator[tuple[str, nn.Conv2d]]:
    """Yield ``(name inside the stage, module)`` for every ``nn.Conv2d`` in a stage, in order."""
    if isinstance(stage.module, nn.Conv2d):
        yield "", stage.module
        return
    for name, m in stage.module.named_modules():
        if isinstance(m, nn.Conv2d):
            yield name, m


def _first_leaf(module: nn.Module) -> nn.Module:
    while True:
        children = list(module.children())
        if not children:
            return module
        module = children[0]


def may_write_input(module: nn.Module) -> bool:
    """True when ``module`` declares it writes its input in place (``inplace=True`` on it or its first leaf): the
    runtime clones such a stage's input where a checkpoint saves it (NOTE [ In-place at segment boundaries ])."""
    return bool(getattr(module, "inplace", False)) or bool(getattr(_first_leaf(module), "inplace", False))
