"""Draw a module model's peers and memtune's plans as step time against peak memory, one PNG per JSON file.

    python -m benchmarks.peer_curves benchmarks/results/h100/module-peers/*.json --out docs/images

Reads what ``python -m benchmarks.module_peers`` writes per model, or ``memtune bench FILE.py:build --json-out``'s
file. One picture per model (``picture``): the compiler's sweep as a curve (each point the whole model compiled at one
activation budget, annotated with it), every other peer that ran as a point of its own (Hugging Face checkpointing,
``checkpoint_sequential``, side-stream activation offload), memtune's plans measured under ``budget_guard`` as points
(eager, and compiled where memtune served a compile), annotated with their budget; the budgets as dotted vertical
lines, and the unplanned eager step as a dashed horizontal line. What did not run (an out-of-memory under the cap, a
compile error) is named under the picture, not drawn. x: the measured peak allocated (GiB); y: the median step (ms;
log scale where the slowest is over three times the fastest). Needs matplotlib (``pip install 'memtune[plots]'``),
imported only when drawing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Picture", "Point", "main", "output_name", "picture", "render"]

GiB = float(1 << 30)


@dataclass(frozen=True)
class Point:
    """One measured configuration: peak allocated (GiB), median step (ms), its name and its annotation."""

    peak_gib: float
    step_ms: float
    name: str
    label: str = ""


@dataclass(frozen=True)
class Picture:
    """What one picture draws (``picture``); every list in the order it is drawn."""

    title: str
    compiler: list[Point] = field(default_factory=list)
    """the compiler's sweep, by activation budget"""
    peers: list[Point] = field(default_factory=list)
    """the other peers that ran"""
    eager: list[Point] = field(default_factory=list)
    """memtune's eager plans measured under their budget's cap, by budget"""
    compiled: list[Point] = field(default_factory=list)
    """memtune's plans that compile (the whole model, or compiled stages), measured under their budget's cap"""
    budgets: list[tuple[str, float]] = field(default_factory=list)
    """(label, GiB) of each budget memtune planned for"""
    unplanned: Point | None = None
    left_out: list[str] = field(default_factory=list)
    """what did not run or is not drawn, and why (an out-of-memory under the cap, a compile error)"""


def _gib(r: dict[str, Any]) -> float:
    return float(r["peak_bytes"]) / GiB


def _ran(r: dict[str, Any] | None) -> bool:
    """Whether ``r`` is a measurement that ran (a step and a peak, no error)."""
    return r is not None and "error" not in r and r.get("step_ms") is not None and r.get("peak_bytes") is not None


def _plans(data: dict[str, Any]) -> list[dict[str, Any]]:
    """memtune's plans: ``benchmarks.module_peers``'s ``plans``, or the one of ``memtune bench`` on a module."""
    if "plans" in data:
        return list(data["plans"])
    if "budget_bytes" not in data:
        return []
    plan_json = data.get("plan_json") or {}
    compiled = plan_json.get("whole_compile") is not None or plan_json.get("compile_budget") is not None
    return [
        {
            "fraction": data.get("fraction"),
            "budget_bytes": data["budget_bytes"],
            "compiled": compiled,
            "plan": data.get("plan"),
            "capped": data.get("planned") or {"error": data.get("error", "no plan")},
        }
    ]


def _fraction_label(p: dict[str, Any]) -> str:
    f = p.get("fraction")
    return f"{f:.0%}" if isinstance(f, (int, float)) else ""


def picture(data: dict[str, Any]) -> Picture:
    """The picture of one model's file (see the module docstring)."""
    device = data.get("device")
    device_name = device.get("name") if isinstance(device, dict) else device
    dtype = f" {data['dtype']}" if data.get("dtype") else ""
    title = f"{data.get('model', '?')} batch {data.get('batch', '?')}{dtype} on {device_name or 'unknown device'}"
    compiler: list[Point] = []
    peers: list[Point] = []
    eager: list[Point] = []
    compiled: list[Point] = []
    budgets: list[tuple[str, float]] = []
    left_out: list[str] = []
    for r in data.get("peers") or []:
        if not r.get("applies"):
            continue
        if not _ran(r):
            left_out.append(f"{r['name']}: {r.get('error', 'not measured')}")
        elif r.get("family") == "compiler":
            compiler.append(Point(_gib(r), float(r["step_ms"]), r["name"], f"{r['activation_budget']:g}"))
        else:
            peers.append(Point(_gib(r), float(r["step_ms"]), r["name"]))
    compiler.sort(key=lambda p: float(p.label))
    for p in _plans(data):
        label = _fraction_label(p)
        if p.get("budget_bytes"):
            budgets.append((label or "budget", float(p["budget_bytes"]) / GiB))
        cap = p.get("capped")
        kind = "compiled" if p.get("compiled") else "eager"
        name = f"memtune {kind} plan at {label or 'its budget'}" + (f" ({p['plan']})" if p.get("plan") else "")
        if "plan_json" not in p and "plan" not in p:  # the search's own answer, e.g. no plan fits
            left_out.append(f"memtune at {label or 'its budget'}: {p.get('error', 'no plan')}")
            continue
        if not _ran(cap):
            left_out.append(f"{name}: {(cap or {}).get('error', 'not measured')}")
            continue
        assert cap is not None
        (compiled if p.get("compiled") else eager).append(Point(_gib(cap), float(cap["step_ms"]), name, label))
    un = data.get("unplanned")
    unplanned = Point(_gib(un), float(un["step_ms"]), "unplanned (eager)") if un is not None and _ran(un) else None
    return Picture(title, compiler, peers, eager, compiled, budgets, unplanned, left_out)


