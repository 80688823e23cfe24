"""vDNN's own memory accounting (Rhu et al. 2016, sections 2.2-3.2), beside memtune's simulator.

# NOTE [ vDNN accounting ]
memtune's simulator counts memory as PyTorch's autograd allocates it (NOTE [ Simulator memory accounting ] in
``memtune.tuner.simulator``). vDNN ran its own cuDNN layers with its own allocator, and counted differently; this module
walks a chain of layers (one stage = one layer) by the paper's rules, so that its figures can be reproduced and
the two accountings compared number by number:

* Buffers. A layer's output ``Y`` is a new buffer unless the layer works in place (activations, footnote 1:
  "Both Caffe and Torch leverage this in-place memory optimization for the activation layers"), whose ``Y`` is
  its ``X``. Weights ``W`` and weight gradients ``dW`` are resident for the whole step (optimizer state is not
  counted: the paper does not).
* Baseline (section 2.3, Figure 2): network-wide. Every feature map of the forward, ``W`` and ``dW``, one ``dX``
  and one ``dY`` buffer sized to the largest gradient map and reused by every layer, and one workspace sized to the
  largest any layer's chosen algorithms need. Its maximum and average are equal.
* vDNN (section 3.1): layer-wise. Forward of layer n holds ``X``, ``Y``, its forward workspace, and every earlier
  map still needed in backward that was not offloaded; an offloaded ``X`` is freed at the end of the layer that
  offloads it (the streams synchronise there). Backward of layer n holds what it reads (a convolution or a
  linear: ``X``; an activation: ``Y``; a pooling: ``X`` and ``Y``), its incoming ``dY``, its ``dX`` (none for an
  in-place activation, which writes ``dX`` over ``dY``), its backward workspace, every map a later-in-backward
  layer still needs, and the map ``findPrefetchLayer`` (Figure 8) brought back at its start: the closest earlier
  offloaded layer not yet prefetched, searching no further than the closest convolution. After layer n, ``Y`` and
  ``dY`` are freed; ``X`` stays while an earlier layer reads it.
* Offloaded layers: vDNN_all offloads the ``X`` of every layer but the activations, which "only use Y and dY"
  (section 3.2); vDNN_conv the ``X`` of the convolutions.

Where PyTorch differs (the docs give the numbers): an activation's backward makes a new ``dX``
(``threshold_backward`` is out of place), so an in-place ReLU's backward holds one more map; an in-place
activation's output is saved for backward, so an offloading ReLU offloads the map the next layer also saves;
the optimizer's momentum is resident; and the prefetch is the plan's ``prefetch_lookahead`` stages ahead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memtune.profiler import Profile, StageProfile
from memtune.tuner._conv_choice import choose_algorithms
from memtune.tuner.plan import Action, Plan
from memtune.tuner.policies.storage_map import is_conv

__all__ = ["PaperMemory", "find_prefetch_layer", "paper_memory"]

_ACTIVATIONS = frozenset({"relu", "relu6", "leakyrelu", "elu", "sigmoid", "tanh", "gelu", "silu"})
_POOLS = frozenset({"maxpool2d", "avgpool2d"})


@dataclass(frozen=True)
class PaperMemory:
    """A step's GPU memory by vDNN's accounting (NOTE [ vDNN accounting ]), bytes.

    Attributes:
        max_bytes: the largest allocation over the step (Figure 9's "maximum").
        avg_bytes: the mean over the layers' forward and backward steps (Figure 9's "average").
        offloaded_bytes: the maps copied to pinned host memory (Figure 10).
        peak_layer: ``"fwd <n>"`` or ``"bwd <n>"``, where the maximum falls.
        peak_parts: the maximum's bytes by what holds them: ``W and dW`` (weights and their gradients), ``feature
            maps`` (every map live then, prefetched ones included), ``gradient maps`` (the layer's ``dY`` and ``dX``)
            and ``workspace``; they sum to ``max_bytes``.
    """

    max_bytes: int
    avg_bytes: float
    offloaded_bytes: int
    peak_layer: str
    peak_parts: tuple[tuple[str, int], ...] = ()


def _is_activation(st: StageProfile) -> bool:
    return st.inplace and st.kind in _ACTIVATIONS


def _reads_backward(st: StageProfile, x: int, y: int) -> tuple[int, ...]:
    """The buffers layer ``st`` reads in its backward: ``x`` its input's, ``y`` its output's."""
    if _is_activation(st):
        return (y,)
    if st.kind in _POOLS:
        return (x, y)
    if is_conv(st) or st.kind == "linear":
        return (x,)
    return ()


def find_prefetch_layer(current: int, offloaded: Sequence[bool], prefetched: list[bool], convs: Sequence[bool]) -> int:
    """vDNN's Figure 8: the closest layer below ``current`` that offloaded and is not prefetched, searching no
    further than the closest convolution; marks it prefetched. -1 when there is none."""
    for i in range(current - 1, -1, -1):
        if offloaded[i] and not prefetched[i]:
            prefetched[i] = True
            return i
        if convs[i]:
            return -1
    return -1


def _workspaces(profile: Profile, plan: Plan) -> tuple[list[int], list[int]]:
    fwd, bwd = [0] * profile.n_stages, [0] * profile.n_stages
    for key, triple in choose_algorithms(profile, plan, check=False).items():
        k = int(key.partition(".")[0])
        fwd[k] = max(fwd[k], triple.fwd.workspace_bytes)
        bwd[k] = max(bwd[k], triple.bwd_data.workspace_bytes, triple.bwd_filter.workspace_bytes)
    return fwd, bwd


def _buffers(profile: Profile) -> tuple[list[int], list[int], list[int]]:
    """Per layer the buffer id of its X and of its Y, and each buffer's bytes (buffer 0: the model input)."""
    size = [profile.input_bytes]
    xs, ys = [], []
    cur = 0
    for st in profile.stages:
        xs.append(cur)
        if not st.inplace:
            size.append(st.output_bytes)
            cur = len(size) - 1
        ys.append(cur)
    return xs, ys, size


def paper_memory(profile: Profile, plan: Plan) -> PaperMemory:
    """Maximum and average memory of one step of ``plan`` by vDNN's accounting (NOTE [ vDNN accounting ]).

    The plan's ``offload`` stages offload their input map (in-place layers never do: their input is their output); every
    other stage keeps. Convolution workspaces are the plan's chosen algorithms' (``memtune.tuner._conv_choice``; none
    when the profile has no algorithm tables). A plan with no offload stage is the network-wide baseline.

    Raises:
        ValueError: the plan recomputes or runs stages selectively, which vDNN has no rule for.
    """
    if any(a not in (Action.KEEP, Action.OFFLOAD) for a in plan.actions):
        raise ValueError("vDNN's accounting knows keep and offload only; the plan recomputes")
    stages = profile.stages
    n = len(stages)
    weights = 2 * sum(st.param_bytes for st in stages)  # W and dW
    ws_f, ws_b = _workspaces(profile, plan)
    xs, ys, size = _buffers(profile)
    offloaded = [plan.actions[k] is Action.OFFLOAD and not stages[k].inplace for k in range(n)]
    if not any(offloaded):
        grad = max(st.output_bytes for st in stages)
        parts = _parts(weights, sum(size), 2 * grad, max(ws_f + ws_b))
        total = sum(b for _, b in parts)
        return PaperMemory(total, float(total), 0, "network-wide", parts)
    reads = [_reads_backward(st, xs[k], ys[k]) for k, st in enumerate(stages)]
    last_bwd = {b: min(k for k in range(n) if b in reads[k]) for r in reads for b in r}  # lowest layer reading b
    first_bwd = {b: max(k for k in range(n) if b in reads[k]) for r in reads for b in r}
    off_buf = {xs[k] for k in range(n) if offloaded[k]}
    samples: list[tuple[int, str, tuple[tuple[str, int], ...]]] = []
    live: set[int] = {0}
    for k in range(n):  # forward
        live.add(ys[k])
        parts = _parts(weights, sum(size[b] for b in live), 0, ws_f[k])
        samples.append((sum(b for _, b in parts), f"fwd {k}", parts))
        if offloaded[k] and xs[k] != ys[k]:
            live.discard(xs[k])
        live = {b for b in live if b in first_bwd and (b not in off_buf or b == ys[k])} | {ys[k]}
    convs = [is_conv(st) for st in stages]
    prefetched = [False] * n
    grad_in = stages[-1].output_bytes  # dY of the last layer: the loss's gradient
    for k in range(n - 1, -1, -1):  # backward
        p = find_prefetch_layer(k, offloaded, prefetched, convs)
        if p >= 0:
            live.add(xs[p])
        live |= set(reads[k]) & off_buf  # brought back on demand if no search found it
        grad_out = 0 if _is_activation(stages[k]) else size[xs[k]]
        parts = _parts(weights, sum(size[b] for b in live), grad_in + grad_out, ws_b[k])
        samples.append((sum(b for _, b in parts), f"bwd {k}", parts))
        live = {b for b in live if last_bwd.get(b, n) < k}  # Y and dY go; X stays while a lower layer reads it
        grad_in = grad_in if _is_activation(stages[k]) else grad_out
    peak, where, parts = max(samples, key=lambda s: (s[0], s[1]))  # ties: the later label
    offloaded_bytes = sum(size[b] for b in off_buf)
    return PaperMemory(peak, sum(s[0] for s in samples) / len(samples), offloaded_bytes, where, parts)


def _parts(weights: int, maps: int, grads: int, workspace: int) -> tuple[tuple[str, int], ...]:
    """``PaperMemory.peak_parts`` of one sample, bytes."""
    return (("W and dW", weights), ("feature maps", maps), ("gradient maps", grads), ("workspace", workspace))
