"""memtune's choice of what a compiled region saves for its backward, made inside the compiler's partitioner.

# NOTE [ Saved tensors chosen inside a compiled region ]
``torch.compile`` decides what a compiled graph saves for its backward in AOTAutograd's partitioner: it traces forward
and backward as one joint graph and cuts it so that the backward keeps some forward values and re-makes the others. Its
one knob, ``activation_memory_budget``, is a share of what the default cut saves; it is one number for the whole
graph, and it bounds nothing that the partitioner will not recompute (on the H100 ResNet-50 compiled at budget 0
peaked 10.48 GiB against 10.49 at budget 1, docs/results/torch-compile.md).

A *save rule* is memtune's own choice, applied per region: before the min-cut runs, ``SavedTags`` tags the forward
nodes of the joint graph with ``torch.utils.checkpoint.CheckpointPolicy`` in ``node.meta["recompute"]`` (the tags
PyTorch's selective checkpointing puts there when it runs under the compiler), then calls
``torch._functorch.partitioners.min_cut_rematerialization_partition``, which honours them: a ``MUST_SAVE`` node is
never recomputed, so the backward keeps its outputs; a ``MUST_RECOMPUTE`` node is always re-made in the backward from
what is kept. The rules (``SAVE_RULES``):

* ``compute``: keep the outputs of the operations that cost arithmetic (matrix products, convolutions, attention:
  ``memtune.profiler.selective.SAVED_OPS``, what memtune's selective checkpointing keeps in eager mode) and re-make
  everything else the forward computed (normalisations, activations, additions, views), which the backward's own
  kernels fuse in: selective checkpointing's policy with the compiler's fusions on both sides.

Rules leave two kinds of node untagged, for the partitioner to decide as it always does: nodes of the backward
(everything that depends on a tangent), and the getter of one output of a multi-output operation (the operation itself
is tagged). Random operations take the tag of NOTE [ Random draws kept in a compiled region ].

NOTE [ Random draws kept in a compiled region ]
Under an activation budget below 1 the partitioner may re-make a random operation in the backward, and re-made, it
draws new numbers: the backward then differentiates another mask than the forward applied. Its ban on recomputing
random operations names ``native_dropout``, ``rand_like`` and ``randn_like`` only, not ``bernoulli`` or ``rand`` (what
torchvision's stochastic depth, ``torch.empty(...).bernoulli_(p)``, becomes), and its budget search may lift any ban
but ``MUST_SAVE``; at budget 0 it keeps the graph's inputs alone. On an H200, EfficientNet-B0 compiled whole at budget
0.5 gave its blocks' last normalisation biases gradients off by their own size against float64 (root-mean-square error
5.6e-4 on gradients of 9.3e-4), where budget 1 and eager were 5.6e-10 off; on the CPU a stochastic-depth block shows it
too (``tests/unit/modules/test_saved_tags.py``). PyTorch replays a re-made draw only where it is tagged for recompute,
as a checkpoint under the compiler tags it: it saves the generator's state in the forward and draws from it again in
the backward (``functionalize_rng_ops`` in ``torch._functorch.partitioners``).

So every graph memtune compiles tags its forward's random operations itself (``KeptDraws``, the partitioner of every
``memtune.profiler.compiled.budget_backend``): ``MUST_SAVE`` (the backward keeps the draw, a mask of the size the
operation drew, as the partitioner's ban intends) where the budget is above 0, and ``MUST_RECOMPUTE`` at budget 0, where
the partitioner keeps nothing but inputs and PyTorch then replays the draw from the saved state. A node already tagged (a
checkpoint inside the region) keeps its tag. The compiler's own points that memtune measures and serves are compiled
this way too: their times and peaks are the stock compiler's but for the masks kept, and their gradients are right.

Where torch calls it (read in torch 2.11, the GPU image, and 2.13, CI, before relying on it): inductor's
``compile_fx.partition_fn`` calls ``config.custom_partitioner_fn`` in place of ``min_cut_rematerialization_partition``
when it is set, with the joint graph, its inputs and the keyword arguments it would have passed (``compiler``,
``num_fwd_outputs``, ``static_lifetime_input_indices``); it must be an instance of
``torch._inductor.custom_graph_pass.CustomPartitionerFn`` (an ``ABC`` in 2.11, a ``CustomPassBase`` in 2.13, both
with ``__call__`` and ``uuid``), whose ``uuid`` keys inductor's cache of compiled graphs. ``must_recompute`` reads
``MUST_RECOMPUTE`` and ``PREFER_RECOMPUTE`` alike, and ``should_ban_recomputation`` answers "marked MUST_SAVE", in both
versions. memtune sets the partitioner through ``compile_fx``'s ``config_patches`` for the graphs of one backend
(``memtune.profiler.compiled.budget_backend(1.0, saves=rule)``) and nowhere else.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Sequence
from typing import Any, get_args

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomPartitionerFn, get_hash_for_files
from torch.utils.checkpoint import CheckpointPolicy

from memtune.profiler._profile import SaveRule
from memtune.profiler.selective import SAVED_OPS

__all__ = ["SAVE_RULES", "KeptDraws", "SavedTags", "forward_nodes", "tag_draws"]

#: the save rules memtune measures compiled regions under (NOTE [ Saved tensors chosen inside a compiled region ])
SAVE_RULES: tuple[str, ...] = get_args(SaveRule)


def _is_random(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def forward_nodes(graph: fx.Graph) -> list[fx.Node]:
    """The operations of a joint graph's forward: every ``call_function`` node that no tangent reaches."""
    backward: set[fx.Node] = set()
    for node in graph.nodes:
        if (node.op == "placeholder" and str(node.target).startswith("tangents")) or any(
            arg in backward for arg in node.all_input_nodes
        ):
            backward.add(node)
    return [n for n in graph.nodes if n.op == "call_function" and n not in backward]


