"""Calibration of the cost model from measurements on a GPU type (committed as data in ``tuner/data``).

A calibration file ``tuner/data/calibration-<gpu key>.json`` holds what ``memtune bench`` taught us
about a GPU type, with the command and date that measured it: the budget headroom of NOTE [ Headroom ]
(``tuner.search``) and the time an allocator retry costs per byte it unmaps (NOTE [ Allocator placement ] in
``tuner.placement``). A GPU type without a file gets no correction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files

__all__ = ["Calibration", "calibration_for"]


@dataclass(frozen=True)
class Calibration:
    """Corrections for one GPU type.

    Attributes:
        gpu: the GPU key (``h200``).
        headroom: fraction of the budget left free for the caching allocator, in [0, 1).
        remap_ms_per_gib: ms a capped step loses per GiB an allocator retry unmaps (and maps again); None
            when not measured on this GPU type.
        source: where the numbers came from (command, date), or ``none``.
    """

    gpu: str
    headroom: float = 0.0
    remap_ms_per_gib: float | None = None
    source: str = "none"


def calibration_for(gpu: str) -> Calibration:
    """The committed calibration of ``gpu``, or an empty one."""
    path = files("tuner").joinpath("data", f"calibration-{gpu}.json")
    if not path.is_file():
        return Calibration(gpu)
    data = json.loads(path.read_text())
    remap = data.get("remap_ms_per_gib")
    sources = [str(data.get("source", "")), str(data.get("remap_source", ""))]
    return Calibration(
        gpu=gpu,
        headroom=float(data.get("headroom", 0.0)),
        remap_ms_per_gib=float(remap) if remap is not None else None,
        source="; ".join(s for s in sources if s),
    )
