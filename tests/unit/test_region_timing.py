"""``benchmarks.region_timing``: the tensors its hooks watch and the tables it prints (its spans need a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.region_timing import _first_grad_tensor, table


def test_the_hooks_watch_the_first_tensor_that_takes_a_gradient() -> None:
    plain, grad = torch.zeros(2), torch.zeros(2, requires_grad=True)
    assert _first_grad_tensor(((plain, 3), {"x": plain, "h": grad})) is grad
    assert _first_grad_tensor((plain, [plain])) is None


def test_the_table_puts_each_region_beside_its_profile_and_the_time_between_regions(tmp_path: Path) -> None:
    entry = {
        "fraction": 0.9, "variant": "plan", "compact": "ok", "simulated_ms": 10.0, "profile_loss_ms": 1.0,
        "profiled": {"a": {"forward": 1.0, "backward": 2.0}, "b": {"forward": 3.0, "backward": 4.0}},
        "wall_ms": 14.0, "issue_ms": 5.0, "gpu_ms": 13.0, "fb_gpu_ms": 12.0,
        "regions": {"a": {"forward": 1.5, "backward": 2.5}, "b": {"forward": 3.0, "backward": 4.0, "recompute": 3.0}},
    }  # fmt: skip
    failed = {"fraction": 0.9, "variant": "keep", "compact": "kk", "simulated_ms": 9.0, "error": "OutOfMemoryError"}
    row = {"model": "m", "device": "GPU", "update_ms": 1.0, "plans": [entry, failed]}
    (tmp_path / "m.json").write_text(json.dumps(row))
    text = table(tmp_path)
    # the regions' forward and backward add up to 11.0 of the 12.0 ms step; a recompute runs inside its backward
    assert "| 90% | plan | `ok` | 10.0 | 12.0 | 13.0 | 14.0 | 5.0 | 11.0 | 1.0 |" in text
    assert "| 90% | plan | a | 1.00 / 1.50 | 2.00 / 2.50 |" in text
    assert "| 90% | keep | `kk` | 9.0 | OutOfMemoryError |" in text
