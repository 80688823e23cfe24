"""``memtune bench`` on a module model measures its peers (``memtune.api.cli._cli_peers``): the set and its measurement
on the CPU,
the table it prints, and the sweep's refusal before any work."""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console
from torch import nn
from typer.testing import CliRunner

from memtune.api.cli import app
from memtune.api.cli._cli_peers import bench_peers, peer_table

GiB = 1 << 30


def test_bench_peers_lists_every_peer_and_measures_those_that_apply() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(5)))
    said: list[str] = []
    rows = bench_peers(model, torch.randn(8, 16), (), warmup=1, steps=1, progress=said.append)
    by = {r["family"]: r for r in rows}
    assert set(by) == {"hf_checkpointing", "checkpoint_sequential", "offload_activations"}
    assert by["checkpoint_sequential"]["step_ms"] > 0 and by["checkpoint_sequential"]["segments"] == 2
    assert not by["hf_checkpointing"]["applies"] and not by["offload_activations"]["applies"]
    assert said == ["checkpoint_sequential (2 segments) (1 of 1)"]


def test_the_peer_table_shows_results_reasons_and_errors() -> None:
    peers = [
        {"name": "torch.compile budget 0.5", "family": "compiler", "applies": True, "note": "", "step_ms": 50.0,
         "peak_bytes": 3 * GiB, "reserved_bytes": 4 * GiB, "first_step_s": 41.2},
        {"name": "HF gradient checkpointing", "family": "hf_checkpointing", "applies": False,
         "note": "no gradient checkpointing in this model class (ResNet is no Hugging Face model)"},
        {"name": "offload activations (side stream)", "family": "offload_activations", "applies": True, "note": "",
         "error": "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB."},
    ]  # fmt: skip
    console = Console(width=250, record=True)
    console.print(peer_table(peers, {"step_ms": 100.0}, "peers of m.py:build batch 8"))
    text = console.export_text()
    assert "peers of m.py:build batch 8" in text
    assert "│ torch.compile budget 0.5          │ 50.0    │ 0.50        │ 3.00     │ 4.00         │ 41.2" in text
    assert "does not apply: no gradient checkpointing in this model class (ResNet is no Hugging Face model)" in text
    assert "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB." in text


def test_a_bad_compiler_sweep_is_refused_first(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", f"{tmp_path / 'm.py'}:build", "--compiler-sweep", "0,2"])
    assert result.exit_code == 2
    assert "--compiler-sweep: activation budgets are shares from 0 to 1, not 2" in result.output
