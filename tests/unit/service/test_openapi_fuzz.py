"""Property-based run over the OpenAPI schema: random paths, queries and bodies never get a 5xx.

Every operation of ``app.openapi()`` is exercised with values drawn from its parameters' declared types
(and out-of-type junk), bodies built from the request schema's property names with arbitrary JSON
values, and with or without a valid key. Every error must be a problem+json 4xx.
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**15), 10**15)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
SCALARS = {
    "integer": st.integers(-(10**13), 10**13).map(str),
    "number": st.floats(allow_nan=False, allow_infinity=False).map(str),
    "boolean": st.sampled_from(["true", "false", "1", "yes"]),
    "string": st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=30),
}
ZOO_NAMES = st.sampled_from(["vgg16", "resnet18", "gpt", "alexnet", "VGG-16", "nope"])


def _types(schema: dict[str, Any]) -> list[str]:
    if "type" in schema:
        return [schema["type"]]
    return [t for s in schema.get("anyOf", []) for t in _types(s)] or ["string"]


def _value(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    if "enum" in schema:
        return st.sampled_from([str(v) for v in schema["enum"]]) | SCALARS["string"]
    return st.one_of([SCALARS.get(t, SCALARS["string"]) for t in _types(schema)] + [SCALARS["string"]])


def _operations(app_schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, op)
        for path, item in app_schema["paths"].items()
        for method, op in item.items()
        if method in ("get", "post")
    ]


def _body(op: dict[str, Any], components: dict[str, Any]) -> st.SearchStrategy[Any]:
    ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
    if not ref:
        return st.none()
    schema = components[ref.rsplit("/", 1)[-1]]
    props = {name: JSON for name in schema.get("properties", {})}
    if "model" in props:  # reach the model paths more often than random JSON would
        props["model"] = JSON | st.fixed_dictionaries({"zoo": ZOO_NAMES}, optional={"params": JSON})
    if "zoo" in props:
        props["zoo"] = ZOO_NAMES | JSON
    return st.fixed_dictionaries({}, optional=props) | JSON


def test_no_operation_answers_5xx(http: TestClient, api_key: str) -> None:
    schema = http.app.openapi()  # type: ignore[attr-defined]
    components = schema["components"]["schemas"]
    ops = _operations(schema)
    assert {p for p, _, _ in ops} >= {"/v1/jobs", "/v1/models", "/v1/gpus/{gpu}/best", "/v1/leaderboard"}

    @st.composite
    def requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], Any, bool]:
        path, method, op = draw(st.sampled_from(ops))
        query: dict[str, str] = {}
        for p in op.get("parameters", []):
            if p["in"] == "path":
                path = path.replace("{" + p["name"] + "}", draw(_value(p["schema"]).filter(lambda v: v.strip("./"))))
            elif p["in"] == "query" and (p.get("required") or draw(st.booleans())):
                query[p["name"]] = draw(_value(p["schema"]))
        return method, path, query, draw(_body(op, components)), draw(st.booleans())

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(requests())
    def check(req: tuple[str, str, dict[str, str], Any, bool]) -> None:
        method, path, query, body, authed = req
        headers = {"Authorization": f"Bearer {api_key}"} if authed else {}
        r = http.request(method.upper(), path, params=query, json=body if method == "post" else None, headers=headers)
        assert r.status_code < 500, (method, path, query, body, r.status_code, r.text[:500])
        if r.status_code >= 400:
            assert r.headers["content-type"].startswith("application/problem+json"), r.text[:200]
            assert isinstance(r.json()["code"], str)

    check()
