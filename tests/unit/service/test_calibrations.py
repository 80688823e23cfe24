"""Calibrations per GPU type in the service (NOTE [ Calibrations in the service ] in ``memtune.api.service.worker``):
the table and migration 0006 (SQLite, and PostgreSQL when a server answers), ``GET``/``PUT /v1/gpus/{gpu}/calibration``,
the headroom of new jobs (the database's calibration before the host's files), and the worker that prices each job with
its GPU type's calibration, installing none, and calibrates a new GPU type before the first job it validates (the
measurement is a test double)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from fastapi.testclient import TestClient
from service_fixtures import SMALL_SPEC, FakeValidator, insert_old_job, schema_diff
from sqlalchemy import MetaData, Table, inspect

from memtune.api.client import ApiError, MemtuneClient
from memtune.api.service.schemas import JobPublic
from memtune.api.service.settings import Settings
from memtune.api.service.worker import Worker
from memtune.storage._storage_errors import NotFoundError
from memtune.storage.database import Database
from memtune.storage.migrate import alembic_config, current_revision, head_revision, upgrade
from memtune.storage.repositories import CalibrationRepository, JobRepository, KeyRepository, ProfileRepository
from memtune.tuner import Action, Plan, Simulator
from memtune.tuner.calibration import Calibration, calibration_for, install_calibration, installed_calibrations

NEW_GPU = "a100-80gb"  # a roofline spec, no committed calibration
MEASURED: dict[str, Any] = {
    "gpu": NEW_GPU,
    "headroom": 0.07,
    "source": "memtune calibrate on a test double",
    "compute_scale": {"resnet50-b64-float32": 0.81},
    "copy_gbps": {"d2h": 24.0, "h2d": 25.0},
    "conv_algos": {"resnet50": [{"layer": 1, "algo": 6}]},
}
#: what a calibration file holds and a PUT may send: MEASURED's fields a file has (a worker stores any it measured)
SENT: dict[str, Any] = {k: v for k, v in MEASURED.items() if k != "conv_algos"} | {"compute_source": "a test double"}
H100: dict[str, Any] = {**SENT, "gpu": "h100", "headroom": 0.2, "source": "memtune calibrate on an H100"}


# ---- databases -------------------------------------------------------------------------------------------------
def test_repository_round_trip(database_url: str) -> None:
    db = Database(database_url)
    try:
        upgrade(db, optuna_tables=False)
        with db.session() as s:
            repo = CalibrationRepository(s)
            assert repo.find("h100") is None and repo.list_all() == []
            with pytest.raises(NotFoundError, match="no calibration of GPU type 'h100'"):
                repo.get("h100")
            first = repo.put("h100", H100, source="first", measured_by="host-a:1:abc")
        with db.session() as s:
            repo = CalibrationRepository(s)
            got = repo.get("h100")
            assert got.data == H100 and got.source == "first" and got.measured_by == "host-a:1:abc"
            assert got.created_at == got.updated_at == first.created_at
            again = repo.put("h100", {**H100, "headroom": 0.25}, source="second", measured_by="API key me")
            assert again.created_at == first.created_at and again.updated_at >= first.updated_at
            kept, created = repo.add_first("h100", H100, source="late", measured_by="host-b:2:def")
            assert not created and kept.data["headroom"] == 0.25 and kept.source == "second"  # the stored one wins
            added, created = repo.add_first(NEW_GPU, {k: v for k, v in MEASURED.items() if k != "gpu"}, source="s",
                                            measured_by=None)  # fmt: skip
            assert created and added.data["gpu"] == NEW_GPU  # the key fills the data's gpu in
            with pytest.raises(ValueError, match="names GPU type 'h100', not 'l4'"):
                repo.put("l4", H100, source="x", measured_by=None)
        with db.session() as s:
            repo = CalibrationRepository(s)
            assert [c.gpu_key for c in repo.list_all()] == [NEW_GPU, "h100"]
            assert [c.gpu_key for c in repo.list_all(["h100", "h200"])] == ["h100"]
            assert repo.get(NEW_GPU).data["conv_algos"] == MEASURED["conv_algos"]  # unknown fields are kept
    finally:
        db.dispose()


def test_migration_0006_up_down_up(database_url: str) -> None:
    db = Database(database_url)
    try:
        assert upgrade(db, "0005", optuna_tables=False) == "0005"
        with db.engine.begin() as conn:
            insert_old_job(conn, MetaData(), validate_top_k=1, headroom=0.05)

        assert upgrade(db, optuna_tables=False) == head_revision()
        assert schema_diff(db) == []
        with db.session() as s:
            old = JobRepository(s).get("j1")
            assert old.headroom == 0.05 and old.headroom_source is None  # not recorded before 0006
            CalibrationRepository(s).put("h100", H100, source="s", measured_by="w")

        command.downgrade(alembic_config(db.url), "0005")
        assert current_revision(db) == "0005"
        insp = inspect(db.engine)
        assert "mt_calibrations" not in insp.get_table_names()
        assert "headroom_source" not in {c["name"] for c in insp.get_columns("mt_jobs")}
        with db.engine.connect() as conn:
            jobs = Table("mt_jobs", MetaData(), autoload_with=conn)
            assert [(r.id, r.headroom) for r in conn.execute(jobs.select())] == [("j1", 0.05)]  # the job survives

        assert upgrade(db, optuna_tables=False) == head_revision()
        assert schema_diff(db) == []
        with db.session() as s:
            assert CalibrationRepository(s).list_all() == []
            assert JobRepository(s).get("j1").headroom_source is None
    finally:
        db.dispose()


# ---- the endpoints ---------------------------------------------------------------------------------------------
def _auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


def test_get_answers_404_without_a_calibration(http: TestClient) -> None:
    r = http.get(f"/v1/gpus/{NEW_GPU}/calibration")
    p = r.json()
    assert (r.status_code, p["code"]) == (404, "no_calibration")
    assert r.headers["content-type"].startswith("application/problem+json")
    assert f"PUT /v1/gpus/{NEW_GPU}/calibration" in p["detail"] and "memtune calibrate" in p["detail"]
    r = http.get("/v1/gpus/no-such-gpu/calibration")
    assert (r.status_code, r.json()["code"]) == (404, "unknown_gpu")


def test_get_answers_the_committed_calibration(client: MemtuneClient) -> None:
    cal = client.calibration("NVIDIA H200")  # a product name resolves to its key
    assert (cal.gpu, cal.origin, cal.headroom) == ("h200", "committed", 0.05)
    assert cal.remap_ms_per_gib == 4.2 and "benchmarks.calibrate" in cal.data["remap_source"]
    assert cal.measured_by is None and cal.created_at is None


def test_put_stores_it_and_it_wins_over_the_files(
    client: MemtuneClient, db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "user-calibrations"
    folder.mkdir()
    (folder / "calibration-h100.json").write_text(json.dumps({"gpu": "h100", "headroom": 0.3, "source": "mine"}))
    monkeypatch.setenv("MEMTUNE_CALIBRATION_DIR", str(folder))
    calibration_for.cache_clear()
    try:
        assert client.calibration("h100").origin == "user file"  # the API host's file before the committed one
        assert _submit(client, gpu="h100").headroom_source == "user file"

        stored = client.put_calibration(H100)
        assert (stored.origin, stored.headroom, stored.measured_by) == ("database", 0.2, "API key tester")
        assert stored.data == H100 and stored.created_at is not None  # fields the service does not read are kept
        got = client.calibration("h100")
        assert (got.origin, got.headroom, got.source) == ("database", 0.2, H100["source"])
        job = _submit(client, gpu="h100")
        assert (job.headroom, job.headroom_source) == (0.2, "database")
        assert (_submit(client, gpu="h100", headroom=0.01).headroom_source) == "request"

        again = client.put_calibration({**H100, "headroom": 0.15})  # a later PUT replaces it
        assert again.headroom == 0.15 and again.created_at == stored.created_at
        with db.session() as s:
            assert CalibrationRepository(s).get("h100").data["headroom"] == 0.15
    finally:
        calibration_for.cache_clear()


def test_jobs_show_where_their_headroom_came_from(client: MemtuneClient) -> None:
    assert _submit(client).headroom_source == "committed"
    none = _submit(client, gpu=NEW_GPU)
    assert (none.headroom, none.headroom_source) == (0.0, "none")
    assert client.get_job(none.id).headroom_source == "none"


def test_gpus_list_their_calibration(client: MemtuneClient) -> None:
    client.put_calibration(SENT)
    gpus = {g.key: g for g in client.gpus().data}
    assert gpus["h200"].calibration is not None and gpus["h200"].calibration.origin == "committed"
    new = gpus[NEW_GPU].calibration
    assert new is not None and (new.origin, new.headroom, new.source) == ("database", 0.07, MEASURED["source"])
    assert gpus["k40"].calibration is None


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The service of these tests: the test key ``tester`` is an admin key (calibrations are written by admins)."""
    return Settings(data_dir=tmp_path, progress_interval_s=0.0, sse_interval_s=0.05, admin_keys=["tester"])


