"""Data-parallel plans on CUDA: staggered copies keep the math and delay the copies, planned DDP over NCCL equals the
full batch on one GPU (two GPUs or more), the shared-link measurement and the launcher run.

Skipped without CUDA; the NCCL test without two GPUs. On the GPU host: ``pytest -m gpu tests/gpu/test_ddp_gpu.py``.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic GEMMs

import pytest
import torch
from torch import nn

from memtune.profiler import zoo
from memtune.profiler.loss import step_loss
from memtune.tuner import Action, Plan, SharedLink, stagger_for
from memtune.tuner.calibration import Calibration
from memtune.tuner.measure.link_share import copier_counts, measure_allreduce, measure_shared_link
from memtune.tuner.runtime import planned
from memtune.tuner.runtime._stagger import StaggeredRuntime
from memtune.tuner.runtime.ddp import planned_ddp, planned_of, spawn_ranks
from memtune.tuner.runtime.verify import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GPT = {"layers": 4, "width": 256, "heads": 4, "seq_len": 128, "vocab": 512}
BATCH = 8


@pytest.fixture(autouse=True)
def _deterministic(deterministic: None) -> None:
    """Every test here runs deterministically (the ``deterministic`` fixture of ``conftest``)."""


def _chain() -> Any:
    torch.manual_seed(0)
    return zoo.build("gpt", GPT)


def _batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, GPT["vocab"], (BATCH, GPT["seq_len"]), generator=g)
    return x.to(device), torch.randint(0, GPT["vocab"], (BATCH, GPT["seq_len"]), generator=g).to(device)


def _plan(n: int, sync: str = "deferred") -> Plan:
    letters = ("ooroko" * n)[: n - 1] + "k"
    actions = tuple({"o": Action.OFFLOAD, "r": Action.RECOMPUTE, "k": Action.KEEP}[c] for c in letters)
    return Plan(actions=actions, sync=sync, sync_delay=1, prefetch_lookahead=1)  # type: ignore[arg-type]


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step_loss(model(x), y).backward()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def test_staggered_copies_keep_the_math_and_wait_on_the_copy_streams() -> None:
    device = torch.device("cuda")
    chain = _chain()
    chain.as_sequential().to(device)
    x, y = _batch(device)
    step_loss(chain.as_sequential()(x), y).backward()
    expected = {f"model.{k}": v for k, v in _grads(chain.as_sequential()).items()}
    plan = _plan(len(chain.stages), sync="layer")  # compute waits for each stage's copies: a wait shows in the step
    plain = planned(chain, plan)
    base = statistics.median(_steps(plain, x, y, 5)[1:])
    link = SharedLink.fair_share(5.0, 5.0)  # a slow link: slot 1 of 2 waits a copy's time at 5 GB/s per burst
    staggered = planned(chain, plan)
    runtime = StaggeredRuntime(stagger_for(1, 2, 2, link))
    staggered._runtime = runtime
    times = _steps(staggered, x, y, 5)
    got = _grads(staggered)
    for key, grad in expected.items():
        assert relative_error(got[key], grad) <= 1e-6, key
    assert runtime.waits > 0 and staggered.stats.d2h_copies > 0
    waited_per_step = runtime.waited_ms / 4  # the first step does not wait (no bytes known yet)
    assert statistics.median(times[1:]) > base + 0.5 * waited_per_step, (base, times, waited_per_step)


def _nccl_rank(rank: int, world: int) -> dict[str, torch.Tensor]:
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda", rank)
    chain = _chain()
    chain.as_sequential().to(device)
    x, y = _batch(device)
    half = BATCH // world
    link = SharedLink.fair_share(20.0, 20.0)
    model = planned_ddp(chain, _plan(len(chain.stages)), stagger=stagger_for(rank, world, world, link))
    for _ in range(2):  # the second step waits its turn
        model.zero_grad(set_to_none=True)
        step_loss(model(x[rank * half : (rank + 1) * half]), y[rank * half : (rank + 1) * half]).backward()
    return {k: v.cpu() for k, v in _grads(planned_of(model)).items()}


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_planned_ddp_over_nccl_equals_the_full_batch() -> None:
    device = torch.device("cuda", 0)
    chain = _chain()
    chain.as_sequential().to(device)
    x, y = _batch(device)
    step_loss(chain.as_sequential()(x), y).backward()
    expected = {f"model.{k}": v.cpu() for k, v in _grads(chain.as_sequential()).items()}
    for rank, got in enumerate(spawn_ranks(_nccl_rank, 2, backend="nccl")):
        for key, grad in expected.items():
            torch.testing.assert_close(got[key], grad, rtol=1e-5, atol=1e-6, msg=f"rank {rank} {key}")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_planned_fsdp_over_nccl_equals_the_full_batch() -> None:
    pytest.importorskip("transformers")
    from tests.unit.runtime.test_fsdp_plans import half, llama, plan_of_stages, sharded_rank

    device = torch.device("cuda", 0)
    plan = plan_of_stages()
    reference = llama().to(device)
    for rank in range(2):  # FSDP2 averages the ranks' gradients: each half's loss counts 1/2
        ids = half(rank, 2).to(device)
        (reference(input_ids=ids, labels=ids).loss / 2).backward()
    results = spawn_ranks(sharded_rank, 2, plan.model_dump(mode="json"), True, backend="nccl")
    for rank, (grads, d2h_bytes) in enumerate(results):
        assert d2h_bytes > 0
        for name, p in reference.named_parameters():
            torch.testing.assert_close(grads[name], p.grad.cpu(), rtol=1e-5, atol=1e-6, msg=f"rank {rank} {name}")


def test_shared_link_measurement_makes_a_valid_calibration_table() -> None:
    run = measure_shared_link(nbytes=64 << 20, warmup=1, repeats=3)
    gpus = torch.cuda.device_count()
    assert list(run.table) == [str(c) for c in copier_counts(gpus)]
    for row in run.table.values():
        assert set(row) == {"d2h", "h2d", "both_d2h", "both_h2d"} and all(v > 1.0 for v in row.values()), row
    cal = Calibration.from_data({"gpu": "test", "shared_link_gbps": run.table, "allreduce_gbps": measure_allreduce()})
    assert cal.shared_link is not None and cal.shared_link.source == "measured"
    assert (cal.allreduce_gbps(2) is not None) == (gpus >= 2)


@pytest.mark.slow
def test_ddp_plans_launcher_runs(tmp_path: Path) -> None:
    from benchmarks.ddp_plans import main

    nproc = min(2, torch.cuda.device_count())
    model = ["--model", "resnet18", "--params", "image_size=64,num_classes=10", "--batches", "16,32"]
    run = [
        "--budget",
        "4GiB",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--trials",
        "30",
        "--methods",
        "unplanned,plan,staggered",
    ]
    main([str(tmp_path), "--nproc", str(nproc), *model, *run])
    result = json.loads(next(tmp_path.glob("ddp-plans-*.json")).read_text())
    for method in ("unplanned", "plan", "staggered"):
        rows = result["methods"][method]
        assert rows and rows[0]["fits"], (method, rows)
        assert rows[0]["step_ms"] > 0 and rows[0]["peak_bytes"] <= result["budget_bytes"]
