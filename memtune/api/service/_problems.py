"""RFC 9457 problem details (``application/problem+json``) with a stable ``code`` per kind of error.

Every error response of the API is a problem object::

    {"type": "urn:memtune:problem:invalid_spec", "title": "Invalid model spec", "status": 422,
     "detail": "layer 3, field 'kernel_size': …", "code": "invalid_spec", "layer": 3, "field": "kernel_size"}

``code`` is what clients branch on; it never changes for a kind of error. Errors of the layers below
(``SpecError``, ``BudgetError``, ``StorageError`` …) are mapped here, in one place.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from memtune.profiler import ArchiveTooLargeError, ExportedError, ProfilerError, SpecError, UnknownGPUError
from memtune.profiler.profiler_errors import TensorTooLargeError
from memtune.storage import ConflictError, NotFoundError, StorageError, UnavailableError
from memtune.tuner import BudgetError, CalibrationError, TunerError

__all__ = ["PROBLEM_MEDIA_TYPE", "ProblemError", "install_problem_handlers", "problem_response"]

PROBLEM_MEDIA_TYPE = "application/problem+json"
log = logging.getLogger("memtune.api")

_STATUS_CODES = {
    400: ("bad_request", "Bad request"),
    401: ("unauthorized", "Unauthorized"),
    403: ("forbidden", "Forbidden"),
    404: ("not_found", "Not found"),
    405: ("method_not_allowed", "Method not allowed"),
    406: ("not_acceptable", "Not acceptable"),
    409: ("conflict", "Conflict"),
    413: ("payload_too_large", "Request body too large"),
    415: ("unsupported_media_type", "Unsupported media type"),
    422: ("validation_error", "Request is not valid"),
    500: ("internal_error", "Internal server error"),
    503: ("unavailable", "Service unavailable"),
}


class ProblemError(Exception):
    """Raise from a route to answer with a problem response.

    Args:
        status: HTTP status code.
        code: stable machine-readable code (``unknown_gpu``).
        title: short human summary of the kind of problem.
        detail: what went wrong this time and what to do next.
        headers: extra response headers (``WWW-Authenticate``).
        extra: extension members added to the problem object.
    """

    def __init__(
        self,
        status: int,
        code: str,
        title: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.headers = headers
        self.extra = extra


def problem_response(
    status: int,
    code: str,
    title: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    """A ``JSONResponse`` carrying a problem object."""
    body: dict[str, Any] = {
        "type": f"urn:memtune:problem:{code}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    body.update({k: v for k, v in extra.items() if v is not None})
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def _jsonable_errors(errors: Any) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        out.append({"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": e.get("type")})
    return out


def _allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """The methods of every route whose path matches the request's (Starlette's 405 names only one route's)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.path_regex.match(request.url.path):
            methods |= route.methods or set()
    return sorted(methods)


_Builder = Callable[[FastAPI, Request, Any], JSONResponse]
"""Builds the problem response to one error, given the app and the request it was raised in."""


@dataclass(frozen=True)
class _Problem:
    """The problem response to one kind of error: its status, code and title are fixed, its detail and extension
    members built from the error, its headers fixed; ``report`` logs the error first where it must be seen."""

    status: int
    code: str
    title: str
    detail: Callable[[Any], str] = str
    extra: Callable[[Any], dict[str, Any]] = lambda _exc: {}
    headers: dict[str, str] | None = None
    report: Callable[[Any], None] | None = None

    def __call__(self, _app: FastAPI, _request: Request, exc: Any) -> JSONResponse:
        if self.report is not None:
            self.report(exc)
        headers = dict(self.headers) if self.headers else None
        return problem_response(
            self.status, self.code, self.title, self.detail(exc), headers=headers, **self.extra(exc)
        )


def _raised_problem(_app: FastAPI, _request: Request, exc: ProblemError) -> JSONResponse:
    """A ``ProblemError`` a route raised: its own status, code, title, detail, headers and members."""
    return problem_response(exc.status, exc.code, exc.title, exc.detail, headers=exc.headers, **exc.extra)