def test_put_needs_a_key(http: TestClient) -> None:
    r = http.put("/v1/gpus/h100/calibration", json=H100)
    assert (r.status_code, r.json()["code"]) == (401, "missing_api_key")


def test_put_needs_an_admin_key(http: TestClient, db: Database) -> None:
    """A calibration serves every key's jobs: an ordinary key's PUT is a 403 and stores nothing."""
    with db.session() as s:
        _, ordinary = KeyRepository(s).create("ordinary")
    r = http.put("/v1/gpus/k40/calibration", json={**H100, "gpu": "k40", "headroom": 0.5}, headers=_auth(ordinary))
    p = r.json()
    assert (r.status_code, p["code"]) == (403, "admin_only") and "MEMTUNE_ADMIN_KEYS" in p["detail"]
    with db.session() as s:
        assert CalibrationRepository(s).list_all() == []


@pytest.mark.parametrize(
    ("change", "where", "words"),
    [
        ({"headroom": 0.99999}, "headroom", "less than or equal to 0.5"),
        ({"headroom": 1.0}, "headroom", "less than or equal to 0.5"),
        ({"headroom": -0.1}, "headroom", "greater than or equal to 0"),
        ({"headroom": "0.1"}, "headroom", "valid number"),
        ({"headroom": None}, "headroom", "valid number"),
        ({"compute_scale": {"resnet50-b64-float32": 0}}, "compute_scale.resnet50-b64-float32", "greater than or equal"),
        ({"copy_gbps": {"d2h": -1}}, "copy_gbps.d2h", "greater than or equal to 0.01"),
        ({"copy_gbps": {"d2h": 1e-300}}, "copy_gbps.d2h", "greater than or equal to 0.01"),
        ({"copy_gbps": {"d2h": 1e6}}, "copy_gbps.d2h", "less than or equal to 2000"),
        ({"copy_gbps": {"sideways": 10.0}}, "copy_gbps.sideways.[key]", "'d2h' or 'h2d'"),
        ({"compute_scale": {"resnet50-b64-float32": 1.7e308}}, "compute_scale.resnet50-b64-float32", "less than"),
        ({"padding": "x" * 900_000}, "padding", "Extra inputs are not permitted"),
        ({"conv_algos": {"x": 1}}, "conv_algos", "Extra inputs are not permitted"),
        ({"compute_source": "x" * 9000}, "compute_source", "at most 8000 characters"),
        ({"shared_link_gbps": {"1": {"d2h": 1e5}}}, "shared_link_gbps.1.d2h", "less than or equal to 2000"),
        ({"shared_link_gbps": {"0": {"d2h": 50.0}}}, "shared_link_gbps.0.[key]", "should match pattern"),
        ({"allreduce_gbps": {"2": 1e9}}, "allreduce_gbps.2", "less than or equal to 10000"),
        ({"remap_ms_per_gib": -2.0}, "remap_ms_per_gib", "greater than or equal to 0"),
        ({"gpu": ""}, "gpu", "at least 1 character"),
        ({"colour": "blue"}, "colour", "Extra inputs are not permitted"),
        ({"copy_gbps": {"d2h": 50.0, "sideways": 1.0}}, "copy_gbps.sideways.[key]", "'d2h' or 'h2d'"),
    ],
)
def test_put_refuses_a_field_out_of_range_naming_it(
    http: TestClient, api_key: str, db: Database, change: dict[str, Any], where: str, words: str
) -> None:
    r = http.put("/v1/gpus/h100/calibration", json={**H100, **change}, headers=_auth(api_key))
    p = r.json()
    assert (r.status_code, p["code"]) == (422, "validation_error")
    assert p["detail"].startswith(f"{where}: ") and words in p["detail"]
    with db.session() as s:
        assert CalibrationRepository(s).list_all() == []


