"""Input the API refuses rather than guesses at: integer ids out of the database's range (422, not a 500 and a
dropped connection), JSON values of the wrong type (never converted), budgets no plan can fit (422 naming the
floor in bytes), and bodies that are not sent as JSON (415)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_fixtures import SMALL_SPEC

from memtune.api.service._deps import ID_MAX
from memtune.storage.database import Database
from memtune.storage.repositories import JobRepository, KeyRepository, ModelRepository

PROBLEM = "application/problem+json"
#: SMALL_SPEC's 12,226 float32 parameters: 48,904 bytes; with their gradients and SGD momentum, 3x that
SMALL_PARAM_BYTES = 48_904
JOB: dict[str, Any] = {"model": {"spec": SMALL_SPEC}, "batch": 8, "gpu": "h200", "budget": "64MiB", "trials": 5}


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _problem(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["code"] == code, body
    return body


@pytest.mark.parametrize(
    "profile_id", ["99999999999999999999999", str(2**63), str(-(2**63) - 1), str(2**31), "0", "-1"]
)
def test_an_integer_id_outside_the_databases_range_is_422_not_500(http: TestClient, profile_id: str) -> None:
    r = http.get(f"/v1/profiles/{profile_id}")
    body = _problem(r, 422, "validation_error")
    assert body["errors"][0]["loc"] == ["path", "profile_id"]
    assert http.get("/healthz").status_code == 200  # the app answers on


def test_the_largest_integer_id_is_looked_up(http: TestClient) -> None:
    _problem(http.get(f"/v1/profiles/{ID_MAX}"), 404, "not_found")
    _problem(http.get("/v1/profiles/1"), 404, "not_found")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batch", True),
        ("batch", "8"),
        ("batch", 8.0),
        ("trials", "5"),
        ("trials", False),
        ("validate_top_k", True),
        ("validate_iters", "6"),
        ("headroom", "0.1"),
        ("headroom", True),
        ("budget", True),
        ("budget", 1.5e9),
        ("dtype", 1),
        ("gpu", 200),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_not_converted(
    http: TestClient, api_key: str, field: str, value: object
) -> None:
    r = http.post("/v1/jobs", json=dict(JOB, **{field: value}), headers=_auth(api_key))
    body = _problem(r, 422, "validation_error")
    assert any(e["loc"][:2] == ["body", field] for e in body["errors"]), body


def test_nested_request_fields_are_strict_too(http: TestClient, api_key: str) -> None:
    r = http.post("/v1/jobs", json=dict(JOB, model={"id": 5}), headers=_auth(api_key))
    body = _problem(r, 422, "validation_error")
    assert any(e["loc"][:3] == ["body", "model", "id"] for e in body["errors"]), body
    r = http.post("/v1/models", json={"zoo": ["vgg16"]}, headers=_auth(api_key))
    _problem(r, 422, "validation_error")


def test_an_integer_is_a_number(http: TestClient, api_key: str) -> None:
    r = http.post("/v1/jobs", json=dict(JOB, headroom=0), headers=_auth(api_key))
    assert r.status_code == 202, r.text
    assert r.json()["headroom"] == 0.0 and r.json()["batch"] == 8


@pytest.mark.parametrize("budget", [1, "1KiB", "0.0000001GiB", "100KiB"])
def test_a_budget_below_the_parameters_gradients_and_optimizer_state_is_refused(
    http: TestClient, api_key: str, budget: object
) -> None:
    r = http.post("/v1/jobs", json=dict(JOB, budget=budget, headroom=0.0), headers=_auth(api_key))
    body = _problem(r, 422, "budget_below_floor")
    assert body["field"] == "budget" and body["floor_bytes"] == 3 * SMALL_PARAM_BYTES
    assert f"{3 * SMALL_PARAM_BYTES} bytes" in body["detail"] and "'sgd'" in body["detail"]
    assert http.get("/v1/jobs").json()["count"] == 0  # nothing queued


def test_the_floor_follows_the_optimizer_and_the_headroom(http: TestClient, api_key: str) -> None:
    budget = 3 * SMALL_PARAM_BYTES + 1000  # above SGD's floor, below Adam's (4x the parameters)
    ok = http.post("/v1/jobs", json=dict(JOB, budget=budget, headroom=0.0), headers=_auth(api_key))
    assert ok.status_code == 202, ok.text
    none = http.post("/v1/jobs", json=dict(JOB, budget=budget, optimizer="none"), headers=_auth(api_key))
    assert none.status_code == 202, none.text  # 2x the parameters, even with the calibrated headroom
    adam = http.post("/v1/jobs", json=dict(JOB, budget=budget, optimizer="adam"), headers=_auth(api_key))
    assert _problem(adam, 422, "budget_below_floor")["floor_bytes"] == 4 * SMALL_PARAM_BYTES
    # the headroom is taken off the budget before the floor is compared: 10% of it leaves too little for SGD
    kept = http.post("/v1/jobs", json=dict(JOB, budget=budget, headroom=0.1), headers=_auth(api_key))
    body = _problem(kept, 422, "budget_below_floor")
    assert body["search_budget_bytes"] == int(budget * 0.9) and "headroom 0.1" in body["detail"]


def test_a_zoo_models_floor_is_counted_without_building_it(http: TestClient, api_key: str) -> None:
    vgg = dict(JOB, model={"zoo": "vgg16"}, batch=64, budget="1GiB", headroom=0.0)
    body = _problem(http.post("/v1/jobs", json=vgg, headers=_auth(api_key)), 422, "budget_below_floor")
    assert body["floor_bytes"] == 3 * 553_430_176  # VGG-16's 138,357,544 float32 parameters, x3 under SGD
    ok = http.post("/v1/jobs", json=dict(vgg, budget="2GiB"), headers=_auth(api_key))
    assert ok.status_code == 202, ok.text


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/models"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml", None])
def test_a_body_not_sent_as_json_is_415(http: TestClient, api_key: str, path: str, content_type: str | None) -> None:
    body = JOB if path == "/v1/jobs" else {"spec": SMALL_SPEC}
    headers = _auth(api_key) | ({"Content-Type": content_type} if content_type else {})
    r = http.post(path, content=json.dumps(body), headers=headers)
    problem = _problem(r, 415, "unsupported_media_type")
    assert "application/json" in problem["detail"] and (content_type or "no content type") in problem["detail"]


def test_json_with_parameters_or_a_json_suffix_is_json(http: TestClient, api_key: str) -> None:
    for content_type in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.memtune+json"):
        headers = _auth(api_key) | {"Content-Type": content_type}
        r = http.post("/v1/models", content=json.dumps({"spec": SMALL_SPEC}), headers=headers)
        assert r.status_code in (200, 201), (content_type, r.text)


def test_an_unauthenticated_request_is_401_before_its_media_type_is_looked_at(http: TestClient) -> None:
    r = http.post("/v1/jobs", content="batch=8", headers={"Content-Type": "text/plain"})
    _problem(r, 401, "missing_api_key")


def test_a_calibration_by_an_ordinary_key_is_403_before_its_body_is_read(http: TestClient, api_key: str) -> None:
    """Authorization first: the key is no admin key, so neither the media type nor the body is looked at."""
    r = http.put(
        "/v1/gpus/h100/calibration",
        content=b'{"gpu": "h100", "headroom": 0.1, "gpu": "h200"}',
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "text/plain"},
    )
    assert r.status_code == 403 and r.json()["code"] == "admin_only"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/jobs", '{"model": {"zoo": "vgg16"}, "batch": 8, "batch": 4096, "gpu": "h200", "budget": "8GiB"}'),
        ("/v1/jobs", '{"model": {"zoo": "vgg16", "zoo": "resnet50"}, "batch": 8, "gpu": "h200", "budget": "8GiB"}'),
        ("/v1/models", '{"spec": {"name": "a", "name": "b"}}'),
    ],
)
def test_a_key_given_twice_is_refused(http: TestClient, api_key: str, db: Database, path: str, body: str) -> None:
    """JSON parsers disagree on which of two equal keys counts (Python's keeps the last): the service takes neither."""
    r = http.post(path, content=body, headers=_auth(api_key) | {"Content-Type": "application/json"})
    problem = _problem(r, 422, "duplicate_key")
    assert problem["field"] in ("batch", "zoo", "name") and "twice" in problem["detail"]
    with db.session() as s:
        assert JobRepository(s).list_all() == []


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        ({"gpu": "h100\u0000"}, "gpu", "invalid_string"),
        ({"model": {"zoo": "vgg16\u0007"}}, "model.zoo", "invalid_string"),
        ({"budget": " 40 GiB "}, "budget", "validation_error"),
        ({"gpu": "h200 "}, "gpu", "validation_error"),
    ],
)
def test_strings_are_taken_as_sent(
    http: TestClient, api_key: str, db: Database, change: dict[str, Any], field: str, code: str
) -> None:
    """A control character or spaces around a GPU type or budget are refused, never cleaned away."""
    r = http.post("/v1/jobs", json={**JOB, **change}, headers=_auth(api_key))
    problem = _problem(r, 422, code)
    assert problem["detail"].startswith(f"{field}")
    with db.session() as s:
        assert JobRepository(s).list_all() == []


