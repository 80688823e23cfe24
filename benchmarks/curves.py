"""Draw `memtune bench --json-out` files as step time against peak memory, one PNG per file.

    python -m benchmarks.curves benchmarks/results/bench-*.json --out docs/figures

Each figure plots the measured step (ms, y) against the measured peak memory (GiB, x) of every row that ran, one
series per family of rows, the points of a family joined in order of their peak: the compiler's activation budgets
(``torch.compile budget 0.3``, each point annotated with its budget), memtune's tuned plans (eager and compiled),
each of PyTorch's tools and the other peers (a point each), and any other kind of row as a family of its own. The
unconstrained step is the dashed horizontal line. A hollow marker is a row whose peak went over its budget. Needs
matplotlib (``pip install 'memtune[plots]'``), imported only when drawing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Point", "family_of", "main", "output_name", "render", "render_file", "series"]

GiB = float(1 << 30)

COMPILER = "torch.compile activation budget"
_KIND_FAMILIES = {
    "compiler": COMPILER,
    "tuned": "memtune (eager, or compiled whole where faster)",
    "compiled-tuned": "memtune (compiled stages)",
}
_PYTORCH_PREFIXES = ("torch save_on_cpu", "torch checkpoint_sequential", "offload activations")
_BUDGET = re.compile(r"budget\s*([0-9]*\.?[0-9]+)")


@dataclass(frozen=True)
class Point:
    """One measured row: peak memory (GiB), step time (ms), its annotation, and whether it fit its budget."""

    peak_gib: float
    step_ms: float
    label: str | None = None
    fits: bool | None = None


def family_of(row: dict[str, Any]) -> str | None:
    """The series a bench row belongs to (None for the unconstrained row, drawn as a line)."""
    kind, name = row.get("kind", ""), row.get("name", "")
    if kind == "unconstrained":
        return None
    if kind in _KIND_FAMILIES:
        return _KIND_FAMILIES[kind]
    if kind == "pytorch":
        return next((p for p in _PYTORCH_PREFIXES if name.startswith(p)), name)
    return str(kind)


def _measured(row: dict[str, Any]) -> bool:
    return not row.get("error") and row.get("step_ms") is not None and row.get("peak_bytes") is not None


def series(data: dict[str, Any]) -> tuple[dict[str, list[Point]], Point | None]:
    """The families of one bench file's measured rows, each sorted by peak, and the unconstrained step.

    Rows with an ``error`` or without a measured step or peak are left out.
    """
    families: dict[str, list[Point]] = {}
    unconstrained: Point | None = None
    for row in data.get("rows", []):
        if not _measured(row):
            continue
        fam = family_of(row)
        label = None
        if fam == COMPILER:
            m = _BUDGET.search(row.get("name", ""))
            label = m.group(1) if m else row.get("name")
        point = Point(row["peak_bytes"] / GiB, float(row["step_ms"]), label, row.get("fits"))
        if fam is None:
            unconstrained = unconstrained or point
        else:
            families.setdefault(fam, []).append(point)
    return {f: sorted(ps, key=lambda p: (p.peak_gib, p.step_ms)) for f, ps in families.items()}, unconstrained


def output_name(data: dict[str, Any]) -> str:
    """``<model>-b<batch>-<dtype>.png``."""
    return f"{data.get('model', 'model')}-b{data.get('batch', '?')}-{data.get('dtype', '?')}.png"


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("benchmarks.curves draws with matplotlib: pip install 'memtune[plots]'") from exc
    return Figure


def render(data: dict[str, Any], out: Path) -> Path:
    """Draw one bench file's content (parsed JSON) into the PNG ``out``; returns ``out``.

    Raises:
        ImportError: matplotlib is not installed (the message says how to install it).
    """
    figure = _figure_class()  # matplotlib's Agg canvas, with no pyplot state: safe in any process
    families, unconstrained = series(data)
    fig = figure(figsize=(9, 6), layout="constrained")
    ax = fig.add_subplot()
    markers = "osD^v<>Pp*hX"
    for i, (fam, points) in enumerate(families.items()):
        xs, ys = [p.peak_gib for p in points], [p.step_ms for p in points]
        (line,) = ax.plot(xs, ys, marker=markers[i % len(markers)], linestyle="-", label=fam)
        over = [p for p in points if p.fits is False]
        if over:  # hollow: over the budget
            ax.plot(
                [p.peak_gib for p in over],
                [p.step_ms for p in over],
                linestyle="none",
                marker=markers[i % len(markers)],
                markerfacecolor="white",
                markeredgecolor=line.get_color(),
            )
        for p in points:
            if p.label is not None:
                ax.annotate(p.label, (p.peak_gib, p.step_ms), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if unconstrained is not None:
        ax.axhline(
            unconstrained.step_ms,
            color="0.3",
            linestyle="--",
            linewidth=1,
            label=f"unconstrained ({unconstrained.step_ms:.1f} ms, {unconstrained.peak_gib:.2f} GiB)",
        )
    device = data.get("device") or {}
    ax.set_title(
        f"{data.get('model', '?')} batch {data.get('batch', '?')} {data.get('dtype', '?')}"
        f" on {device.get('name', 'unknown device')}"
    )
    ax.set_xlabel("measured peak memory (GiB)")
    ax.set_ylabel("step time (ms, log scale)")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if families or unconstrained is not None:
        ax.legend(fontsize=8, loc="best")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def render_file(path: Path, out_dir: Path, name: str | None = None) -> Path:
    """Draw the bench file ``path`` into ``out_dir`` as ``name`` (default ``output_name``); returns the PNG's path."""
    data = json.loads(path.read_text())
    return render(data, out_dir / (name or output_name(data)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.curves", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="`memtune bench --json-out` files")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    args = parser.parse_args(argv)
    written: set[str] = set()
    for path in args.files:
        data = json.loads(path.read_text())
        name = output_name(data)
        if name in written:  # two runs of one model, batch and dtype: keep both
            name = f"{name.removesuffix('.png')}-{path.stem}.png"
        written.add(name)
        try:
            out = render(data, args.out / name)
        except ImportError as exc:
            print(exc, file=sys.stderr)
            return 2
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
