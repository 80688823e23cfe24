"""Measure each stage's transients with its convolutions run by their memory-optimal algorithms.

A stage's measured transient (``StageProfile.forward_workspace_bytes``, ``backward_workspace_bytes``) holds the
workspace of the framework's convolution algorithms *and* everything else the stage allocates for a moment
(a batch norm's or a residual sum's gradients). A plan that chooses the algorithms replaces the first part only;
this module measures the second, as NOTE [ Lean transients ] in ``memtune.tuner.simulator`` uses it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from memtune.profiler import ModelChain, Profile
from memtune.profiler.measure import chained_backward_bytes, model_input, stage_workspaces
from memtune.profiler.stagefacts import torch_dtype
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Plan
from memtune.tuner.runtime.conv import apply_conv_choices

__all__ = ["measure_lean_transients"]


def measure_lean_transients(
    chain: ModelChain, profile: Profile, *, progress: Callable[[str, int, int], None] | None = None
) -> Profile:
    """``profile`` with every stage's ``chained_backward_bytes`` measured, and, where the profile has cuDNN algorithm
    tables, the ``lean_{forward,backward}_workspace_bytes`` of every stage that has convolutions.

    Each stage is fed the input the chain gives it; its forward is measured as
    ``memtune.profiler.measure.stage_workspaces`` does, its backward as
    ``memtune.profiler.measure.chained_backward_bytes`` (above the gradients it makes), with every
    convolution of the chain swapped for a ``ChosenConv2d`` running the memory-optimal triple of the
    profile's tables (unsplit: ``memtune.tuner._conv_choice.select_algo``'s ``memory_optimal`` rule). Stages without
    convolutions keep None. CUDA only; the chain's modules are moved to the GPU in training mode.

    Args:
        chain: the model the profile was measured on.
        profile: a profile of this GPU's type (with cuDNN algorithm tables for the lean transients).
        progress: ``progress(stage_name, done, total)`` after each stage.

    Raises:
        PlanError: the profile does not match the chain.
        ProfilerError: CUDA is not available.
    """
    if len(chain.stages) != profile.n_stages:
        raise PlanError(
            f"the model has {len(chain.stages)} stages but profile {profile.model!r} has {profile.n_stages}"
        )
    if not torch.cuda.is_available():
        from memtune.profiler import ProfilerError

        raise ProfilerError("measuring transients needs a CUDA device")
    dev = torch.device("cuda")
    torch_dtype(profile.dtype)
    for stage in chain.stages:
        stage.module.to(dev).train()
    plan = Plan.uniform(profile.n_stages, conv_rule="memory_optimal")
    stages = list(profile.stages)
    # every stage's backward as in a chain, with the framework's algorithms (NOTE [ Backward transient ])
    x = model_input(chain, profile.batch, dev)
    for i, stage in enumerate(chain.stages):
        chained = chained_backward_bytes(stage, x, input_needs_grad=i > 0, dtype=profile.dtype)
        stages[i] = stages[i].model_copy(update={"chained_backward_bytes": chained})
        with torch.no_grad(), _autocast(profile.dtype):
            x = stage.module(x)
        if progress is not None and not profile.has_conv_algos:
            progress(stage.name, i + 1, len(chain.stages))
    if profile.has_conv_algos:
        with apply_conv_choices(chain, plan, profile):
            x = model_input(chain, profile.batch, dev)
            for i, stage in enumerate(chain.stages):
                if profile.stages[i].convs:
                    fwd, _ = stage_workspaces(stage, x, input_needs_grad=i > 0, dtype=profile.dtype)
                    bwd = chained_backward_bytes(stage, x, input_needs_grad=i > 0, dtype=profile.dtype)
                    stages[i] = stages[i].model_copy(
                        update={"lean_forward_workspace_bytes": fwd, "lean_backward_workspace_bytes": bwd}
                    )
                with torch.no_grad(), _autocast(profile.dtype):
                    x = stage.module(x)
                if progress is not None:
                    progress(stage.name, i + 1, len(chain.stages))
    torch.cuda.empty_cache()
    return profile.model_copy(update={"stages": tuple(stages)})


def _autocast(dtype: str) -> torch.autocast:
    return torch.autocast("cuda", dtype=torch_dtype(dtype), enabled=dtype != "float32")
