"""FastAPI dependencies as ``Annotated`` aliases: the settings, the database, the caller's API key, a JSON body's
media type, and the type of integer path parameters."""

from __future__ import annotations

import json
import unicodedata
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from memtune.api.service._problems import ProblemError
from memtune.api.service.settings import Settings
from memtune.storage import Database
from memtune.storage.records import ApiKey
from memtune.storage.repositories import KeyRepository

__all__ = [
    "ID_MAX",
    "AdminKey",
    "DbDep",
    "IdPath",
    "JsonBody",
    "ReadAccess",
    "SettingsDep",
    "WriteKey",
    "get_db",
    "get_settings",
    "is_admin",
]

ID_MAX = 2**31 - 1
"""The largest integer id every supported database holds: the ids are ``Integer`` columns, 32-bit on PostgreSQL."""

IdPath = Annotated[int, Path(ge=1, le=ID_MAX, description="a stored row's integer id, 1 to 2**31 - 1")]
"""Every integer path parameter: an id outside what the database can hold is a 422 problem, never a query."""

_bearer = HTTPBearer(auto_error=False, description="an API key from `memtune keys create`")


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[Database, Depends(get_db)]
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _authenticate(db: Database, credentials: HTTPAuthorizationCredentials | None) -> ApiKey:
    challenge = {"WWW-Authenticate": 'Bearer realm="memtune"'}
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise ProblemError(
            401,
            "missing_api_key",
            "API key required",
            "this request needs 'Authorization: Bearer <key>'; create a key with `memtune keys create --name NAME`",
            headers=challenge,
        )
    with db.session() as s:
        key = KeyRepository(s).authenticate(credentials.credentials)
    if key is None:
        raise ProblemError(
            401,
            "invalid_api_key",
            "API key not valid",
            "the API key is unknown or revoked; ask for a new one (`memtune keys create`)",
            headers=challenge,
        )
    return key


def require_key(db: DbDep, credentials: _Credentials) -> ApiKey:
    """The caller's active API key; 401 problem when missing, unknown or revoked."""
    return _authenticate(db, credentials)


def read_access(request: Request, db: DbDep, settings: SettingsDep) -> ApiKey | None:
    """Reads are open unless ``MEMTUNE_READS_OPEN=false``; then they need a key like writes.

    The header is read here rather than through the bearer scheme's dependency, which would declare every read as
    secured in the OpenAPI document (NOTE [ Exact OpenAPI ] in ``memtune.api.service._openapi``: closed reads are
    declared there).
    """
    if settings.reads_open:
        return None
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    credentials = HTTPAuthorizationCredentials(scheme=scheme, credentials=token.strip()) if token.strip() else None
    return _authenticate(db, credentials)


WriteKey = Annotated[ApiKey, Depends(require_key)]
ReadAccess = Annotated[ApiKey | None, Depends(read_access)]


def is_admin(settings: Settings, key: ApiKey) -> bool:
    """Whether ``key`` may act on every key's jobs: its name is in ``MEMTUNE_ADMIN_KEYS``."""
    return key.name in settings.admin_keys


def require_admin(settings: SettingsDep, key: WriteKey) -> ApiKey:
    """The caller's API key when it is an admin key (``MEMTUNE_ADMIN_KEYS``); 403 ``admin_only`` otherwise, before
    the request's body is looked at."""
    if not is_admin(settings, key):
        raise ProblemError(
            403,
            "admin_only",
            "Admin keys only",
            f"this write changes what every key's jobs read, so only an admin key (MEMTUNE_ADMIN_KEYS) may make it; "
            f"API key {key.name!r} is none. Ask an admin, or pass headroom on your own jobs",
        )
    return key


AdminKey = Annotated[ApiKey, Depends(require_admin)]


_JSON_MEDIA_TYPES = ("application/json",)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict; a key given twice raises ``_DuplicateKey`` (json.loads keeps the last)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


_ALLOWED_CONTROLS = frozenset("\t\n\r")


def _control_character(value: Any, where: str = "") -> str | None:
    """The dotted path of the first string (key or value) in ``value`` that holds a control character, else None
    ("" for the body itself)."""
    if isinstance(value, str):
        bad = any(unicodedata.category(c) == "Cc" and c not in _ALLOWED_CONTROLS for c in value)
        return where if bad else None
    items: Any = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        path = f"{where}.{key}" if where else str(key)
        if isinstance(key, str) and _control_character(key) is not None:
            return path
        found = _control_character(item, path)
        if found is not None:
            return found
    return None


async def require_json_body(request: Request) -> None:
    """A JSON request body must say so: ``Content-Type: application/json`` (or ``application/…+json``), and name
    each member of an object once.

    Raises:
        ProblemError: 415 ``unsupported_media_type`` naming the type sent, before the body is validated (a body
            sent as ``text/plain`` or curl's default form encoding is not a malformed object but the wrong kind);
            422 ``duplicate_key`` naming a key an object gives twice (JSON parsers disagree on which one counts, so
            the service takes neither); 422 ``invalid_string`` naming a string (key or value) that holds a control
            character other than tab and line breaks (``"h100\u0000"`` was once matched to ``h100``).
    """
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media in _JSON_MEDIA_TYPES or (media.startswith("application/") and media.endswith("+json")):
        try:
            data = json.loads(await request.body(), object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            raise ProblemError(
                422,
                "duplicate_key",
                "Duplicate key",
                f"{exc.key}: the body gives this key twice in one object; give it once",
                field=exc.key,
            ) from exc
        except ValueError:  # not JSON at all: the body's validation says so
            return
        where = _control_character(data)
        if where is not None:
            raise ProblemError(
                422,
                "invalid_string",
                "Control character in a string",
                f"{where or 'body'}: a string holds a control character (U+0000 to U+001F or U+007F to U+009F, "
                "other than tab and line breaks); names and values are taken as sent, never cleaned, so send it "
                "without",
                field=where or None,
            )
        return
    raise ProblemError(
        415,
        "unsupported_media_type",
        "Unsupported media type",
        f"send the request body as JSON with Content-Type: application/json (got {media or 'no content type'}), "
        "e.g. curl --json @job.json",
        accepted=list(_JSON_MEDIA_TYPES),
    )


JsonBody = Annotated[None, Depends(require_json_body)]
