"""Rows of a data-parallel benchmark survive a rank that stops mid-run (NOTE [ A rank out of memory ] in
``benchmarks.ranked``): two gloo ranks, the second dies at the second batch; the first batch's row stands and the
second is reported as not trained, with what that rank saw."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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


@pytest.mark.slow
def test_rows_written_before_a_rank_died_stand() -> None:
    rows = spawn_rows(_trials, 2, _Cfg(batches=(1, 2, 3)), batches=(1, 2, 3), backend="gloo", timeout_s=30)
    assert [r["batch"] for r in rows] == [1, 2]
    assert rows[0]["fits"] and rows[0]["step_ms"] == 1.0
    assert not rows[1]["fits"] and "collective" in rows[1]["error"]


@pytest.mark.slow
def test_all_batches_train() -> None:
    rows = spawn_rows(_trials, 2, _Cfg(batches=(1, 3)), batches=(1, 3), backend="gloo", timeout_s=30)
    assert [(r["batch"], r["fits"], r["step_ms"]) for r in rows] == [(1, True, 1.0), (3, True, 3.0)]


@pytest.mark.slow
def test_the_fsdp_benchmark_runs_on_the_cpu(tmp_path: Path) -> None:
    """``benchmarks.fsdp_plans --cpu``: two gloo ranks train a tiny Llama under FSDP2 alone, with Hugging Face
    checkpointing and with memtune's plan; every row trains and the plan's row carries its simulation."""
    from benchmarks.fsdp_plans import main

    tiny = "num_hidden_layers=2,hidden_size=32,intermediate_size=64,num_attention_heads=4,num_key_value_heads=2"
    main([str(tmp_path), "--nproc", "2", "--cpu", "--llama", f"{tiny},vocab_size=128", "--seq", "16",
          "--batches", "1,2", "--trials", "10", "--steps", "1", "--warmup", "1"])  # fmt: skip
    result = json.loads(next(tmp_path.glob("fsdp-plans-*.json")).read_text())
    for method in ("fsdp", "hf_checkpointing", "plan"):
        rows = result["methods"][method]
        assert [r["batch"] for r in rows] == [1, 2] and all(r["fits"] and r["step_ms"] > 0 for r in rows), rows
    assert set(result["predicted"]["1"]) == {"fsdp", "plan"}
