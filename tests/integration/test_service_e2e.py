"""The service for real: uvicorn on loopback, the typed client, SQLite and PostgreSQL.

Submit a model, tune it to completion (VGG-16, modeled profile, 30 trials), fetch the best plan for the
GPU type, read the leaderboard, follow the events; bad input over real HTTP gets problem responses.
"""

from __future__ import annotations

import json

import httpx
import pytest
from live_server import create_key

from memtune.api.client import ApiError, MemtuneClient

pytestmark = pytest.mark.integration


def test_submit_tune_best_leaderboard(server: str, database_url: str) -> None:
    key = create_key(database_url)
    with MemtuneClient(server, api_key=key, timeout_s=30) as mt:
        assert mt.health().worker == "up"  # serve supervises its worker, a process of its own that runs the job below
        model = mt.create_model(zoo="vgg16")
        job = mt.submit_job({"id": model.id}, batch=32, gpu="h200", budget="3GiB", trials=30, idempotency_key="e2e")
        assert (
            mt.submit_job(model.id, batch=32, gpu="h200", budget="3GiB", trials=30, idempotency_key="e2e").id == job.id
        )
        events = list(mt.events(job.id, timeout_s=180))
        assert events[-1].event == "end"
        done = mt.get_job(job.id)
        assert done.state == "succeeded", done.error
        assert done.progress.trials_done == 30 and done.progress.best is not None

        best = mt.best("h200", model="vgg16", batch=32, budget="3GiB")
        assert best.fallback == "exact" and best.source == "simulated" and best.job_id == job.id
        assert best.peak_bytes <= 3 << 30 and best.step_ms == done.progress.best.step_ms
        board = mt.leaderboard(model="vgg16", gpu="h200", batch=32, page_size=5)
        assert board.count >= 2 and board.data[0].rank == 1 and board.data[0].step_ms == best.step_ms
        assert len(list(mt.iter_leaderboard(model="vgg16", page_size=3))) == board.count
        assert mt.profile(done.profile_id or -1).source == "modeled"


def test_bad_input_over_http(server: str, database_url: str) -> None:
    key = create_key(database_url)
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    r = httpx.post(f"{server}/v1/jobs", content=b'{"model": ', headers=auth)
    assert r.status_code == 400 and r.json()["code"] == "malformed_json"
    big = json.dumps({"spec": {"input_shape": [3, 8, 8], "layers": [{"type": "relu"}] * 120_000}})
    r = httpx.post(f"{server}/v1/models", content=big, headers=auth)
    assert r.status_code == 413 and r.headers["content-type"].startswith("application/problem+json")
    with MemtuneClient(server, api_key=key) as mt:
        with pytest.raises(ApiError) as e:
            mt.submit_job({"zoo": "vgg16"}, batch=8, gpu="b9000", budget="1GiB")
        assert (e.value.status, e.value.code) == (422, "unknown_gpu")
        with pytest.raises(ApiError) as e:
            mt.submit_job({"zoo": "vgg16"}, batch=8, gpu="h200", budget="-1GiB")
        assert (e.value.status, e.value.code) == (422, "invalid_budget")
        with pytest.raises(ApiError) as e:
            mt.create_model(spec={"input_shape": [3, 8, 8], "layers": [{"type": "relu"}, {"type": "warp"}]})
        assert (e.value.status, e.value.code, e.value.problem["layer"]) == (422, "invalid_spec", 1)
    with MemtuneClient(server) as anonymous, pytest.raises(ApiError) as e:
        anonymous.create_model(zoo="vgg16")
    assert (e.value.status, e.value.code) == (401, "missing_api_key")
