"""ASGI middleware refusing request bodies above a size limit with a 413 problem response."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import PROBLEM_MEDIA_TYPE

__all__ = ["BodySizeLimit"]


class BodySizeLimit:
    """Refuse bodies over ``max_bytes``: at once by ``Content-Length``, else while reading the stream.

    The body is read (up to the limit) before the app runs, so the app never sees a partial body.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, send: Send, size: str) -> None:
        body = json.dumps(
            {
                "type": "urn:memtune:problem:payload_too_large",
                "title": "Request body too large",
                "status": 413,
                "detail": f"the request body ({size}) exceeds the limit of {self.max_bytes} bytes "
                "(MEMTUNE_MAX_BODY_BYTES); send a smaller model spec",
                "code": "payload_too_large",
                "limit_bytes": self.max_bytes,
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
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await self._refuse(send, f"{declared} bytes")
                    return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await self._refuse(send, f"more than {self.max_bytes} bytes")
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
