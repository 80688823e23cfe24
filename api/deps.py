"""FastAPI dependencies as ``Annotated`` aliases: the settings, the database, the caller's API key."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.problems import ProblemError
from api.settings import Settings
from storage.database import Database
from storage.records import ApiKey
from storage.repositories import KeyRepository

__all__ = ["DbDep", "ReadAccess", "SettingsDep", "WriteKey", "get_db", "get_settings"]

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


def read_access(db: DbDep, settings: SettingsDep, credentials: _Credentials) -> ApiKey | None:
    """Reads are open unless ``MEMTUNE_READS_OPEN=false``; then they need a key like writes."""
    if settings.reads_open:
        return None
    return _authenticate(db, credentials)


WriteKey = Annotated[ApiKey, Depends(require_key)]
ReadAccess = Annotated[ApiKey | None, Depends(read_access)]
