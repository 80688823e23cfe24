"""The peers of a module model in ``memtune bench``: measured after memtune's rows, written under ``peers`` in its
JSON and printed as a table of their own (NOTE [ Module peers ] in ``memtune.tuner.measure.module_peers``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table

if TYPE_CHECKING:
    from torch import nn

__all__ = ["bench_peers", "peer_table"]

GiB = float(1 << 30)


def bench_peers(
    model: nn.Module,
    inputs: Any,
    budgets: Sequence[float],
    *,
    warmup: int,
    steps: int,
    stages: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Every peer of ``model`` on its device, those that do not apply with their reason, each that does measured
    (``memtune.tuner.measure.peer_measure.measure_peers``); ``budgets``: the compiler's sweep."""
    from memtune.tuner.measure.module_peers import applicable_peers
    from memtune.tuner.measure.peer_measure import measure_peers

    peers = applicable_peers(model, inputs, compiler_budgets=budgets, stages=stages)

    def tick(done: int, total: int, name: str) -> None:
        if progress is not None and done < total:
            progress(f"{name} ({done + 1} of {total})")

    return measure_peers(model, inputs, peers=peers, warmup=warmup, steps=steps, progress=tick)


def peer_table(peers: Sequence[dict[str, Any]], unplanned: dict[str, Any] | None, title: str) -> Table:
    """The peers as rows: step ms, its ratio to the unplanned step, peak allocated and reserved GiB, the first step's
    seconds (compiling, for the compiler), and the reason or error of a peer that did not run."""
    base = (unplanned or {}).get("step_ms")
    table = Table(
        "peer", "step ms", "x unplanned", "peak GiB", "reserved GiB", "first step s", "note", title=title,
        caption="uncapped, as users run them; the compiler's rows: the whole model compiled at that activation budget",
    )  # fmt: skip
    for p in peers:
        if not p.get("applies"):
            table.add_row(p["name"], "-", "-", "-", "-", "-", f"does not apply: {p['note']}")
        elif "error" in p:
            table.add_row(p["name"], "-", "-", "-", "-", "-", p["error"][:160])
        else:
            table.add_row(
                p["name"],
                f"{p['step_ms']:.1f}",
                f"{p['step_ms'] / base:.2f}" if base else "-",
                f"{p['peak_bytes'] / GiB:.2f}",
                f"{p['reserved_bytes'] / GiB:.2f}",
                f"{p['first_step_s']:.1f}",
                "",
            )
    return table
