"""The host's time to issue a step under a plan's actions, from a profile's host prices.

# NOTE [ Host issue time ]
The engines above are the GPU's. The host issues every kernel first, and where it issues more slowly than the GPU
runs, the GPU waits and the step takes the host's time. A compiled region pays a fixed host cost per call (the
compiler's guards and wrappers, its kernels' launches), and a plan adds its own: a recomputed region is called again
in the backward under a checkpoint, an offloaded one packs, copies and fetches every saved tensor from Python hooks.
Measured on the H200 (torch 2.11, MobileNetV2, batch 128, ``python -m benchmarks.host_issue``, its files under
``benchmarks/results/h200/host-issue``): the 21-region plan with every region kept issued its step in 39.4 ms against
21.3 ms of GPU time, the whole model compiled in 20.8 against 20.1; the 45% plan of four regions recomputed and five
offloaded issued in 74.6 ms against 35.0 ms of GPU time and took 75.1 ms, where the simulator, pricing the GPU alone,
had predicted 44.3. Where the profile carries host prices
(``Profile.host``, measured with memtune's runtime by ``memtune.tuner.measure.host_price``), a plan's host time is the
kept step's plus what each recomputed or offloaded stage adds (a selective stage is priced as a recomputed one), and
the step takes at least that (``SimResult.host_ms``). The host is a floor, not a third engine: a step where host and
GPU each bind part of the time is priced by the larger total, which errs short. Without host prices the GPU alone
prices the step, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from memtune.profiler import Profile
from memtune.tuner.plan import Action

__all__ = ["HostTime"]


class HostTime:
    """A profile's host prices as the simulator reads them (NOTE [ Host issue time ]), ms: the kept step's, and per
    stage what recomputing and offloading it add (0 where that action was not priced)."""

    def __init__(self, keep_ms: float, recompute_ms: Sequence[float], offload_ms: Sequence[float]) -> None:
        self.keep_ms = keep_ms
        self.recompute_ms = list(recompute_ms)
        self.offload_ms = list(offload_ms)

    @classmethod
    def of(cls, profile: Profile) -> HostTime | None:
        """The host prices of ``profile``; None where it has none (the GPU alone prices its steps)."""
        host = profile.host
        if host is None:
            return None
        n = len(profile.stages)
        return cls(host.keep_ms, host.recompute_ms or [0.0] * n, host.offload_ms or [0.0] * n)

    def ms(self, actions: Sequence[Action]) -> float:
        """The host's time to issue a step of ``actions``, ms: the kept step's plus each stage's action's (a selective
        stage priced as a recomputed one)."""
        ms = self.keep_ms
        for k, a in enumerate(actions):
            if a is Action.OFFLOAD:
                ms += self.offload_ms[k]
            elif a is Action.RECOMPUTE or a is Action.SELECTIVE:
                ms += self.recompute_ms[k]
        return ms