def test_put_refuses_a_missing_headroom(http: TestClient, api_key: str) -> None:
    body = {k: v for k, v in H100.items() if k != "headroom"}
    r = http.put("/v1/gpus/h100/calibration", json=body, headers=_auth(api_key))
    assert r.status_code == 422 and r.json()["detail"] == "headroom: Field required"


def test_put_refuses_a_calibration_of_another_gpu_type(http: TestClient, api_key: str, db: Database) -> None:
    r = http.put("/v1/gpus/h200/calibration", json=H100, headers=_auth(api_key))
    p = r.json()
    assert (r.status_code, p["code"], p["field"]) == (422, "gpu_mismatch", "gpu")
    assert "'h100'" in p["detail"] and "'h200'" in p["detail"]
    r = http.put("/v1/gpus/NVIDIA H100 80GB HBM3/calibration", json=H100, headers=_auth(api_key))
    assert r.status_code == 200 and r.json()["gpu"] == "h100"  # the path may name the type by product name
    r = http.put("/v1/gpus/no-such-gpu/calibration", json={**H100, "gpu": "no-such-gpu"}, headers=_auth(api_key))
    assert (r.status_code, r.json()["code"]) == (404, "unknown_gpu")
    with db.session() as s:
        assert [c.gpu_key for c in CalibrationRepository(s).list_all()] == ["h100"]


