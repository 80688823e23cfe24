"""An in-process cache of the lookup answers (``GET /v1/gpus/{gpu}/best``, ``GET /v1/leaderboard``), as bytes.

# NOTE [ Lookup cache ]
The two lookups are read far more often than results are written, and answering one through FastAPI (dependencies,
query validation, a thread for the sync route, a few queries, the response model, JSON) costs milliseconds of CPU
that a loaded server spends under the GIL. ``LookupCache`` is a plain ASGI middleware in front of the app that
keeps each successful answer (status 200) as the exact bytes the route sent, keyed by the request's raw path and
query string:

* a hit is answered by the middleware itself, without entering FastAPI, with the stored body and headers;
* every answer of these paths carries a strong ``ETag`` (a hash of the body), and a request whose
  ``If-None-Match`` names it gets ``304 Not Modified`` with no body, on a hit or a miss;
* freshness is a TTL (``MEMTUNE_LOOKUP_CACHE_TTL_S``, 1 s by default; 0 turns the cache off): results are written
  by workers in other processes (NOTE [ Worker process ] in ``api.cli_service``), which the API process cannot be
  told about. An answer is served as is for ``ttl_s``; for another ``ttl_s`` it is still served while one
  background request recomputes it (so a loaded server never stalls every client on a refresh); after that,
  requests wait for one recomputation (no stampede: concurrent requests of the key share it). So a new result is
  served at most ``2 * ttl_s`` after it was written (plus one recomputation); ``clear()`` drops every entry at once
  (writes made in this process can call it);
* errors (404 ``no_plan``, 422, …) are never stored, so a new result is served as soon as the TTL allows;
* with ``MEMTUNE_READS_OPEN=false`` reads need a key: the cache is then bypassed, every request is authenticated.

The body of a hit is byte for byte the body the route produced on the miss that stored it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_TTL_S", "CachedAnswer", "LookupCache", "LookupCacheMiddleware", "etag_matches", "install"]

DEFAULT_TTL_S = 1.0
_CACHED_PATHS = re.compile(r"^/v1/(gpus/[^/]+/best|leaderboard)$")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class CachedAnswer:
    """One stored answer: its body, its headers (``ETag`` among them) and when it was stored (monotonic)."""

    body: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    etag: bytes
    stored_at: float


def _etag(body: bytes) -> bytes:
    return b'"' + hashlib.blake2b(body, digest_size=12).hexdigest().encode() + b'"'


def etag_matches(if_none_match: bytes, etag: bytes) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (weak comparison, RFC 9110 13.1.2; ``*`` matches)."""
    value = if_none_match.strip()
    if value == b"*":
        return True
    for tag in value.split(b","):
        tag = tag.strip()
        if tag.startswith(b"W/"):
            tag = tag[2:]
        if tag == etag:
            return True
    return False


