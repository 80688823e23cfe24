"""A job of an exported program with ``compile`` ``auto`` on a worker whose CUDA GPU is of the job's type: the worker
measures the program compiled whole and its candidate partitions into compiled regions on that GPU, searches each
beside the job's own search, then runs the finalists on that GPU and serves the fastest measured (NOTE [ Compiled
regions in the service ] and NOTE [ Finalists in the service ] in ``memtune.api.service.worker``). On a migrated SQLite
database in the test's folder, the API in process."""

from __future__ import annotations

import pytest
import torch
from exported_fixtures import TinyNet, export_archive

from memtune.api.client import MemtuneClient
from memtune.api.service.worker import Worker, cuda_gpu_key
from memtune.storage.database import Database
from memtune.storage.repositories import ResultRepository

pytestmark = pytest.mark.gpu


def test_an_exported_program_gets_its_compiled_regions_measured_on_this_gpu(
    gpu_service: tuple[Database, MemtuneClient],
) -> None:
    db, client = gpu_service
    gpu = cuda_gpu_key()
    assert gpu is not None
    torch.manual_seed(0)
    model = client.upload_exported(export_archive(TinyNet(width=1024), torch.randn(256, 1024)), name="tiny-gpu")
    job = client.submit_job(model.id, batch=256, gpu=gpu, budget="1GiB", trials=20, compile="auto")
    worker = Worker(db, worker_id="gpu-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0)
    assert worker.run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded", done.error
    note = done.compile_note or ""
    assert "compiled regions searched: depth 1: 3 regions (blocks.0, blocks.1, head) at activation budget 1" in note
    assert "; served: a plan of compiled regions" in note or "; served: the job's own search's best plan" in note, note
    with db.session() as s:
        stored = ResultRepository(s).for_job(job.id)
    rows = {r.name: r for r in stored if r.source == "simulated"}
    measured = {r.name: r for r in stored if r.source == "measured"}
    regions = [r for name, r in rows.items() if name.startswith("compiled regions")]
    assert regions, note
    for r in regions:  # plans of the regions the worker measured, each within the budget
        assert r.plan["stages"] == ["blocks.0", "blocks.1", "head"] and r.plan["compile_budget"] is not None
        assert r.feasible and r.step_ms > 0
    best = done.progress.best
    assert best is not None
    if "finalists measured on this worker's GPU: " in note:  # two or more finalists: the fastest measured is served
        assert note.count("  <- served") == 1 and measured, note  # the one served, wherever it sits in the list
        won = min(measured.values(), key=lambda r: r.step_ms)
        assert best.name == won.name and won.predicted_step_ms == pytest.approx(best.step_ms)
        for r in measured.values():  # each ran under the job's budget's cap
            assert r.feasible and r.peak_bytes <= r.budget_bytes and r.predicted_step_ms is not None
        answer = client.best(gpu, model=model.id, batch=256, budget="1GiB")
        assert answer.source == "measured" and answer.step_ms == pytest.approx(won.step_ms)
    else:  # one finalist alone, or none ran: the fastest plan found stands, and no finalist's row is stored
        # (a compiler point's rows are measured, by the sweep: no prediction beside them)
        assert all(r.predicted_step_ms is None for r in measured.values()), note
        assert best.step_ms == pytest.approx(min(r.step_ms for r in stored if r.feasible))
    print(note)
