"""Calibration of the cost model from measurements on a GPU type (committed as data in ``tuner/data``).

A calibration file ``tuner/data/calibration-<gpu key>.json`` holds what ``memtune bench`` taught us
about a GPU type, with the command and date that measured it. Today that is the budget headroom of
NOTE [ Headroom ] (``tuner.search``). A GPU type without a file gets no correction.
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
        source: where the numbers came from (command, date), or ``none``.
    """

    gpu: str
    headroom: float = 0.0
    source: str = "none"


def calibration_for(gpu: str) -> Calibration:
    """The committed calibration of ``gpu``, or an empty one."""
    path = files("tuner").joinpath("data", f"calibration-{gpu}.json")
    if not path.is_file():
        return Calibration(gpu)
    data = json.loads(path.read_text())
    return Calibration(gpu=gpu, headroom=float(data.get("headroom", 0.0)), source=str(data.get("source", "")))