def test_a_calibration_sent_as_text_is_refused_with_415(http: TestClient, api_key: str) -> None:
    r = http.put(
        "/v1/gpus/h100/calibration",
        content=b'{"gpu": "h100", "headroom": 0.1}',
        headers={**_auth(api_key), "Content-Type": "text/plain"},
    )
    assert r.status_code == 415 and r.json()["code"] == "unsupported_media_type"


def test_put_refuses_data_that_is_not_json(http: TestClient, api_key: str) -> None:
    body = json.dumps({**H100, "copy_gbps": {"d2h": 1.5}}).replace("1.5", "NaN")
    headers = {**_auth(api_key), "Content-Type": "application/json"}
    r = http.put("/v1/gpus/h100/calibration", content=body, headers=headers)
    assert (r.status_code, r.json()["code"]) == (422, "validation_error")
    assert r.json()["detail"].startswith("copy_gbps.d2h: ") and "finite number" in r.json()["detail"]


def test_put_accepts_the_committed_calibration_files(http: TestClient, api_key: str) -> None:
    """Every field a calibration file has is listed (shared link and all-reduce tables included): the committed
    files are stored as they are."""
    for key in ("h100", "h200"):
        data = calibration_for(key).to_data()
        r = http.put(f"/v1/gpus/{key}/calibration", json=data, headers=_auth(api_key))
        assert r.status_code == 200, r.text
        assert r.json()["data"] == data


# ---- the worker ------------------------------------------------------------------------------------------------
def _submit(client: MemtuneClient, **kw: Any) -> JobPublic:
    args: dict[str, Any] = {"batch": 8, "gpu": "h200", "budget": "64MiB", "trials": 15, **kw}
    return client.submit_job({"spec": SMALL_SPEC}, **args)


