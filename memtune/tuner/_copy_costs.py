"""What offloading a saved storage costs: its D2H and H2D copy times, as the simulator and the policies price them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memtune.profiler import Profile

__all__ = ["storage_copy_ms"]


def storage_copy_ms(profile: Profile) -> tuple[list[float], list[float]]:
    """Per storage, the D2H and H2D copy times in ms.

    A storage's share of its first saver's measured ``d2h_ms``/``h2d_ms`` (by bytes) when that stage has
    one, else its bytes over the device's pinned bandwidth. The simulator and the policies both use this.
    """
    d2h_bw = profile.device.d2h_gbps * 1e6  # bytes per ms
    h2d_bw = profile.device.h2d_gbps * 1e6
    d2h: list[float] = []
    h2d: list[float] = []
    for s in profile.storages:
        owner = profile.stages[min(s.saved_by)] if s.saved_by else None
        if owner is not None and owner.saved_bytes > 0 and owner.d2h_ms > 0:
            share = s.bytes / owner.saved_bytes
            d2h.append(owner.d2h_ms * share)
            h2d.append(owner.h2d_ms * share)
        else:
            d2h.append(s.bytes / d2h_bw if d2h_bw > 0 else 0.0)
            h2d.append(s.bytes / h2d_bw if h2d_bw > 0 else 0.0)
    return d2h, h2d
