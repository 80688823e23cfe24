"""Storage on SQLite: migrations match the rows, repositories, atomic claims, reclaim, keys, best, leaderboard."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from service_fixtures import schema_diff
from sqlalchemy import inspect, update

from memtune.profiler.devices import GPUS
from memtune.profiler.identity import spec_identity
from memtune.storage._storage_errors import ConflictError, IdempotencyConflictError, NotFoundError
from memtune.storage.database import Database
from memtune.storage.migrate import current_revision, head_revision, upgrade
from memtune.storage.orm import ApiKeyRow, Base, JobRow, ModelRow, utcnow
from memtune.storage.records import Job, ResultIn
from memtune.storage.repositories import (
    GpuRepository,
    JobRepository,
    KeyRepository,
    ModelRepository,
    ResultRepository,
    content_hash,
    hash_key,
    pareto_flags,
)
from memtune.storage.repositories._results import decode_page_token

GiB = 1 << 30


def _model(db: Database, name: str = "vgg16") -> str:
    definition = {"zoo": name, "params": {"image_size": 224}}
    with db.session() as s:
        m, _ = ModelRepository(s).get_or_create(
            name=name, kind="zoo", digest=content_hash(definition), definition=definition, n_stages=None
        )
    return m.id


def _job(db: Database, model_id: str, *, gpu: str = "h200", budget: int = 12 * GiB, key: str | None = None) -> Job:
    with db.session() as s:
        job, _ = JobRepository(s).create(
            model_id=model_id,
            gpu_key=gpu,
            batch=32,
            dtype="float32",
            budget_text=str(budget),
            budget_bytes=budget,
            trials=10,
            mode="fastest",
            optimizer="sgd",
            owner="tester",
            request_hash="h1",
            idempotency_key=key,
        )
    return job


def test_migrations_create_every_table_and_match_the_rows(db: Database) -> None:
    assert current_revision(db) == head_revision()
    tables = set(inspect(db.engine).get_table_names())
    assert {t.name for t in Base.metadata.sorted_tables} <= tables
    assert {"studies", "trials", "mt_alembic_version"} <= tables  # Optuna's tables share the database
    assert schema_diff(db) == []
    assert upgrade(db) == head_revision()  # idempotent


def test_sqlite_uses_wal(db: Database) -> None:
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_models_dedupe_by_content_hash(db: Database) -> None:
    a = _model(db)
    b = _model(db)
    assert a == b
    with db.session() as s:
        assert [m.id for m in ModelRepository(s).find("vgg16")] == [a]
        assert ModelRepository(s).find(a)[0].definition == {"zoo": "vgg16", "params": {"image_size": 224}}
        with pytest.raises(NotFoundError, match="POST /v1/models"):
            ModelRepository(s).get("m_nope")


def test_integrity_errors_become_conflicts(db: Database) -> None:
    _model(db)
    with pytest.raises(ConflictError), db.session() as s:
        s.add(
            ModelRow(
                id="m_other",
                name="x",
                kind="zoo",
                content_hash=content_hash({"zoo": "vgg16", "params": {"image_size": 224}}),
                definition={},
            )
        )


def test_job_lifecycle_and_lease(db: Database) -> None:
    job = _job(db, _model(db))
    assert job.state == "queued" and job.attempts == 0 and job.study_name.endswith(job.id)
    with db.session() as s:
        claimed = JobRepository(s).claim("w1")
    assert claimed is not None
    running, lease = claimed
    assert running.state == "running" and running.worker_id == "w1" and lease.attempt == 1
    with db.session() as s:
        assert JobRepository(s).claim("w2") is None  # nothing else is claimable
        st = JobRepository(s).progress(lease, trials_done=4, best_name="optuna", best_step_ms=12.5, best_peak_bytes=99)
    assert not st.lost and not st.cancel
    with db.session() as s:
        assert JobRepository(s).finish(lease, "succeeded", trials_done=10)
        done = JobRepository(s).get(job.id)
        claims = JobRepository(s).claims(job.id)
    assert done.state == "succeeded" and done.trials_done == 10 and done.best_step_ms == 12.5
    assert done.finished_at is not None and done.finished_at >= done.started_at  # type: ignore[operator]
    assert [(c.worker_id, c.attempt) for c in claims] == [("w1", 1)]
    with db.session() as s:
        assert not JobRepository(s).finish(lease, "failed")  # a finished lease writes nothing


def test_claim_filters_by_gpu_type(db: Database) -> None:
    m = _model(db)
    _job(db, m, gpu="h100")
    with db.session() as s:
        assert JobRepository(s).claim("w", gpu_keys=["h200"]) is None
        got = JobRepository(s).claim("w", gpu_keys=["h100", "a100-80gb"])
    assert got is not None and got[0].gpu_key == "h100"


def test_idempotency_key(db: Database) -> None:
    m = _model(db)
    first = _job(db, m, key="k-1")
    again = _job(db, m, key="k-1")
    assert again.id == first.id
    with pytest.raises(IdempotencyConflictError, match="different request"), db.session() as s:
        JobRepository(s).create(
            model_id=m,
            gpu_key="h200",
            batch=64,
            dtype="float32",
            budget_text="1",
            budget_bytes=1,
            trials=1,
            mode="fastest",
            optimizer="sgd",
            owner="tester",
            request_hash="h2",
            idempotency_key="k-1",
        )


def test_concurrent_claims_never_share_a_job(db: Database) -> None:
    m = _model(db)
    ids = {_job(db, m).id for _ in range(24)}
    claimed: dict[str, list[str]] = {}
    lock = threading.Lock()

    def claimer(name: str) -> None:
        own = Database(db.url)  # its own engine and connections, as another process would have
        while True:
            with own.session() as s:
                got = JobRepository(s).claim(name)
            if got is None:
                break
            with lock:
                claimed.setdefault(got[0].id, []).append(name)
        own.dispose()

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(claimed) == ids
    assert all(len(v) == 1 for v in claimed.values()), claimed
    with db.session() as s:
        assert all(len(JobRepository(s).claims(j)) == 1 for j in ids)


def test_stale_job_is_reclaimed_and_the_old_lease_is_dead(db: Database) -> None:
    job = _job(db, _model(db))
    with db.session() as s:
        got = JobRepository(s).claim("dead")
    assert got is not None
    _, old = got
    with db.session() as s:
        assert JobRepository(s).claim("alive", stale_after_s=30) is None  # fresh heartbeat: not stale
        s.execute(update(JobRow).values(heartbeat_at=utcnow() - timedelta(seconds=60)))
    with db.session() as s:
        again = JobRepository(s).claim("alive", stale_after_s=30)
    assert again is not None
    _, new = again
    assert new.attempt == 2
    with db.session() as s:
        assert JobRepository(s).heartbeat(old).lost
        assert not JobRepository(s).finish(old, "succeeded")
        assert not JobRepository(s).heartbeat(new).lost
        claims = JobRepository(s).claims(job.id)
    assert [(c.worker_id, c.attempt, c.reclaimed_from) for c in claims] == [("dead", 1, None), ("alive", 2, "dead")]


def test_cancel(db: Database) -> None:
    m = _model(db)
    queued = _job(db, m)
    with db.session() as s:
        assert JobRepository(s).request_cancel(queued.id).state == "cancelled"
    running = _job(db, m)
    with db.session() as s:
        got = JobRepository(s).claim("w")
    assert got is not None and got[0].id == running.id
    with db.session() as s:
        job = JobRepository(s).request_cancel(running.id)
        assert job.state == "running" and job.cancel_requested
        assert JobRepository(s).heartbeat(got[1]).cancel
        assert JobRepository(s).finish(got[1], "cancelled")
    with pytest.raises(ConflictError, match="already cancelled"), db.session() as s:
        JobRepository(s).request_cancel(running.id)


def test_keys_are_hashed_and_revocable(db: Database) -> None:
    with db.session() as s:
        key, secret = KeyRepository(s).create("alice")
    assert secret.startswith("mtk_") and len(secret) > 40
    with db.session() as s:
        stored = s.get(ApiKeyRow, key.id)
        assert stored is not None and stored.key_hash == hash_key(secret) and secret not in stored.key_hash
        assert KeyRepository(s).authenticate(secret) == key
        assert KeyRepository(s).authenticate(secret + "x") is None
    with pytest.raises(ConflictError, match="exists"), db.session() as s:
        KeyRepository(s).create("alice")
    with db.session() as s:
        assert KeyRepository(s).revoke("alice").revoked_at is not None
        assert KeyRepository(s).authenticate(secret) is None
    with pytest.raises(NotFoundError), db.session() as s:
        KeyRepository(s).revoke("bob")


def test_pareto_flags() -> None:
    pts = [(10.0, 100, True), (12.0, 80, True), (11.0, 120, True), (5.0, 50, False), (12.0, 80, True)]
    assert pareto_flags(pts) == [True, True, False, False, True]


def _results(db: Database, job: Job, points: list[tuple[float, int]]) -> None:
    rows = [
        ResultIn(
            name=f"p{i}",
            kind="baseline" if i else "optuna",
            plan={"actions": ["keep"]},
            step_ms=t,
            peak_bytes=m,
            feasible=m <= job.budget_bytes,
        )
        for i, (t, m) in enumerate(points)
    ]
    with db.session() as s:
        ResultRepository(s).add_for_job(job, rows, profile_id=None)


def test_best_plan_fallback(db: Database) -> None:
    with db.session() as s:
        for key in ("h100", "h200"):
            GpuRepository(s).upsert(spec_identity(GPUS[key]))
    m = _model(db)
    job = _job(db, m, gpu="h100", budget=10 * GiB)
    _results(db, job, [(200.0, 9 * GiB), (150.0, 11 * GiB), (300.0, 5 * GiB)])
    with db.session() as s:
        repo = ResultRepository(s)
        exact = repo.best(gpu_key="h100", model_ids=[m], batch=32, budget_bytes=10 * GiB)
        smaller = repo.best(gpu_key="h100", model_ids=[m], batch=32, budget_bytes=12 * GiB)
        arch = repo.best(gpu_key="h200", model_ids=[m], batch=32, budget_bytes=12 * GiB, same_architecture=["h100"])
        tight = repo.best(gpu_key="h200", model_ids=[m], batch=32, budget_bytes=6 * GiB, same_architecture=["h100"])
        none = repo.best(gpu_key="h100", model_ids=[m], batch=32, budget_bytes=8 * GiB)
        other_batch = repo.best(gpu_key="h100", model_ids=[m], batch=64, budget_bytes=10 * GiB)
    assert exact is not None and exact.fallback == "exact" and exact.result.step_ms == 200.0
    assert smaller is not None and smaller.fallback == "smaller_budget" and smaller.result.budget_bytes == 10 * GiB
    assert arch is not None and arch.fallback == "same_architecture" and arch.result.gpu_key == "h100"
    assert tight is None  # h100's only budget (10 GiB) is above the 6 GiB asked
    assert none is None and other_batch is None


def test_leaderboard_pages_cover_every_row_once(db: Database) -> None:
    m = _model(db)
    job = _job(db, m)
    points = [(float(t), (7 - t) * GiB) for t in (5, 1, 4, 1, 3, 2, 6)]
    _results(db, job, points)
    seen, ranks, token = [], [], None
    while True:
        with db.session() as s:
            page = ResultRepository(s).leaderboard(
                model_ids=[m], page_size=3, page_token=token, include_infeasible=True
            )
        assert page.count == 7
        seen += [r.id for r in page.results]
        ranks += page.ranks
        steps = [r.step_ms for r in page.results]
        assert steps == sorted(steps)
        token = page.next_page_token
        if token is None:
            break
    assert len(seen) == len(set(seen)) == 7 and ranks == list(range(1, 8))
    with db.session() as s:
        flagged = [r for r in ResultRepository(s).for_job(job.id) if r.pareto_optimal]
    assert {(r.step_ms, r.peak_bytes) for r in flagged} == {
        (1.0, 6 * GiB),
        (2.0, 5 * GiB),
        (3.0, 4 * GiB),
        (4.0, 3 * GiB),
        (5.0, 2 * GiB),
        (6.0, 1 * GiB),
    }
    with pytest.raises(ValueError, match="page_token"):
        decode_page_token("not-a-token")
    with db.session() as s, pytest.raises(ValueError, match="order_by"):
        page = ResultRepository(s).leaderboard(page_size=2)
        ResultRepository(s).leaderboard(order_by="peak_bytes", page_token=page.next_page_token)
