"""``benchmarks.peer_curves``: a module model's peers and memtune's plans, from either file that holds them, as one
step-time against peak-memory picture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import peer_curves

GiB = 1 << 30
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _peer(name: str, family: str, step_ms: float | None, peak_gib: float | None, **more: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "family": family, "applies": True, "note": ""}
    if step_ms is not None and peak_gib is not None:
        row.update(step_ms=step_ms, peak_bytes=int(peak_gib * GiB), reserved_bytes=int(peak_gib * GiB) + GiB)
    return {**row, **more}


def _peers() -> list[dict[str, Any]]:
    return [
        *(
            _peer(f"torch.compile budget {b:g}", "compiler", 40 + 20 * (1 - b), 3 + 6 * b, activation_budget=b)
            for b in (1.0, 0.5, 0.0)
        ),
        _peer("torch.compile budget 0.1", "compiler", None, None, activation_budget=0.1, error="RuntimeError: boom"),
        {"name": "HF gradient checkpointing", "family": "hf_checkpointing", "applies": False, "note": "no"},
        _peer("checkpoint_sequential (5 segments)", "checkpoint_sequential", 90.0, 5.9, segments=5),
        _peer("offload activations (side stream)", "offload_activations", 550.0, 2.3),
    ]


def _module_peers_file() -> dict[str, Any]:
    return {
        "model": "resnet50",
        "batch": 128,
        "dtype": "float32",
        "device": "NVIDIA H100 80GB HBM3",
        "unplanned": {"step_ms": 71.0, "peak_bytes": int(10.6 * GiB), "reserved_bytes": 11 * GiB},
        "peers": _peers(),
        "plans": [
            {"fraction": 0.9, "budget_bytes": int(8.1 * GiB), "compiled": True, "plan": "compiled whole, budget 1",
             "capped": {"step_ms": 41.0, "peak_bytes": int(7.9 * GiB)}},
            {"fraction": 0.6, "budget_bytes": int(5.4 * GiB), "compiled": False, "plan": "kkrro",
             "capped": {"step_ms": 85.0, "peak_bytes": int(5.2 * GiB)}},
            {"fraction": 0.3, "budget_bytes": int(2.7 * GiB), "compiled": False, "plan": "rrooo",
             "capped": {"error": "PlanOutOfMemoryError: stage 3"}},
        ],
    }  # fmt: skip


def test_the_picture_of_a_module_peers_file() -> None:
    pic = peer_curves.picture(_module_peers_file())
    assert pic.title == "resnet50 batch 128 float32 on NVIDIA H100 80GB HBM3"
    assert [p.label for p in pic.compiler] == ["0", "0.5", "1"]  # by budget
    assert [p.name for p in pic.peers] == ["checkpoint_sequential (5 segments)", "offload activations (side stream)"]
    assert [(p.label, p.step_ms) for p in pic.eager] == [("60%", 85.0)]
    assert [p.name for p in pic.compiled] == ["memtune compiled plan at 90% (compiled whole, budget 1)"]
    assert [label for label, _ in pic.budgets] == ["90%", "60%", "30%"]
    assert pic.unplanned is not None and pic.unplanned.step_ms == 71.0
    assert pic.left_out == [
        "torch.compile budget 0.1: RuntimeError: boom",
        "memtune eager plan at 30% (rrooo): PlanOutOfMemoryError: stage 3",
    ]


def test_the_picture_of_memtune_bench_on_a_module() -> None:
    data = {
        "model": "models.py:build",
        "batch": 32,
        "device": "NVIDIA H100 80GB HBM3",
        "fraction": 0.6,
        "budget_bytes": 6 * GiB,
        "plan": "kkrk",
        "plan_json": {"actions": ["keep"], "whole_compile": None},
        "unplanned": {"step_ms": 50.0, "peak_bytes": 10 * GiB},
        "planned": {"step_ms": 60.0, "peak_bytes": int(5.8 * GiB)},
        "peers": _peers(),
    }
    pic = peer_curves.picture(data)
    assert [(p.name, p.label) for p in pic.eager] == [("memtune eager plan at 60% (kkrk)", "60%")]
    assert pic.budgets == [("60%", 6.0)] and not pic.compiled
    assert peer_curves.output_name(data) == "peers-models-py-build-b32.png"


def test_render_and_main_write_one_png_per_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    src = tmp_path / "resnet50.json"
    src.write_text(json.dumps(_module_peers_file()))
    failed = tmp_path / "broken.json"
    failed.write_text(json.dumps({"model": "broken", "error": "ImportError: no transformers"}))
    assert peer_curves.main([str(src), str(failed), "--out", str(tmp_path / "png")]) == 0
    out = tmp_path / "png" / "peers-resnet50-b128.png"
    assert out.read_bytes().startswith(PNG_SIGNATURE)
    streams = capsys.readouterr()
    assert streams.out.strip() == str(out)
    assert "broken.json: no picture, the run failed: ImportError: no transformers" in streams.err
