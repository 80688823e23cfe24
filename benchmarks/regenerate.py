"""Rebuild every results file a CPU can make, and re-render every GPU table from its committed JSON.

    python -m benchmarks.regenerate                  # every entry, written in place
    python -m benchmarks.regenerate --check          # the same, then the files that changed (exit 1 if any)
    python -m benchmarks.regenerate --ci --check     # what CI runs: the entries marked slow left out
    python -m benchmarks.regenerate --only hmms,vdnn # some entries (names from --list)
    python -m benchmarks.regenerate --list           # every entry, and every committed file kept as measured

Each entry of ``GENERATED`` is one benchmark command, run in a fresh process as its page says (``python -m
benchmarks.X ...``) with the GPU hidden, ``PYTHONHASHSEED=0`` and ``MEMTUNE_RESULTS_REPRODUCIBLE=1``: the
environment line then names the library versions and no date, machine or core count
(``benchmarks.common.environment``), so a file depends on the code, the committed profiles and JSON, and those
versions alone. Its standard output is the file. Two kinds:

* ``cpu``: the numbers are computed here (simulator, search with fixed seeds, roofline profiles, linear programs);
* ``gpu``: the numbers were measured on a GPU and are only re-rendered from the committed JSON beside them.

Where a page quotes an entry's table (``quoted_in``), every table row of the file must appear on that page word for
word, and ``--check`` reports the rows a page lacks.

Not regenerated, each with its reason in ``KEPT`` (``--list`` prints them): what a GPU measured (the JSON and the
logs of the runs, traces), and what was timed on a CPU (service latency and job time, the CPU inference run, the
simulator's speed and ``tune``'s wall time): a timing is not the same twice, so no file holding one can be checked
byte for byte. Figures (``docs/images/*.png``) are not regenerated either: their pixels depend on matplotlib's
fonts; their commands are on their pages.

``tests/unit/test_regenerate.py`` checks that every committed file under ``benchmarks/results/`` is one entry's
output or matches one ``KEPT`` pattern.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["GENERATED", "KEPT", "Generated", "Kept", "classify", "main", "missing_rows"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "benchmarks/results"
TMP = "{tmp}"  # an argument that names a scratch folder (a figure the entry draws but does not keep)


@dataclass(frozen=True)
class Generated:
    """One results file and the command whose standard output it is."""

    name: str
    output: str  # path from the repository root
    argv: tuple[str, ...]  # after ``python -m``
    kind: Literal["cpu", "gpu"]
    seconds: int  # about how long it takes on the 2-core development machine
    slow: bool = False  # left out of ``--ci``
    quoted_in: tuple[str, ...] = ()  # pages that show the file's table rows word for word


@dataclass(frozen=True)
class Kept:
    """Committed files that are not regenerated (a glob from the repository root) and why."""

    pattern: str
    reason: str


_R = RESULTS
GENERATED: tuple[Generated, ...] = (
    Generated(
        "hmms",
        f"{_R}/hmms-repro.md",
        ("benchmarks.hmms_repro",),
        "cpu",
        10,
        quoted_in=("docs/results/seed-systems.md",),
    ),
    Generated("vdnn", f"{_R}/vdnn-repro.md", ("benchmarks.vdnn_repro",), "cpu", 120),
    Generated(
        "layup",
        f"{_R}/layup-fig4.md",
        ("benchmarks.layup_thresholds", "--out", TMP),
        "cpu",
        15,
        quoted_in=("docs/results/seed-systems.md",),
    ),
    Generated(
        "modeled-vs-measured",
        f"{_R}/modeled-vs-measured.txt",
        ("benchmarks.modeled_vs_measured",),
        "cpu",
        130,
        slow=True,
    ),
    Generated(
        "compiler-choice",
        f"{_R}/h100/compiled/compiler-choice.md",
        (
            "benchmarks.compiler_choice",
            *(
                f"{_R}/h100/compiled/bench-{m}-whole.json"
                for m in ("gpt-b16-bfloat16", "gpt-b16-float32", "resnet50-b128-float32", "vgg16-b128-float32")
            ),
            "--fractions",
            "0.4,0.6,0.8",
        ),
        "cpu",
        90,
    ),
    Generated(
        "conv-workspace-check",
        f"{_R}/conv-workspace-check.md",
        ("benchmarks.conv_workspace_check",),
        "cpu",
        5,
    ),
    Generated(
        "modeled-check",
        f"{_R}/h100/promises/modeled-check.md",
        ("benchmarks.modeled_check", f"{_R}/h100/promises", "--trials", "100"),
        "cpu",
        70,
    ),
    Generated(
        "modeled-check-b2",
        f"{_R}/h100/promises-b2/modeled-check.md",
        ("benchmarks.modeled_check", f"{_R}/h100/promises-b2", "--trials", "100"),
        "cpu",
        40,
    ),
    Generated(
        "selective",
        f"{_R}/selective-search.txt",
        (
            "benchmarks.selective",
            "gpt:16:bfloat16",
            "gpt:16:float32",
            "resnet50:256:float32",
            "resnet50:256:bfloat16",
            "--trials",
            "200",
        ),
        "cpu",
        600,
        slow=True,
    ),
    Generated(
        "budget-bound",
        f"{_R}/budget-bound.txt",
        (
            "benchmarks.budget_bound",
            "resnet50:256:float32",
            "resnet50:256:bfloat16",
            "vgg16:256:float32",
            "vgg16:256:bfloat16",
            "gpt:16:float32",
            "gpt:16:bfloat16",
            "--fractions",
            "0.5,0.6,0.8",
        ),
        "cpu",
        600,
        slow=True,
    ),
    Generated(
        "budget-bound-no-placement",
        f"{_R}/budget-bound-vgg16-no-placement.txt",
        ("benchmarks.budget_bound", "vgg16:256:float32", "--fractions", "0.6", "--no-placement"),
        "cpu",
        60,
    ),
    Generated(
        "budget-bound-no-placement-1500",
        f"{_R}/budget-bound-vgg16-no-placement-1500.txt",
        ("benchmarks.budget_bound", "vgg16:256:float32", "--fractions", "0.6", "--no-placement", "--trials", "1500"),
        "cpu",
        300,
        slow=True,
    ),
    Generated(
        "conv-joint", f"{_R}/conv-joint.txt", ("benchmarks.conv_joint", "--trials", "300"), "cpu", 300, slow=True
    ),
    Generated(
        "optimality-gap",
        f"{_R}/optimality-gap.md",
        ("benchmarks.optimality_gap", "--stages", "7", "--trials", "300", "--seeds", "3"),
        "cpu",
        300,
        slow=True,
        quoted_in=("docs/results/engine.md",),
    ),
    Generated(
        "promises-tables",
        f"{_R}/h100/promises/tables.md",
        ("benchmarks.promises", "--table", f"{_R}/h100/promises"),
        "gpu",
        5,
        quoted_in=("docs/results/promises.md",),
    ),
    Generated(
        "compiled-regions-table",
        f"{_R}/h100/compiled-regions/table.md",
        ("benchmarks.compiled_regions", "--table", f"{_R}/h100/compiled-regions"),
        "gpu",
        5,
        quoted_in=("docs/results/torch-compile.md",),
    ),
    Generated(
        "step-time-table",
        f"{_R}/h100/step-time/table.md",
        ("benchmarks.step_time", "--table", f"{_R}/h100/step-time"),
        "gpu",
        5,
    ),
    Generated(
        "your-models-table",
        f"{_R}/your-models-h100/table.md",
        ("benchmarks.your_models", "--table", f"{_R}/your-models-h100"),
        "gpu",
        5,
        quoted_in=("docs/results/your-models.md",),
    ),
    Generated(
        "h100-sweep-table",
        f"{_R}/h100/sweep/table.md",
        (
            "benchmarks.render_bench",
            "--sweep",
            *(
                f"{_R}/h100/sweep/bench-{m}.json"
                for m in (
                    "gpt-b16-bfloat16",
                    "gpt-b16-float32",
                    "resnet50-b256-bfloat16",
                    "resnet50-b256-float32",
                    "vgg16-b256-bfloat16",
                    "vgg16-b256-float32",
                )
            ),
        ),
        "gpu",
        2,
        quoted_in=("docs/results/your-gpu.md",),
    ),
    Generated(
        "modeled-modules-table",
        f"{_R}/h100/modeled-modules/table.md",
        ("benchmarks.modeled_modules", "--table", f"{_R}/h100/modeled-modules"),
        "gpu",
        5,
    ),
    Generated(
        "module-peers-table",
        f"{_R}/h100/module-peers/table.md",
        ("benchmarks.module_peers", "--table", f"{_R}/h100/module-peers"),
        "gpu",
        5,
        quoted_in=("docs/results/torch-compile.md",),
    ),
    Generated(
        "region-timing-table-h200",
        f"{_R}/h200/region-timing/table.md",
        ("benchmarks.region_timing", "--table", f"{_R}/h200/region-timing"),
        "gpu",
        5,
    ),
    Generated(
        "module-peers-table-h200",
        f"{_R}/h200/module-peers/table.md",
        ("benchmarks.module_peers", "--table", f"{_R}/h200/module-peers"),
        "gpu",
        5,
        quoted_in=("docs/results/compiler-grid.md",),
    ),
)

KEPT: tuple[Kept, ...] = (
    Kept(f"{_R}/bench-*", "`memtune bench` on the H200: the JSON is the measurement, the .txt its console log"),
    Kept(f"{_R}/h100/bench-*", "`memtune bench` on the H100: measurement and console log"),
    Kept(f"{_R}/h100/compiled/bench-*", "`memtune bench --compiler-sweep` on the H100: measurement"),
    Kept(f"{_R}/h100/sweep/bench-*", "`memtune bench --sweep` on the H100: measurement and console log"),
    Kept(f"{_R}/h100/compiled/*.json", "compiled runs on the H100: measurement"),
    Kept(f"{_R}/h100/compiled/*.txt", "GPU test log on the H100"),
    Kept(f"{_R}/h100/module-peers/*.json", "`benchmarks.module_peers` on the H100: measurement (one row per model)"),
    Kept(f"{_R}/h200/module-peers/*.json", "`benchmarks.module_peers` on H200s: measurement (one row per model)"),
    Kept(f"{_R}/h200/float64-gradients/*", "`benchmarks.float64_gradients` on the H200: per-gradient errors, log"),
    Kept(f"{_R}/h200/host-issue/*", "`benchmarks.host_issue` on the H200: step times and Python's profiler tables"),
    Kept(f"{_R}/h200/host-prices/*.json", "`benchmarks.host_price_check` on the H200: plans' host times, priced"),
    Kept(f"{_R}/runtime-overhead/*.json", "`benchmarks.runtime_overhead`: timed on the 2-core CPU machine"),
    Kept(
        f"{_R}/h200/host-prices/fitted/*",
        "host prices fitted as a fixed part per region plus a part per storage or forward ms, set aside: the pricing "
        "module as run (`host_price.py.txt`) and `benchmarks.host_price_check`'s measurement with it, on an H200",
    ),
    Kept(f"{_R}/h200/region-timing/*.json", "`benchmarks.region_timing` on an H200: measurement (one row per model)"),
    Kept(f"{_R}/h200/region-timing/traces/*", "`benchmarks.region_timing --trace` on an H200: one step's Chrome trace"),
    Kept(
        f"{_R}/h200/region-layout/*",
        "ResNet-50's regions in each memory layout on an H200: the experiment `benchmarks.region_layout` was written "
        "from (its script as run, `experiment.py.txt`), its measurement, two kernel summaries and two host profiles",
    ),
    Kept(
        f"{_R}/h100/promises/*.json",
        "`benchmarks.promises` on the H100 (rows with measured profiles); the modeled-"
        "*.json beside them are `scripts/modeled_profiles.py`'s CPU profiles, kept as the inputs modeled_check read",
    ),
    Kept(f"{_R}/h100/promises/*.txt", "`scripts/uniform_steps.py` on the H100: measurement"),
    Kept(
        f"{_R}/h100/promises-b2/*.json",
        "`benchmarks.promises --batch 2` on the H100 and `scripts/modeled_profiles.py --batch 2`'s CPU profile beside "
        "it, the inputs modeled_check read",
    ),
    Kept(f"{_R}/h100/step-time/*.json", "`benchmarks.step_time` on the H100: measurement"),
    Kept(
        f"{_R}/h100/compiled-regions/*.json",
        "`benchmarks.compiled_regions` on the H100: measurement (the per-model rows and the profiles they measured)",
    ),
    Kept(
        f"{_R}/h100/compiled-regions/*-trace-*.txt",
        "`scripts/region_plan_peak.py --trace` on the H100: a served plan's peaks stage by stage beside the simulation",
    ),
    Kept(
        f"{_R}/h100/modeled-modules/*.json",
        "`benchmarks.modeled_modules`: module profiles timed on the CPU (their "
        "counting times are CPU timings) beside the H100's",
    ),
    Kept(
        f"{_R}/h100/seeds/*",
        "the seed systems measured on the H100 (spatial split, prefetch trigger, inference), "
        "their environment and GPU test logs",
    ),
    Kept(f"{_R}/h100/several-gpus/*", "one and two H100s: link rates, DDP and FSDP2 runs, GPU test logs"),
    Kept(f"{_R}/h100/calibrate-*", "calibration run on the H100: console log"),
    Kept(f"{_R}/h100/first-use-*", "the first use of a GPU type on the H100: measurement and log"),
    Kept(f"{_R}/your-models-h100/*.json", "`benchmarks.your_models` on the H100: measurement"),
    Kept(f"{_R}/allocator/*", "allocator traces, events and headroom runs on the H200: measurement"),
    Kept(f"{_R}/memtrace/*", "memory traces of plans on the H200 and their logs: measurement"),
    Kept(f"{_R}/h200-*", "allocator cap and headroom experiments on the H200: measurement"),
    Kept(f"{_R}/conv-cache-h200.json", "cuDNN algorithm cache measured on the H200"),
    Kept(f"{_R}/split-algos-h200.txt", "batch-split convolution algorithms measured on the H200"),
    Kept(f"{_R}/selective-fields-*", "`scripts/selective_fields.py` on the H200: measurement"),
    Kept(f"{_R}/validate-*", "`memtune validate` runs on the H200: measurement and job logs"),
    Kept(
        f"{_R}/repredict-2026-11-21-rerun.md",
        "the bench runs re-predicted by the simulator of 2026-11-21, a dated "
        "record the archive page cites; `python -m benchmarks.repredict benchmarks/results/bench-*.json` prints "
        "today's predictions",
    ),
    Kept(f"{_R}/service-*.txt", "service latency and job time: wall-clock timings of this CPU"),
    Kept(f"{_R}/cpu/inference/*", "`benchmarks.inference_budget --device cpu`: latencies timed on this CPU"),
)


def classify(path: str) -> Generated | Kept | None:
    """The entry that makes ``path`` (from the repository root), or the ``KEPT`` pattern it matches."""
    for g in GENERATED:
        if g.output == path:
            return g
    for k in KEPT:
        if fnmatch.fnmatch(path, k.pattern):
            return k
    return None


def missing_rows(text: str, page: str) -> list[str]:
    """The table rows of ``text`` (lines starting with ``|``, separators left out) that ``page`` lacks."""
    lines = set(page.splitlines())
    return [
        row for row in text.splitlines() if row.startswith("|") and not set(row) <= set("|-: ") and row not in lines
    ]


def _run(g: Generated) -> str:
    env = dict(os.environ, PYTHONHASHSEED="0", MEMTUNE_RESULTS_REPRODUCIBLE="1", CUDA_VISIBLE_DEVICES="")
    with tempfile.TemporaryDirectory() as tmp:
        argv = [a.replace(TMP, tmp) for a in g.argv]
        done = subprocess.run(
            [sys.executable, "-m", *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=False
        )
    if done.returncode != 0:
        raise RuntimeError(f"{g.name}: `python -m {' '.join(g.argv)}` exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def _diff_hint(old: str, new: str) -> str:
    a, b = old.splitlines(), new.splitlines()
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"line {i + 1}: was {x[:160]!r}, now {y[:160]!r}"
    return f"{len(a)} lines before, {len(b)} now"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="list the files that changed; exit 1 if any did")
    ap.add_argument("--ci", action="store_true", help="leave out the entries marked slow")
    ap.add_argument("--only", default="", help="comma-separated entry names")
    ap.add_argument("--list", action="store_true", help="print the entries and the kept files, run nothing")
    args = ap.parse_args(argv)
    if args.list:
        for g in GENERATED:
            slow = ", slow: not in --ci" if g.slow else ""
            print(f"{g.name} ({g.kind}, ~{g.seconds} s{slow}): {g.output} <- python -m {' '.join(g.argv)}")
        for k in KEPT:
            print(f"kept {k.pattern}: {k.reason}")
        return 0
    names = {n for n in args.only.split(",") if n}
    unknown = names - {g.name for g in GENERATED}
    if unknown:
        ap.error(f"--only: no entry named {', '.join(sorted(unknown))} (see --list)")
    chosen = [g for g in GENERATED if (not names or g.name in names) and not (args.ci and g.slow and not names)]
    changed: list[str] = []
    unquoted: list[str] = []
    start = time.perf_counter()
    for i, g in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {g.name}: python -m {' '.join(g.argv)}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        text = _run(g)
        path = ROOT / g.output
        old = path.read_text() if path.exists() else None
        if old != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(f"{g.output} ({'new' if old is None else _diff_hint(old, text)})")
        for page in g.quoted_in:
            lacking = missing_rows(text, (ROOT / page).read_text())
            if lacking:
                unquoted.append(f"{page} lacks {len(lacking)} row(s) of {g.output}, first: {lacking[0][:160]}")
        state = "changed" if old != text else "unchanged"
        print(f"    {state}, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"{len(chosen)} entries in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    for line in changed:
        print(f"changed: {line}")
    for line in unquoted:
        print(f"stale page: {line}")
    if args.check and (changed or unquoted):
        print(
            "regenerate --check: the files above differ from their commands' output (now written in place; "
            "commit them if the change is meant), or a page no longer quotes its table (correct the page)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
