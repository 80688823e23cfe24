"""The lookup cache (NOTE [ Lookup cache ]): ETag and 304, bodies equal to the uncached ones, a new result served
once twice the TTL has passed (or at once after ``clear()``), errors never stored, closed reads never cached."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_fixtures import SMALL_SPEC

from api.client import MemtuneClient
from api.lookup_cache import LookupCache, etag_matches
from api.main import create_app
from api.settings import Settings
from api.worker import Worker
from storage.database import Database
from storage.records import ResultIn
from storage.repositories import JobRepository, ResultRepository

BEST = "/v1/gpus/h200/best"


def _tuned(client: MemtuneClient, db: Database) -> tuple[str, str]:
    """A finished job for the small spec model: (model id, job id)."""
    model = client.create_model(spec=SMALL_SPEC)
    job = client.submit_job(model.id, batch=8, gpu="h200", budget="64MiB", trials=12)
    Worker(db, worker_id="cache-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0).run_once()
    assert client.get_job(job.id).state == "succeeded"
    return model.id, job.id


def _cache(http: TestClient) -> LookupCache:
    cache: LookupCache = http.app.state.lookup_cache  # type: ignore[attr-defined]
    return cache


def _add_measured(db: Database, job_id: str, step_ms: float) -> None:
    """A measured result, faster than every simulated one: /best prefers it (NOTE [ Measured results ])."""
    with db.session() as s:
        job = JobRepository(s).get(job_id)
        row = ResultRepository(s).for_job(job_id)[0]
        measured = ResultIn(
            name=row.name,
            kind=row.kind,  # type: ignore[arg-type]
            plan=row.plan,
            step_ms=step_ms,
            peak_bytes=1 << 20,
            feasible=True,
            source="measured",
            predicted_step_ms=row.step_ms,
            predicted_peak_bytes=row.peak_bytes,
        )
        ResultRepository(s).add_measured(job, [measured], profile_id=None)


@pytest.mark.slow
def test_etag_304_and_bodies_equal_to_the_uncached_ones(
    http: TestClient, client: MemtuneClient, db: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_id, _ = _tuned(client, db)
    params = {"model": model_id, "batch": 8, "budget": "64MiB"}
    cache = _cache(http)
    cache.ttl_s = 60.0
    first = http.get(BEST, params=params)
    second = http.get(BEST, params=params)
    assert first.status_code == second.status_code == 200
    assert cache.misses == 1 and cache.hits == 1
    etag = first.headers["etag"]
    assert second.headers["etag"] == etag and second.content == first.content
    assert second.headers["content-type"] == first.headers["content-type"] == "application/json"
    assert int(second.headers["content-length"]) == len(second.content)

    r = http.get(BEST, params=params, headers={"If-None-Match": etag})
    assert r.status_code == 304 and r.content == b"" and r.headers["etag"] == etag
    assert http.get(BEST, params=params, headers={"If-None-Match": f'"other", W/{etag}'}).status_code == 304
    assert http.get(BEST, params=params, headers={"If-None-Match": '"other"'}).status_code == 200

    board = {"gpu": "h200", "plans": "true"}
    cached_board = [http.get("/v1/leaderboard", params=board) for _ in range(2)]
    assert cached_board[1].content == cached_board[0].content and "etag" in cached_board[1].headers

    monkeypatch.setenv("MEMTUNE_LOOKUP_CACHE_TTL_S", "0")
    with TestClient(create_app(settings, db=db)) as uncached:
        assert not uncached.app.state.lookup_cache.enabled  # type: ignore[attr-defined]
        plain = uncached.get(BEST, params=params)
        assert plain.content == first.content and "etag" not in plain.headers
        assert uncached.get("/v1/leaderboard", params=board).content == cached_board[0].content


@pytest.mark.slow
def test_a_new_result_is_served_once_the_ttl_has_passed(http: TestClient, client: MemtuneClient, db: Database) -> None:
    model_id, job_id = _tuned(client, db)
    params = {"model": model_id, "batch": 8, "budget": "64MiB"}
    cache = _cache(http)
    cache.ttl_s = 0.5
    before = http.get(BEST, params=params)
    assert before.json()["source"] == "simulated"
    _add_measured(db, job_id, step_ms=0.001)
    during = http.get(BEST, params=params)
    assert during.content == before.content  # within the TTL: the stored answer
    time.sleep(1.05)  # past 2 * ttl_s: the answer is recomputed before it is served
    after = http.get(BEST, params=params)
    assert after.json()["source"] == "measured" and after.json()["step_ms"] == 0.001
    assert after.headers["etag"] != before.headers["etag"]
    assert http.get(BEST, params=params, headers={"If-None-Match": before.headers["etag"]}).status_code == 200

    cache.ttl_s = 60.0
    _add_measured(db, job_id, step_ms=0.0005)
    assert http.get(BEST, params=params).json()["step_ms"] == 0.001
    cache.clear()
    assert http.get(BEST, params=params).json()["step_ms"] == 0.0005


@pytest.mark.slow
def test_errors_are_not_stored(http: TestClient, client: MemtuneClient, db: Database) -> None:
    cache = _cache(http)
    cache.ttl_s = 60.0
    params = {"model": "tiny-cnn", "batch": 8, "budget": "64MiB"}
    assert http.get(BEST, params=params).status_code == 404
    _tuned(client, db)
    assert http.get(BEST, params=params).status_code == 200  # the 404 was not kept
    assert http.get(BEST, params={"model": "tiny-cnn", "batch": 0, "budget": "1GiB"}).status_code == 422


def test_closed_reads_bypass_the_cache(db: Database, tmp_path: Path, api_key: str) -> None:
    settings = Settings(data_dir=tmp_path, reads_open=False)
    with TestClient(create_app(settings, db=db)) as http:
        assert http.get("/v1/leaderboard").status_code == 401
        auth = {"Authorization": f"Bearer {api_key}"}
        assert http.get("/v1/leaderboard", headers=auth).status_code == 200
        assert http.get("/v1/leaderboard").status_code == 401
        assert _cache(http).hits == 0


def test_etag_matching() -> None:
    assert etag_matches(b"*", b'"a"')
    assert etag_matches(b'W/"a"', b'"a"') and etag_matches(b'"b" , "a"', b'"a"')
    assert not etag_matches(b'"b"', b'"a"')


@pytest.mark.slow
def test_a_stale_answer_is_served_while_it_is_refreshed(http: TestClient, client: MemtuneClient, db: Database) -> None:
    model_id, job_id = _tuned(client, db)
    params = {"model": model_id, "batch": 8, "budget": "64MiB"}
    cache = _cache(http)
    cache.ttl_s = 0.4
    before = http.get(BEST, params=params)
    _add_measured(db, job_id, step_ms=0.002)
    time.sleep(0.45)  # stale, but younger than 2 * ttl_s
    assert http.get(BEST, params=params).content == before.content  # served at once; a refresh starts
    deadline = time.monotonic() + 5
    while http.get(BEST, params=params).json()["source"] != "measured":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert cache.misses == 2
