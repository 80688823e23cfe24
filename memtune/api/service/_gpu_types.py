"""GPU types the service knows: roofline specs (``memtune.profiler.devices.GPUS``) and stored identities."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from memtune.profiler import GPUS, UnknownGPUError, get_gpu
from memtune.profiler.identity import spec_identity
from memtune.storage.records import GpuType
from memtune.storage.repositories import GpuRepository

__all__ = ["KnownGpu", "known_gpus", "resolve_gpu", "same_architecture"]


@dataclass(frozen=True)
class KnownGpu:
    """A GPU type as the API sees it; ``modeled``: a roofline spec exists; ``stored``: rows exist."""

    gpu: GpuType
    modeled: bool
    stored: bool


def _from_spec(key: str) -> GpuType:
    """The GPU type of roofline spec ``key``: its datasheet identity, no driver or cuDNN version."""
    return GpuType.from_identity(spec_identity(GPUS[key]))


def known_gpus(session: Session) -> list[KnownGpu]:
    """Every GPU type: stored identities (measured ones carry driver/cuDNN) and roofline specs, by key."""
    stored = {g.key: g for g in GpuRepository(session).list_all()}
    keys = sorted(set(stored) | set(GPUS))
    return [KnownGpu(stored.get(k) or _from_spec(k), modeled=k in GPUS, stored=k in stored) for k in keys]


def resolve_gpu(session: Session, name: str) -> KnownGpu:
    """The GPU type for a key or product name (``h200``, ``NVIDIA H200``).

    Raises:
        UnknownGPUError: neither a roofline spec nor a stored GPU type matches; lists the known keys.
    """
    stored = GpuRepository(session).find(name)
    if stored is not None:
        return KnownGpu(stored, modeled=stored.key in GPUS, stored=True)
    try:
        spec = get_gpu(name)
    except UnknownGPUError:
        keys = sorted({g.gpu.key for g in known_gpus(session)})
        raise UnknownGPUError(
            f"unknown GPU type {name!r}; known GPU types: {', '.join(keys)} (GET /v1/gpus lists them)"
        ) from None
    row = GpuRepository(session).find(spec.key)
    return KnownGpu(row or _from_spec(spec.key), modeled=True, stored=row is not None)


def same_architecture(session: Session, gpu: GpuType) -> list[str]:
    """Keys of the other GPU types with ``gpu``'s compute capability, in key order."""
    if gpu.compute_capability is None:
        return []
    keys = {g.gpu.key for g in known_gpus(session) if g.gpu.compute_capability == gpu.compute_capability}
    keys.discard(gpu.key)
    return sorted(keys)
