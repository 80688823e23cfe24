"""The inference planner: the fewest output-channel partitions that fit a working-set budget, then residency where it
pays (NOTE [ Inference plans ])."""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass

from memtune.tuner.budget import format_bytes
from memtune.tuner.inference._facts import InferenceFacts, LayerFacts, part_ms
from memtune.tuner.inference._inference_plan import InferencePlan, LayerFitError, LayerPlan, OutputAt, WeightsAt
from memtune.tuner.inference._inference_simulator import simulate_inference
from memtune.tuner.inference._memory import (
    WorkingSet,
    arriving_bytes,
    layer_working_set,
    model_input_held,
    part_bytes,
    part_units,
    working_sets,
)

__all__ = ["plain_plan", "plan_inference"]

SizeFn = Callable[[int, OutputAt, int], int]
"""A layer's working set, bytes, at (partitions, output place, bytes of the weight partition arriving)."""


def plan_inference(facts: InferenceFacts, budget_bytes: int, *, residency: bool = True) -> InferencePlan:
    """The plan that fits every layer's working set within ``budget_bytes`` (NOTE [ Inference plans ]).

    Everything resident and whole when that fits. Otherwise every layer with weights prefetches them from host
    memory in the fewest output-channel partitions that fit; then, with ``residency``, layers turn resident one at a
    time, each time the one whose residency lowers the simulated latency most, while some does.

    Args:
        facts: the chain's layers and host link.
        budget_bytes: the most device memory any layer may hold while it runs, bytes.
        residency: try resident weights where they fit and pay; False keeps every layer's weights on the host.

    Raises:
        LayerFitError: a layer does not fit even at one output channel per partition with every weight on the host;
            the message names it, its least working set and the budget.
    """
    if budget_bytes < 1:
        raise LayerFitError(f"the budget must be at least one byte, not {budget_bytes}", layer=facts.layers[0].name,
                            need_bytes=1, budget_bytes=budget_bytes)  # fmt: skip
    plain = plain_plan(facts, budget_bytes=budget_bytes)
    if max(ws.total_bytes for ws in working_sets(facts, plain)) <= budget_bytes:
        return plain
    layout = _fit(facts, budget_bytes, frozenset(), None)
    plan = layout.plan(facts, budget_bytes)
    if not residency:
        return plan
    best_ms = simulate_inference(facts, plan).latency_ms
    resident: frozenset[int] = frozenset()
    while True:
        tried: list[tuple[float, frozenset[int], _Layout]] = []
        for k, f in enumerate(facts.layers):
            if not f.has_weights or k in resident:
                continue
            try:
                cand = _fit(facts, budget_bytes, resident | {k}, layout)
            except LayerFitError:
                continue
            tried.append((simulate_inference(facts, cand.plan(facts, budget_bytes)).latency_ms, resident | {k}, cand))
        if not tried:
            return plan
        ms, chosen, cand = min(tried, key=lambda t: t[0])
        if ms >= best_ms:
            return plan
        best_ms, resident, layout = ms, chosen, cand
        plan = layout.plan(facts, budget_bytes)


def plain_plan(facts: InferenceFacts, **fields: object) -> InferencePlan:
    """The plain model as a plan of ``facts``: every layer whole and resident, convolutions as the facts timed them
    (``fields`` add ``budget_bytes`` and the like)."""
    return InferencePlan.resident([f.name for f in facts.layers], model=facts.model, label="resident",
                                  conv_workspace=facts.conv_workspace, **fields)  # fmt: skip


@dataclass
class _Layout:
    """A plan under construction: per layer, partitions, output place and whether the weights are resident."""

    parts: list[int]
    output: list[OutputAt]
    resident: frozenset[int]

    def weights(self, facts: InferenceFacts, k: int) -> WeightsAt:
        return "host_prefetch" if facts.layers[k].has_weights and k not in self.resident else "resident"

    def plan(self, facts: InferenceFacts, budget_bytes: int) -> InferencePlan:
        layers = tuple(
            LayerPlan(name=f.name, channel_parts=self.parts[k], weights=self.weights(facts, k), output=self.output[k])
            for k, f in enumerate(facts.layers)
        )
        return InferencePlan(model=facts.model, budget_bytes=budget_bytes, layers=layers, label="mmcnn",
                             conv_workspace=facts.conv_workspace)  # fmt: skip


