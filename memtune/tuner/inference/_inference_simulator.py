"""The latency of an inference plan: a compute engine and a host->device copy engine (NOTE [ Inference plans ])."""

from __future__ import annotations

from dataclasses import dataclass

from memtune.tuner.inference._facts import InferenceFacts, part_ms
from memtune.tuner.inference._inference_plan import InferencePlan
from memtune.tuner.inference._memory import WorkingSet, part_bytes, part_units, working_sets

__all__ = ["InferenceSim", "LayerTiming", "simulate_inference"]


@dataclass(frozen=True)
class LayerTiming:
    """One layer in the simulated run, ms from the start of the inference.

    Attributes:
        name: the layer.
        start_ms, end_ms: when its first partition starts computing and its last output copy ends.
        stall_ms: time compute waited for copies (weights, or its input coming back from the host).
    """

    name: str
    start_ms: float
    end_ms: float
    stall_ms: float


@dataclass(frozen=True)
class InferenceSim:
    """What a plan costs.

    Attributes:
        latency_ms: the whole inference, ms.
        stall_ms: compute waiting for copies, ms, summed over layers.
        h2d_bytes, d2h_bytes: bytes copied each way (weights and inputs in; outputs out).
        copies: host<->device copies made.
        peak_bytes: the largest working set, bytes.
        layers: per-layer timings, in run order.
        working_sets: per-layer working sets, in run order.
    """

    latency_ms: float
    stall_ms: float
    h2d_bytes: int
    d2h_bytes: int
    copies: int
    peak_bytes: int
    layers: tuple[LayerTiming, ...]
    working_sets: tuple[WorkingSet, ...]


class _Clock:
    """Compute and copy engines; one clock where copies do not overlap compute."""

    def __init__(self, facts: InferenceFacts) -> None:
        self.facts = facts
        self.compute_free = 0.0
        self.copy_free = 0.0
        self.h2d_bytes = 0
        self.d2h_bytes = 0
        self.copies = 0

    def h2d(self, nbytes: int, at: float) -> float:
        """Copy ``nbytes`` in, issued at ``at``; returns when it ends."""
        self.h2d_bytes += nbytes
        self.copies += 1
        if not self.facts.copies_overlap:  # the computing thread copies, then computes
            self.compute_free = max(self.compute_free, at) + self.facts.h2d_ms(nbytes)
            return self.compute_free
        self.copy_free = max(self.copy_free, at) + self.facts.h2d_ms(nbytes)
        return self.copy_free

    def d2h_inline(self, nbytes: int) -> None:
        """Copy ``nbytes`` out on the compute stream: compute waits for it."""
        self.d2h_bytes += nbytes
        self.copies += 1
        self.compute_free += self.facts.d2h_ms(nbytes)


def simulate_inference(facts: InferenceFacts, plan: InferencePlan) -> InferenceSim:
    """Price ``plan`` on ``facts``: prefetch one partition ahead, outputs to the host in line with compute
    (NOTE [ Inference plans ]). Deterministic and pure.

    Raises:
        PlanError: the plan does not fit the chain (``InferencePlan.check``).
    """
    sets = working_sets(facts, plan)
    loads: list[int] = []  # bytes of every host-prefetched partition, in run order
    for f, lp in zip(facts.layers, plan.layers, strict=True):
        if lp.weights == "host_prefetch":
            k = lp.channel_parts
            loads.extend(part_bytes(f.weight_bytes, f.units, part_units(f.units, k, p)) for p in range(k))
    clock = _Clock(facts)
    ready: dict[int, float] = {}
    if loads:
        ready[0] = clock.h2d(loads[0], 0.0)
    q = 0
    input_on_host = False
    timings: list[LayerTiming] = []
    for f, lp in zip(facts.layers, plan.layers, strict=True):
        input_ready = 0.0
        if input_on_host:  # the previous layer's output comes back whole
            input_ready = clock.h2d(f.input_bytes, clock.compute_free)
        stall = 0.0
        first = None
        for p in range(lp.channel_parts):
            need = input_ready
            if lp.weights == "host_prefetch":
                need = max(need, ready.pop(q))
            start = max(clock.compute_free, need)
            stall += start - clock.compute_free
            first = start if first is None else first
            if lp.weights == "host_prefetch":
                if q + 1 < len(loads):
                    ready[q + 1] = clock.h2d(loads[q + 1], start)
                q += 1
            units_p = part_units(f.units, lp.channel_parts, p)
            clock.compute_free = max(clock.compute_free, start) + part_ms(facts, f, lp.channel_parts, units_p)
            if lp.output == "host":
                clock.d2h_inline(part_bytes(f.output_bytes, f.units, units_p))
        input_on_host = lp.output == "host"
        timings.append(LayerTiming(f.name, first if first is not None else 0.0, clock.compute_free, stall))
    if input_on_host:  # the result comes back to the device
        clock.compute_free = clock.h2d(facts.layers[-1].output_bytes, clock.compute_free)
    return InferenceSim(
        latency_ms=clock.compute_free,
        stall_ms=sum(t.stall_ms for t in timings),
        h2d_bytes=clock.h2d_bytes,
        d2h_bytes=clock.d2h_bytes,
        copies=clock.copies,
        peak_bytes=max(ws.total_bytes for ws in sets),
        layers=tuple(timings),
        working_sets=tuple(sets),
    )