def _invalid_request(_app: FastAPI, _request: Request, exc: RequestValidationError) -> JSONResponse:
    """A body that is not JSON (400 ``malformed_json``), or a request that does not validate (422, its first five
    errors in the detail, all of them in ``errors``)."""
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        first = next(e for e in errors if e.get("type") == "json_invalid")
        where = (first.get("ctx") or {}).get("error", "")
        return problem_response(
            400,
            "malformed_json",
            "Malformed JSON",
            f"the request body is not valid JSON ({where}); send a JSON object",
        )
    parts = []
    for e in errors[:5]:
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {e.get('msg')}")
    return problem_response(
        422,
        "validation_error",
        "Request is not valid",
        "; ".join(parts) + ("" if len(errors) <= 5 else f" (and {len(errors) - 5} more)"),
        errors=_jsonable_errors(errors),
    )


def _http_error(app: FastAPI, request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """An HTTP error of the framework (404, 405 …), coded by its status; a 405 names every method of the path."""
    code, title = _STATUS_CODES.get(exc.status_code, ("http_error", "HTTP error"))
    detail = exc.detail if isinstance(exc.detail, str) else title
    headers = dict(exc.headers) if exc.headers else {}
    if exc.status_code == 405:  # every method of the path, not only those of the first route that matched it
        headers["Allow"] = ", ".join(_allowed_methods(app, request))
    return problem_response(exc.status_code, code, title, detail, headers=headers or None)


def _unhandled(exc: Exception) -> str:
    """The detail of an error nothing else maps: its class only (the rest is in the server log)."""
    return f"{type(exc).__name__}; see the server log"


#: Every error the app maps to a problem response, and how. An error is answered by the entry of the nearest class in
#: its MRO (Starlette's lookup), so ``ProfilerError`` answers the profiler's errors that have no entry of their own,
#: ``StorageError`` the storage's, and ``Exception`` the rest.
_PROBLEMS: dict[type[Exception], _Builder] = {
    ProblemError: _raised_problem,
    RequestValidationError: _invalid_request,
    StarletteHTTPException: _http_error,
    SpecError: _Problem(
        422, "invalid_spec", "Invalid model spec", extra=lambda e: {"layer": e.layer, "field": e.field}
    ),
    ArchiveTooLargeError: _Problem(
        413,
        "payload_too_large",
        "Request body too large",
        detail=lambda e: str(e) + " (MEMTUNE_MAX_EXPORTED_BYTES)",
        extra=lambda e: {"limit_bytes": e.limit_bytes, "member": e.member},
    ),
    TensorTooLargeError: _Problem(
        422,
        "tensor_too_large",
        "Tensor larger than the GPU's memory",
        extra=lambda e: {
            "member": e.member,
            "tensor": e.tensor,
            "tensor_bytes": e.nbytes,
            "limit_bytes": e.limit_bytes,
        },
    ),
    ExportedError: _Problem(
        422,
        "invalid_exported_program",
        "Exported program refused",
        extra=lambda e: {"member": e.member, "field": e.field},
    ),
    UnknownGPUError: _Problem(422, "unknown_gpu", "Unknown GPU type"),
    BudgetError: _Problem(422, "invalid_budget", "Invalid memory budget"),
    CalibrationError: _Problem(422, "invalid_calibration", "Invalid calibration", extra=lambda e: {"field": e.field}),
    ProfilerError: _Problem(422, "profiler_error", "Model could not be profiled"),
    TunerError: _Problem(422, "tuner_error", "Tuning request is not valid"),
    NotFoundError: _Problem(404, "not_found", "Not found"),
    ConflictError: _Problem(409, "conflict", "Conflict"),
    UnavailableError: _Problem(503, "database_unavailable", "Database unavailable", headers={"Retry-After": "1"}),
    StorageError: _Problem(
        500,
        "storage_error",
        "Storage error",
        detail=lambda _e: "the database failed; see the server log",
        report=lambda e: log.error("storage error: %s", e),
    ),
    Exception: _Problem(
        500,
        "internal_error",
        "Internal server error",
        detail=_unhandled,
        report=lambda e: log.exception("unhandled error", exc_info=e),
    ),
}


def _handler(app: FastAPI, build: _Builder) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    """The exception handler that answers with ``build``'s response."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return build(app, request, exc)

    return handle


def install_problem_handlers(app: FastAPI) -> None:
    """Map every error the app can raise to a problem response (``_PROBLEMS``)."""
    for error, build in _PROBLEMS.items():
        app.add_exception_handler(error, _handler(app, build))