class FakeCalibrate:
    """Stands in for ``memtune.api.service.worker.measure_calibration``: reports progress, then returns ``data`` or
    raises ``fail``;
    ``during`` runs at the progress report (to look at the job, or to store a calibration meanwhile)."""

    def __init__(
        self, data: dict[str, Any] | None = None, *, fail: Exception | None = None, during: Callable[[], None] = list
    ) -> None:
        self.data = data if data is not None else dict(MEASURED)
        self.fail = fail
        self.during = during
        self.calls = 0

    def __call__(self, progress: Callable[[str], None]) -> dict[str, Any]:
        self.calls += 1
        progress("profiling resnet50 batch 64 float32")
        self.during()
        if self.fail is not None:
            raise self.fail
        return self.data


def _worker(db: Database, fake: FakeCalibrate, *, gpu: str | None = NEW_GPU, **kw: Any) -> Worker:
    return Worker(
        db,
        worker_id="gpu-host:1:abc",
        heartbeat_interval_s=0.5,
        progress_interval_s=0.0,
        validator=FakeValidator(),
        calibrate_fn=fake,
        local_gpu=lambda: gpu,
        **kw,
    )


@pytest.mark.slow
def test_a_worker_calibrates_a_new_gpu_type_before_the_first_job_it_validates(
    client: MemtuneClient, db: Database
) -> None:
    job = _submit(client, gpu=NEW_GPU, validate_top_k=1)
    assert (job.headroom, job.headroom_source) == (0.0, "none")
    seen: list[JobPublic] = []
    fake = FakeCalibrate(during=lambda: seen.append(client.get_job(job.id)))

    assert _worker(db, fake).run_once() == job.id
    assert fake.calls == 1
    (during,) = seen  # what the job showed while its GPU type was calibrated
    assert during.validation is not None and during.validation.state == "pending"
    assert during.validation.note == f"calibrating GPU type '{NEW_GPU}': profiling resnet50 batch 64 float32"

    with db.session() as s:
        stored = CalibrationRepository(s).get(NEW_GPU)
    assert stored.data == MEASURED and stored.measured_by == "gpu-host:1:abc" and stored.source == MEASURED["source"]
    done = client.get_job(job.id)
    assert done.state == "succeeded" and (done.headroom, done.headroom_source) == (0.07, "database")
    assert done.validation is not None and done.validation.state == "done"
    assert done.validation.note is not None and done.validation.note.startswith(
        f"calibrated GPU type '{NEW_GPU}' first (measured on this worker's GPU; headroom 0.07), stored for every "
        "worker; this job is searched at that headroom (it had none); measured 1 of 1 plan(s)"
    )
    assert installed_calibrations() == {} and calibration_for(NEW_GPU).origin == "none"  # passed to the search only
    assert client.calibration(NEW_GPU).origin == "database"

    nxt = _submit(client, gpu=NEW_GPU, validate_top_k=1)  # from now on: the stored calibration, measured once
    assert (nxt.headroom, nxt.headroom_source) == (0.07, "database")
    assert _worker(db, fake).run_once() == nxt.id and fake.calls == 1
    assert client.get_job(nxt.id).validation.note.startswith("measured 1 of 1")  # type: ignore[union-attr]


