"""Calibration of the cost model from measurements on a GPU type (committed as data in ``tuner/data``).

A calibration file ``tuner/data/calibration-<gpu key>.json`` holds what ``memtune bench`` taught us
about a GPU type, with the command and date that measured it: the budget headroom of NOTE [ Headroom ]
(``tuner.search``), the time an allocator retry costs per byte it unmaps (NOTE [ Allocator placement ] in
``tuner.placement``) and, per measured profile, the factor between its whole unconstrained step and the sum of
its stages (NOTE [ Compute scale ]). ``python -m benchmarks.calibrate`` derives the last two from committed
``memtune bench`` runs. A GPU type without a file gets no correction.

# NOTE [ Compute scale ]
The profiler times each stage alone (forward, then backward, synchronised around each); a training step runs
them back to back, so launch gaps overlap and caches stay warm. On the H200 every measured profile's simulated
unconstrained step was 2-8% longer than the measured one (GPT bf16: 120.7 against 112.0 ms). The simulator
multiplies every compute time of a profile (stages, convolution algorithms, loss; not copies) by measured /
simulated unconstrained step, the median over the committed bench runs of that profile. It is one number per
profile, measured on one plan (no plan at all), and applied to every other.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from profiler.profile import Profile

__all__ = ["Calibration", "calibration_for", "missing_calibration", "profile_key", "user_calibration_dir"]


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
    compute_scale: dict[str, float] = field(default_factory=dict)
    """measured / simulated unconstrained step per measured profile, keyed ``model-bBATCH-dtype``"""

    def compute_scale_for(self, profile: Profile) -> float:
        """The factor on ``profile``'s compute times (NOTE [ Compute scale ]); 1.0 when not calibrated."""
        if profile.source != "measured" or profile.device.key != self.gpu or profile.modules:
            return 1.0  # a profile of module stages adds up to its own measured step (NOTE [ Time outside stages ])
        return self.compute_scale.get(profile_key(profile), 1.0)


def missing_calibration(profile: Profile) -> str | None:
    """What a measured profile's GPU type lacks, as advice to print, or None when it is calibrated (or modeled)."""
    cal = calibration_for(profile.device.key)
    if profile.source != "measured" or cal.source != "none":
        return None
    return (
        f"no calibration for GPU type {profile.device.key!r}: plans are searched right up to the budget and may run "
        "out of memory under it; run `memtune calibrate` on this GPU once (NOTE [ Calibrating a GPU type ])"
    )


def profile_key(profile: Profile) -> str:
    """``model-bBATCH-dtype``: how the calibration names a profile."""
    return f"{profile.model}-b{profile.batch}-{profile.dtype}"


def user_calibration_dir() -> Path:
    """Where ``memtune calibrate`` writes a GPU type's calibration for this user: ``$MEMTUNE_CALIBRATION_DIR``, else
    ``$XDG_DATA_HOME/memtune/calibrations`` (``~/.local/share/memtune/calibrations``)."""
    chosen = os.environ.get("MEMTUNE_CALIBRATION_DIR")
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "memtune" / "calibrations"


@functools.cache
def calibration_for(gpu: str) -> Calibration:
    """The calibration of ``gpu``: the user's (``memtune calibrate``, ``user_calibration_dir``), else the committed
    one, else an empty one (read once per process; ``calibration_for.cache_clear()`` after writing one)."""
    user = user_calibration_dir() / f"calibration-{gpu}.json"
    path: Any = user if user.is_file() else files("tuner").joinpath("data", f"calibration-{gpu}.json")
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
        compute_scale={str(k): float(v) for k, v in data.get("compute_scale", {}).items()},
    )
