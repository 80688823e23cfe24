"""Measured validation for real: a job asks for its top plans to be measured, the worker runs them on this
GPU, and the leaderboard and the best-plan answer carry ``measured`` rows with the prediction beside them.

Skipped without CUDA (run on the H200 with ``pytest -m gpu tests/gpu``). A small ResNet-18 (64x64
images, 10 classes) at batch 16 keeps it to seconds.
"""

from __future__ import annotations

import pytest
import torch

from memtune.api.client import MemtuneClient
from memtune.api.service.worker import Worker
from memtune.profiler.identity import cuda_identity
from memtune.storage.database import Database

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MODEL = {"zoo": "resnet18", "params": {"image_size": 64, "num_classes": 10}}
BUDGET = "2GiB"


@pytest.fixture
def service(gpu_service: tuple[Database, MemtuneClient]) -> tuple[MemtuneClient, Database]:
    db, client = gpu_service
    return client, db


def _worker(db: Database) -> Worker:
    return Worker(db, worker_id="gpu-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0)


def test_job_measures_its_top_plans_on_this_gpu(service: tuple[MemtuneClient, Database]) -> None:
    client, db = service
    ident = cuda_identity()
    job = client.submit_job(
        MODEL, batch=16, gpu=ident.key, budget=BUDGET, trials=30, validate_top_k=2, validate_iters=4
    )
    assert job.validate_top_k == 2 and job.validation is not None and job.validation.state == "pending"
    assert _worker(db).run_once() == job.id

    done = client.get_job(job.id)
    assert done.state == "succeeded", done.error
    v = done.validation
    assert v is not None and v.state == "done", v
    assert v.device == ident.name and v.note is not None and "measured 2 of 2" in v.note, v.note
    assert v.unconstrained is not None and v.unconstrained.step_ms > 0 and v.unconstrained.peak_bytes > 0

    results = client.job_results(job.id, plans=True).data
    simulated = {r.name: r for r in results if r.source == "simulated"}
    measured = [r for r in results if r.source == "measured"]
    assert len(measured) == 2 and len({str(r.plan) for r in measured}) == 2
    for r in measured:
        twin = simulated[r.name]  # the prediction beside the measurement is the simulated row's
        assert r.plan == twin.plan and r.kind == twin.kind
        assert r.predicted_step_ms == twin.step_ms and r.predicted_peak_bytes == twin.peak_bytes
        assert r.step_ms > 0 and 0 < r.peak_bytes <= job.budget_bytes and r.feasible
        assert r.reserved_peak_bytes is not None and r.reserved_peak_bytes >= r.peak_bytes
        assert r.samples_per_s is not None and r.samples_per_s > 0 and r.step_error is not None

    board = client.leaderboard(model=job.model_id, gpu=ident.key, batch=16, source="measured", page_size=10)
    assert board.count == 2 and {r.source for r in board.data} == {"measured"}
    assert all(r.step_ms > 0 and r.peak_bytes > 0 and r.predicted_step_ms for r in board.data)
    mixed = list(client.iter_leaderboard(model=job.model_id, gpu=ident.key, batch=16))
    assert {r.source for r in mixed} == {"simulated", "measured"}

    best = client.best(ident.key, model=job.model_id, batch=16, budget=BUDGET)
    assert best.source == "measured" and best.fallback == "exact" and "measured" in best.note
    assert best.step_ms == min(r.step_ms for r in measured) and best.predicted_step_ms is not None


def test_a_job_for_another_gpu_type_is_not_measured_here(service: tuple[MemtuneClient, Database]) -> None:
    client, db = service
    other = "a100-80gb" if cuda_identity().key != "a100-80gb" else "h200"
    job = client.submit_job(MODEL, batch=16, gpu=other, budget=BUDGET, trials=12, validate_top_k=1)
    assert _worker(db).run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded", done.error
    assert done.validation is not None and done.validation.state == "skipped"
    assert done.validation.note is not None and f"not {other!r}" in done.validation.note
    assert {r.source for r in client.job_results(job.id).data} == {"simulated"}
