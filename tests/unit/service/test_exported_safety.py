"""Hostile exported programs (NOTE [ Safe exported programs ] in ``memtune.profiler.exported``): each puts a payload
where ``torch.export.load`` (or ``.module()`` on what it returns) would run it; memtune refuses every one, through the
loader and over HTTP, with a problem naming the archive member, and the payload never runs. A control test shows the
stock loader running the same payloads, so the refusals are tested against real attacks. Also: not a zip, a zip
bomb, a truncated archive."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from exported_fixtures import (
    HOSTILE_STOCK_RUNS,
    TinyNet,
    dead_nodes,
    export_archive,
    factory_call,
    hostile_archives,
    huge_parameter,
    stack_trace_variant,
    zip_bomb,
)
from fastapi.testclient import TestClient

from memtune.api.client import MemtuneClient
from memtune.api.service.main import create_app
from memtune.api.service.settings import Settings
from memtune.api.service.worker import Worker
from memtune.profiler import _exported_checks
from memtune.profiler.exported import (
    ArchiveTooLargeError,
    ExportedError,
    TensorTooLargeError,
    check_exported,
    load_exported,
)
from memtune.storage.database import Database
from memtune.storage.repositories import JobRepository

PROBLEM = "application/problem+json"

# the member (and field) each variant's problem names
REFUSED_AT = {
    "weight_pickle": ("data/weights/model_weights_config.json", "blocks.0.fc.weight"),
    "constant_pickle": ("data/constants/model_constants_config.json", "evil"),
    "opaque_object": ("data/constants/opaque_obj_0", None),
    "custom_object": ("data/constants/custom_obj_0", None),
    "legacy_weights": ("data/weights/model.pt", None),
    "legacy_constants": ("data/constants/model.pt", None),
    "sample_inputs": ("data/sample_inputs/model.pt", None),
    "sample_inputs_zip": ("data/sample_inputs/model.pt", None),
    "extra_pickle": ("extra/payload.pkl", None),
    "aoti_library": ("data/aotinductor/model/model.so", None),
    "guards_code": ("models/model.json", "guards_code"),
    "sympy_expression": ("models/model.json", "p_blocks_0_fc_weight"),
    "os_target": ("models/model.json", "linear"),
    "fqn_injection": ("models/model.json", None),
}


@pytest.fixture(scope="module")
def base() -> bytes:
    return export_archive(TinyNet(), torch.randn(4, 16))


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


def test_every_hostile_variant_is_listed(base: bytes, markers: Path) -> None:
    assert set(hostile_archives(base, markers)) == set(REFUSED_AT)
    assert set(HOSTILE_STOCK_RUNS) <= set(REFUSED_AT)


@pytest.mark.parametrize("variant", sorted(REFUSED_AT))
def test_the_loader_refuses_and_runs_nothing(variant: str, base: bytes, markers: Path) -> None:
    archive = hostile_archives(base, markers)[variant]
    with pytest.raises(ExportedError) as e:
        load_exported(archive, max_bytes=1 << 26)
    assert (e.value.member, e.value.field) == REFUSED_AT[variant], str(e.value)
    assert not any(markers.iterdir()), "a payload ran"


def test_the_api_refuses_each_with_a_problem(
    client: MemtuneClient, http: TestClient, api_key: str, base: bytes, markers: Path
) -> None:
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/octet-stream"}
    for variant, archive in hostile_archives(base, markers).items():
        r = http.post("/v1/models/exported", content=archive, headers=headers)
        assert r.status_code == 422 and r.headers["content-type"] == PROBLEM, (variant, r.text)
        problem = r.json()
        member, field = REFUSED_AT[variant]
        assert problem["code"] == "invalid_exported_program" and problem["title"] == "Exported program refused"
        assert problem["member"] == member and problem.get("field") == field, (variant, problem)
        assert problem["detail"].startswith(member), problem["detail"]
    assert not any(markers.iterdir()), "a payload ran"
    assert list(client.iter_leaderboard(page_size=5)) == []


@pytest.mark.slow
def test_a_stack_trace_never_reaches_generated_code(
    client: MemtuneClient, db: Database, base: bytes, markers: Path
) -> None:
    """Stack traces are dropped from the canonical form (FX would paste them into comments of generated code)."""
    model = client.upload_exported(stack_trace_variant(base, markers))
    job = client.submit_job(model.id, batch=4, gpu="h200", budget="100MiB", trials=4)
    assert Worker(db, worker_id="unit-worker", heartbeat_interval_s=0.5).run_once() == job.id
    assert client.get_job(job.id).state == "succeeded"
    assert not any(markers.iterdir()), "a payload ran"


def test_not_a_zip_truncated_and_zip_bomb(
    http: TestClient, api_key: str, base: bytes, db: Database, tmp_path: Path
) -> None:
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/octet-stream"}
    for body, says in (
        (b"\x80\x02cposix\nsystem\n", "not a .pt2 archive"),  # a bare pickle
        (base[: len(base) // 2], "truncated or corrupt"),
        (base[:-10], "truncated or corrupt"),
    ):
        with pytest.raises(ExportedError, match=says):
            check_exported(body, max_bytes=1 << 26)
        r = http.post("/v1/models/exported", content=body, headers=headers)
        assert r.status_code == 422 and r.json()["code"] == "invalid_exported_program" and says in r.json()["detail"]

    bomb = zip_bomb(base, 64 << 20)  # a small body that unpacks past the limit
    assert len(bomb) < 1 << 20
    with pytest.raises(ArchiveTooLargeError) as e:
        check_exported(bomb, max_bytes=32 << 20)
    assert e.value.member == "archive/data/weights/weight_99" and e.value.limit_bytes == 32 << 20
    settings = Settings(data_dir=tmp_path, max_exported_bytes=32 << 20)
    with TestClient(create_app(settings, db=db), raise_server_exceptions=False) as tc:
        r = tc.post("/v1/models/exported", content=bomb, headers=headers)
    assert r.status_code == 413 and r.headers["content-type"] == PROBLEM
    problem = r.json()
    assert problem["code"] == "payload_too_large" and problem["member"] == "archive/data/weights/weight_99"
    assert "unpacks to" in problem["detail"] and problem["limit_bytes"] == 32 << 20


@pytest.mark.slow
def test_the_stock_loader_runs_these_payloads(base: bytes, tmp_path: Path) -> None:
    """Control: in a subprocess, ``torch.export.load`` and a call of ``.module()`` run every payload in
    ``HOSTILE_STOCK_RUNS`` (so the refusals above are tested against working attacks)."""
    markers = tmp_path / "stock"
    markers.mkdir()
    files = tmp_path / "archives"
    files.mkdir()
    for variant in HOSTILE_STOCK_RUNS:
        (files / f"{variant}.pt2").write_bytes(hostile_archives(base, markers)[variant])
    code = textwrap.dedent(
        f"""
        import logging, pathlib, warnings
        import torch
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        for path in sorted(pathlib.Path({str(files)!r}).iterdir()):
            try:
                torch.export.load(path).module()(torch.randn(4, 16))
            except Exception:
                pass
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True)
    assert sorted(p.name for p in markers.iterdir()) == sorted(HOSTILE_STOCK_RUNS)


