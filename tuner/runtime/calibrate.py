"""``memtune calibrate``: what the simulator and the guard need to know of this GPU type, measured on it.

# NOTE [ Calibrating a GPU type ]
On this CUDA device, with one reference chain of the zoo (ResNet-50 by default):

1. its identity, pinned copy rates included (``profiler.identity.cuda_identity``);
2. the chain's profile, measured stage by stage;
3. the unconstrained step, measured (``tuner.runtime.bench.bench_plans``): the profile's compute scale is measured
   over simulated (NOTE [ Compute scale ]);
4. at each fraction of the simulated unconstrained peak, the plan the search finds with no headroom, run under a cap
   of the whole GPU: the headroom is the largest share of its budget by which what the caching allocator reserved
   exceeded the plan's simulated peak, rounded up to a percent. Under a cap of the budget that share would be
   missing (an out-of-memory or allocator retries); the H200's 5% was found so (``scripts/cap_experiment.py``).

The result is written where ``tuner.calibration.calibration_for`` reads it first (``user_calibration_dir``), or to a
given file. Not measured here yet: the allocator retry price, convolution algorithm tables, and profiles of other
models (their compute scales).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from profiler.identity import cuda_identity
from profiler.measure import profile as measure
from profiler.profile import Profile
from profiler.zoo import build
from tuner.calibration import calibration_for, profile_key, user_calibration_dir
from tuner.errors import TunerError
from tuner.plan import Plan
from tuner.runtime.bench import BenchRow, bench_plans
from tuner.search import tune
from tuner.simulator import Simulator

__all__ = ["CalibrationRun", "calibrate"]


@dataclass(frozen=True)
class CalibrationRun:
    """What ``calibrate`` measured and the calibration it wrote (``data``, the file's JSON) to ``path``."""

    data: dict[str, Any]
    path: Path
    rows: list[BenchRow]


def calibrate(
    *,
    model: str = "resnet50",
    batch: int = 64,
    dtype: str = "float32",
    fractions: Sequence[float] = (0.4, 0.5, 0.6, 0.7, 0.8),
    trials: int = 100,
    output: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> CalibrationRun:
    """Measure this GPU type's calibration (NOTE [ Calibrating a GPU type ]) and write it.

    Raises:
        TunerError: no CUDA device, or the reference plans did not run (each row's error is named).
    """
    import torch

    if not torch.cuda.is_available():
        raise TunerError("memtune calibrate measures this GPU: no CUDA device is available here")
    note = progress or (lambda _what: None)
    note("identity and copy rates")
    ident = cuda_identity()
    chain = build(model)
    note(f"profiling {model} batch {batch} {dtype}")
    prof = measure(chain, batch, dtype, device="cuda")
    torch.cuda.empty_cache()
    sim = Simulator(prof, compute_scale=1.0)
    keep = sim.run(Plan.uniform(prof.n_stages))
    plans: list[tuple[str, str, Plan]] = []
    budgets: dict[str, tuple[int, int]] = {}
    for f in fractions:
        budget = int(f * keep.peak_bytes)
        result = tune(prof, budget, trials=trials, seed=0, headroom=0.0, placement=False)
        if result.best is not None:
            name = f"tuned@{f:.0%}"
            plans.append((name, "tuned", result.best.plan))
            budgets[name] = (budget, sim.run(result.best.plan).peak_bytes)
    note("measuring the unconstrained step and the plans, each in its own process")
    rows = bench_plans(
        None,
        prof,
        batch,
        dtype,
        ident.memory_bytes,
        plans,
        pytorch_builtins=False,
        chain_factory=functools.partial(build, model),  # picklable: each row runs in a fresh process
        progress=note,
    )
    return _write(ident.key, ident.name, prof, keep.step_ms, rows, budgets, output)


def _write(
    key: str,
    name: str,
    prof: Profile,
    simulated_ms: float,
    rows: list[BenchRow],
    budgets: dict[str, tuple[int, int]],
    output: Path | None,
) -> CalibrationRun:
    base = next((r for r in rows if r.kind == "unconstrained" and r.step_ms), None)
    if base is None or base.step_ms is None:
        raise TunerError(f"the unconstrained step did not run: {[r.error for r in rows if r.error]}")
    shares = []
    for r in rows:
        if r.name in budgets and r.reserved_bytes is not None:
            budget, predicted = budgets[r.name]
            shares.append(max(0.0, (r.reserved_bytes - predicted) / budget))
    if not shares:
        raise TunerError(f"no tuned plan ran: {[f'{r.name}: {r.error}' for r in rows if r.error]}")
    headroom = math.ceil(max(shares) * 100) / 100
    day = datetime.now(UTC).date().isoformat()
    data = {
        "gpu": key,
        "headroom": headroom,
        "source": f"memtune calibrate on an {name} ({prof.device.torch_version}), {day}: under a cap of the whole "
        f"GPU the caching allocator reserved up to {max(shares):.1%} of the budget above the simulated peak of the "
        f"plans tuned at {', '.join(n.removeprefix('tuned@') for n in sorted(budgets))} of the peak of {prof.model} "
        f"b{prof.batch} {prof.dtype}",
        "compute_scale": {profile_key(prof): round(base.step_ms / simulated_ms, 4)},
        "compute_source": f"memtune calibrate, {day}: the measured unconstrained step of {profile_key(prof)} "
        f"({base.step_ms:.2f} ms) over the simulated one ({simulated_ms:.2f} ms)",
        "copy_gbps": {"d2h": prof.device.d2h_gbps, "h2d": prof.device.h2d_gbps},
    }
    path = output or user_calibration_dir() / f"calibration-{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    calibration_for.cache_clear()
    return CalibrationRun(data, path, rows)
