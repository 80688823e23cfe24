"""What one simulated training step costs (``SimResult``), the simulator's answer (``memtune.tuner.simulator``)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SimResult"]


@dataclass(frozen=True)
class SimResult:
    """What one simulated training step costs.

    Attributes:
        step_ms: wall time of forward + backward, ms.
        peak_bytes: maximum of the memory timeline, bytes.
        forward_ms / backward_ms: compute-stream end of each phase, ms (backward_ms is its duration).
        recompute_ms: extra forward time spent re-running recompute segments and selective stages' cheap operations, ms.
        stall_ms: total time compute waited for copies, ms.
        forward_stalls_ms / backward_stalls_ms: per stage, ms.
        d2h_bytes / h2d_bytes: bytes copied each way.
        timeline: ``(time ms, live bytes, label)`` after each event, when asked for.
        blocks: the same events tensor by tensor, ``("alloc" | "free", key, bytes)`` in program order, when a
            timeline is asked for (NOTE [ Allocator placement ] in ``memtune.tuner.placement`` replays them).
        spans: when a timeline is asked for, what the copy engines and the backward ran when: ``("d2h" | "h2d",
            storage id in ``Simulator.tables``, start ms, end ms)`` per copy and ``("backward", stage, start ms, end
            ms)`` per stage (``memtune.tuner._ranks`` prices a shared host link with them).
        host_ms: the host's time to issue the step (NOTE [ Host issue time ] in ``memtune.tuner._host_time``), ms;
            ``step_ms`` is at least it; 0 where the profile has no host prices.
    """

    step_ms: float
    peak_bytes: int
    forward_ms: float
    backward_ms: float
    recompute_ms: float
    stall_ms: float
    forward_stalls_ms: tuple[float, ...]
    backward_stalls_ms: tuple[float, ...]
    d2h_bytes: int
    h2d_bytes: int
    base_bytes: int
    timeline: tuple[tuple[float, int, str], ...] = field(default=(), repr=False)
    blocks: tuple[tuple[str, object, int], ...] = field(default=(), repr=False)
    spans: tuple[tuple[str, int, float, float], ...] = field(default=(), repr=False)
    host_ms: float = 0.0

    def fits(self, budget_bytes: int) -> bool:
        """True when the simulated peak is within ``budget_bytes``."""
        return self.peak_bytes <= budget_bytes
