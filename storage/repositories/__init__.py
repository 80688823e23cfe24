"""Repositories: one class per resource, each wrapping a SQLAlchemy ``Session`` and returning records."""

from __future__ import annotations

from storage.repositories.calibrations import CalibrationRepository
from storage.repositories.gpus import GpuRepository, identity_hash
from storage.repositories.jobs import JobLease, JobRepository, LeaseStatus
from storage.repositories.keys import KeyRepository, hash_key
from storage.repositories.models import ModelRepository, content_hash
from storage.repositories.profiles import ProfileRepository
from storage.repositories.results import (
    BestAnswer,
    LeaderboardPage,
    ResultRepository,
    pareto_flags,
)
from storage.repositories.workers import WorkerRecord, WorkerRepository

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
