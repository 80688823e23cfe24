"""The memtune HTTP service: the FastAPI app (``main.create_app``), its routes (``routes/``), the job worker and its
steps (``worker``, ``supervisor``, ``job_*``), the request and response bodies (``schemas``), the settings, and the
web page (``routes/web.py`` with ``static/`` and ``templates/``, installed as package data).

It imports neither the command line (``memtune.api.cli``) nor the client (``memtune.api.client``); NOTE [ Rooms of
the API ] in ``memtune/api/__init__.py`` says which way the API's rooms import. ``create_app`` is offered by
``memtune.api``; every other name is imported from its module.
"""

from __future__ import annotations

__all__ = []  # type: list[str]  # each module is imported on its own; create_app through memtune.api
