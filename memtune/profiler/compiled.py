"""Stages run by ``torch.compile`` under the compiler's activation-memory budget.

# NOTE [ Compiled stages ]
A compiled stage is the stage's module run through ``torch.compile`` with
``torch._functorch.config.activation_memory_budget`` set to the stage's budget while it compiles: AOTAutograd's min-
cut partitioner then chooses which intermediate tensors the backward keeps and which it re-makes, 1.0 being its
default partition (the fastest) and 0.0 the fewest bytes it can keep. The budget is read when the joint graph is
partitioned, inside the backend; dynamo's cache checks the backend but not that config, so each budget has its own
backend object (``budget_backend``) and two budgets of one module code never share a compiled graph. What the
compiled forward saves still goes through saved-tensor hooks, so a plan can keep, offload
(``memtune.tuner.runtime.offload`` keeps strides: the compiled backward asserts them) or recompute (a non-reentrant
checkpoint around the compiled
stage) what the stage saves, as for an eager stage; PyTorch's selective checkpointing and memtune's own cuDNN
algorithm choice work on eager operations only, so a compiled stage takes neither. A stage that writes its input in
place stays eager (``CompiledStage.eager``).

The wrapper shares the module's parameters and buffers (``inner``): the math is the compiler's lowering of the same
operations, equal to eager up to floating-point reassociation (tests compare within tolerance). A chain's stages run
their convolutions in the layout the compiler gives all of them together, as compiled regions do (NOTE [ Regions in
the whole model's layout ] in ``memtune.profiler.region_layout``): ``compiled_chain`` (the profile) and a planned chain
(the run) decide it from the same stages, so a plan runs in the layout it was profiled in.

Dynamo compiles one graph per input shape and module code; a chain's stages of one class (ResNet's bottlenecks)
share the code, so ``configure_dynamo`` raises the recompile limits above the number of stages: without that,
dynamo silently runs the stages past the limit eagerly, and a profile of them would not be a compiled one.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from memtune.profiler.chain import ModelChain, Stage, may_write_input
from memtune.profiler.region_layout import regions_channels_last

__all__ = [
    "COMPILE_BUDGETS",
    "GRAPHS_COMPILED",
    "CompiledStage",
    "budget_backend",
    "compiled_chain",
    "configure_dynamo",
    "eager_module",
]

#: the compiler's activation budgets a compiled profile is measured at by default (``memtune profile --compile``)
COMPILE_BUDGETS: tuple[float, ...] = (0.0, 0.5, 1.0)

_RECOMPILE_LIMIT = 256

#: graphs ``budget_backend`` compiled in this process, per activation budget: one per graph dynamo hands it (its
#: backward is compiled with it); a count that stays put across calls means nothing recompiled
GRAPHS_COMPILED: collections.Counter[float] = collections.Counter()


def configure_dynamo() -> None:
    """Raise dynamo's per-code recompile limits so that every stage of a chain compiles (NOTE [ Compiled stages ])."""
    import torch._dynamo.config as dynamo_config

    for name, limit in (("recompile_limit", _RECOMPILE_LIMIT), ("accumulated_recompile_limit", 4 * _RECOMPILE_LIMIT)):
        if getattr(dynamo_config, name) < limit:
            setattr(dynamo_config, name, limit)


