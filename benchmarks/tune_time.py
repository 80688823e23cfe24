"""Wall time of the documented command `memtune tune vgg16 --batch 256 --gpu h200 --budget 13GiB --trials 300`.

    python -m benchmarks.tune_time [--runs 3]

Each run is a fresh process (imports and profile loading included), as a user would see it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from benchmarks.common import environment

__all__ = ["main"]

COMMAND = [
    sys.executable,
    "-m",
    "api",
    "tune",
    "vgg16",
    "--batch",
    "256",
    "--gpu",
    "h200",
    "--budget",
    "13GiB",
    "--trials",
    "300",
    "--json",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    times = []
    result = {}
    for _ in range(args.runs):
        t0 = time.perf_counter()
        done = subprocess.run(COMMAND, check=True, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        result = json.loads(done.stdout)
    best = result["best"]
    if best is None:
        raise SystemExit(f"{' '.join(COMMAND[2:])} found no plan within the budget; nothing to time")
    print(f"environment: {environment()}")
    print("| command | runs | wall s (median) | min | max | best plan | step ms | peak GiB | profile |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| `memtune tune vgg16 --batch 256 --gpu h200 --budget 13GiB --trials 300` | {args.runs} | "
        f"{statistics.median(times):.2f} | {min(times):.2f} | {max(times):.2f} | {best['name']} | "
        f"{best['step_ms']:.1f} | {best['peak_bytes'] / 2**30:.2f} | {result['profile_source']} |"
    )


if __name__ == "__main__":
    main()
