"""The FastAPI application factory: assembles routers, problem handlers, the body limit and the lifespan.

On start the app runs the Alembic migrations (and creates Optuna's tables), then, when
``settings.embedded_worker`` is set, starts one worker thread (``memtune serve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI

from memtune.api.service import _lookup_cache
from memtune.api.service._body_limit import BodySizeLimit, PathLimit
from memtune.api.service._openapi import install_docs
from memtune.api.service._problems import install_problem_handlers
from memtune.api.service.routes import charts, gpus, health, jobs, leaderboard, models, profiles, web
from memtune.api.service.settings import Settings
from memtune.storage import Database, upgrade

__all__ = ["API_VERSION", "create_app"]

API_VERSION = "1.0.0"
log = logging.getLogger("memtune.api")

_DESCRIPTION = """\
memtune tunes memory plans (offload / recompute / cuDNN algorithms) for training a network on a GPU
within a memory budget, and serves the best plans it found.

* `POST /v1/jobs` submits a model to tune; follow it with `GET /v1/jobs/{id}` or `/events` (SSE).
* `POST /v1/models/exported` stores a `torch.export` program (`.pt2`, checked without running code from it);
  tune it with `POST /v1/jobs` and `{"model": {"id": …}}`.
* `GET /v1/gpus/{gpu}/best?model=&batch=&budget=` answers with the best stored plan.
* `GET /v1/leaderboard` ranks stored plans; baselines are marked, Pareto-optimal rows flagged.

Writes need `Authorization: Bearer <key>` (`memtune keys create --name NAME`). Errors are RFC 9457
`application/problem+json` objects with a stable `code`.
"""


def create_app(settings: Settings | None = None, *, db: Database | None = None) -> FastAPI:
    """Build the app for ``settings`` (``Settings()`` from the environment by default).

    Args:
        settings: service settings.
        db: an existing database handle to share (tests); by default one is made from ``settings``.
    """
    settings = settings or Settings()
    database = db or Database(settings.url())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(upgrade, database)
        app.state.migrated = True
        cache: _lookup_cache.LookupCache = app.state.lookup_cache
        watcher = None
        if cache.enabled:  # NOTE [ Lookup cache ]
            poll_s = settings.lookup_cache_poll_s
            watcher = asyncio.create_task(_lookup_cache.watch(cache, database.lookup_version, poll_s))
        worker = None
        if settings.embedded_worker:
            from memtune.api.service.worker import Worker

            worker = Worker.from_settings(database, settings)
            worker.start()
            app.state.worker = worker
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if worker is not None:
                await anyio.to_thread.run_sync(worker.stop)
            if db is None:
                database.dispose()

    app = FastAPI(
        title="memtune",
        version=API_VERSION,
        description=_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # install_docs serves it without a CDN (NOTE [ Exact OpenAPI ])
    )
    app.state.settings = settings
    app.state.db = database
    app.state.migrated = False
    app.state.worker = None
    install_problem_handlers(app)
    for module in (health, models, jobs, charts, gpus, leaderboard, profiles):
        app.include_router(module.router)
    web.install(app)
    install_docs(app)
    exported = PathLimit(
        settings.max_exported_bytes,
        "MEMTUNE_MAX_EXPORTED_BYTES",
        "drop the parameters' values before sending: memtune.profiler.exported.check_exported(data, "
        "max_bytes=...).archive is the program without them",
    )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, paths={models.EXPORTED_PATH: exported})
    _lookup_cache.install(app, settings.lookup_cache_poll_s)  # NOTE [ Lookup cache ]
    return app
