"""The lookup cache (NOTE [ Lookup cache ]): ETag and 304, bodies equal to the uncached ones, an answer kept until a
write moves the lookup version (NOTE [ Lookup version ]) and recomputed once then, errors never stored, closed reads
never cached."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from service_fixtures import SMALL_SPEC

from memtune.api.client import MemtuneClient
from memtune.api.service._lookup_cache import LookupCache, etag_matches
from memtune.api.service.main import create_app
from memtune.api.service.settings import Settings
from memtune.api.service.worker import Worker
from memtune.storage.database import Database
from memtune.storage.records import ResultIn
from memtune.storage.repositories import JobRepository, ResultRepository

BEST = "/v1/gpus/h200/best"


def _tuned(client: MemtuneClient, db: Database) -> tuple[str, str]:
    """A finished job for the small spec model: (model id, job id)."""
    model = client.create_model(spec=SMALL_SPEC)
    job = client.submit_job(model.id, batch=8, gpu="h200", budget="64MiB", trials=12)
    Worker(db, worker_id="cache-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0).run_once()
    assert client.get_job(job.id).state == "succeeded"
    return model.id, job.id


def _cache(http: TestClient, db: Database) -> LookupCache:
    """The app's cache, once it has read the database's lookup version as it is now (it caches nothing before, and
    drops what it holds when it reads a newer one)."""
    cache: LookupCache = http.app.state.lookup_cache  # type: ignore[attr-defined]
    _until(lambda: cache.version == db.lookup_version())
    return cache


def _until(check: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.02)


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
    http: TestClient, client: MemtuneClient, db: Database, settings: Settings
) -> None:
    model_id, _ = _tuned(client, db)
    params: dict[str, str | int] = {"model": model_id, "batch": 8, "budget": "64MiB"}
    cache = _cache(http, db)
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

    with TestClient(create_app(settings.model_copy(update={"lookup_cache_poll_s": 0}), db=db)) as uncached:
        assert not uncached.app.state.lookup_cache.enabled  # type: ignore[attr-defined]
        plain = uncached.get(BEST, params=params)
        assert plain.content == first.content and "etag" not in plain.headers
        assert uncached.get("/v1/leaderboard", params=board).content == cached_board[0].content


@pytest.mark.slow
def test_a_cached_answer_changes_after_a_write_and_only_then(
    http: TestClient, client: MemtuneClient, db: Database
) -> None:
    model_id, job_id = _tuned(client, db)
    params: dict[str, str | int] = {"model": model_id, "batch": 8, "budget": "64MiB"}
    cache = _cache(http, db)
    before = http.get(BEST, params=params)
    board = http.get("/v1/leaderboard", params={"source": "measured"})
    assert before.json()["source"] == "simulated" and board.json()["count"] == 0
    misses = cache.misses
    time.sleep(4 * http.app.state.settings.lookup_cache_poll_s)  # type: ignore[attr-defined]
    assert http.get(BEST, params=params).content == before.content
    assert cache.misses == misses  # no write, no recomputation, however long

    _add_measured(db, job_id, step_ms=0.001)  # as a worker in another process would: through the database only
    _until(lambda: http.get(BEST, params=params).json()["source"] == "measured")
    after = http.get(BEST, params=params)
    assert after.json()["step_ms"] == 0.001 and after.headers["etag"] != before.headers["etag"]
    assert http.get(BEST, params=params, headers={"If-None-Match": before.headers["etag"]}).status_code == 200
    assert http.get("/v1/leaderboard", params={"source": "measured"}).json()["count"] == 1

    cache.clear()  # a write this process knows of can drop the answers at once
    assert http.get(BEST, params=params).content == after.content


def test_the_lookup_version_moves_with_the_lookups_tables_only(client: MemtuneClient, db: Database) -> None:
    start = db.lookup_version()
    model = client.create_model(spec=SMALL_SPEC)  # a model row
    created = db.lookup_version()
    assert created > start
    client.submit_job(model.id, batch=8, gpu="h200", budget="64MiB", trials=4)  # a job row only
    assert db.lookup_version() == created


def test_an_answer_computed_across_a_write_is_not_kept() -> None:
    cache = LookupCache()
    cache.observe(7)
    generation = cache.generation
    assert cache.store(b"k", b"{}", [], generation) is cache.fresh(b"k")
    cache.observe(8)  # a write: the version moved
    assert cache.fresh(b"k") is None
    cache.store(b"k", b"{}", [], generation)  # computed before the write was seen
    assert cache.fresh(b"k") is None
    cache.observe(None)  # the version cannot be read: nothing is fresh
    cache.store(b"k", b"{}", [], cache.generation)
    assert cache.fresh(b"k") is None


@pytest.mark.slow
def test_concurrent_misses_are_computed_once(http: TestClient, client: MemtuneClient, db: Database) -> None:
    model_id, _ = _tuned(client, db)
    cache = _cache(http, db)
    cache.clear()
    misses = cache.misses

    async def many() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=http.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            params: dict[str, str | int] = {"model": model_id, "batch": 8, "budget": "64MiB"}
            return await asyncio.gather(*(c.get(BEST, params=params) for _ in range(20)))

    answers = asyncio.run(many())
    assert {r.status_code for r in answers} == {200} and len({r.content for r in answers}) == 1
    assert cache.misses == misses + 1 and cache.hits >= 19


@pytest.mark.slow
def test_errors_are_not_stored(http: TestClient, client: MemtuneClient, db: Database) -> None:
    _cache(http, db)
    params: dict[str, str | int] = {"model": "tiny-cnn", "batch": 8, "budget": "64MiB"}
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
        assert _cache(http, db).hits == 0


def test_etag_matching() -> None:
    assert etag_matches(b"*", b'"a"')
    assert etag_matches(b'W/"a"', b'"a"') and etag_matches(b'"b" , "a"', b'"a"')
    assert not etag_matches(b'"b"', b'"a"')
