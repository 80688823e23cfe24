"""Simulator plan evaluations per second on one core, for VGG-16 and ResNet-50 (batch 256, H200 profile).

    python -m benchmarks.simulator_speed [--plans 3000]
    python -m benchmarks.simulator_speed --against /tmp/a5d74da [--rounds 5]

Plans are random (seeded) mixes of keep/offload/recompute with random lookahead and sync, the kind of
plans the search evaluates; timing covers ``Simulator.run`` as the search calls it.

With ``--against`` (a checkout of another commit, e.g. ``git worktree add /tmp/a5d74da a5d74da``) the same plans
(keep, offload and recompute mixes, the actions every commit knows) are timed in a fresh process of each tree in
turn, the other tree first and this one second, ``--rounds`` times; the table gives each tree's median rate and
their ratio. On a shared machine only such interleaved ratios compare two commits: a rate measured alone moves
with whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import environment, zoo_profile
from memtune.tuner import Plan, Simulator
from memtune.tuner.stage_choices import stage_actions

__all__ = ["main"]

MODELS = ("vgg16", "resnet50")


def measure(model: str, plans: int, seed: int = 0) -> tuple[int, float, str]:
    profile = zoo_profile(model, 256)
    sim = Simulator(profile)
    rng = random.Random(seed)
    batch = [
        Plan(
            actions=tuple(rng.choice(acts) for acts in stage_actions(profile)),
            prefetch_lookahead=rng.randint(0, 8),
            sync=rng.choice(["deferred", "layer"]),
        )
        for _ in range(plans)
    ]
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        for plan in batch:
            sim.run(plan, check=False)
        rates.append(plans / (time.perf_counter() - t0))
    return profile.n_stages, statistics.median(rates), profile.source


# the timing each tree runs in ``--against`` mode, with that tree's simulator: the same plans in both (keep, offload
# and recompute, the actions every commit knows, drawn from one seed), 3 passes, the median rate per model
_PROBE = """
import json, os, random, statistics, sys, time
from benchmarks.common import zoo_profile
if os.path.isdir("memtune/tuner"):  # the rooms under memtune/ (NOTE [ One installed name ])
    from memtune.tuner.plan import Plan
    from memtune.tuner.simulator import Simulator
else:  # a checkout from before, its rooms at its top
    from tuner.plan import Plan
    from tuner.simulator import Simulator
plans = int(sys.argv[1])
rates = {}
for model in sys.argv[2:]:
    profile = zoo_profile(model, 256)
    sim = Simulator(profile)
    rng = random.Random(0)
    batch = [
        Plan.from_actions([rng.choice("kor") for _ in range(profile.n_stages)], prefetch_lookahead=rng.randint(0, 8),
                          sync=rng.choice(["deferred", "layer"]))
        for _ in range(plans)
    ]
    passes = []
    for _ in range(3):
        t0 = time.perf_counter()
        for plan in batch:
            sim.run(plan, check=False)
        passes.append(plans / (time.perf_counter() - t0))
    rates[model] = statistics.median(passes)
print(json.dumps(rates))
"""


def _rates(tree: Path, plans: int) -> dict[str, float]:
    """Each model's plans/s in a fresh process of ``tree``, with that tree's simulator (``_PROBE``)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(plans), *MODELS], cwd=tree, check=True, capture_output=True, text=True
    )
    rates: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return rates


def _commit(tree: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return done.stdout.strip() or str(tree)


def side_by_side(other: Path, plans: int, rounds: int) -> None:
    """The table of ``--against``: both trees' median rates over ``rounds`` interleaved runs, and their ratio."""
    here = Path(__file__).resolve().parents[1]
    runs: dict[str, list[dict[str, float]]] = {"other": [], "here": []}
    for _ in range(rounds):
        runs["other"].append(_rates(other, plans))
        runs["here"].append(_rates(here, plans))
    print(f"environment: {environment()}")
    print(f"{rounds} rounds, each {_commit(other)} then {_commit(here)} in fresh processes; medians over the rounds")
    print(f"| model | {_commit(other)} plans/s | {_commit(here)} plans/s | ratio | per-round ratios |")
    print("|---|---|---|---|---|")
    for model in MODELS:
        old = [r[model] for r in runs["other"]]
        new = [r[model] for r in runs["here"]]
        each = ", ".join(f"{b / a:.2f}" for a, b in zip(old, new, strict=True))
        a, b = statistics.median(old), statistics.median(new)
        print(f"| {model} b256 | {a:,.0f} | {b:,.0f} | {b / a:.2f}x | {each} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", type=int, default=3000)
    ap.add_argument("--against", type=Path, help="a checkout of another commit to measure side by side")
    ap.add_argument("--rounds", type=int, default=5, help="with --against: runs of each tree, interleaved")
    args = ap.parse_args()
    if args.against is not None:
        side_by_side(args.against, args.plans, args.rounds)
        return
    print(f"environment: {environment()}")
    print("| model | stages | profile | plan evaluations / s (median of 3) |")
    print("|---|---|---|---|")
    for model in MODELS:
        n, rate, source = measure(model, args.plans)
        print(f"| {model} b256 | {n} | {source} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