def output_name(data: dict[str, Any]) -> str:
    """``peers-<model>-b<batch>.png``, the model's name made safe for a file name."""
    model = "".join(c if c.isalnum() or c in "-_" else "-" for c in str(data.get("model", "model"))).strip("-")
    return f"peers-{model}-b{data.get('batch', '?')}.png"


def render(data: dict[str, Any], out: Path) -> Path:
    """Draw one file's content (parsed JSON) into the PNG ``out``; returns ``out``.

    Raises:
        ImportError: matplotlib is not installed (the message says how to install it).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("benchmarks.peer_curves draws with matplotlib: pip install 'memtune[plots]'") from exc
    pic = picture(data)
    fig = Figure(figsize=(9, 6), layout="constrained")  # the Agg canvas, no pyplot state
    ax = fig.add_subplot()
    if pic.compiler:
        ax.plot([p.peak_gib for p in pic.compiler], [p.step_ms for p in pic.compiler], marker="o", color="#0072b2",
                label="torch.compile, activation budget 0 … 1")  # fmt: skip
        for p in pic.compiler:
            ax.annotate(p.label, (p.peak_gib, p.step_ms), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color="#0072b2")  # fmt: skip
    for p, marker in zip(pic.peers, "^sDvP<>", strict=False):
        ax.plot([p.peak_gib], [p.step_ms], marker=marker, linestyle="none", markersize=8, label=p.name)
    for points, marker, color, label in (
        (pic.eager, "*", "#d55e00", "memtune, eager plans under the cap"),
        (pic.compiled, "X", "#cc79a7", "memtune, compiled plans under the cap"),
    ):
        if not points:
            continue
        ax.plot([p.peak_gib for p in points], [p.step_ms for p in points], marker=marker, markersize=11,
                linestyle="none", color=color, label=label)  # fmt: skip
        for p in points:
            ax.annotate(p.label, (p.peak_gib, p.step_ms), textcoords="offset points", xytext=(6, -10), fontsize=8,
                        color=color)  # fmt: skip
    for i, (label, gib) in enumerate(pic.budgets):
        ax.axvline(gib, color="#d55e00", linestyle=":", linewidth=1, label="memtune's budgets" if i == 0 else None)
        ax.annotate(label, (gib, 1.0), xycoords=("data", "axes fraction"), textcoords="offset points", xytext=(2, -10),
                    fontsize=7, color="#d55e00")  # fmt: skip
    if pic.unplanned is not None:
        u = pic.unplanned
        ax.axhline(u.step_ms, color="0.3", linestyle="--", linewidth=1,
                   label=f"unplanned eager ({u.step_ms:.1f} ms, {u.peak_gib:.2f} GiB)")  # fmt: skip
        ax.plot([u.peak_gib], [u.step_ms], marker="o", color="0.3", markerfacecolor="white", linestyle="none")
    steps = [p.step_ms for p in (*pic.compiler, *pic.peers, *pic.eager, *pic.compiled)]
    if pic.unplanned is not None:
        steps.append(pic.unplanned.step_ms)
    if steps and max(steps) > 3 * min(steps):
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_title(pic.title)
    ax.set_xlabel("measured peak memory allocated (GiB)")
    if pic.left_out:  # named under the picture, where the layout keeps room for it
        import textwrap

        note = textwrap.wrap("not drawn: " + "; ".join(pic.left_out), 150)
        fig.supxlabel("\n".join(note[:4]), fontsize=7, color="0.35")
    ax.set_ylabel("step time (ms" + (", log scale)" if ax.get_yscale() == "log" else ")"))
    ax.grid(True, alpha=0.3)
    if steps:
        ax.legend(fontsize=8, loc="best")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer_curves", description=__doc__.splitlines()[0])
    parser.add_argument(
        "files", nargs="+", type=Path, help="benchmarks.module_peers or `memtune bench --json-out` files"
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    args = parser.parse_args(argv)
    for path in args.files:
        data = json.loads(path.read_text())
        if "error" in data and "peers" not in data:
            print(f"{path}: no picture, the run failed: {str(data['error'])[:200]}", file=sys.stderr)
            continue
        try:
            print(render(data, args.out / output_name(data)))
        except ImportError as exc:
            print(exc, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
