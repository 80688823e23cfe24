"""An in-process cache of the lookup answers (``GET /v1/gpus/{gpu}/best``, ``GET /v1/leaderboard``), as bytes.

# NOTE [ Lookup cache ]
The two lookups are read far more often than results are written, and answering one through FastAPI (dependencies,
query validation, a thread for the sync route, a few queries, the response model, JSON) costs milliseconds of CPU
that a loaded server spends under the GIL. ``LookupCacheMiddleware`` is a plain ASGI middleware in front of the app
that keeps each successful answer (status 200) as the exact bytes the route sent, keyed by the request's raw path
and query string:

* a hit is answered by the middleware itself, without entering FastAPI, with the stored body and headers;
* every answer of these paths carries a strong ``ETag`` (a hash of the body), and a request whose
  ``If-None-Match`` names it gets ``304 Not Modified`` with no body, on a hit or a miss;
* an answer stays fresh until a write to what the lookups read: every such write raises the lookup version in the
  database (NOTE [ Lookup version ] in ``memtune.storage._lookup_version``), whichever process made it, and ``watch``
  reads that version every ``MEMTUNE_LOOKUP_CACHE_POLL_S`` (0.25 s by default; 0 turns the cache off). When it has
  moved, every stored answer is dropped at once; so a result is served at most one poll interval (plus one
  recomputation) after its commit, and answers without writes between them are never recomputed. While the version
  cannot be read (the database is down) nothing is cached: every request goes to the app;
* a missing answer is computed once: concurrent requests of the key wait for that one computation and are all
  answered when it ends (no stampede, no queue behind a lock). An answer computed while the version moved is sent
  to the requests that waited for it but not stored;
* errors (404 ``no_plan``, 422, …) are never stored;
* with ``MEMTUNE_READS_OPEN=false`` reads need a key: the cache is then bypassed, every request is authenticated.

The body of a hit is byte for byte the body the route produced on the miss that stored it.

Why no time to live: an earlier version kept each answer 1 s and then recomputed it in the loaded process. Under
200 connections that computation (a sync route in a thread, contending for the GIL with the busy event loop) took
0.5–1 s, and the requests queued behind it were let through an ``asyncio.Lock`` one per turn of the loop; hundreds of
requests a run waited past 2 s (``docs/results/service.md``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

__all__ = [
    "DEFAULT_POLL_S",
    "CachedAnswer",
    "LookupCache",
    "LookupCacheMiddleware",
    "etag_matches",
    "install",
    "watch",
]

DEFAULT_POLL_S = 0.25
_CACHED_PATHS = re.compile(r"^/v1/(gpus/[^/]+/best|leaderboard)$")
log = logging.getLogger("memtune.api")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class CachedAnswer:
    """One stored answer: its body, its headers (``ETag`` among them) and the cache generation it was computed in."""

    body: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    etag: bytes
    generation: int


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
    """The stored answers, at most ``max_entries`` (least recently stored dropped first), each fresh until the
    lookup version moves (NOTE [ Lookup cache ]).

    Thread safety: none; the middleware and ``watch`` use it from the event loop's thread only.

    Args:
        enabled: False keeps nothing (``MEMTUNE_LOOKUP_CACHE_POLL_S=0``).
        max_entries: the most answers kept.
    """

    def __init__(self, enabled: bool = True, max_entries: int = 4096) -> None:
        self.enabled = enabled
        self.max_entries = max_entries
        self.version: int | None = None
        """The lookup version last read; None until it is read, and while it cannot be (nothing is fresh then)."""
        self.generation = 0
        """Raised whenever the stored answers are dropped; an answer computed in an older one is never stored."""
        self._entries: OrderedDict[bytes, CachedAnswer] = OrderedDict()
        self._computing: dict[bytes, asyncio.Future[CachedAnswer | None]] = {}
        self.hits = 0
        self.misses = 0

    def fresh(self, key: bytes) -> CachedAnswer | None:
        entry = self._entries.get(key)
        if entry is None or entry.generation != self.generation or self.version is None:
            return None
        return entry

    def store(self, key: bytes, body: bytes, headers: list[tuple[bytes, bytes]], generation: int) -> CachedAnswer:
        """Keep ``body`` as ``key``'s answer if ``generation`` is still the current one; the answer either way."""
        etag = _etag(body)
        kept = tuple((k, v) for k, v in headers if k.lower() not in (b"etag", b"content-length"))
        entry = CachedAnswer(body, (*kept, (b"etag", etag)), etag, generation)
        if generation == self.generation and self.version is not None:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return entry

    def observe(self, version: int | None) -> None:
        """Take the lookup version just read (None: it could not be read); drop every answer when it moved."""
        if version is None or version != self.version:
            self.clear()
        self.version = version

    def clear(self) -> None:
        """Drop every stored answer: the next request of each key is answered by the app."""
        self.generation += 1
        self._entries.clear()
        self._computing.clear()


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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cache = self.cache
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or not _CACHED_PATHS.match(scope["path"])
            or not cache.enabled
            or not self.reads_open
            or cache.version is None
        ):
            await self.app(scope, receive, send)
            return
        key = scope["path"].encode() + b"?" + scope["query_string"]
        if_none_match = _header(scope, b"if-none-match")
        entry = cache.fresh(key)
        if entry is not None:
            cache.hits += 1
            await self._answer(send, entry, if_none_match)
            return
        computing = cache._computing.get(key)
        if computing is not None:  # another request computes it: wait for that one (shielded: it is not ours)
            entry = await asyncio.shield(computing)
            if entry is not None:
                cache.hits += 1
                await self._answer(send, entry, if_none_match)
                return
            await self.app(scope, receive, send)  # not cacheable (an error): answered as every request is
            return
        computing = cache._computing[key] = asyncio.get_running_loop().create_future()
        cache.misses += 1
        entry = None
        try:
            entry = await self._through(scope, receive, send, key)
        finally:
            computing.set_result(entry)
            if cache._computing.get(key) is computing:
                del cache._computing[key]
        if entry is not None:
            await self._answer(send, entry, if_none_match)

    async def _through(self, scope: Scope, receive: Receive, send: Send, key: bytes) -> CachedAnswer | None:
        """Run the app, keeping its answer; a 200 is stored and returned unsent, anything else is sent as it came."""
        generation = self.cache.generation
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
        return self.cache.store(key, body, list(start.get("headers", [])), generation)

    @staticmethod
    async def _answer(send: Send, entry: CachedAnswer, if_none_match: bytes | None) -> None:
        if if_none_match is not None and etag_matches(if_none_match, entry.etag):
            await send({"type": "http.response.start", "status": 304, "headers": [(b"etag", entry.etag)]})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = [*entry.headers, (b"content-length", str(len(entry.body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": entry.body})


async def watch(cache: LookupCache, read_version: Callable[[], int], poll_s: float) -> None:
    """Read the lookup version every ``poll_s`` seconds for ever, in a thread of its own (the request threads' limit
    does not hold it up), and give it to ``cache.observe`` (NOTE [ Lookup cache ]). Run it as a task; cancel it to
    stop. A version that cannot be read turns caching off until it can."""
    limiter = anyio.CapacityLimiter(1)
    failing = False
    while True:
        try:
            version: int | None = await anyio.to_thread.run_sync(read_version, limiter=limiter)
            failing = False
        except Exception as e:  # a StorageError above all; any error means the version is unknown
            if not failing:
                log.warning("lookup cache off until the lookup version can be read: %s", e)
            failing = True
            version = None
        cache.observe(version)
        await anyio.sleep(poll_s)


def install(app: Any, poll_s: float = DEFAULT_POLL_S) -> LookupCache:
    """Put the lookup cache in front of ``app`` (a FastAPI app with ``state.settings``) and keep it as
    ``app.state.lookup_cache``; ``poll_s`` 0 turns it off. The app's lifespan runs ``watch``
    (``memtune.api.service.main``)."""
    cache = LookupCache(enabled=poll_s > 0)
    app.state.lookup_cache = cache
    app.add_middleware(LookupCacheMiddleware, cache=cache, reads_open=app.state.settings.reads_open)
    return cache