def _fit(facts: InferenceFacts, budget: int, resident: Set[int], start: _Layout | None) -> _Layout:
    """The fewest partitions that fit with ``resident`` layers' weights on the device: raise a layer's own partitions
    until its working set fits, else the partitions of the layer whose first weight partition arrives during it.
    Partition counts only grow, and every working set shrinks as they do, so this ends. ``start`` gives lower bounds
    (a fit with fewer resident layers needs no more partitions than one with more)."""
    n = len(facts.layers)
    res = frozenset(resident)
    parts = [1 if start is None or k in res else start.parts[k] for k in range(n)]
    layout = _Layout(parts, ["device"] * n, res)
    resident_bytes = sum(facts.layers[k].weight_bytes for k in res)
    held = model_input_held(facts)
    _check_least(facts, layout, budget, resident_bytes)
    changed = True
    while changed:
        changed = False
        prefetched = [layout.weights(facts, k) == "host_prefetch" for k in range(n)]
        arriving = arriving_bytes(facts, layout.parts, prefetched)
        for k in reversed(range(n)):  # later layers first: their own splits shrink what arrives during earlier ones
            f = facts.layers[k]
            weights = layout.weights(facts, k)

            def size(
                parts: int, out: OutputAt, nxt: int, f: LayerFacts = f, w: WeightsAt = weights, m: int = held[k]
            ) -> int:
                ws = layer_working_set(f, parts, w, out, resident_bytes=resident_bytes, arriving_next=nxt,
                                       model_input_bytes=m)  # fmt: skip
                return ws.total_bytes

            if size(layout.parts[k], layout.output[k], arriving[k]) <= budget:
                continue
            own = _own_fit(facts, f, layout.parts[k], arriving[k], budget, size)
            if own is not None:
                layout.parts[k], layout.output[k] = own
            else:
                _shrink_arriving(facts, layout, k, budget, size)
            changed = True
            break  # the arriving partitions changed: recompute them
    return layout


def _check_least(facts: InferenceFacts, layout: _Layout, budget: int, resident_bytes: int) -> None:
    """Raise ``LayerFitError`` for the layer that needs the most when every layer is split one output channel per
    partition (its output to the host where it makes one): then every working set is at its least at once, so the
    largest of them is the least budget that fits."""
    n = len(facts.layers)
    prefetched = [layout.weights(facts, k) == "host_prefetch" for k in range(n)]
    finest = [facts.layers[k].units for k in range(n)]
    arriving = arriving_bytes(facts, finest, prefetched)
    held = model_input_held(facts)
    least: list[WorkingSet] = []
    for k, f in enumerate(facts.layers):
        out: OutputAt = "host" if f.units > 1 and not f.aliases_input else "device"
        least.append(layer_working_set(f, finest[k], layout.weights(facts, k), out, resident_bytes=resident_bytes,
                                       arriving_next=arriving[k], model_input_bytes=held[k]))  # fmt: skip
    k = max(range(n), key=lambda i: least[i].total_bytes)
    if least[k].total_bytes > budget:
        raise LayerFitError(_too_big(facts.layers[k], least[k], budget), layer=facts.layers[k].name,
                            need_bytes=least[k].total_bytes, budget_bytes=budget)  # fmt: skip