def test_the_worker_checks_the_stored_archive_again(
    client: MemtuneClient, db: Database, base: bytes, markers: Path
) -> None:
    """A hostile archive that reached the database by another way than the API is refused when the worker loads it:
    the job fails naming the member, and the payload never runs."""
    from memtune.storage.repositories import ModelRepository

    hostile = hostile_archives(base, markers)["weight_pickle"]
    summary = check_exported(base, max_bytes=1 << 26)
    with db.session() as s:
        model, _ = ModelRepository(s).get_or_create(
            name="smuggled",
            kind="exported",
            digest="f" * 64,
            n_stages=None,
            definition={"exported": {**summary.summary(), "int_high": None}},
            program=hostile,
        )
    job = client.submit_job(model.id, batch=4, gpu="h200", budget="100MiB", trials=4)
    assert Worker(db, worker_id="unit-worker", heartbeat_interval_s=0.5).run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "failed" and "use_pickle" in (done.error or "") and "ExportedError" in (done.error or "")
    assert not any(markers.iterdir()), "a payload ran"


def test_upload_limits_besides_bytes(base: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ Upload limits ]: a deflated member that unpacks over 100 times its size, ten thousand members, a graph
    over the node limit: each refused naming the member, before anything is stored."""
    bomb = zip_bomb(base, 8 << 20)  # within the byte limit, 8 MiB of zeros from a few kilobytes
    with pytest.raises(ExportedError, match="over 100 times") as e:
        check_exported(bomb, max_bytes=1 << 26)
    assert e.value.member == "data/weights/weight_99"
    crowd = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(base)) as src, zipfile.ZipFile(crowd, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
        for k in range(10_000):
            dst.writestr(f"archive/data/weights/weight_{1000 + k}", b"")
    with pytest.raises(ExportedError, match="members, over the limit of 10000"):
        check_exported(crowd.getvalue(), max_bytes=1 << 26)
    check_exported(base, max_bytes=1 << 26)  # the model itself passes
    monkeypatch.setattr(_exported_checks, "_MAX_NODES", 3)
    with pytest.raises(ExportedError, match="nodes, over the limit of 3") as e:
        check_exported(base, max_bytes=1 << 26)
    assert e.value.member == "models/model.json"


def _stored_models(db: Database) -> int:
    from sqlalchemy import text

    with db.session() as s:
        return int(s.execute(text("SELECT count(*) FROM mt_models")).scalar_one())


@pytest.mark.slow
def test_an_archive_slow_to_check_is_stopped_and_the_api_answers_meanwhile(
    db: Database, api_key: str, base: bytes, tmp_path: Path
) -> None:
    """NOTE [ Upload limits ]: 20,000 dead nodes (within the node limit) take seconds to check. The check runs in a
    child process that is killed past MEMTUNE_MAX_EXPORTED_CHECK_S: a 422 naming the limit, nothing stored, and the
    API answers other requests at once while the check runs (before, the upload was stored after the whole check)."""
    slow = dead_nodes(base, 20_000)
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/octet-stream"}
    settings = Settings(data_dir=tmp_path, max_exported_check_s=1.0)
    with TestClient(create_app(settings, db=db), raise_server_exceptions=False) as tc:
        assert tc.post("/v1/models/exported", content=base, headers=headers).status_code == 201  # warm
        answer: dict[str, object] = {}

        def upload() -> None:
            t0 = time.monotonic()
            answer["response"] = tc.post("/v1/models/exported", content=slow, headers=headers)
            answer["seconds"] = time.monotonic() - t0

        thread = threading.Thread(target=upload)
        thread.start()
        waits = []
        while thread.is_alive():
            t0 = time.monotonic()
            assert tc.get("/healthz").status_code in (200, 503)
            waits.append(time.monotonic() - t0)
            time.sleep(0.05)
        thread.join()
    r: Any = answer["response"]
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM, r.text
    problem = r.json()
    assert problem["code"] == "exported_check_timeout" and problem["limit_s"] == 1.0
    assert "MEMTUNE_MAX_EXPORTED_CHECK_S" in problem["detail"] and "nothing was stored" in problem["detail"]
    assert float(answer["seconds"]) < 10  # type: ignore[arg-type]
    assert len(waits) >= 3 and max(waits) < 0.5, waits
    assert _stored_models(db) == 1  # the warm-up model only


def test_a_tensor_larger_than_the_gpu_is_refused_naming_it(base: bytes) -> None:
    """NOTE [ Upload limits ]: a parameter declared 4 TiB with an empty record, and ``torch.ones(2**35)`` (128 GiB)
    whether its output's metadata says so or lies, are refused against a GPU's memory, naming the tensor."""
    h100 = 80 << 30
    with pytest.raises(TensorTooLargeError) as e:
        check_exported(huge_parameter(base, [1 << 20, 1 << 20]), max_bytes=1 << 26, max_tensor_bytes=h100)
    assert (e.value.tensor, e.value.nbytes, e.value.limit_bytes) == ("blocks.0.fc.weight", 4 << 40, h100)
    assert e.value.member == "data/weights/model_weights_config.json" and "parameter" in str(e.value)
    for declared in (None, 1):
        with pytest.raises(TensorTooLargeError) as e:
            check_exported(factory_call(base, 1 << 35, declared=declared), max_bytes=1 << 26, max_tensor_bytes=h100)
        assert (e.value.tensor, e.value.nbytes) == ("big", 128 << 30) and "aten.ones.default" in str(e.value)
    checked = check_exported(factory_call(base, 1 << 35), max_bytes=1 << 26, max_tensor_bytes=None)
    assert checked.max_tensor_bytes == 128 << 30 and checked.summary()["largest_tensor_name"] == "big"
    small = check_exported(factory_call(base, 16), max_bytes=1 << 26, max_tensor_bytes=h100)
    assert small.max_tensor_bytes == 16 * 16 * 4  # a weight matrix is the largest


@pytest.mark.slow
def test_the_api_checks_every_tensor_against_the_gpu_types_memory(
    http: TestClient, api_key: str, base: bytes, db: Database
) -> None:
    """Over HTTP: at upload against the ``gpu`` named (else the largest known GPU type), and again when a job names
    its GPU type: 422 ``tensor_too_large`` naming the tensor, its bytes and the limit; nothing stored."""
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/octet-stream"}
    r = http.post("/v1/models/exported", content=huge_parameter(base, [1 << 20, 1 << 20]), headers=headers)
    problem = r.json()
    assert (r.status_code, r.headers["content-type"], problem["code"]) == (422, PROBLEM, "tensor_too_large"), r.text
    assert problem["tensor"] == "blocks.0.fc.weight" and problem["tensor_bytes"] == 4 << 40
    assert problem["limit_bytes"] == 150754820096 and "h200" in problem["detail"]  # the largest known GPU type
    big = factory_call(base, 1 << 35, declared=1)  # 128 GiB: over an H100's 80, within an H200's 140
    r = http.post("/v1/models/exported", params={"gpu": "h100"}, content=big, headers=headers)
    problem = r.json()
    assert (r.status_code, problem["code"], problem["tensor"]) == (422, "tensor_too_large", "big"), r.text
    assert (problem["tensor_bytes"], problem["limit_bytes"]) == (128 << 30, 80 << 30)
    assert "the h100's memory" in problem["detail"]
    assert _stored_models(db) == 0
    r = http.post("/v1/models/exported", params={"gpu": "h200"}, content=big, headers=headers)
    assert r.status_code == 201, r.text
    model_id = r.json()["id"]
    job = {"model": {"id": model_id}, "batch": 4, "gpu": "h100", "budget": "1GiB", "trials": 4}
    auth = {"Authorization": f"Bearer {api_key}"}
    r = http.post("/v1/jobs", json=job, headers=auth)
    problem = r.json()
    assert (r.status_code, problem["code"], problem["tensor"], problem["field"]) == (
        422,
        "tensor_too_large",
        "big",
        "model",
    ), r.text
    assert (problem["tensor_bytes"], problem["limit_bytes"]) == (128 << 30, 80 << 30)
    with db.session() as s:
        assert JobRepository(s).list_all() == []
    assert http.post("/v1/jobs", json=dict(job, gpu="h200"), headers=auth).status_code == 202
    r = http.post("/v1/models/exported", params={"gpu": "b9000"}, content=big, headers=headers)
    assert (r.status_code, r.json()["code"]) == (422, "unknown_gpu")
