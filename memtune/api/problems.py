"""RFC 9457 problem details (``application/problem+json``) with a stable ``code`` per kind of error.

Every error response of the API is a problem object::

    {"type": "urn:memtune:problem:invalid_spec", "title": "Invalid model spec", "status": 422,
     "detail": "layer 3, field 'kernel_size': …", "code": "invalid_spec", "layer": 3, "field": "kernel_size"}

``code`` is what clients branch on; it never changes for a kind of error. Errors of the layers below
(``SpecError``, ``BudgetError``, ``StorageError`` …) are mapped here, in one place.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from memtune.profiler import ArchiveTooLargeError, ExportedError, ProfilerError, SpecError, UnknownGPUError
from memtune.profiler.errors import TensorTooLargeError
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


def install_problem_handlers(app: FastAPI) -> None:
    """Map every error the app can raise to a problem response."""

    @app.exception_handler(ProblemError)
    async def _problem(_: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(exc.status, exc.code, exc.title, exc.detail, headers=exc.headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
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

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code, title = _STATUS_CODES.get(exc.status_code, ("http_error", "HTTP error"))
        detail = exc.detail if isinstance(exc.detail, str) else title
        headers = dict(exc.headers) if exc.headers else {}
        if exc.status_code == 405:  # every method of the path, not only those of the first route that matched it
            headers["Allow"] = ", ".join(_allowed_methods(app, request))
        return problem_response(exc.status_code, code, title, detail, headers=headers or None)

    @app.exception_handler(SpecError)
    async def _spec(_: Request, exc: SpecError) -> JSONResponse:
        return problem_response(422, "invalid_spec", "Invalid model spec", str(exc), layer=exc.layer, field=exc.field)

    @app.exception_handler(ArchiveTooLargeError)
    async def _too_large(_: Request, exc: ArchiveTooLargeError) -> JSONResponse:
        return problem_response(
            413,
            "payload_too_large",
            "Request body too large",
            str(exc) + " (MEMTUNE_MAX_EXPORTED_BYTES)",
            limit_bytes=exc.limit_bytes,
            member=exc.member,
        )

    @app.exception_handler(TensorTooLargeError)
    async def _tensor_too_large(_: Request, exc: TensorTooLargeError) -> JSONResponse:
        return problem_response(
            422,
            "tensor_too_large",
            "Tensor larger than the GPU's memory",
            str(exc),
            member=exc.member,
            tensor=exc.tensor,
            tensor_bytes=exc.nbytes,
            limit_bytes=exc.limit_bytes,
        )

    @app.exception_handler(ExportedError)
    async def _exported(_: Request, exc: ExportedError) -> JSONResponse:
        return problem_response(
            422,
            "invalid_exported_program",
            "Exported program refused",
            str(exc),
            member=exc.member,
            field=exc.field,
        )

    @app.exception_handler(UnknownGPUError)
    async def _gpu(_: Request, exc: UnknownGPUError) -> JSONResponse:
        return problem_response(422, "unknown_gpu", "Unknown GPU type", str(exc))

    @app.exception_handler(BudgetError)
    async def _budget(_: Request, exc: BudgetError) -> JSONResponse:
        return problem_response(422, "invalid_budget", "Invalid memory budget", str(exc))

    @app.exception_handler(CalibrationError)
    async def _calibration(_: Request, exc: CalibrationError) -> JSONResponse:
        return problem_response(422, "invalid_calibration", "Invalid calibration", str(exc), field=exc.field)

    @app.exception_handler(ProfilerError)
    async def _profiler(_: Request, exc: ProfilerError) -> JSONResponse:
        return problem_response(422, "profiler_error", "Model could not be profiled", str(exc))

    @app.exception_handler(TunerError)
    async def _tuner(_: Request, exc: TunerError) -> JSONResponse:
        return problem_response(422, "tuner_error", "Tuning request is not valid", str(exc))

    @app.exception_handler(NotFoundError)
    async def _not_found(_: Request, exc: NotFoundError) -> JSONResponse:
        return problem_response(404, "not_found", "Not found", str(exc))

    @app.exception_handler(ConflictError)
    async def _conflict(_: Request, exc: ConflictError) -> JSONResponse:
        return problem_response(409, "conflict", "Conflict", str(exc))

    @app.exception_handler(UnavailableError)
    async def _unavailable(_: Request, exc: UnavailableError) -> JSONResponse:
        return problem_response(
            503, "database_unavailable", "Database unavailable", str(exc), headers={"Retry-After": "1"}
        )

    @app.exception_handler(StorageError)
    async def _storage(_: Request, exc: StorageError) -> JSONResponse:
        log.error("storage error: %s", exc)
        return problem_response(500, "storage_error", "Storage error", "the database failed; see the server log")

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return problem_response(
            500, "internal_error", "Internal server error", f"{type(exc).__name__}; see the server log"
        )
