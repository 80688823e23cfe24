"""Rows of a data-parallel benchmark survive a rank that stops mid-run (NOTE [ A rank out of memory ] in
``benchmarks.ranked``): two gloo ranks, the second dies at the second batch; the first batch's row stands and the
second is reported as not trained, with what that rank saw."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.ranked import rank_rows, spawn_rows


@dataclass(frozen=True)
class _Cfg:
    batches: tuple[int, ...]
    rows_file: str | None = None


def _measure(rank: int, batch: int) -> dict[str, Any]:
    if batch == 2 and rank == 1:
        raise RuntimeError("rank 1 ran out of memory at batch 2")
    return {"ok": True, "ms": float(batch), "peak": None, "error": None}


def _trials(rank: int, world: int, cfg: _Cfg) -> list[dict[str, Any]]:
    return rank_rows(rank, world, cfg.batches, lambda b: _measure(rank, b), cfg.rows_file)


def test_rows_written_before_a_rank_died_stand() -> None:
    rows = spawn_rows(_trials, 2, _Cfg(batches=(1, 2, 3)), batches=(1, 2, 3), backend="gloo", timeout_s=30)
    assert [r["batch"] for r in rows] == [1, 2]
    assert rows[0]["fits"] and rows[0]["step_ms"] == 1.0
    assert not rows[1]["fits"] and "collective" in rows[1]["error"]


def test_all_batches_train() -> None:
    rows = spawn_rows(_trials, 2, _Cfg(batches=(1, 3)), batches=(1, 3), backend="gloo", timeout_s=30)
    assert [(r["batch"], r["fits"], r["step_ms"]) for r in rows] == [(1, True, 1.0), (3, True, 3.0)]
