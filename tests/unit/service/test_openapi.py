"""The OpenAPI document says what the handlers do (NOTE [ Exact OpenAPI ]), and ``/docs`` works offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from memtune.api.service._problems import PROBLEM_MEDIA_TYPE
from memtune.api.service.main import create_app
from memtune.api.service.settings import Settings
from memtune.storage.database import Database


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, item in doc["paths"].items() for method, op in item.items()]


def test_open_reads_declare_no_key_and_writes_do(http: TestClient) -> None:
    doc = http.get("/openapi.json").json()
    for method, path, op in _operations(doc):
        secured = bool(op.get("security"))
        assert secured == (method != "get"), (method, path)  # reads are open by default; every write needs a key
        assert ("401" in op["responses"]) == secured, (method, path)


def test_closed_reads_are_declared_as_needing_a_key(db: Database, tmp_path: Path, api_key: str) -> None:
    settings = Settings(data_dir=tmp_path, reads_open=False)  # type: ignore[arg-type]
    with TestClient(create_app(settings, db=db)) as http:
        doc = http.get("/openapi.json").json()
        reads = [(path, op) for method, path, op in _operations(doc) if method == "get" and path.startswith("/v1/")]
        assert reads and all(op.get("security") and "401" in op["responses"] for _, op in reads)
        assert http.get("/v1/gpus").status_code == 401  # and the handler agrees
        assert http.get("/v1/gpus", headers={"Authorization": f"Bearer {api_key}"}).status_code == 200


def test_every_error_response_is_documented_as_problem_json(http: TestClient) -> None:
    doc = http.get("/openapi.json").json()
    assert "Problem" in doc["components"]["schemas"] and "HTTPValidationError" not in doc["components"]["schemas"]
    for method, path, op in _operations(doc):
        codes = {c for c in op["responses"] if c[0] in "45"}
        assert {"422", "500"} <= codes, (method, path)
        if "{" in path:
            assert "404" in codes, (method, path)
        if "requestBody" in op:
            assert {"413", "415"} <= codes, (method, path)
        for code in codes:
            content = op["responses"][code]["content"]
            if (method, path, code) == ("get", "/healthz", "503"):  # degraded: the health body, as the app sends it
                assert content == {"application/json": {"schema": {"$ref": "#/components/schemas/HealthPublic"}}}
                continue
            assert list(content) == [PROBLEM_MEDIA_TYPE], (method, path, code)
            assert content[PROBLEM_MEDIA_TYPE]["schema"] == {"$ref": "#/components/schemas/Problem"}


def test_a_documented_error_is_the_one_sent(http: TestClient) -> None:
    r = http.get("/v1/jobs/0")  # below the smallest id, or not found: either way a documented problem
    assert r.status_code in (404, 422) and r.headers["content-type"].startswith(PROBLEM_MEDIA_TYPE)
    assert {"type", "title", "status", "code"} <= r.json().keys()


def test_docs_page_loads_its_assets_from_the_service(http: TestClient) -> None:
    page = http.get("/docs")
    assert page.status_code == 200
    assert "cdn.jsdelivr.net" not in page.text and "unpkg.com" not in page.text
    for asset in ("/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"):
        assert asset in page.text
        r = http.get(asset)
        assert r.status_code == 200 and len(r.content) > 10_000
