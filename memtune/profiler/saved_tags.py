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
is tagged). Random operations are tagged as NOTE [ Random draws kept in a compiled region ] says.

NOTE [ Random draws kept in a compiled region ]
Under an activation budget below 1 the partitioner may re-make a random operation in the backward, and re-made, it
draws new numbers: the backward then differentiates another mask than the forward applied. Its ban on recomputing
random operations names ``native_dropout``, ``rand_like`` and ``randn_like`` only, not ``bernoulli`` or ``rand`` (what
torchvision's stochastic depth, ``torch.empty(...).bernoulli_(p)``, becomes), and its budget search may lift any ban
but ``MUST_SAVE``; at budget 0 it keeps the graph's inputs alone. On an H200, EfficientNet-B0 compiled whole at budget
0.5 gave its blocks' last normalisation biases gradients off by their own size against float64 (root-mean-square error
5.6e-4 on gradients of 9.3e-4), where budget 1 and eager were 5.6e-10 off (its random numbers drawn as eager draws
them, as memtune's gradient checks run; ``benchmarks.float64_gradients``). On the CPU a block with stochastic depth
and a dropout shows it at budgets 0.5, 0.25 and 0 with inductor's own random kernels too: the backward's mask is not
the forward's (``tests/unit/modules/test_saved_tags.py``). PyTorch replays a re-made draw only where it is tagged
for recompute, as a checkpoint under the compiler tags it: it saves the generator's state in the forward and draws
from it again in the backward (``functionalize_rng_ops`` in ``torch._functorch.partitioners``).

So every graph memtune compiles lets the partitioner choose as it would, then keeps or replays what it would draw
again (``KeptDraws``, the partitioner of every ``memtune.profiler.compiled.budget_backend``): a trial partition of a
copy of the joint graph names the random operations of the forward that the backward would re-make; a small one
(``SAVED_DRAW_BYTES``: inductor's seeds, which its own random kernels draw from, or a per-sample mask) is tagged
``MUST_SAVE``, a large one (a dropout's mask) ``MUST_RECOMPUTE``, and the graph is partitioned for real: PyTorch then
saves the generator's state for each in the forward and replays it in the backward (``tag_redrawn``; the trial repeats
while the tags move the cut onto other draws, and after three trials every untagged draw is tagged). At budget 0 the
partitioner keeps the inputs alone and reads no tag, so a graph with draws is partitioned just above it
(``NEAR_ZERO``), where everything else it may re-make is still re-made. The rest of what the backward keeps is the
partitioner's own choice, so the compiler's points that memtune measures and serves keep about the stock compiler's
peaks and times, with right gradients. A node already tagged (a save rule's, or a checkpoint's inside the region)
keeps its tag. NOTE: ``has_recomputable_rng_ops`` and ``functionalize_rng_ops`` (the
replay), ``choose_saved_values_set`` (the budget search that keeps ``MUST_SAVE`` nodes, and returns the inputs alone
at budget 0) read in torch 2.13. On torch 2.11 (the GPU image) the CPU tests passed for an earlier form that tagged
every draw (``MUST_SAVE`` at budgets 0.25 to 1, ``MUST_RECOMPUTE`` at 0), which uses the same two mechanisms; this
form's trial partitions have not run on 2.11 yet.

Where torch calls it (read in torch 2.11, the GPU image, and 2.13, CI, before relying on it): inductor's
``compile_fx.partition_fn`` calls ``config.custom_partitioner_fn`` in place of ``min_cut_rematerialization_partition``
when it is set, with the joint graph, its inputs and the keyword arguments it would have passed (``compiler``,
``num_fwd_outputs``, ``static_lifetime_input_indices``); it must be an instance of
``torch._inductor.custom_graph_pass.CustomPartitionerFn`` (an ``ABC`` in 2.11, a ``CustomPassBase`` in 2.13, both
with ``__call__`` and ``uuid``), whose ``uuid`` keys inductor's cache of compiled graphs. ``must_recompute`` reads
``MUST_RECOMPUTE`` and ``PREFER_RECOMPUTE`` alike, and ``should_ban_recomputation`` answers "marked MUST_SAVE", in both
versions. memtune sets the partitioner through ``compile_fx``'s ``config_patches`` for the graphs of its own backends
(``memtune.profiler.compiled.budget_backend``: a save rule's ``SavedTags`` at budget 1, ``KeptDraws`` otherwise) and
nowhere else.
"""

from __future__ import annotations

import collections
import copy
import operator
from collections.abc import Sequence
from typing import Any, get_args

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomPartitionerFn, get_hash_for_files
from torch.utils.checkpoint import CheckpointPolicy

from memtune.profiler._profile import SaveRule
from memtune.profiler.selective import SAVED_OPS

__all__ = ["NEAR_ZERO", "SAVED_DRAW_BYTES", "SAVE_RULES", "KeptDraws", "SavedTags", "forward_nodes", "tag_redrawn"]

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


_TRIALS = 3

#: a draw of at most this many bytes that the backward would re-make is kept instead of replayed: inductor's seeds (a
#: few int64s, what its own random kernels draw from), a stochastic depth's per-sample mask
SAVED_DRAW_BYTES = 64 * 1024


#: the activation budget a graph with random draws is partitioned under where 0 is asked: at 0 the partitioner keeps
#: the graph's inputs alone and honours no tag, just above it everything it may re-make is re-made but what is tagged
NEAR_ZERO = 1e-9


def _draw_bytes(node: fx.Node) -> int:
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (tuple, list)) else (vals,)
    return sum(v.numel() * v.element_size() for v in vals if isinstance(v, torch.Tensor))


def tag_redrawn(gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any) -> collections.Counter[str]:
    """Tag every untagged random operation of ``gm``'s forward that the min-cut partitioner, as ``gm`` is tagged now,
    would re-make in the backward: ``MUST_SAVE`` where it draws at most ``SAVED_DRAW_BYTES``, else ``MUST_RECOMPUTE``,
    which PyTorch replays from the generator's saved state (NOTE [ Random draws kept in a compiled region ]); returns
    the tags placed, by policy name. Trial partitions run on copies of the graph until one re-makes no untagged draw;
    after ``_TRIALS`` of them every untagged draw of the forward is tagged."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    placed: collections.Counter[str] = collections.Counter()
    for trial in range(_TRIALS + 1):
        untagged = [n for n in forward_nodes(gm.graph) if _is_random(n) and n.meta.get("recompute") is None]
        if untagged and trial < _TRIALS:
            copy_ = fx.GraphModule(gm, copy.deepcopy(gm.graph))
            _, backward = min_cut_rematerialization_partition(copy_, joint_inputs, **kwargs)
            again = {n.name for n in backward.graph.nodes if n.op == "call_function" and _is_random(n)}
            untagged = [n for n in untagged if n.name in again]
        if not untagged:
            break
        for node in untagged:
            small = _draw_bytes(node) <= SAVED_DRAW_BYTES
            policy = CheckpointPolicy.MUST_SAVE if small else CheckpointPolicy.MUST_RECOMPUTE
            node.meta["recompute"] = policy
            placed[policy.name] += 1
    return placed


class KeptDraws(CustomPartitionerFn):
    """Inductor's min-cut partitioner with the random draws it would re-make in the backward kept or replayed, never
    drawn again (NOTE [ Random draws kept in a compiled region ]); the partitioner of every graph memtune compiles."""

    def __init__(self) -> None:
        super().__init__()
        #: tags placed in the graphs partitioned so far, by policy name (for tests and reports)
        self.tagged: collections.Counter[str] = collections.Counter()

    def tag(self, graph: fx.Graph) -> None:
        """A save rule's tags on ``graph``'s forward, placed before the draws'; none here."""

    def __call__(
        self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        import torch._functorch.config as functorch_config
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        self.tag(gm.graph)
        budget = functorch_config.activation_memory_budget
        drawn = any(_is_random(n) for n in forward_nodes(gm.graph))
        # at budget 0 the partitioner keeps the inputs alone, tags or not: just above it, it honours MUST_SAVE
        with functorch_config.patch(activation_memory_budget=NEAR_ZERO if drawn and budget <= 0 else budget):
            self.tagged.update(tag_redrawn(gm, joint_inputs, **kwargs))
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
        """Put this rule's tags on ``graph``'s forward nodes (random operations are ``KeptDraws``')."""
        for node in forward_nodes(graph):
            if node.target is operator.getitem or _is_random(node):
                continue
            policy = CheckpointPolicy.MUST_SAVE if node.target in SAVED_OPS else CheckpointPolicy.MUST_RECOMPUTE
            node.meta["recompute"] = policy
            self.tagged[policy.name] += 1

    def uuid(self) -> Any:
        """This file and the rule: inductor's cache keeps graphs of one rule apart from another's."""
        return (self.rule, get_hash_for_files((__file__,)))
