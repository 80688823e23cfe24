"""One ``APIRouter`` per resource."""

from __future__ import annotations

from memtune.api.service.routes import charts, gpus, health, jobs, leaderboard, models, profiles, web

__all__ = ["charts", "gpus", "health", "jobs", "leaderboard", "models", "profiles", "web"]