@pytest.mark.slow
def test_a_failed_calibration_leaves_the_job_succeeded_with_a_note(
    client: MemtuneClient, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    job = _submit(client, gpu=NEW_GPU, validate_top_k=1)
    fake = FakeCalibrate(fail=RuntimeError("the reference plans did not run"))
    with caplog.at_level(logging.WARNING, logger="memtune.worker"):
        assert _worker(db, fake).run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded" and done.error is None
    assert (done.headroom, done.headroom_source) == (0.0, "none")
    assert done.validation is not None and done.validation.state == "done"
    assert done.validation.note is not None and done.validation.note.startswith(
        f"calibrating GPU type '{NEW_GPU}' failed, so its plans are searched at headroom 0: RuntimeError: the "
        "reference plans did not run; measured 1 of 1 plan(s)"
    )
    assert any("calibrating GPU type" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    with db.session() as s:
        assert CalibrationRepository(s).list_all() == []
    assert calibration_for(NEW_GPU).origin == "none"


@pytest.mark.slow
def test_a_measurement_that_is_not_a_calibration_is_not_stored(client: MemtuneClient, db: Database) -> None:
    job = _submit(client, gpu=NEW_GPU, validate_top_k=1)
    assert _worker(db, FakeCalibrate({**MEASURED, "headroom": 1.4})).run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded" and done.validation is not None and done.validation.note is not None
    assert "CalibrationError" in done.validation.note and "'headroom'" in done.validation.note
    with db.session() as s:
        assert CalibrationRepository(s).list_all() == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("submit", "local"),
    [
        ({"gpu": NEW_GPU}, NEW_GPU),  # nothing to validate
        ({"gpu": NEW_GPU, "validate_top_k": 1}, None),  # no CUDA device
        ({"gpu": NEW_GPU, "validate_top_k": 1}, "h100"),  # a GPU of another type
        ({"gpu": NEW_GPU, "validate_top_k": 1, "optimizer": "adam"}, NEW_GPU),  # validation would be skipped
        ({"gpu": "h100", "validate_top_k": 1}, "h100"),  # a committed calibration
    ],
)
def test_no_calibration_where_the_worker_would_not_measure(
    client: MemtuneClient, db: Database, submit: dict[str, Any], local: str | None
) -> None:
    job = _submit(client, **submit)
    fake = FakeCalibrate({**MEASURED, "gpu": submit["gpu"]})
    assert _worker(db, fake, gpu=local).run_once() == job.id
    assert fake.calls == 0 and client.get_job(job.id).state == "succeeded"
    with db.session() as s:
        assert CalibrationRepository(s).list_all() == []


@pytest.mark.slow
def test_a_calibration_stored_meanwhile_wins(client: MemtuneClient, db: Database) -> None:
    job = _submit(client, gpu=NEW_GPU, validate_top_k=1)

    def another_worker_stores_one() -> None:
        with db.session() as s:
            CalibrationRepository(s).put(NEW_GPU, {**MEASURED, "headroom": 0.09}, source="other", measured_by="w2")

    assert _worker(db, FakeCalibrate(during=another_worker_stores_one)).run_once() == job.id
    done = client.get_job(job.id)
    assert (done.headroom, done.headroom_source) == (0.09, "database")
    assert done.validation is not None and done.validation.note is not None
    assert done.validation.note.startswith(f"GPU type '{NEW_GPU}' was calibrated by w2 meanwhile (headroom 0.09)")
    with db.session() as s:
        assert CalibrationRepository(s).get(NEW_GPU).measured_by == "w2"


@pytest.mark.slow
def test_a_hosts_own_calibration_file_is_stored_without_measuring(
    client: MemtuneClient, db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "worker-calibrations"
    folder.mkdir()
    (folder / f"calibration-{NEW_GPU}.json").write_text(json.dumps({**MEASURED, "headroom": 0.11}))
    job = _submit(client, gpu=NEW_GPU, validate_top_k=1)  # submitted before the file: headroom 'none'
    monkeypatch.setenv("MEMTUNE_CALIBRATION_DIR", str(folder))
    calibration_for.cache_clear()
    try:
        fake = FakeCalibrate()
        assert _worker(db, fake).run_once() == job.id
        assert fake.calls == 0
        with db.session() as s:
            assert CalibrationRepository(s).get(NEW_GPU).data["headroom"] == 0.11
        done = client.get_job(job.id)
        assert done.headroom == 0.11 and done.validation is not None and done.validation.note is not None
        assert "from this host's `memtune calibrate` file" in done.validation.note
    finally:
        calibration_for.cache_clear()


def test_an_explicit_headroom_stays_when_the_worker_calibrates(client: MemtuneClient, db: Database) -> None:
    job = _submit(client, gpu=NEW_GPU, validate_top_k=1, headroom=0.02)
    assert _worker(db, FakeCalibrate()).run_once() == job.id
    done = client.get_job(job.id)
    assert (done.headroom, done.headroom_source) == (0.02, "request")
    with db.session() as s:
        assert CalibrationRepository(s).get(NEW_GPU).data["headroom"] == 0.07  # stored for the next jobs all the same


#: a zoo model with committed measured profiles on the H100 and the H200: its calibration's compute scale shows in the
#: unplanned step of every job of it (NOTE [ Compute scale ] in memtune.tuner.calibration)
SCALED = "alexnet-b256-float32"


def _scaled(gpu: str, scale: float) -> dict[str, Any]:
    """A calibration of ``gpu`` whose only price is a compute scale of ``scale`` on ``SCALED``."""
    return {"gpu": gpu, "headroom": 0.1, "source": f"a test: {gpu} at {scale}", "compute_scale": {SCALED: scale}}


def _unplanned_ms(db: Database, job_id: str, data: dict[str, Any]) -> float:
    """The unplanned step of ``job_id``'s stored profile, simulated under the calibration ``data``, ms."""
    with db.session() as s:
        job = JobRepository(s).get(job_id)
        assert job.profile_id is not None
        profile = ProfileRepository(s).get(job.profile_id).profile()
    assert profile.source == "measured" and profile.device.key == data["gpu"]
    sim = Simulator(profile, "sgd", calibration=Calibration.from_data(data))
    return sim.run(Plan.uniform(profile.n_stages, Action.KEEP)).step_ms


def test_each_job_is_priced_with_its_own_calibration_and_none_is_installed(
    client: MemtuneClient, http: TestClient, db: Database
) -> None:
    """One worker in one process runs jobs of two GPU types, then of one type under a second calibration: each is
    priced with its GPU type's calibration in the database when it runs (NOTE [ Calibrations in the service ]), the
    timeline with the same, and the process's registry is what it was (a calibration installed there is not used)."""
    install_calibration(_scaled("h100", 3.0))  # hidden state the service must neither read nor change
    before = installed_calibrations()
    first, other, second = _scaled("h100", 0.5), _scaled("h200", 2.0), _scaled("h100", 0.8)
    client.put_calibration(first)
    client.put_calibration(other)
    worker = _worker(db, FakeCalibrate(), gpu=None)
    job_args: dict[str, Any] = {"batch": 256, "budget": "100% of gpu", "trials": 3}
    jobs = [client.submit_job({"zoo": "alexnet"}, gpu=gpu, **job_args) for gpu in ("h100", "h200")]
    assert [worker.run_once(), worker.run_once()] == [j.id for j in jobs]
    client.put_calibration(second)  # the same GPU type, calibrated again: the next job is priced with it
    jobs.append(client.submit_job({"zoo": "alexnet"}, gpu="h100", **job_args))
    assert worker.run_once() == jobs[2].id

    steps = []
    for job, data in zip(jobs, (first, other, second), strict=True):
        done = client.get_job(job.id)
        assert done.state == "succeeded" and done.unconstrained is not None, done.error
        assert done.unconstrained.step_ms == pytest.approx(_unplanned_ms(db, job.id, data), rel=1e-9)
        steps.append(done.unconstrained.step_ms)
    assert steps[2] == pytest.approx(steps[0] * 0.8 / 0.5, rel=0.05)  # the compute scale, on one profile
    for job, data in zip(jobs[1:], (other, second), strict=True):  # the timeline: the calibration in effect
        timeline = http.get(f"/v1/jobs/{job.id}/timeline").json()
        assert timeline["unplanned"]["step_ms"] == pytest.approx(_unplanned_ms(db, job.id, data), rel=1e-9)
    assert installed_calibrations() == before


def test_the_client_says_when_there_is_no_calibration(client: MemtuneClient) -> None:
    with pytest.raises(ApiError) as caught:
        client.calibration(NEW_GPU)
    assert (caught.value.status, caught.value.code) == (404, "no_calibration")
    with pytest.raises(ValueError, match="field 'gpu'"):
        client.put_calibration({"headroom": 0.1})
