"""The HTTP API in process (Starlette TestClient, SQLite) through the typed client: the three uses,
jobs run by a real worker, server-sent events, idempotency, auth, and every bad-input problem."""

from __future__ import annotations

import base64
import json

import pytest
from fastapi.testclient import TestClient
from service_fixtures import SMALL_SPEC

from memtune.api.client import ApiError, MemtuneClient
from memtune.api.service.main import create_app
from memtune.api.service.settings import Settings
from memtune.api.service.worker import Worker
from memtune.storage.database import Database
from memtune.storage.migrate import head_revision
from memtune.storage.repositories import JobRepository, KeyRepository

PROBLEM = "application/problem+json"


def _run_worker(db: Database) -> str | None:
    return Worker(db, worker_id="unit-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0).run_once()


@pytest.mark.slow
def test_submit_tune_fetch_best_and_leaderboard(client: MemtuneClient, db: Database) -> None:
    model = client.create_model(spec=SMALL_SPEC)
    assert model.kind == "spec" and model.n_stages == len(SMALL_SPEC["layers"])
    assert client.create_model(spec=dict(SMALL_SPEC, name="tiny-cnn")).id == model.id  # dedupe
    job = client.submit_job(model.id, batch=8, gpu="h200", budget="64MiB", trials=25)
    assert job.state == "queued" and job.budget_bytes == 64 << 20
    assert _run_worker(db) == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded", done.error
    assert done.progress.trials_done == 25 and done.progress.fraction == 1.0
    assert done.progress.best is not None and done.unconstrained is not None
    assert done.profile_id is not None and done.attempts == 1

    results = client.job_results(job.id, plans=True)
    kinds = {r.kind for r in results.data}
    assert kinds == {"baseline", "optuna"} and all(r.source == "simulated" for r in results.data)
    assert any(r.pareto_optimal for r in results.data)
    optuna_row = next(r for r in results.data if r.kind == "optuna")
    feasible_baselines = [r.step_ms for r in results.data if r.baseline and r.feasible]
    assert optuna_row.feasible and optuna_row.step_ms <= min(feasible_baselines) + 1e-9

    best = client.best("h200", model=model.id, batch=8, budget="64MiB")
    assert best.fallback == "exact" and best.source == "simulated"
    assert best.step_ms == min(r.step_ms for r in results.data if r.feasible)
    assert best.peak_bytes <= 64 << 20 and len(best.plan["actions"]) == model.n_stages
    by_name = client.best("H200", model="tiny-cnn", batch=8, budget=f"{96 << 20}B")
    assert by_name.fallback == "smaller_budget" and by_name.plan_budget_bytes == 64 << 20
    arch = client.best("h100", model=model.id, batch=8, budget="64MiB")
    assert arch.fallback == "same_architecture" and arch.answered_by_gpu == "h200"

    rows = list(client.iter_leaderboard(model=model.id, gpu="h200", page_size=4, include_infeasible=True))
    assert len(rows) == results.count and [r.rank for r in rows] == list(range(1, len(rows) + 1))
    assert [r.step_ms for r in rows] == sorted(r.step_ms for r in rows)
    assert any(r.baseline for r in rows) and any(r.pareto_optimal for r in rows)
    feasible = list(client.iter_leaderboard(model=model.id, page_size=50))
    assert [r.id for r in feasible] == [r.id for r in rows if r.feasible] and feasible[0].step_ms == best.step_ms

    prof = client.profile(done.profile_id)
    assert prof.source == "modeled" and prof.gpu == "h200" and len(prof.profile["stages"]) == model.n_stages
    assert any(g.key == "h200" and g.stored and g.modeled for g in client.gpus().data)


def test_events_stream_until_the_job_ends(client: MemtuneClient, db: Database) -> None:
    job = client.submit_job({"spec": SMALL_SPEC}, batch=4, gpu="h200", budget="50% of gpu", trials=12)
    assert _run_worker(db) == job.id
    events = list(client.events(job.id, timeout_s=30))
    assert events[-1].event == "end" and events[-1].job.state == "succeeded"


def test_cancel_a_queued_job(client: MemtuneClient, db: Database) -> None:
    job = client.submit_job({"spec": SMALL_SPEC}, batch=4, gpu="h200", budget="1GiB", trials=5)
    assert client.cancel_job(job.id).state == "cancelled"
    assert _run_worker(db) is None
    with pytest.raises(ApiError) as e:
        client.cancel_job(job.id)
    assert e.value.status == 409 and e.value.code == "conflict"


def test_idempotency_key(client: MemtuneClient, http: TestClient, api_key: str) -> None:
    kw = {"batch": 4, "gpu": "h200", "budget": "1GiB", "trials": 5, "idempotency_key": "retry-1"}
    a = client.submit_job({"spec": SMALL_SPEC}, **kw)  # type: ignore[arg-type]
    b = client.submit_job({"spec": SMALL_SPEC}, **kw)  # type: ignore[arg-type]
    assert a.id == b.id and len(client.list_jobs().data) == 1
    with pytest.raises(ApiError) as e:
        client.submit_job({"spec": SMALL_SPEC}, **dict(kw, batch=8))  # type: ignore[arg-type]
    assert e.value.status == 409 and e.value.code == "idempotency_key_reused"


def _post(http: TestClient, path: str, body: object, key: str | None, **kw: object) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    r = http.post(path, content=content, headers={**headers, "Content-Type": "application/json"}, **kw)  # type: ignore[arg-type]
    if r.status_code >= 400:
        assert r.headers["content-type"].startswith(PROBLEM)
    return r.status_code, r.json()


JOB = {"model": {"zoo": "vgg16"}, "batch": 32, "gpu": "h200", "budget": "12GiB", "trials": 10}


def test_bad_input_gets_the_right_problem(http: TestClient, api_key: str, db: Database) -> None:
    status, p = _post(http, "/v1/jobs", b'{"model": {"zoo": "vgg16"}, "batch": 3', api_key)
    assert (status, p["code"]) == (400, "malformed_json")
    bad_layer = dict(SMALL_SPEC, layers=[*SMALL_SPEC["layers"][:2], {"type": "conv3d", "out_channels": 4}])
    status, p = _post(http, "/v1/models", {"spec": bad_layer}, api_key)
    assert (status, p["code"], p["layer"]) == (422, "invalid_spec", 2) and "conv3d" in p["detail"]
    status, p = _post(http, "/v1/jobs", dict(JOB, model={"spec": bad_layer}), api_key)
    assert (status, p["code"], p["layer"]) == (422, "invalid_spec", 2)
    huge = dict(SMALL_SPEC, layers=[{"type": "relu"}] * 200_000)
    status, p = _post(http, "/v1/models", {"spec": huge}, api_key)
    assert (status, p["code"]) == (413, "payload_too_large")
    deep = dict(SMALL_SPEC, layers=[{"type": "relu"}] * 5000)
    status, p = _post(http, "/v1/models", {"spec": deep}, api_key)
    assert (status, p["code"], p["field"]) == (422, "invalid_spec", "layers")
    status, p = _post(http, "/v1/jobs", dict(JOB, budget="-4GiB"), api_key)
    assert (status, p["code"]) == (422, "invalid_budget") and "positive" in p["detail"]
    status, p = _post(http, "/v1/jobs", dict(JOB, budget=-1), api_key)
    assert (status, p["code"]) == (422, "invalid_budget")
    # NOTE [ Budget grammar ]: "2" meant two bytes; a number without a unit is refused, naming both ways to write it
    status, p = _post(http, "/v1/jobs", dict(JOB, budget="2"), api_key)
    assert (status, p["code"]) == (422, "invalid_budget") and "'12GiB'" in p["detail"] and "of peak" in p["detail"]
    status, p = _post(http, "/v1/jobs", dict(JOB, budget="60% of peak"), api_key)
    assert (status, p["code"]) == (422, "invalid_budget") and "not known here" in p["detail"]
    status, p = _post(http, "/v1/jobs", dict(JOB, budget=0.6), api_key)
    assert status == 422
    status, p = _post(http, "/v1/jobs", dict(JOB, gpu="b9000"), api_key)
    assert (status, p["code"]) == (422, "unknown_gpu") and "h200" in p["detail"]
    status, p = _post(http, "/v1/jobs", dict(JOB, colour="blue"), api_key)
    assert (status, p["code"]) == (422, "validation_error") and "colour" in p["detail"]
    status, p = _post(http, "/v1/jobs", dict(JOB, model={"zoo": "vgg17"}), api_key)
    assert (status, p["code"], p["field"]) == (422, "invalid_spec", "model") and "vgg16" in p["detail"]
    status, p = _post(http, "/v1/jobs", dict(JOB, batch=0), api_key)
    assert (status, p["code"]) == (422, "validation_error")
    status, p = _post(http, "/v1/jobs", JOB, None)
    assert (status, p["code"]) == (401, "missing_api_key")
    status, p = _post(http, "/v1/jobs", JOB, "mtk_not-a-key")
    assert (status, p["code"]) == (401, "invalid_api_key")
    with db.session() as s:
        KeyRepository(s).revoke("tester")
    status, p = _post(http, "/v1/jobs", JOB, api_key)
    assert (status, p["code"]) == (401, "invalid_api_key")
    with db.session() as s:
        assert JobRepository(s).list_all() == []  # nothing bad was stored


EDITED_TOKENS = [
    {"o": "step_ms", "v": {"a": 1}, "id": 1, "n": 1},
    {"o": "step_ms", "v": [1], "id": 1, "n": 1},
    {"o": "step_ms", "v": None, "id": 1, "n": 1},
    {"o": "step_ms", "v": 1.0, "id": True, "n": 1},
    {"o": "step_ms", "v": 1.0, "id": 10**30, "n": 1},
    {"o": "step_ms", "v": 1e40, "id": 1, "n": 1},
    {"o": "peak_bytes", "v": 1e40, "id": 1, "n": 1},
    {"o": "peak_bytes", "v": "abc", "id": 1, "n": 1},
    {"o": "created_at", "v": "abc", "id": 1, "n": 1},
    {"o": "step_ms", "v": 1.0, "id": 1, "n": -1000},
    {"o": "step_ms", "v": 1.0, "id": 1, "n": 1, "x": 0},
]


@pytest.mark.slow
def test_an_edited_page_token_is_a_400_on_every_database(database_url: str, tmp_path: object) -> None:
    """NOTE [ Page tokens ] on SQLite and PostgreSQL: PostgreSQL types a query's parameters, so a token that reached
    a query with ``"abc"`` for an integer column failed there as a 500; each is refused before any query, with a
    stored result for the query to find."""
    from memtune.storage.migrate import upgrade

    database = Database(database_url)
    try:
        upgrade(database)
        with database.session() as s:
            _, key = KeyRepository(s).create("pager")
        with TestClient(create_app(Settings(data_dir=tmp_path), db=database), raise_server_exceptions=False) as tc:
            client = MemtuneClient(api_key=key, http=tc)
            client.submit_job({"spec": SMALL_SPEC}, batch=8, gpu="h200", budget="64MiB", trials=3)
            assert _run_worker(database) is not None
            page = tc.get("/v1/leaderboard", params={"page_size": 1, "order_by": "peak_bytes"})
            assert page.status_code == 200 and page.json()["next_page_token"], page.text
            for edited in EDITED_TOKENS:
                token = base64.urlsafe_b64encode(json.dumps(edited).encode()).decode().rstrip("=")
                params = {"page_size": 1, "page_token": token, "order_by": edited["o"]}
                r = tc.get("/v1/leaderboard", params=params)
                assert (r.status_code, r.headers["content-type"]) == (400, PROBLEM), (edited, r.text)
                assert r.json()["code"] == "invalid_page_token", r.text
    finally:
        database.dispose()


@pytest.mark.parametrize(
    "edited",
    [
        {"o": "step_ms", "v": {"a": 1}, "id": 1, "n": 1},
        {"o": "step_ms", "v": [1], "id": 1, "n": 1},
        {"o": "step_ms", "v": None, "id": 1, "n": 1},
        {"o": "step_ms", "v": 1.0, "id": True, "n": 1},
        {"o": "step_ms", "v": 1.0, "id": 10**30, "n": 1},
        {"o": "step_ms", "v": 1e40, "id": 1, "n": 1},
        {"o": "peak_bytes", "v": 1e40, "id": 1, "n": 1},
        {"o": "peak_bytes", "v": "abc", "id": 1, "n": 1},
        {"o": "step_ms", "v": 1.0, "id": 1, "n": -1000},
        {"o": "step_ms", "v": 1.0, "id": 1, "n": 1, "x": 0},
    ],
)
def test_an_edited_page_token_is_a_400(http: TestClient, edited: dict[str, object]) -> None:
    """NOTE [ Page tokens ]: a token with any field of the wrong type or out of range is refused before a query."""
    token = base64.urlsafe_b64encode(json.dumps(edited).encode()).decode().rstrip("=")
    order = edited["o"]
    r = http.get("/v1/leaderboard", params={"page_size": 1, "page_token": token, "order_by": order})
    assert r.status_code == 400 and r.json()["code"] == "invalid_page_token", r.text


def test_read_errors(http: TestClient) -> None:
    r = http.get("/v1/jobs/nope")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = http.get("/v1/gpus/b9000/best", params={"model": "vgg16", "batch": 8, "budget": "1GiB"})
    assert r.status_code == 404 and r.json()["code"] == "unknown_gpu"
    r = http.get("/v1/gpus/h200/best", params={"model": "vgg16", "batch": 8, "budget": "1GiB"})
    assert r.status_code == 404 and r.json()["code"] == "unknown_model"
    r = http.get("/v1/leaderboard", params={"page_token": "garbage"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_page_token"
    r = http.get("/v1/leaderboard", params={"order_by": "colour"})
    assert r.status_code == 422 and r.headers["content-type"].startswith(PROBLEM)
    r = http.delete("/v1/jobs")
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"


def test_no_plan_is_404_with_a_hint(client: MemtuneClient) -> None:
    client.create_model(zoo="vgg16")
    with pytest.raises(ApiError) as e:
        client.best("h200", model="vgg16", batch=8, budget="1GiB")
    assert e.value.status == 404 and e.value.code == "no_plan" and "POST /v1/jobs" in e.value.detail


def test_zoo_models_dedupe_over_spelling_and_defaults(client: MemtuneClient) -> None:
    a = client.create_model(zoo="VGG-16")
    b = client.create_model(zoo="vgg16", params={"num_classes": 1000})
    c = client.create_model(zoo="vgg16", params={"num_classes": 10})
    assert a.id == b.id != c.id and a.name == "vgg16"
    with pytest.raises(ApiError) as e:
        client.create_model(zoo="vgg16", params={"depth": 3})
    assert e.value.status == 422 and e.value.problem["field"] == "depth"


def test_closed_reads_need_a_key(db: Database, tmp_path: object, api_key: str) -> None:
    settings = Settings(data_dir=tmp_path, reads_open=False)  # type: ignore[arg-type]
    with TestClient(create_app(settings, db=db)) as http:
        assert http.get("/v1/gpus").status_code == 401
        assert http.get("/v1/gpus", headers={"Authorization": f"Bearer {api_key}"}).status_code == 200
        assert http.get("/healthz").status_code == 200


def test_health_reports_the_embedded_worker(db: Database, tmp_path: object) -> None:
    settings = Settings(data_dir=tmp_path, embedded_worker=True, poll_interval_s=0.05)  # type: ignore[arg-type]
    with TestClient(create_app(settings, db=db)) as http:
        r = http.get("/healthz")
        body = r.json()
        assert body.pop("workers_alive") in (0, 1)  # its first heartbeat may not be written yet
        assert r.status_code == 200 and body == {
            "status": "ok",
            "database": "ok",
            "revision": head_revision(),
            "worker": "up",
            "unserved_gpu_types": [],
        }
