"""Static vDNN policies (Rhu et al. 2016, section 3.3): offload all layers, or only the convolutions.

vDNN offloads a layer's input feature map X to pinned host memory on a memory stream while the layer
runs, synchronises the two streams at the end of that layer (``sync="layer"``) and frees X; in backward
it prefetches X while the next layer up runs its backward (section 3.2, Figure 8: the search for a layer
to prefetch stops at the closest convolution, so one offloaded layer ahead: ``prefetch_lookahead=1``).

Each static policy comes with the memory-optimal convolution algorithms (``_m``: ``memory_optimal``,
cuDNN's no-workspace implicit GEMM) or the performance-optimal ones (``_p``: ``fastest``).
"""

from __future__ import annotations

from typing import Literal

from memtune.profiler import Profile
from memtune.tuner.plan import Action, Plan
from memtune.tuner.policies.storage_map import StorageMap, is_conv

__all__ = [
    "conv_offload_stages",
    "vdnn_all",
    "vdnn_all_m",
    "vdnn_all_p",
    "vdnn_conv",
    "vdnn_conv_m",
    "vdnn_conv_p",
]

VdnnRule = Literal["memory_optimal", "fastest"]
_SUFFIX: dict[str, str] = {"memory_optimal": "m", "fastest": "p"}


def _check_rule(conv_rule: str) -> None:
    if conv_rule not in _SUFFIX:
        raise ValueError(f"vDNN conv_rule must be 'memory_optimal' or 'fastest', not {conv_rule!r}")


def conv_offload_stages(profile: Profile) -> tuple[int, ...]:
    """The stages vDNN_conv offloads: every convolution stage and every stage sharing its saved storage.

    A convolution saves its input X, which is also saved by, e.g., the in-place ReLU before it; unless
    that ReLU offloads too, X stays on the GPU (NOTE [ Plan semantics ]), so those stages are included.
    """
    storage_map = StorageMap.of(profile)
    out: set[int] = set()
    for st in profile.stages:
        if is_conv(st):
            out.update(storage_map.sharers(st.index))
    return tuple(sorted(out))


def vdnn_all(profile: Profile, budget_bytes: int, *, conv_rule: VdnnRule = "memory_optimal") -> Plan:
    """vDNN_all: offload the feature maps of every layer (the most memory-efficient vDNN policy).

    "The first option ... is to have the vDNN memory manager offload all of the Xs of all of the
    layers" (section 3.3). Every stage is ``offload`` with layer sync and one-layer prefetch.
    ``budget_bytes`` is not used: the policy is static.

    Args:
        profile: the chain's profile.
        budget_bytes: the memory budget, bytes (unused).
        conv_rule: ``memory_optimal`` (vDNN_all(m)) or ``fastest`` (vDNN_all(p)).

    Returns:
        The plan, labelled ``vdnn_all_m`` or ``vdnn_all_p``.
    """
    del budget_bytes
    _check_rule(conv_rule)
    return Plan.uniform(
        profile.n_stages,
        Action.OFFLOAD,
        sync="layer",
        prefetch_lookahead=1,
        conv_rule=conv_rule,
        label=f"vdnn_all_{_SUFFIX[conv_rule]}",
    )


def vdnn_conv(profile: Profile, budget_bytes: int, *, conv_rule: VdnnRule = "memory_optimal") -> Plan:
    """vDNN_conv: offload only the input feature maps of the convolution layers.

    "The second vDNN policy is to only offload Xs for the CONV layers and leave the remaining layers' Xs
    resident inside GPU memory" (section 3.3): convolutions run long enough to hide their copy. The
    stages of ``conv_offload_stages`` are ``offload``, the rest ``keep``; layer sync, one-layer prefetch.
    ``budget_bytes`` is not used: the policy is static.

    Args:
        profile: the chain's profile.
        budget_bytes: the memory budget, bytes (unused).
        conv_rule: ``memory_optimal`` (vDNN_conv(m)) or ``fastest`` (vDNN_conv(p)).

    Returns:
        The plan, labelled ``vdnn_conv_m`` or ``vdnn_conv_p``.
    """
    del budget_bytes
    _check_rule(conv_rule)
    offload = set(conv_offload_stages(profile))
    actions = tuple(Action.OFFLOAD if i in offload else Action.KEEP for i in range(profile.n_stages))
    return Plan(
        actions=actions,
        sync="layer",
        prefetch_lookahead=1,
        conv_rule=conv_rule,
        label=f"vdnn_conv_{_SUFFIX[conv_rule]}",
    )


def vdnn_all_m(profile: Profile, budget_bytes: int) -> Plan:
    """vDNN_all with memory-optimal convolution algorithms (see ``vdnn_all``)."""
    return vdnn_all(profile, budget_bytes, conv_rule="memory_optimal")


def vdnn_all_p(profile: Profile, budget_bytes: int) -> Plan:
    """vDNN_all with performance-optimal (fastest) convolution algorithms (see ``vdnn_all``)."""
    return vdnn_all(profile, budget_bytes, conv_rule="fastest")


def vdnn_conv_m(profile: Profile, budget_bytes: int) -> Plan:
    """vDNN_conv with memory-optimal convolution algorithms (see ``vdnn_conv``)."""
    return vdnn_conv(profile, budget_bytes, conv_rule="memory_optimal")


def vdnn_conv_p(profile: Profile, budget_bytes: int) -> Plan:
    """vDNN_conv with performance-optimal (fastest) convolution algorithms (see ``vdnn_conv``)."""
    return vdnn_conv(profile, budget_bytes, conv_rule="fastest")