@functools.cache
def budget_backend(budget: float, saves: str | None = None, channels_last: bool = False) -> Callable[..., Any]:
    """Inductor, partitioning under ``activation_memory_budget = budget``: one backend object per budget and save rule,
    so that dynamo's cache (which checks the backend, not the functorch config) keeps one compiled graph per policy.

    The partitioner keeps or replays the forward's random draws, never draws them again in the backward
    (``KeptDraws``, NOTE [ Random draws kept in a compiled region ] in ``memtune.profiler.saved_tags``). With ``saves``
    (one of ``memtune.profiler.saved_tags.SAVE_RULES``) the partitioner is memtune's: the rule's tags on the joint
    graph, then the min-cut under ``budget`` (NOTE [ Saved tensors chosen inside a compiled region ] in
    ``memtune.profiler.saved_tags``).

    Outputs keep the layout inductor chose (``keep_output_stride=False``): a stage whose convolutions it ran in
    channels-last order hands that layout to the next stage instead of copying back to the eager layout at every
    stage boundary, forward and backward (the values are the same; only strides differ). With ``channels_last`` the
    graph's convolutions run channels-last whatever the compiler would decide for this graph alone (NOTE [ Regions in
    the whole model's layout ] in ``memtune.profiler.region_layout``).

    Raises:
        ValueError: ``saves`` is not a save rule.
    """
    patches: dict[str, Any] = {"keep_output_stride": False}
    if channels_last:
        patches["force_layout_optimization"] = True
    from memtune.profiler.saved_tags import KeptDraws, SavedTags

    # NOTE [ Random draws kept in a compiled region ]: the forward's draws are never drawn again in the backward
    patches["custom_partitioner_fn"] = SavedTags(saves) if saves is not None else KeptDraws()

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        import torch._functorch.config as functorch_config
        from torch._inductor.compile_fx import compile_fx

        GRAPHS_COMPILED[budget] += 1
        with functorch_config.patch(activation_memory_budget=budget):
            return compile_fx(gm, example_inputs, config_patches=patches)

    suffix = (f"_saves_{saves}" if saves else "") + ("_nhwc" if channels_last else "")
    backend.__name__ = f"inductor_activation_budget_{budget:g}{suffix}"
    return backend


class CompiledStage(nn.Module):
    """``inner`` compiled with ``torch.compile``, partitioned under the activation budget ``budget`` (0 to 1).

    Args:
        inner: the stage's module; its parameters and buffers are shared, not copied.
        budget: ``activation_memory_budget`` while the stage compiles (NOTE [ Compiled stages ]).
        saves: memtune's save rule inside the stage, None for the compiler's own choice (``budget_backend``).
        channels_last: its convolutions run channels-last whatever the compiler decides for the stage alone: a chain's
            stages take the decision of all of them together (``compiled_chain``; NOTE [ Regions in the whole
            model's layout ] in ``memtune.profiler.region_layout``).

    Raises:
        ValueError: ``budget`` is outside 0..1.
    """

    def __init__(self, inner: nn.Module, budget: float, saves: str | None = None, channels_last: bool = False) -> None:
        super().__init__()
        if not 0.0 <= budget <= 1.0:
            raise ValueError(f"a compiled stage's activation budget is a share from 0 to 1, not {budget}")
        configure_dynamo()
        self.inner = inner
        self.budget = float(budget)
        self.saves = saves
        self.channels_last = channels_last
        #: a stage that writes its input in place (ReLU(inplace=True)) runs eagerly: compiled, its graph mutates
        #: the input after saving it, and under a low budget the backward then finds the saved tensor changed
        #: (seen with ResNet's relu stage at budget 0, on the H100 and the CPU)
        self.eager = may_write_input(inner)
        compiled: Callable[..., Any] = (
            inner
            if self.eager
            else torch.compile(inner, dynamic=False, backend=budget_backend(self.budget, saves, channels_last))
        )
        # not a submodule: the parameters are ``inner``'s, listed once (state_dict, optimizers)
        object.__setattr__(self, "_compiled", compiled)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        compiled: Callable[..., Any] = self.__dict__["_compiled"]
        return compiled(*args, **kwargs)

    def extra_repr(self) -> str:
        if self.eager:
            return "eager: writes its input in place"
        layout = ", convolutions channels-last" if self.channels_last else ""
        return f"activation_memory_budget={self.budget}{layout}"


def eager_module(module: nn.Module) -> nn.Module:
    """The eager module behind a ``CompiledStage`` (the module itself otherwise)."""
    return module.inner if isinstance(module, CompiledStage) else module


def compiled_chain(chain: ModelChain, budget: float) -> ModelChain:
    """``chain`` with every stage compiled under ``budget`` (shares its parameters; NOTE [ Compiled stages ]), in the
    layout the compiler gives all the stages' convolutions together (``regions_channels_last``)."""
    modules = [eager_module(s.module) for s in chain.stages]
    layout = regions_channels_last(modules)
    stages = [
        Stage(s.name, s.kind, CompiledStage(m, budget, channels_last=layout))
        for s, m in zip(chain.stages, modules, strict=True)
    ]
    return dataclasses.replace(chain, stages=stages, params=dict(chain.params))