@pytest.mark.parametrize("label", ["vgg16", "VGG-16", "resnet_50"])
def test_a_zoo_models_name_is_reserved(http: TestClient, api_key: str, db: Database, label: str) -> None:
    """A spec or an upload named like a zoo model is refused: lookups by name would answer another structure."""
    spec = {**SMALL_SPEC, "name": label}
    r = http.post("/v1/models", json={"spec": spec}, headers=_auth(api_key))
    problem = _problem(r, 422, "invalid_spec")
    assert problem["field"] == "spec.name" and "reserved" in problem["detail"]
    r = http.post("/v1/jobs", json=dict(JOB, model={"spec": spec}), headers=_auth(api_key))
    assert _problem(r, 422, "invalid_spec")["field"] in ("spec.name", "model")
    r = http.post(
        "/v1/models/exported",
        params={"name": label},
        content=b"not read",
        headers=_auth(api_key) | {"Content-Type": "application/octet-stream"},
    )
    assert _problem(r, 422, "invalid_spec")["field"] == "name"
    with db.session() as s:
        assert JobRepository(s).list_all() == []


def test_a_stored_models_name_is_not_taken_by_another_structure(http: TestClient, api_key: str, db: Database) -> None:
    """Key B names its spec like key A's stored model: refused, and lookups by the name keep answering A's model
    (before, ``/best?model=…`` and the leaderboard mixed the two under one name). The same structure again is A's
    model, and a renamed one is stored apart."""
    with db.session() as s:
        _, other = KeyRepository(s).create("other")
    first = http.post("/v1/models", json={"spec": SMALL_SPEC}, headers=_auth(api_key))
    assert first.status_code in (200, 201), first.text
    again = http.post("/v1/models", json={"spec": SMALL_SPEC}, headers=_auth(other))
    assert again.status_code in (200, 201) and again.json()["id"] == first.json()["id"]
    changed = {**SMALL_SPEC, "layers": [*SMALL_SPEC["layers"], {"type": "relu"}]}
    r = http.post("/v1/models", json={"spec": changed}, headers=_auth(other))
    problem = _problem(r, 422, "invalid_spec")
    assert problem["field"] == "spec.name" and first.json()["id"] in problem["detail"]
    r = http.post("/v1/jobs", json=dict(JOB, model={"spec": changed}), headers=_auth(other))
    assert _problem(r, 422, "invalid_spec")["field"] == "spec.name"
    renamed = http.post("/v1/models", json={"spec": {**changed, "name": "tiny-cnn-2"}}, headers=_auth(other))
    assert renamed.status_code in (200, 201) and renamed.json()["id"] != first.json()["id"]
    with db.session() as s:
        assert [m.id for m in ModelRepository(s).find("tiny-cnn")] == [first.json()["id"]]
        assert JobRepository(s).list_all() == []
