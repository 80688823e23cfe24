"""Exported programs through the service (in process, SQLite): upload a ``torch.export`` archive, tune it with a
real worker (module stages profiled on the CPU, copies modeled for the job's GPU type), read the best plan and the
leaderboard; one stored model per structure; the upload's problems (batch, integer inputs, eval mode, media type,
size)."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch
from exported_fixtures import TinyNet, TokenNet, export_archive
from fastapi.testclient import TestClient

from memtune.api.client import ApiError, MemtuneClient
from memtune.api.service.main import create_app
from memtune.api.service.settings import Settings
from memtune.api.service.worker import Worker
from memtune.profiler.exported import check_exported, load_exported
from memtune.storage.database import Database
from memtune.storage.repositories import ModelRepository

PROBLEM = "application/problem+json"
OCTET = {"Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def tiny() -> bytes:
    torch.manual_seed(0)
    return export_archive(TinyNet(width=64), torch.randn(4, 64))


def _run_worker(db: Database) -> str | None:
    return Worker(db, worker_id="unit-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0).run_once()


@pytest.mark.slow
def test_upload_tune_best_and_leaderboard(client: MemtuneClient, db: Database, tiny: bytes) -> None:
    model = client.upload_exported(tiny, name="tiny-exported")
    assert (model.kind, model.name, model.n_stages) == ("exported", "tiny-exported", None)
    info = model.definition["exported"]
    assert info["batch"] == 4 and info["inputs"] == [{"name": "x", "shape": [4, 64], "dtype": "float32", "high": None}]
    assert info["n_parameters"] == 6 and info["parameter_bytes"] == (2 * (64 * 64 + 64) + 4 * 64 + 4) * 4

    job = client.submit_job(model.id, batch=4, gpu="h200", budget="100MiB", trials=12, validate_top_k=1)
    assert _run_worker(db) == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded", done.error
    assert done.validation is not None and done.validation.state == "skipped"
    assert "exported programs" in (done.validation.note or "")

    prof = client.profile(done.profile_id or -1)
    assert prof.source == "modeled" and prof.gpu == "h200" and prof.batch == 4
    assert prof.profile["stages_from"] == "modules"
    assert [s["name"] for s in prof.profile["stages"]] == ["blocks.0", "blocks.1", "head"]

    results = client.job_results(job.id, plans=True)
    assert {r.kind for r in results.data} >= {"baseline", "optuna"}
    best = client.best("h200", model=model.id, batch=4, budget="100MiB")
    assert best.fallback == "exact" and best.source == "simulated" and best.job_id == job.id
    assert best.step_ms == min(r.step_ms for r in results.data if r.feasible)
    assert len(best.plan["actions"]) == 3
    assert client.best("h200", model="tiny-exported", batch=4, budget="100MiB").plan == best.plan  # by name

    rows = list(client.iter_leaderboard(model=model.id, gpu="h200", page_size=5))
    assert rows and rows[0].step_ms == best.step_ms and all(r.model_id == model.id for r in rows)


def test_the_same_model_exported_twice_is_one_model(client: MemtuneClient, db: Database, tiny: bytes) -> None:
    first = client.upload_exported(tiny)
    torch.manual_seed(1)  # other weights, another trace: the same structure
    again = export_archive(TinyNet(width=64), torch.randn(4, 64))
    assert again != tiny
    r = client._http.post("/v1/models/exported", content=again, headers=OCTET)
    assert r.status_code == 200 and r.json()["id"] == first.id and r.headers["Location"] == f"/v1/models/{first.id}"
    other = client.upload_exported(export_archive(TinyNet(width=32), torch.randn(4, 32)))
    assert other.id != first.id

    with db.session() as s:
        stored = ModelRepository(s).program(first.id)
    checked = check_exported(stored, max_bytes=len(stored))
    assert checked.digest == first.content_hash  # the canonical form is accepted as it is, with the same key
    with zipfile.ZipFile(io.BytesIO(stored)) as zf:
        weights = {i.filename: i.file_size for i in zf.infolist() if "/data/weights/weight_" in i.filename}
    assert weights and set(weights.values()) == {0}  # the parameters' values are not stored
    model, inputs = load_exported(stored, max_bytes=len(stored))
    assert [n for n, _ in model.named_children()] == ["blocks", "head"]
    model(*inputs).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_job_runs_at_the_exported_batch(client: MemtuneClient, tiny: bytes) -> None:
    model = client.upload_exported(tiny)
    with pytest.raises(ApiError) as e:
        client.submit_job(model.id, batch=8, gpu="h200", budget="100MiB", trials=5)
    assert (e.value.status, e.value.code, e.value.problem["model_batch"]) == (422, "batch_mismatch", 4)
    assert "batch 4" in e.value.detail


class _Hashed(torch.nn.Module):
    """Token ids hashed into an embedding: the ids themselves index nothing, so their range must be given."""

    def __init__(self) -> None:
        super().__init__()
        self.net = TokenNet(vocab=50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.net(ids % 50)


@pytest.mark.slow
def test_integer_inputs_are_bounded_by_their_embedding_or_int_high(client: MemtuneClient, db: Database) -> None:
    tokens = client.upload_exported(export_archive(TokenNet(vocab=50), torch.randint(0, 50, (4, 8))))
    assert tokens.definition["exported"]["inputs"][0] == {"name": "ids", "shape": [4, 8], "dtype": "int64", "high": 50}

    hashed = export_archive(_Hashed(), torch.randint(0, 50, (4, 8)))
    with pytest.raises(ApiError) as e:
        client.upload_exported(hashed)
    assert (e.value.status, e.value.code, e.value.problem["field"]) == (422, "invalid_exported_program", "int_high")
    model = client.upload_exported(hashed, int_high=1000)
    assert model.definition["exported"]["inputs"][0]["high"] == 1000
    assert client.upload_exported(hashed, int_high=999).id != model.id  # the inputs' range is part of the model

    job = client.submit_job(model.id, batch=4, gpu="h100", budget="50% of gpu", trials=6)
    assert _run_worker(db) == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded", done.error
    stages = [s["name"] for s in client.profile(done.profile_id or -1).profile["stages"]]
    assert stages == ["net.emb", "net.blocks.0", "net.blocks.1", "net.drop", "net.head"]


def test_a_program_exported_in_eval_mode_is_refused(client: MemtuneClient) -> None:
    archive = export_archive(TokenNet(), torch.randint(0, 50, (4, 8)), train=False)
    with pytest.raises(ApiError) as e:
        client.upload_exported(archive)
    assert (e.value.status, e.value.code, e.value.problem["member"]) == (422, "invalid_exported_program", PROGRAM)
    assert "eval mode" in e.value.detail and "model.train()" in e.value.detail


PROGRAM = "models/model.json"


def test_upload_problems(http: TestClient, api_key: str, tiny: bytes, db: Database, tmp_path: object) -> None:
    auth = {"Authorization": f"Bearer {api_key}"}
    r = http.post("/v1/models/exported", content=tiny, headers=OCTET)
    assert r.status_code == 401 and r.headers["content-type"] == PROBLEM
    r = http.post("/v1/models/exported", content=tiny, headers=auth | {"Content-Type": "application/json"})
    assert r.status_code == 415 and r.json()["code"] == "unsupported_media_type"
    assert "application/octet-stream" in r.json()["detail"] and "--data-binary" in r.json()["detail"]
    r = http.post("/v1/models/exported", files={"file": ("model.pt2", tiny)}, headers=auth)
    assert r.status_code == 415  # multipart is not accepted: the body is the archive
    r = http.post("/v1/models/exported", content=b"", headers=auth | OCTET)
    assert r.status_code == 422 and r.json()["code"] == "invalid_exported_program"

    small = Settings(data_dir=tmp_path, max_exported_bytes=len(tiny) - 1)  # type: ignore[arg-type]
    with TestClient(create_app(small, db=db), raise_server_exceptions=False) as tc:
        r = tc.post("/v1/models/exported", content=tiny, headers=auth | OCTET)
        assert r.status_code == 413 and r.headers["content-type"] == PROBLEM
        body = r.json()
        assert body["code"] == "payload_too_large" and body["limit_bytes"] == len(tiny) - 1
        assert "MEMTUNE_MAX_EXPORTED_BYTES" in body["detail"]
        r = tc.post("/v1/models", json={"zoo": "vgg16"}, headers=auth)
        assert r.status_code == 201  # other paths keep their own limit
