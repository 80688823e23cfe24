"""ASGI middleware refusing request bodies above a size limit with a 413 problem response."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memtune.api.service._problems import PROBLEM_MEDIA_TYPE

__all__ = ["BodySizeLimit", "PathLimit"]


@dataclass(frozen=True)
class PathLimit:
    """A body limit for one path: ``max_bytes``, the setting that sets it and what to do when it is exceeded."""

    max_bytes: int
    setting: str
    hint: str


class BodySizeLimit:
    """Refuse bodies over the limit: at once by ``Content-Length``, else while reading the stream.

    The body is read (up to the limit) before the app runs, so the app never sees a partial body.

    Args:
        app: the ASGI app.
        max_bytes: the limit for every path not in ``paths`` (``MEMTUNE_MAX_BODY_BYTES``).
        paths: limits of their own for exact paths (an exported program's upload is larger than a spec).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, paths: Mapping[str, PathLimit] | None = None) -> None:
        self.app = app
        self.default = PathLimit(max_bytes, "MEMTUNE_MAX_BODY_BYTES", "send a smaller model spec")
        self.paths = dict(paths or {})

    async def _refuse(self, send: Send, size: str, limit: PathLimit) -> None:
        body = json.dumps(
            {
                "type": "urn:memtune:problem:payload_too_large",
                "title": "Request body too large",
                "status": 413,
                "detail": f"the request body ({size}) exceeds the limit of {limit.max_bytes} bytes "
                f"({limit.setting}); {limit.hint}",
                "code": "payload_too_large",
                "limit_bytes": limit.max_bytes,
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self.paths.get(scope.get("path", ""), self.default)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit.max_bytes:
                    await self._refuse(send, f"{declared} bytes", limit)
                    return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit.max_bytes:
                await self._refuse(send, f"more than {limit.max_bytes} bytes", limit)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
