"""One ``APIRouter`` per resource."""

from __future__ import annotations

from api.routes import gpus, health, jobs, leaderboard, models, profiles

__all__ = ["gpus", "health", "jobs", "leaderboard", "models", "profiles"]
