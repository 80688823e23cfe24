"""Exported programs for real: uvicorn on loopback with its worker, the typed client, SQLite and PostgreSQL.

Upload a ``torch.export`` archive, tune it to completion (module stages profiled on the server's CPU, copies
modeled for the H200), fetch the best plan and the leaderboard; a hostile archive over real HTTP is refused with a
problem and its payload never runs in the server.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from exported_fixtures import TinyNet, export_archive, hostile_archives
from live_server import create_key

from memtune.api.client import MemtuneClient

pytestmark = pytest.mark.integration


def test_upload_tune_best_leaderboard(server: str, database_url: str, tmp_path: Path) -> None:
    key = create_key(database_url)
    archive = export_archive(TinyNet(), torch.randn(4, 16))
    with MemtuneClient(server, api_key=key, timeout_s=30) as mt:
        model = mt.upload_exported(archive, name="tiny-e2e")
        assert model.kind == "exported" and mt.upload_exported(archive).id == model.id
        job = mt.submit_job(model.id, batch=4, gpu="h200", budget="100MiB", trials=10)
        events = list(mt.events(job.id, timeout_s=180))
        assert events[-1].event == "end"
        done = mt.get_job(job.id)
        assert done.state == "succeeded", done.error
        best = mt.best("h200", model="tiny-e2e", batch=4, budget="100MiB")
        assert best.job_id == job.id and best.source == "simulated" and len(best.plan["actions"]) == 3
        board = mt.leaderboard(model=model.id, gpu="h200", batch=4, page_size=5)
        assert board.count >= 1 and board.data[0].step_ms == best.step_ms
        prof = mt.profile(done.profile_id or -1)
        assert prof.profile["stages_from"] == "modules" and prof.source == "modeled"

    markers = tmp_path / "markers"
    markers.mkdir()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/octet-stream"}
    for variant in ("weight_pickle", "sample_inputs_zip", "guards_code", "fqn_injection"):
        r = httpx.post(
            f"{server}/v1/models/exported", content=hostile_archives(archive, markers)[variant], headers=headers
        )
        assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
        assert r.json()["code"] == "invalid_exported_program"
    assert not any(markers.iterdir()), "a payload ran in the server"
