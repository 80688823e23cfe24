"""``bench_plans`` on a CUDA GPU, each row in a fresh process (NOTE [ Bench isolation ]) and in one process.

Skipped without CUDA (run on the H200 with ``pytest -m gpu tests/gpu``).
"""

from __future__ import annotations

import functools

import pytest
import torch

from memtune.profiler import zoo
from memtune.profiler.modeled import modeled_profile
from memtune.tuner.measure.bench import bench_plans
from memtune.tuner.plan import Action, Plan

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PARAMS = {"image_size": 64, "num_classes": 10}


@pytest.mark.parametrize("isolated", [True, False])
def test_bench_rows_measure_in_fresh_processes_and_in_one(isolated: bool) -> None:
    chain = zoo.build("resnet18", PARAMS)
    profile = modeled_profile(chain, 16, "float32", "h200")
    plans = [
        ("all offload", "policy", Plan.uniform(profile.n_stages, Action.OFFLOAD)),
        ("all recompute", "policy", Plan.uniform(profile.n_stages, Action.RECOMPUTE)),
    ]
    seen: list[str] = []
    rows = bench_plans(
        chain,
        profile,
        16,
        "float32",
        8 << 30,
        plans,
        warmup=1,
        iters=2,
        progress=seen.append,
        chain_factory=functools.partial(zoo.build, "resnet18", PARAMS) if isolated else None,
    )
    names = [r.name for r in rows]
    assert names[:3] == ["unconstrained", "all offload", "all recompute"] and seen == names
    assert names[3].startswith("torch save_on_cpu") and names[4].startswith("torch checkpoint_sequential")
    for row in rows:
        assert row.error is None, row.error
        assert row.step_ms is not None and row.step_ms > 0 and row.peak_bytes is not None and row.fits
    # the plans keep fewer saved activations than the unplanned step
    assert rows[1].peak_bytes is not None and rows[0].peak_bytes is not None
    assert rows[1].peak_bytes < rows[0].peak_bytes