def tag_draws(graph: fx.Graph, budget: float) -> collections.Counter[str]:
    """Tag the random operations of ``graph``'s forward that carry no tag yet, for the partitioner at activation budget
    ``budget`` (NOTE [ Random draws kept in a compiled region ]); returns the tags placed, by policy name."""
    policy = CheckpointPolicy.MUST_RECOMPUTE if budget <= 0 else CheckpointPolicy.MUST_SAVE
    placed: collections.Counter[str] = collections.Counter()
    for node in forward_nodes(graph):
        if _is_random(node) and node.meta.get("recompute") is None:
            node.meta["recompute"] = policy
            placed[policy.name] += 1
    return placed


class KeptDraws(CustomPartitionerFn):
    """Inductor's min-cut partitioner with the forward's random draws kept or replayed, never drawn again (NOTE
    [ Random draws kept in a compiled region ]); the partitioner of every graph memtune compiles."""

    def __init__(self) -> None:
        super().__init__()
        #: tags placed in the graphs partitioned so far, by policy name (for tests and reports)
        self.tagged: collections.Counter[str] = collections.Counter()

    def tag(self, graph: fx.Graph) -> None:
        """Tag ``graph``'s forward random operations for the activation budget it is partitioned under."""
        import torch._functorch.config as functorch_config

        self.tagged.update(tag_draws(graph, float(functorch_config.activation_memory_budget)))

    def __call__(
        self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        self.tag(gm.graph)
        return min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)

    def uuid(self) -> Any:
        """This file: inductor's cache keeps graphs partitioned by another version of these tags apart."""
        return ("draws", get_hash_for_files((__file__,)))


class SavedTags(KeptDraws):
    """Inductor's partitioner under one of memtune's save rules (NOTE [ Saved tensors chosen inside a compiled
    region ]): tag the joint graph's forward, then run the min-cut partitioner, which honours the tags.

    Args:
        rule: one of ``SAVE_RULES``.

    Raises:
        ValueError: ``rule`` is not one of ``SAVE_RULES``.
    """

    def __init__(self, rule: str) -> None:
        super().__init__()
        if rule not in SAVE_RULES:
            raise ValueError(f"save rule {rule!r} is not one of {', '.join(SAVE_RULES)}")
        self.rule = rule

    def tag(self, graph: fx.Graph) -> None:
        """Put this rule's tags on ``graph``'s forward nodes, and the draws' (``KeptDraws``)."""
        super().tag(graph)
        for node in forward_nodes(graph):
            if node.target is operator.getitem or _is_random(node):
                continue
            policy = CheckpointPolicy.MUST_SAVE if node.target in SAVED_OPS else CheckpointPolicy.MUST_RECOMPUTE
            node.meta["recompute"] = policy
            self.tagged[policy.name] += 1

    def uuid(self) -> Any:
        """This file and the rule: inductor's cache keeps graphs of one rule apart from another's."""
        return (self.rule, get_hash_for_files((__file__,)))
