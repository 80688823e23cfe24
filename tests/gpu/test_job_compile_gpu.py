"""A job with ``compile`` ``auto`` on a worker with a CUDA GPU of the job's type: the worker measures the whole model
compiled at ``COMPILE_BUDGETS`` on that GPU (NOTE [ Compiler points in the service ] in ``memtune.api.service.worker``),
keeps the points with the stored profile, and serves the faster of the compiled points that fit and the searched eager
plans; a second job reuses the points. On a migrated SQLite database in the test's folder, the API in process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memtune.api.client import MemtuneClient
from memtune.api.service.worker import COMPILE_BUDGETS, Worker, cuda_gpu_key
from memtune.storage.database import Database
from memtune.storage.repositories import ProfileRepository
from memtune.tuner.calibration import uninstall_calibrations

pytestmark = pytest.mark.gpu

MODEL = {"zoo": "alexnet"}
BATCH = 256
BUDGET = "1800MB"
CAP_BYTES = 1_800_000_000


@pytest.fixture
def service(gpu_service: tuple[Database, MemtuneClient]) -> Iterator[tuple[Database, MemtuneClient]]:
    if cuda_gpu_key() not in ("h100", "h200"):
        pytest.skip(f"committed AlexNet profiles exist for the H100 and the H200, not for {cuda_gpu_key()!r}")
    uninstall_calibrations()
    yield gpu_service
    uninstall_calibrations()


def test_auto_measures_the_compiled_model_on_this_gpu_and_serves_the_faster_plan(
    service: tuple[Database, MemtuneClient],
) -> None:
    db, client = service
    gpu = cuda_gpu_key()
    assert gpu is not None
    worker = Worker(db, worker_id="gpu-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0)
    job = client.submit_job(MODEL, batch=BATCH, gpu=gpu, budget=BUDGET, trials=20, compile="auto")
    assert worker.run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded", done.error
    note = done.compile_note or ""
    assert note.startswith("measured the whole model compiled on this worker's GPU"), note

    with db.session() as s:
        found = ProfileRepository(s).find(job.model_id, gpu, BATCH, "float32")
    assert found is not None
    points = found.profile().compiler_points
    assert points, note
    assert {p.activation_budget for p in points} <= set(COMPILE_BUDGETS)
    for p in points:  # measured here
        assert p.step_ms > 0 and p.peak_bytes > 0, p

    best = done.progress.best
    assert best is not None
    # a point whose measured reserved peak is within the cap runs under it: none of them is faster than the best
    under_cap = [p for p in points if p.reserved_bytes is not None and p.reserved_bytes <= CAP_BYTES]
    assert all(p.step_ms >= best.step_ms - 1e-6 for p in under_cap), (best, under_cap)
    if best.name and best.name.startswith("compiled whole"):
        assert any(best.step_ms == pytest.approx(p.step_ms) for p in points), (best, points)

    later = client.submit_job(MODEL, batch=BATCH, gpu=gpu, budget=BUDGET, trials=20, compile="auto")
    assert worker.run_once() == later.id
    again = client.get_job(later.id)
    assert again.state == "succeeded", again.error
    assert not (again.compile_note or "").startswith("measured the whole model compiled"), again.compile_note
