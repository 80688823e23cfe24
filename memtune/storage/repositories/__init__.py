"""Repositories: one class per resource, each wrapping a SQLAlchemy ``Session`` and returning records."""

from __future__ import annotations

from memtune.storage.repositories.calibrations import CalibrationRepository
from memtune.storage.repositories.gpus import GpuRepository, identity_hash
from memtune.storage.repositories.jobs import JobLease, JobRepository, LeaseStatus
from memtune.storage.repositories.keys import KeyRepository, hash_key
from memtune.storage.repositories.models import ModelRepository, content_hash
from memtune.storage.repositories.profiles import ProfileRepository
from memtune.storage.repositories.results import (
    BestAnswer,
    LeaderboardPage,
    ResultRepository,
    pareto_flags,
)
from memtune.storage.repositories.workers import WorkerRecord, WorkerRepository

__all__ = [
    "BestAnswer",
    "CalibrationRepository",
    "GpuRepository",
    "JobLease",
    "JobRepository",
    "KeyRepository",
    "LeaderboardPage",
    "LeaseStatus",
    "ModelRepository",
    "ProfileRepository",
    "ResultRepository",
    "WorkerRecord",
    "WorkerRepository",
    "content_hash",
    "hash_key",
    "identity_hash",
    "pareto_flags",
]
