"""What a job is searched on: its stored model, and its profile (stored, committed, of an exported program, or modeled).

A stored profile for (model, GPU type, batch, dtype) is reused; else a committed measured profile from
``memtune.profiler.library`` (zoo models at their default parameters); else a roofline profile
(``memtune.profiler.modeled``), built on the ``meta`` device so no memory is allocated. An exported program is
profiled by its module stages (``memtune.profiler.profile_module``): on this worker's GPU when it is of the job's type,
else its compute on the CPU and its copies from the job's GPU type's roofline spec. Budgets are in bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memtune.api.service._job_lease import LeaseLost
from memtune.storage import Database
from memtune.storage.records import Job, ModelRecord
from memtune.storage.repositories import JobLease, JobRepository, ModelRepository, ProfileRepository

if TYPE_CHECKING:
    from memtune.profiler import Profile

__all__ = [
    "committed_profile",
    "exported_profile",
    "job_profile",
    "load_stored_program",
    "roofline_profile",
    "stored_model",
]


def stored_model(db: Database, job: Job) -> ModelRecord:
    """The job's model, as stored."""
    with db.session() as s:
        return ModelRepository(s).get(job.model_id)


def job_profile(db: Database, job: Job, lease: JobLease) -> tuple[Profile, int]:
    """The profile the job is searched on and its id, stored for later jobs when it is new, and set on the job.

    Raises:
        LeaseLost: the job was reclaimed meanwhile.
    """
    with db.session() as s:
        model = ModelRepository(s).get(job.model_id)
        stored = ProfileRepository(s).find(model.id, job.gpu_key, job.batch, job.dtype)
    if stored is not None:
        profile = stored.profile()
        profile_id = stored.id
    else:
        if model.kind == "exported":
            with db.session() as s:
                archive = ModelRepository(s).program(model.id)
            profile = exported_profile(model, job, archive)
        else:
            profile = committed_profile(model, job) or roofline_profile(model, job)
        with db.session() as s:
            profile_id = ProfileRepository(s).store(model.id, profile).id
    with db.session() as s:
        if JobRepository(s).set_profile(lease, profile_id).lost:
            raise LeaseLost
    return profile, profile_id


def committed_profile(model: ModelRecord, job: Job) -> Profile | None:
    """A committed measured profile for this zoo model, parameters, batch, dtype and GPU type, if one exists."""
    if model.kind != "zoo":
        return None
    from memtune.profiler import find_profile

    params = model.definition.get("params") or {}
    profile = find_profile(str(model.definition["zoo"]), job.batch, job.dtype, job.gpu_key, params=params)
    if profile is not None and profile.device.key != job.gpu_key:
        return None
    return profile


def exported_profile(model: ModelRecord, job: Job, archive: bytes) -> Profile:
    """An exported program's profile, stage by stage (``memtune.profiler.module_profile.profile_module``): measured on
    this worker's GPU when it is of the job's type, else computed on the CPU with the copies of the job's GPU type's
    roofline spec (``modeled``). The archive is checked again on loading (NOTE [ Safe exported programs ])."""
    import torch

    from memtune.profiler import profile_module
    from memtune.tuner.measure.first_use import present_gpu

    exported = model.definition["exported"]
    if job.batch != exported["batch"]:  # the API refuses such jobs; a job queued another way fails here
        raise ValueError(f"job batch {job.batch} is not the exported program's batch {exported['batch']}")
    present = present_gpu()
    device = torch.device("cuda", 0) if present is not None and present.key == job.gpu_key else torch.device("cpu")
    module, inputs = load_stored_program(model, archive, device)
    gpu = None if device.type == "cuda" else job.gpu_key
    return profile_module(module, inputs, dtype=job.dtype, gpu=gpu, name=model.name)


def load_stored_program(model: ModelRecord, archive: bytes, device: Any) -> tuple[Any, Any]:
    """The stored exported program as a module and its example inputs on ``device``, checked again on loading (NOTE
    [ Safe exported programs ]); the inputs' seed is the model's, so every load gives the same batch."""
    from memtune.profiler.exported import load_exported

    return load_exported(
        archive,
        max_bytes=len(archive),
        int_high=model.definition["exported"].get("int_high"),
        device=device,
        seed=int(model.content_hash[:8], 16),
    )


def roofline_profile(model: ModelRecord, job: Job) -> Profile:
    """A roofline profile of the model on the job's GPU type, built on the meta device."""
    import torch

    from memtune.profiler import build, from_spec, modeled_profile

    with torch.device("meta"):
        if model.kind == "zoo":
            chain = build(str(model.definition["zoo"]), model.definition.get("params"))
        else:
            chain = from_spec(model.definition["spec"])
    return modeled_profile(chain, job.batch, job.dtype, job.gpu_key)
