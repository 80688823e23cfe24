"""Allocator retries on stored results (migration 0004): the search's predicted retries and their price reach
the results API for GPU types whose calibration prices them, and nothing is invented for the others."""

from __future__ import annotations

from typing import Any

import pytest
from service_fixtures import SMALL_SPEC

from memtune.api.client import MemtuneClient
from memtune.api.service.worker import Worker
from memtune.storage.database import Database


def _job(client: MemtuneClient, db: Database, gpu: str) -> Any:
    job = client.submit_job({"spec": SMALL_SPEC}, batch=8, gpu=gpu, budget="64MiB", trials=25)
    assert Worker(db, worker_id="unit-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0).run_once() == job.id
    return client.job_results(job.id).data


@pytest.mark.slow
def test_the_best_plan_carries_its_predicted_retries(client: MemtuneClient, db: Database) -> None:
    rows = _job(client, db, "h200")  # the H200 calibration prices retries (remap_ms_per_gib)
    best = next(r for r in rows if r.kind == "optuna")
    assert best.source == "simulated"
    assert best.alloc_retries is not None and best.alloc_retries >= 0
    assert best.allocator_ms is not None and 0 <= best.allocator_ms <= best.step_ms


@pytest.mark.slow
def test_gpu_types_without_a_retry_price_store_none(client: MemtuneClient, db: Database) -> None:
    rows = _job(client, db, "h100")  # no calibration file
    assert rows and all(r.alloc_retries is None and r.allocator_ms is None for r in rows)
