"""Working sets of an inference plan: the device bytes each layer holds while it runs (NOTE [ Inference plans ])."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memtune.tuner.inference._facts import InferenceFacts, LayerFacts
from memtune.tuner.inference._inference_plan import InferencePlan, OutputAt, WeightsAt

__all__ = [
    "WorkingSet",
    "arriving_bytes",
    "layer_working_set",
    "model_input_held",
    "part_bytes",
    "part_units",
    "working_sets",
]


def part_units(units: int, parts: int, p: int) -> int:
    """Output channels of partition ``p`` when ``units`` split ``parts`` ways (``torch.tensor_split``'s rule: the
    first ``units % parts`` partitions have one more)."""
    return units // parts + (1 if p < units % parts else 0)


def part_bytes(total_bytes: int, units: int, n: int) -> int:
    """Bytes of ``n`` of ``units`` equal channels of a ``total_bytes`` tensor (rounded up)."""
    return -(-total_bytes * n // units)


@dataclass(frozen=True)
class WorkingSet:
    """The device bytes of one layer at its worst partition (NOTE [ Inference plans ]).

    Attributes:
        name: the layer.
        resident_bytes: the weights of every resident layer.
        input_bytes: its input.
        weight_bytes: the host-prefetched weight partition in use (0 for a resident layer: counted as resident).
        output_bytes: the output it holds.
        arriving_bytes: the weight partition being copied in for what runs next.
        model_input_bytes: the model's input, which its caller holds for the whole call, where this layer reads
            another tensor (0 where its input is the model's input, counted as ``input_bytes``).
        scratch_bytes: what the layer's kernel allocates besides its output (``LayerShape.scratch_bytes``).
    """

    name: str
    resident_bytes: int
    input_bytes: int
    weight_bytes: int
    output_bytes: int
    arriving_bytes: int
    model_input_bytes: int = 0
    scratch_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Everything on the device at that moment, bytes."""
        return (
            self.resident_bytes
            + self.model_input_bytes
            + self.input_bytes
            + self.weight_bytes
            + self.output_bytes
            + self.arriving_bytes
            + self.scratch_bytes
        )


def layer_working_set(
    f: LayerFacts,
    parts: int,
    weights: WeightsAt,
    output: OutputAt,
    *,
    resident_bytes: int,
    arriving_next: int,
    model_input_bytes: int = 0,
) -> WorkingSet:
    """The working set of layer ``f`` run in ``parts`` partitions, at its worst partition.

    Args:
        f: the layer.
        parts, weights, output: its ``LayerPlan`` fields.
        resident_bytes: the weights of every resident layer, bytes.
        model_input_bytes: the model's input where this layer does not read it, bytes (``model_input_held``).
        arriving_next: the first partition of the next host-prefetched layer after this one, bytes (0 if none): it
            arrives during this layer's last partition, or during all of it when this layer's weights are resident.
    """
    prefetched = weights == "host_prefetch"
    n_big = f.units % parts or parts
    # sizes are piecewise constant in p, so the worst partition is at a boundary of those pieces
    candidates = {p for p in (0, n_big - 1, n_big, parts - 2, parts - 1) if 0 <= p < parts}
    best: WorkingSet | None = None
    for p in sorted(candidates):
        units_p = part_units(f.units, parts, p)
        y_p = part_bytes(f.output_bytes, f.units, units_p) if parts > 1 else f.output_bytes
        if f.aliases_input:
            held = 0
        elif output == "host":
            held = y_p
        else:
            held = f.output_bytes + (y_p if parts > 1 else 0)
        own = part_bytes(f.weight_bytes, f.units, units_p) if prefetched else 0
        if prefetched and p < parts - 1:
            arriving = part_bytes(f.weight_bytes, f.units, part_units(f.units, parts, p + 1))
        else:
            arriving = arriving_next
        ws = WorkingSet(f.name, resident_bytes, f.input_bytes, own, held, arriving, model_input_bytes, f.scratch_bytes)
        if best is None or ws.total_bytes > best.total_bytes:
            best = ws
    assert best is not None  # parts >= 1: partition 0 is a candidate
    return best


def model_input_held(facts: InferenceFacts) -> list[int]:
    """Per layer, the model's input bytes its caller holds beside the layer's own input: 0 while the layers so far
    return their input's storage (the layer reads the model's input itself), the first layer's input after."""
    out = []
    same = True
    for f in facts.layers:
        out.append(0 if same else facts.layers[0].input_bytes)
        same = same and f.aliases_input
    return out


def arriving_bytes(facts: InferenceFacts, parts: Sequence[int], prefetched: Sequence[bool]) -> list[int]:
    """Per layer, the first weight partition of the next host-prefetched layer after it, bytes (0 if none)."""
    out = [0] * len(facts.layers)
    nxt = 0
    for k in range(len(facts.layers) - 1, -1, -1):
        out[k] = nxt
        if prefetched[k]:
            f = facts.layers[k]
            nxt = part_bytes(f.weight_bytes, f.units, part_units(f.units, parts[k], 0))
    return out


def working_sets(facts: InferenceFacts, plan: InferencePlan) -> list[WorkingSet]:
    """Every layer's working set under ``plan`` (checked against ``facts`` first).

    Raises:
        PlanError: the plan does not fit the chain (``InferencePlan.check``).
    """
    plan.check(facts)
    resident = sum(f.weight_bytes for f, lp in zip(facts.layers, plan.layers, strict=True) if lp.weights == "resident")
    parts = [lp.channel_parts for lp in plan.layers]
    arriving = arriving_bytes(facts, parts, [lp.weights == "host_prefetch" for lp in plan.layers])
    held = model_input_held(facts)
    return [
        layer_working_set(
            f, lp.channel_parts, lp.weights, lp.output, resident_bytes=resident, arriving_next=a, model_input_bytes=m
        )
        for f, lp, a, m in zip(facts.layers, plan.layers, arriving, held, strict=True)
    ]
