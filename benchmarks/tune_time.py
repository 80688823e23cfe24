"""Wall time of the documented command `memtune tune vgg16 --batch 256 --gpu h200 --budget 13GiB --trials 300`.

    python -m benchmarks.tune_time [--runs 3]
    python -m benchmarks.tune_time --against /tmp/a5d74da [--runs 3] [--table]

Each run is a fresh process (imports and profile loading included), as a user would see it. With ``--against`` (a
checkout of another commit) each run times the other tree's command and then this one's, and the table gives both
medians and their ratio: on a shared machine only interleaved runs compare two commits. Beside the wall time each
run's CPU time (user and system, of the process and its children) is given, and the machine's load average over the
runs: where others' work shares the cores, the wall time grows with it, the CPU time far less. ``--table`` times the
command as the README types it, without ``--json``: its printed tables and the lower bound under the best plan
(NOTE [ Budget bound ]), which the JSON leaves out; the best plan is then read from the printout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import environment

__all__ = ["main"]

COMMAND = [
    sys.executable,
    "-m",
    "memtune.api",
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


def _timed(tree: Path | None = None, *, table: bool = False) -> tuple[float, float, str]:
    """One run of ``COMMAND`` (in ``tree``, with that tree's code, when given; without ``--json`` where ``table``):
    wall seconds, CPU seconds (user and system, the command's child processes included) and its standard output."""
    command = [c for c in COMMAND if c != "--json"] if table else list(COMMAND)
    command[2] = _cli_module(tree or Path(__file__).resolve().parents[1])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=tree)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done.stdout


def _cli_module(tree: Path) -> str:
    """The command line's module in ``tree``: ``memtune.api`` since the rooms moved under ``memtune/`` (NOTE [ One
    installed name ]), ``api`` in a checkout from before, so that older commits time side by side."""
    return "memtune.api" if (tree / "memtune" / "api").is_dir() else "api"


def _printed_best(stdout: str) -> str:
    """The best plan's step and peak as the table prints them (``best: optuna 226.98 ms (…), peak 11.65 GiB``)."""
    found = re.search(r"best: \S+ ([\d.]+) ms .*?peak ([\d.]+ \S+)", " ".join(stdout.split()))
    return "none" if found is None else f"{found[1]} ms, {found[2]}"


def _load() -> float:
    """The one-minute load average (runnable processes, all cores), or 0 where the system does not say."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def _best(result: dict[str, Any]) -> str:
    best = result["best"]
    return "none" if best is None else f"{best['step_ms']:.2f} ms, {best['peak_bytes'] / 2**30:.2f} GiB"


def side_by_side(other: Path, runs: int, *, table: bool = False) -> None:
    """The table of ``--against``: each tree's median wall and CPU time over ``runs`` interleaved runs, their ratios
    (``table``: the command without ``--json``)."""
    here = Path(__file__).resolve().parents[1]
    times: dict[Path, list[float]] = {other: [], here: []}
    cpus: dict[Path, list[float]] = {other: [], here: []}
    bests: dict[Path, str] = {}
    loads = [_load()]
    for _ in range(runs):
        for tree in (other, here):
            seconds, cpu, stdout = _timed(tree, table=table)
            times[tree].append(seconds)
            cpus[tree].append(cpu)
            bests[tree] = _printed_best(stdout) if table else _best(json.loads(stdout))
            loads.append(_load())
    names = {tree: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                                  text=True).stdout.strip() or str(tree) for tree in (other, here)}  # fmt: skip
    print(f"environment: {environment()}")
    command = " ".join(c for c in COMMAND[3:] if not (table and c == "--json"))
    print(f"`memtune {command}`: {runs} runs of each, interleaved ({names[other]} first), each a fresh process; load "
          f"average {min(loads):.1f}-{max(loads):.1f} over the runs")  # fmt: skip
    print("| commit | wall s (median) | min | max | CPU s (median) | min | max | best plan |")
    print("|---|---|---|---|---|---|---|---|")
    for tree in (other, here):
        t, c = times[tree], cpus[tree]
        walls = f"{statistics.median(t):.2f} | {min(t):.2f} | {max(t):.2f}"
        cpu_s = f"{statistics.median(c):.2f} | {min(c):.2f} | {max(c):.2f}"
        print(f"| {names[tree]} | {walls} | {cpu_s} | {bests[tree]} |")
    print(
        f"ratio of medians: wall {statistics.median(times[other]) / statistics.median(times[here]):.2f}x, "
        f"CPU {statistics.median(cpus[other]) / statistics.median(cpus[here]):.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--against", type=Path, help="a checkout of another commit to time side by side")
    ap.add_argument("--table", action="store_true", help="with --against: the command as typed, without --json")
    args = ap.parse_args()
    if args.against is not None:
        side_by_side(args.against, args.runs, table=args.table)
        return
    if args.table:
        raise SystemExit("--table compares two trees: give --against too")
    times = []
    cpus = []
    result: dict[str, Any] = {}
    loads = [_load()]
    for _ in range(args.runs):
        seconds, cpu, stdout = _timed()
        result = json.loads(stdout)
        times.append(seconds)
        cpus.append(cpu)
        loads.append(_load())
    best = result["best"]
    if best is None:
        raise SystemExit(f"{' '.join(COMMAND[2:])} found no plan within the budget; nothing to time")
    print(f"environment: {environment()}; load average {min(loads):.1f}-{max(loads):.1f} over the runs")
    print(
        "| command | runs | wall s (median) | min | max | CPU s (median) | best plan | step ms | peak GiB | profile |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| `memtune tune vgg16 --batch 256 --gpu h200 --budget 13GiB --trials 300` | {args.runs} | "
        f"{statistics.median(times):.2f} | {min(times):.2f} | {max(times):.2f} | {statistics.median(cpus):.2f} | "
        f"{best['name']} | {best['step_ms']:.1f} | {best['peak_bytes'] / 2**30:.2f} | {result['profile_source']} |"
    )


if __name__ == "__main__":
    main()
