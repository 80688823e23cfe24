"""Row -> record conversion, shared by the repositories."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from memtune.storage.orm import (
    ApiKeyRow,
    CalibrationRow,
    GpuTypeRow,
    JobClaimRow,
    JobRow,
    ModelRow,
    ProfileRow,
    ResultRow,
)
from memtune.storage.records import (
    ApiKey,
    CalibrationRecord,
    Claim,
    GpuType,
    Job,
    ModelRecord,
    ProfileRecord,
    Result,
)

__all__ = [
    "to_api_key",
    "to_calibration",
    "to_claim",
    "to_gpu",
    "to_job",
    "to_model",
    "to_profile",
    "to_result",
]


def _fields(row: Any, cls: Any) -> dict[str, Any]:
    return {f.name: getattr(row, f.name) for f in dataclasses.fields(cls)}


def to_gpu(row: GpuTypeRow) -> GpuType:
    return GpuType(**_fields(row, GpuType))


def to_model(row: ModelRow) -> ModelRecord:
    return ModelRecord(**_fields(row, ModelRecord))


def to_profile(row: ProfileRow) -> ProfileRecord:
    return ProfileRecord(**_fields(row, ProfileRecord))


def to_job(row: JobRow) -> Job:
    return cast(Job, Job(**_fields(row, Job)))


def to_claim(row: JobClaimRow) -> Claim:
    return Claim(**_fields(row, Claim))


def to_result(row: ResultRow) -> Result:
    return Result(**_fields(row, Result))


def to_api_key(row: ApiKeyRow) -> ApiKey:
    return ApiKey(**_fields(row, ApiKey))


def to_calibration(row: CalibrationRow) -> CalibrationRecord:
    return CalibrationRecord(**_fields(row, CalibrationRecord))
