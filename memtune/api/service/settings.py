"""Service settings: one pydantic-settings class, read from ``MEMTUNE_*`` environment variables.

There are no secrets with defaults: API keys are created with ``memtune keys create`` and stored
hashed in the database.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from memtune.storage import default_url, normalize_url

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Everything the API, the worker and the service CLI need.

    Attributes:
        data_dir: where the default SQLite database (``memtune.db``) lives.
        database_url: SQLAlchemy URL; overrides ``data_dir`` (``postgresql://user@host/db``).
        reads_open: GET requests need no API key when True.
        max_body_bytes: request bodies above this many bytes get 413.
        max_exported_bytes: the same for an exported program's archive (``POST /v1/models/exported``), which is
            also the most it may unpack to.
        max_exported_check_s: seconds an exported program's check may take; a slower one is stopped and the upload
            refused (NOTE [ Upload limits ] in ``memtune.profiler._exported_checks``).
        embedded_worker: run one worker thread inside the API process (``memtune serve``).
        worker_gpus: GPU type keys the embedded worker serves; empty for every known GPU type.
        heartbeat_interval_s: seconds between a worker's job heartbeats.
        stale_after_s: seconds without a heartbeat after which a running job is reclaimed.
        poll_interval_s: seconds an idle worker waits between claim attempts.
        progress_interval_s: least seconds between two progress writes of one job.
        sse_interval_s: seconds between two database polls of the job events stream.
        admin_keys: names of API keys that may act on every key's jobs (cancel them); any other key acts on its
            own jobs only (``MEMTUNE_ADMIN_KEYS='["ops"]'``).
        max_active_jobs_per_key: queued plus running jobs one API key may have; a submission over it is 429.
        max_jobs_per_hour_per_key: jobs one API key may submit in any 3600 s; a submission over it is 429.
        max_trials_per_job: the most Optuna trials one job may ask for; more is 429 (see
            ``memtune.api.service.routes.jobs``).
        lookup_cache_poll_s: seconds between two reads of the lookup version by the lookup cache (NOTE [ Lookup
            cache ] in ``memtune.api.service._lookup_cache``): a result committed by any process is served at most
            this long (plus one recomputation) after its commit; 0 turns the cache off.

    The limits apply to admin keys too; an idempotent retry of a stored job is not a new submission and counts
    against none of them.
    """

    model_config = SettingsConfigDict(env_prefix="MEMTUNE_", extra="ignore")

    data_dir: Path = Path("data")
    database_url: str | None = None
    reads_open: bool = True
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    max_exported_bytes: int = Field(default=256 << 20, ge=1024)
    max_exported_check_s: float = Field(default=20.0, gt=0)
    embedded_worker: bool = False
    worker_gpus: list[str] = Field(default_factory=list)
    heartbeat_interval_s: float = Field(default=2.0, gt=0)
    stale_after_s: float = Field(default=30.0, gt=0)
    poll_interval_s: float = Field(default=0.5, gt=0)
    progress_interval_s: float = Field(default=0.5, ge=0)
    sse_interval_s: float = Field(default=0.25, gt=0)
    admin_keys: list[str] = Field(default_factory=list)
    max_active_jobs_per_key: int = Field(default=10, ge=1)
    max_jobs_per_hour_per_key: int = Field(default=60, ge=1)
    max_trials_per_job: int = Field(default=10_000, ge=1)
    lookup_cache_poll_s: float = Field(default=0.25, ge=0)

    def url(self) -> str:
        """The database URL in effect (``database_url``, else the SQLite file in ``data_dir``)."""
        if self.database_url:
            return normalize_url(self.database_url)
        return default_url(self.data_dir)
