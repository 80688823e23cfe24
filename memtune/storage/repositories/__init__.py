"""Repositories: one class per resource, each wrapping a SQLAlchemy ``Session`` and returning records."""

from __future__ import annotations

from memtune.storage.repositories._calibrations import CalibrationRepository
from memtune.storage.repositories._gpus import GpuRepository, identity_hash
from memtune.storage.repositories._jobs import JobLease, JobRepository, LeaseStatus
from memtune.storage.repositories._keys import KeyRepository, hash_key
from memtune.storage.repositories._models import ModelRepository, content_hash
from memtune.storage.repositories._profiles import ProfileRepository
from memtune.storage.repositories._results import (
    BestAnswer,
    LeaderboardPage,
    ResultRepository,
    pareto_flags,
)
from memtune.storage.repositories._workers import WorkerRecord, WorkerRepository

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