def _least(lo: int, hi: int, fits: Callable[[int], bool]) -> int | None:
    """The least ``k`` in ``lo..hi`` with ``fits(k)``, where fitting is monotone in ``k``; None if ``hi`` does not."""
    if lo > hi or not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _own_fit(
    facts: InferenceFacts, f: LayerFacts, lo: int, nxt: int, budget: int, size: SizeFn
) -> tuple[int, OutputAt] | None:
    """The fewest partitions (at least ``lo``) that fit layer ``f`` with the output on the device, or sent to the
    host (two partitions at least), whichever the layer's estimated time prefers; None when neither fits."""
    on_device = _least(lo, f.units, lambda k: size(k, "device", nxt) <= budget)
    to_host = _least(max(lo, 2), f.units, lambda k: size(k, "host", nxt) <= budget) if not f.aliases_input else None
    options: list[tuple[float, int, OutputAt]] = []
    if on_device is not None:
        options.append((_layer_ms(facts, f, on_device, "device"), on_device, "device"))
    if to_host is not None:
        options.append((_layer_ms(facts, f, to_host, "host"), to_host, "host"))
    if not options:
        return None
    _, parts, out = min(options, key=lambda o: (o[0], o[2] != "device"))
    return parts, out


def _layer_ms(facts: InferenceFacts, f: LayerFacts, parts: int, out: OutputAt) -> float:
    """A layer's own time run ``parts`` ways: its partitions, and under ``output="host"`` its output's copies out and
    back (the weight copies, the same whatever the split, are left out)."""
    if parts == 1:
        return f.forward_ms
    ms = 0.0
    n_big = f.units % parts  # partitions with one channel more
    for units_p, count in ((f.units // parts + 1, n_big), (f.units // parts, parts - n_big)):
        one = part_ms(facts, f, parts, units_p)
        if out == "host":
            one += facts.d2h_ms(part_bytes(f.output_bytes, f.units, units_p))
        ms += count * one
    if out == "host":
        ms += facts.h2d_ms(f.output_bytes)
    return ms


def _shrink_arriving(facts: InferenceFacts, layout: _Layout, k: int, budget: int, size: SizeFn) -> None:
    """Layer ``k`` cannot fit by its own partitions: split the next host-prefetched layer more, so that its first
    partition, arriving during layer ``k``, is smaller; then fit layer ``k`` itself. ``_check_least`` has made sure
    that one output channel per partition of both fits."""
    f = facts.layers[k]
    j = next(i for i in range(k + 1, len(facts.layers)) if layout.weights(facts, i) == "host_prefetch")
    g = facts.layers[j]

    def first(parts_j: int) -> int:
        return part_bytes(g.weight_bytes, g.units, part_units(g.units, parts_j, 0))

    out_least: OutputAt = "host" if f.units > 1 and not f.aliases_input else "device"
    parts_j = _least(layout.parts[j] + 1, g.units, lambda m: size(f.units, out_least, first(m)) <= budget)
    assert parts_j is not None, f"layer {f.name!r} does not fit though _check_least passed"
    layout.parts[j] = parts_j
    own = _own_fit(facts, f, layout.parts[k], first(parts_j), budget, size)
    assert own is not None  # the finest split fits by the search above
    layout.parts[k], layout.output[k] = own


def _too_big(f: LayerFacts, ws: WorkingSet, budget: int) -> str:
    """The message of ``LayerFitError``: the layer, what its least working set holds, the budget, what to do."""
    how = "at one output channel per partition" if f.units > 1 else f"whole (a {f.kind} layer is not split)"
    held = [
        ("its input", ws.input_bytes),
        ("its output" if f.units == 1 else "one output channel", ws.output_bytes),
        ("its weights" if f.units == 1 else "one channel's weights", ws.weight_bytes),
        ("the next weights arriving", ws.arriving_bytes),
        ("resident weights", ws.resident_bytes),
        ("the model's input", ws.model_input_bytes),
        ("its kernel's scratch", ws.scratch_bytes),
    ]
    shown = ", ".join(f"{what} {format_bytes(nbytes)}" for what, nbytes in held if nbytes)
    hint = "; its input alone exceeds the budget: a smaller batch or input size is the other way"
    return (
        f"layer {f.name!r} ({f.kind}) needs a working set of {format_bytes(ws.total_bytes)} even {how} ({shown}), "
        f"above the budget of {format_bytes(budget)}; raise the budget to at least {format_bytes(ws.total_bytes)}"
        f"{hint if f.input_bytes >= budget else ''}"
    )
