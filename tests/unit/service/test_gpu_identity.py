"""A GPU type's identity fields are defined once (NOTE [ GPU identity ] in ``memtune.storage.records``): the lists that
must stay written out elsewhere (the table's columns, the published schema) are held to that one here."""

from __future__ import annotations

import hashlib
import json

from memtune.api.service._views import gpu_public
from memtune.api.service.schemas import GpuPublic
from memtune.profiler import GPUS, DeviceIdentity
from memtune.profiler.identity import spec_identity
from memtune.storage.orm import GpuTypeRow
from memtune.storage.records import GPU_IDENTITY_FIELDS, GpuType, identity_hash

MEASURED = spec_identity(GPUS["h100"]).model_copy(update={"driver": "550.54", "cudnn_version": "90100"})


def test_the_identity_fields() -> None:
    assert GPU_IDENTITY_FIELDS == (
        "key", "name", "compute_capability", "sm_count", "memory_bytes", "pcie_gen", "pcie_width", "driver",
        "cudnn_version",
    )  # fmt: skip
    assert set(GPU_IDENTITY_FIELDS) <= set(DeviceIdentity.model_fields)


def test_the_table_and_the_schema_carry_the_identity_fields() -> None:
    columns = [c.name for c in GpuTypeRow.__table__.columns]
    assert columns == [*GPU_IDENTITY_FIELDS, "identity_hash", "created_at"]
    assert list(GpuPublic.model_fields)[: len(GPU_IDENTITY_FIELDS)] == list(GPU_IDENTITY_FIELDS)


def test_the_identity_hash_is_the_stored_one() -> None:
    """Stored rows carry this hash: the fields but the key, as canonical JSON."""
    data = {f: getattr(MEASURED, f) for f in GPU_IDENTITY_FIELDS if f != "key"}
    assert identity_hash(MEASURED) == hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def test_a_record_from_an_identity_and_its_public_view() -> None:
    gpu = GpuType.from_identity(MEASURED)
    assert gpu.identity_fields() == {f: getattr(MEASURED, f) for f in GPU_IDENTITY_FIELDS}
    assert gpu.identity_hash == identity_hash(MEASURED)
    public = gpu_public(gpu, modeled=True, stored=False)
    assert public.model_dump() == {**gpu.identity_fields(), "modeled": True, "stored": False, "calibration": None}
