"""``benchmarks.curves``: bench JSON to a step-time against peak-memory PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import curves

pytest.importorskip("matplotlib")

GiB = 1 << 30
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _row(name: str, kind: str, step_ms: float | None, peak_gib: float | None, error: str | None = None) -> dict:
    return {
        "name": name,
        "kind": kind,
        "step_ms": step_ms,
        "peak_bytes": None if peak_gib is None else int(peak_gib * GiB),
        "fits": None if peak_gib is None else peak_gib <= 6,
        "budget_bytes": 6 * GiB,
        "error": error,
    }


def _bench() -> dict[str, Any]:
    return {
        "model": "gpt",
        "batch": 16,
        "dtype": "bfloat16",
        "device": {"name": "NVIDIA H200"},
        "rows": [
            _row("unconstrained", "unconstrained", 100.0, 10.0),
            _row("torch.compile budget 0.3", "compiler", 130.0, 5.0),
            _row("torch.compile budget 1.0", "compiler", 95.0, 9.0),
            _row("torch.compile budget 0.0", "compiler", 150.0, 4.0),
            _row("tuned@50% (headroom 5%)", "tuned", 120.0, 5.5),
            _row("tuned (headroom 5%)", "tuned", 110.0, 6.5),
            _row("tuned compiled", "compiled-tuned", 105.0, 5.8),
            _row("torch save_on_cpu", "pytorch", 300.0, 3.0),
            _row("torch checkpoint_sequential (5)", "pytorch", 140.0, 4.5),
            _row("offload activations (1 MiB)", "pytorch", 250.0, 3.5),
            _row("vdnn_all_m", "policy", 200.0, 4.2),
            _row("broken", "tuned", None, None, error="out of memory: tried to allocate 2 GiB"),
            _row("broken compiler", "compiler", 1.0, 1.0, error="RuntimeError: boom"),
        ],
    }


def test_series_families_and_skips_errors() -> None:
    families, unconstrained = curves.series(_bench())
    assert unconstrained is not None and unconstrained.step_ms == 100.0
    assert set(families) == {
        "torch.compile activation budget",
        "memtune (eager, or compiled whole where faster)",
        "memtune (compiled stages)",
        "torch save_on_cpu",
        "torch checkpoint_sequential",
        "offload activations",
        "policy",
    }
    compiler = families["torch.compile activation budget"]
    assert [p.label for p in compiler] == ["0.0", "0.3", "1.0"]  # sorted by peak, annotated with the budget
    assert [p.peak_gib for p in compiler] == sorted(p.peak_gib for p in compiler)
    assert len(families["memtune (eager, or compiled whole where faster)"]) == 2  # the failed tuned row is left out
    assert all(p.step_ms != 1.0 for ps in families.values() for p in ps)  # so is the failed compiler row


def test_render_file_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_bench()))
    out = curves.render_file(path, tmp_path / "figures")
    assert out == tmp_path / "figures" / "gpt-b16-bfloat16.png"
    data = out.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_SIGNATURE)


def test_main_keeps_two_files_of_one_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "bench-a.json", tmp_path / "bench-b.json"
    for p in (a, b):
        p.write_text(json.dumps(_bench()))
    assert curves.main([str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["gpt-b16-bfloat16-bench-b.png", "gpt-b16-bfloat16.png"]
    assert "gpt-b16-bfloat16.png" in capsys.readouterr().out


def test_missing_matplotlib_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match=r"memtune\[plots\]"):
        curves.render(_bench(), tmp_path / "x.png")
