"""``memtune calibrate``: what the simulator and the guard need to know of this GPU type, measured on it.

# NOTE [ Calibrating a GPU type ]
On this CUDA device, with one reference chain of the zoo (ResNet-50 by default):

1. its identity, pinned copy rates included (``memtune.profiler.identity.cuda_identity``);
2. the chain's profile, measured stage by stage;
3. the unconstrained step, measured (``memtune.tuner.measure.bench.bench_plans``): the profile's compute scale is
measured
   over simulated (NOTE [ Compute scale ]);
4. at each fraction of the simulated unconstrained peak, the plan the search finds with no headroom, run under a cap
   of the whole GPU: the largest share of its budget by which the peak the plan allocated exceeded its simulated
   peak, rounded up to a percent, is what the simulator misses (``simulated_share``);
5. the headroom, verified under the cap it guards: starting from that share plus one percent, the plans the search
   finds at that headroom run each under ``budget_guard`` at its own budget; while one runs out of memory, the
   headroom grows by ``HEADROOM_STEP`` and they run again (at most ``HEADROOM_ROUNDS`` rounds).

What the caching allocator *reserved* above the simulated peak is not the headroom: under no cap it keeps freed
blocks cached, and under a cap it releases them (expandable segments, the garbage-collection threshold, NOTE
[ Allocator retries ]). On the H100 that share was 47% of the budget (ResNet-50 batch 64) and a headroom taken from
it made plans 2.7x slower than needed; the allocated peaks were within 1% of the simulated ones.

The result is written where ``memtune.tuner.calibration.calibration_for`` reads it first (``user_calibration_dir``), or
to a given file. Not measured here: the allocator retry price, and profiles of other models (their compute scales come
from ``memtune bench`` runs); cuDNN algorithm tables belong to each measured profile (NOTE [ First use of a GPU
type ]), since they depend on every convolution's shape and batch.
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

from memtune.profiler import Profile, build
from memtune.profiler.identity import cuda_identity
from memtune.profiler.measure import profile as measure
from memtune.tuner._tuner_errors import TunerError
from memtune.tuner.calibration import calibration_for, profile_key, user_calibration_dir
from memtune.tuner.measure.bench import BenchRow, bench_plans
from memtune.tuner.plan import Plan
from memtune.tuner.runtime.guard import configure_allocator
from memtune.tuner.search import tune
from memtune.tuner.simulator import Simulator

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
    fractions: Sequence[float] = (0.4, 0.6, 0.8),
    trials: int = 100,
    output: Path | None = None,
    progress: Callable[[str], None] | None = None,
    isolate: bool = True,
) -> CalibrationRun:
    """Measure this GPU type's calibration (NOTE [ Calibrating a GPU type ]) and write it.

    With ``isolate`` each plan runs in a fresh process (NOTE [ Bench isolation ]); without, in this one (for a
    caller whose process cannot start children, e.g. a user's script without a ``__main__`` guard).

    Raises:
        TunerError: no CUDA device, or the reference plans did not run (each row's error is named).
    """
    import torch

    if not torch.cuda.is_available():
        raise TunerError("memtune calibrate measures this GPU: no CUDA device is available here")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # also in a child process, which starts at INFO
    configure_allocator()  # the settings the guard's plans run with (NOTE [ Allocator retries ]); before CUDA starts
    note = progress or (lambda _what: None)
    note("identity and copy rates")
    ident = cuda_identity()
    chain = build(model)
    note(f"profiling {model} batch {batch} {dtype}")
    prof = measure(chain, batch, dtype, device="cuda")
    torch.cuda.empty_cache()
    sim = Simulator(prof, compute_scale=1.0)
    keep = sim.run(Plan.uniform(prof.n_stages))
    budgets = {f"tuned@{f:.0%}": int(f * keep.peak_bytes) for f in fractions}
    run_rows = functools.partial(
        _run_plans, None if isolate else chain, prof, batch, dtype, functools.partial(build, model) if isolate else None
    )
    note("measuring the unconstrained step and the plans with no headroom, each in its own process")
    plans = _tuned(prof, budgets, 0.0, trials)
    rows = run_rows(plans, ident.memory_bytes, unconstrained=True, progress=note)
    share = simulated_share(rows, {n: (budgets[n], sim.run(p).peak_bytes) for n, _, p in plans})
    headroom, checks = _verified_headroom(prof, budgets, share, trials, run_rows, note)
    if not isolate:
        torch.cuda.empty_cache()
    return _write(ident.key, ident.name, prof, keep.step_ms, rows + checks, share, headroom, output)


#: how much the headroom grows after a plan ran out of memory under its cap, and how often
HEADROOM_STEP = 0.03
HEADROOM_ROUNDS = 4

RunRows = Callable[..., list[BenchRow]]


def _tuned(prof: Profile, budgets: dict[str, int], headroom: float, trials: int) -> list[tuple[str, str, Plan]]:
    """The plan the search finds at each budget and ``headroom`` (budgets where none fits are left out)."""
    plans = []
    for name, budget in budgets.items():
        result = tune(prof, budget, trials=trials, seed=0, headroom=headroom, placement=False)
        if result.best is not None:
            plans.append((name, "tuned", result.best.plan))
    return plans


def _run_plans(
    chain: Any,
    prof: Profile,
    batch: int,
    dtype: str,
    factory: Callable[[], Any] | None,
    plans: list[tuple[str, str, Plan]],
    cap_bytes: int,
    *,
    unconstrained: bool,
    progress: Callable[[str], None],
) -> list[BenchRow]:
    return bench_plans(
        chain, prof, batch, dtype, cap_bytes, plans, pytorch_builtins=False, chain_factory=factory,
        unconstrained=unconstrained, progress=progress,
    )  # fmt: skip


def simulated_share(rows: Sequence[BenchRow], budgets: dict[str, tuple[int, int]]) -> float:
    """The largest share of its budget by which a plan's allocated peak exceeded its simulated one (0 when none did).

    Args:
        rows: measured rows; ``budgets``: ``{row name: (budget bytes, simulated peak bytes)}``.

    Raises:
        TunerError: no plan of ``budgets`` ran (each row's error is named).
    """
    shares = [
        max(0.0, (r.peak_bytes - budgets[r.name][1]) / budgets[r.name][0])
        for r in rows
        if r.name in budgets and r.peak_bytes is not None
    ]
    if not shares:
        raise TunerError(f"no tuned plan ran: {[f'{r.name}: {r.error}' for r in rows if r.error]}")
    return max(shares)


def _verified_headroom(
    prof: Profile,
    budgets: dict[str, int],
    share: float,
    trials: int,
    run_rows: RunRows,
    note: Callable[[str], None],
) -> tuple[float, list[BenchRow]]:
    """Step 5 of NOTE [ Calibrating a GPU type ]: the smallest headroom tried under which every plan ran."""
    headroom = math.ceil(share * 100) / 100 + 0.01
    checks: list[BenchRow] = []
    for _ in range(HEADROOM_ROUNDS):
        plans = _tuned(prof, budgets, headroom, trials)
        rows = []
        for name, kind, plan in plans:  # each under the cap of its own budget
            rows += run_rows([(f"{name} headroom {headroom:.0%}", kind, plan)], budgets[name], unconstrained=False,
                             progress=note)  # fmt: skip
        checks += rows
        failed = [r.name for r in rows if r.error is not None]
        note(f"headroom {headroom:.0%}: {len(rows) - len(failed)} of {len(rows)} plans ran under their caps"
             + (f"; out of memory: {', '.join(failed)}" if failed else ""))  # fmt: skip
        if not failed:
            return round(headroom, 2), checks
        headroom += HEADROOM_STEP
    raise TunerError(
        f"plans still ran out of memory under their caps at a headroom of {headroom - HEADROOM_STEP:.0%}: "
        f"{[f'{r.name}: {r.error}' for r in checks if r.error][-3:]}"
    )


def _write(
    key: str,
    name: str,
    prof: Profile,
    simulated_ms: float,
    rows: list[BenchRow],
    share: float,
    headroom: float,
    output: Path | None,
) -> CalibrationRun:
    base = next((r for r in rows if r.kind == "unconstrained" and r.step_ms), None)
    if base is None or base.step_ms is None:
        raise TunerError(f"the unconstrained step did not run: {[r.error for r in rows if r.error]}")
    day = datetime.now(UTC).date().isoformat()
    data = {
        "gpu": key,
        "headroom": headroom,
        "source": f"memtune calibrate on an {name} ({prof.device.torch_version}), {day}: the plans tuned for "
        f"{prof.model} b{prof.batch} {prof.dtype} allocated up to {share:.1%} of their budget above their simulated "
        f"peak; tuned with a headroom of {headroom:.0%}, each ran under the cap of its budget",
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
