"""The OpenAPI document as the handlers answer, and the docs page served without the internet.

# NOTE [ Exact OpenAPI ]
FastAPI describes what a route returns when it succeeds, a JSON validation error it never sends (our handlers answer
every error as ``application/problem+json``, ``memtune.api.service._problems``) and nothing else. ``exact_openapi``
adds,
to every operation, the problem responses it can give:

- every operation: 422 (a parameter or body the schema refuses) and 500;
- an operation that needs an API key (it declares the bearer scheme: writes, and reads when
  ``MEMTUNE_READS_OPEN=false``): 401;
- a path with parameters: 404 (nothing with that id or key);
- an operation with a request body: 400 (not well-formed), 413 (over the size limit) and 415 (not
  ``application/json``); an operation with a ``page_token``: 400 (a token this service did not give);
- the operations a route lists in its own ``responses`` keep their own description, with the problem schema.

The document is made once per app and cached, as FastAPI's own is. ``/docs`` serves Swagger UI from the
``swagger-ui-bundle`` package's files (``/docs/assets``), not from a CDN, so it works offline.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from memtune.api.service._problems import PROBLEM_MEDIA_TYPE

__all__ = ["exact_openapi", "install_docs"]

_PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "RFC 9457 problem details with a stable `code`",
    "type": "object",
    "required": ["type", "title", "status", "code"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "instance": {"type": "string"},
        "errors": {"type": "array", "items": {"type": "object"}},
    },
    "additionalProperties": True,
}

_DESCRIPTIONS = {
    "400": "the request body is not well-formed JSON, or the page token is not one this service gave",
    "401": "API key missing, unknown or revoked",
    "404": "no such resource",
    "413": "request body over the size limit",
    "415": "request body is not application/json",
    "422": "a parameter or the body is not valid",
    "500": "unexpected server error",
}


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


def _codes(path: str, op: dict[str, Any]) -> list[str]:
    codes = ["422", "500"]
    if op.get("security"):
        codes.append("401")
    if "{" in path:
        codes.append("404")
    if "requestBody" in op:
        codes += ["400", "413", "415"]
    elif any(param.get("name") == "page_token" for param in op.get("parameters", [])):
        codes.append("400")
    return codes


def exact_openapi(app: FastAPI, *, reads_open: bool = True) -> dict[str, Any]:
    """The app's OpenAPI document with every problem response each operation can give (NOTE [ Exact OpenAPI ]);
    with ``reads_open`` False the ``/v1`` reads are declared as needing the bearer key too."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    doc.setdefault("components", {}).setdefault("schemas", {})["Problem"] = _PROBLEM_SCHEMA
    doc["components"]["schemas"].pop("HTTPValidationError", None)
    doc["components"]["schemas"].pop("ValidationError", None)
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            if not reads_open and method == "get" and path.startswith("/v1/"):
                op.setdefault("security", [{"HTTPBearer": []}])
            responses: dict[str, Any] = op.setdefault("responses", {})
            for code, response in list(responses.items()):
                # a route's own error responses: its words, our schema; unless it names a body of its own
                # (``/healthz``'s 503 answers its ``HealthPublic``, as its 200 does)
                ref = response.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref", "")
                if code.startswith(("4", "5")) and (not ref or ref.endswith("/HTTPValidationError")):
                    responses[code] = _problem(response.get("description") or _DESCRIPTIONS.get(code, "error"))
            for code in _codes(path, op):
                responses.setdefault(code, _problem(_DESCRIPTIONS[code]))
    app.openapi_schema = doc
    return doc


def install_docs(app: FastAPI, *, path: str = "/docs") -> None:
    """Serve Swagger UI at ``path`` from the ``swagger-ui-bundle`` package (no CDN) and the exact document.

    The app must be made with ``docs_url=None`` (FastAPI's own page loads its assets from a CDN).
    """
    from swagger_ui_bundle import swagger_ui_path

    reads_open = bool(getattr(app.state, "settings", None) is None or app.state.settings.reads_open)
    app.openapi = lambda: exact_openapi(app, reads_open=reads_open)  # type: ignore[method-assign]
    app.mount(f"{path}/assets", StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui-assets")

    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} — API",
            swagger_js_url=f"{path}/assets/swagger-ui-bundle.js",
            swagger_css_url=f"{path}/assets/swagger-ui.css",
            swagger_favicon_url=f"{path}/assets/favicon-32x32.png",
        )

    app.add_api_route(path, docs, methods=["GET"], include_in_schema=False, response_class=HTMLResponse)