class LookupCache:
    """The stored answers, at most ``max_entries`` (least recently stored dropped first), each fresh ``ttl_s``."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_entries: int = 4096) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, CachedAnswer] = OrderedDict()
        self._locks: dict[bytes, asyncio.Lock] = {}
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def fresh(self, key: bytes) -> CachedAnswer | None:
        entry = self._entries.get(key)
        if entry is None or time.monotonic() - entry.stored_at >= self.ttl_s:
            return None
        return entry

    def servable(self, key: bytes) -> CachedAnswer | None:
        """The entry while it may be served during a background refresh (younger than ``2 * ttl_s``)."""
        entry = self._entries.get(key)
        if entry is None or time.monotonic() - entry.stored_at >= 2 * self.ttl_s:
            return None
        return entry

    def store(self, key: bytes, body: bytes, headers: list[tuple[bytes, bytes]]) -> CachedAnswer:
        etag = _etag(body)
        kept = tuple((k, v) for k, v in headers if k.lower() not in (b"etag", b"content-length"))
        entry = CachedAnswer(body, (*kept, (b"etag", etag)), etag, time.monotonic())
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return entry

    def clear(self) -> None:
        """Drop every stored answer: the next request of each key is answered by the app."""
        self._entries.clear()

    def lock(self, key: bytes) -> asyncio.Lock:
        found = self._locks.get(key)
        if found is None:
            if len(self._locks) > self.max_entries:
                self._locks = {k: v for k, v in self._locks.items() if v.locked()}
            found = self._locks[key] = asyncio.Lock()
        return found


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return bytes(v)
    return None


class LookupCacheMiddleware:
    """Answers the lookups from ``cache`` (NOTE [ Lookup cache ]); everything else goes to ``app`` untouched."""

    def __init__(self, app: ASGIApp, cache: LookupCache, reads_open: bool = True) -> None:
        self.app = app
        self.cache = cache
        self.reads_open = reads_open
        self._refreshing: set[asyncio.Future[None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or not _CACHED_PATHS.match(scope["path"])
            or not self.cache.enabled
            or not self.reads_open
        ):
            await self.app(scope, receive, send)
            return
        key = scope["path"].encode() + b"?" + scope["query_string"]
        if_none_match = _header(scope, b"if-none-match")
        entry = self.cache.fresh(key)
        if entry is None and (stale := self.cache.servable(key)) is not None:
            lock = self.cache.lock(key)
            if not lock.locked():
                self._refreshing.add(asyncio.ensure_future(self._refresh(dict(scope), key, lock)))
            entry = stale
        if entry is None:
            async with self.cache.lock(key):
                entry = self.cache.fresh(key)  # another request may have stored it while this one waited
                if entry is None:
                    self.cache.misses += 1
                    entry = await self._through(scope, receive, send, key, if_none_match)
                    if entry is None:
                        return  # not cacheable: the app's answer was sent as it came
                    await self._answer(send, entry, if_none_match)
                    return
        self.cache.hits += 1
        await self._answer(send, entry, if_none_match)

    async def _refresh(self, scope: Scope, key: bytes, lock: asyncio.Lock) -> None:
        """Recompute ``key``'s answer in the background (its stale one is served meanwhile)."""
        done = asyncio.Event()

        async def receive() -> Message:
            if not done.is_set():
                done.set()
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # never: nobody waits on this request
            return {"type": "http.disconnect"}

        async def discard(message: Message) -> None:
            return None

        try:
            async with lock:
                if self.cache.fresh(key) is None:
                    self.cache.misses += 1
                    await self._through(scope, receive, discard, key, None)
        finally:
            self._refreshing.discard(asyncio.current_task())  # type: ignore[arg-type]

    async def _through(
        self, scope: Scope, receive: Receive, send: Send, key: bytes, if_none_match: bytes | None
    ) -> CachedAnswer | None:
        """Run the app, keeping its answer; a 200 is stored and returned unsent, anything else is sent as it came."""
        start: Message | None = None
        chunks: list[bytes] = []

        async def keep(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, keep)
        if start is None:
            return None
        body = b"".join(chunks)
        if start["status"] != 200:
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return None
        return self.cache.store(key, body, list(start.get("headers", [])))

    @staticmethod
    async def _answer(send: Send, entry: CachedAnswer, if_none_match: bytes | None) -> None:
        if if_none_match is not None and etag_matches(if_none_match, entry.etag):
            await send({"type": "http.response.start", "status": 304, "headers": [(b"etag", entry.etag)]})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = [*entry.headers, (b"content-length", str(len(entry.body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": entry.body})


def install(app: Any, ttl_s: float | None = None) -> LookupCache:
    """Put the lookup cache in front of ``app`` (a FastAPI app with ``state.settings``) and keep it as
    ``app.state.lookup_cache``; ``ttl_s`` defaults to ``MEMTUNE_LOOKUP_CACHE_TTL_S`` (1 s)."""
    if ttl_s is None:
        ttl_s = float(os.environ.get("MEMTUNE_LOOKUP_CACHE_TTL_S", DEFAULT_TTL_S))
    cache = LookupCache(ttl_s)
    app.state.lookup_cache = cache
    app.add_middleware(LookupCacheMiddleware, cache=cache, reads_open=app.state.settings.reads_open)
    return cache
