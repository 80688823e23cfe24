"""The web page: ``GET /`` (recent jobs and the leaderboard) and ``GET /jobs/{id}`` (a job's charts).

The pages are static HTML shells (``memtune/api/service/templates``); ``memtune/api/service/static/app.js`` fetches the
JSON API and draws every chart as inline SVG (no CDN, no build step). ``install(app)`` adds the page router and serves
``/static``. Reads on the page go through the same API as any client, so a page shows nothing a
``GET /v1/…`` would not.
"""

from __future__ import annotations

import html
from functools import cache
from importlib.resources import files

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from memtune.api.service._deps import DbDep
from memtune.storage import NotFoundError
from memtune.storage.repositories import JobRepository

__all__ = ["STATIC_DIR", "install", "render", "router"]

STATIC_DIR = files("memtune.api.service") / "static"
_TEMPLATES = files("memtune.api.service") / "templates"

router = APIRouter(include_in_schema=False)


@cache
def _template(name: str) -> str:
    return (_TEMPLATES / name).read_text(encoding="utf-8")


def render(name: str, **values: str) -> str:
    """Template ``name`` with each ``{{key}}`` replaced by ``values[key]``, HTML-escaped."""
    text = _template(name)
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", html.escape(value, quote=True))
    return text


_HEADERS = {"Cache-Control": "no-store", "Content-Security-Policy": "default-src 'self'; style-src 'self'"}


@router.get("/", response_class=HTMLResponse)
def index_page() -> HTMLResponse:
    """Recent jobs and the leaderboard, drawn from ``/v1/jobs`` and ``/v1/leaderboard``."""
    return HTMLResponse(render("index.html"), headers=_HEADERS)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, db: DbDep) -> HTMLResponse:
    """One job: the Pareto front, the best plan's memory timeline, the per-stage profile; 404 page if unknown."""
    try:
        with db.session() as s:
            JobRepository(s).get(job_id)
    except NotFoundError:
        body = render("not_found.html", job_id=job_id)
        return HTMLResponse(body, status_code=404, headers=_HEADERS)
    return HTMLResponse(render("job.html", job_id=job_id), headers=_HEADERS)


def install(app: FastAPI) -> None:
    """Add the page router and serve ``memtune/api/service/static`` at ``/static``."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")
