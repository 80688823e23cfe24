"""The library of committed profiles: measured profiles shipped with memtune in ``profiler/data/``.

Files are named ``<model>-b<batch>-<dtype>-<gpu>.json`` (``vgg16-b256-float32-h200.json``) and hold one
``Profile`` each, made on the real GPU by ``scripts/profile_zoo.py``. The tuner prefers them to modeled
profiles: ``find_profile`` returns one when it exists.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from profiler.devices import get_gpu
from profiler.errors import ProfilerError, UnknownGPUError
from profiler.profile import Profile

__all__ = ["LibraryEntry", "data_dir", "find_profile", "list_profiles", "profile_filename"]

_NAME = re.compile(
    r"^(?P<model>.+)-b(?P<batch>\d+)-(?P<dtype>float32|bfloat16|float16)-(?P<gpu>[a-z0-9][a-z0-9-]*)\.json$"
)


@dataclass(frozen=True)
class LibraryEntry:
    """One committed profile file: what its name says, and where it is."""

    model: str
    batch: int
    dtype: str
    gpu: str
    path: Path


def data_dir() -> Path:
    """The folder of committed profiles (``profiler/data``)."""
    return Path(str(files("profiler").joinpath("data")))


def _gpu_key(gpu: str) -> str:
    try:
        return get_gpu(gpu).key
    except UnknownGPUError:
        return gpu.strip().lower()


def profile_filename(model: str, batch: int, dtype: str, gpu: str) -> str:
    """``<model>-b<batch>-<dtype>-<gpu key>.json``."""
    return f"{model}-b{batch}-{dtype}-{_gpu_key(gpu)}.json"


def list_profiles(directory: Path | None = None) -> list[LibraryEntry]:
    """Every committed profile, sorted by model, GPU, dtype and batch (files with other names are ignored)."""
    root = directory or data_dir()
    if not root.is_dir():
        return []
    out = []
    for path in root.iterdir():
        m = _NAME.match(path.name)
        if m:
            out.append(LibraryEntry(m["model"], int(m["batch"]), m["dtype"], m["gpu"], path))
    return sorted(out, key=lambda e: (e.model, e.gpu, e.dtype, e.batch))


def find_profile(
    model: str,
    batch: int,
    dtype: str,
    gpu: str,
    *,
    params: Mapping[str, object] | None = None,
    directory: Path | None = None,
) -> Profile | None:
    """The committed measured profile of ``model`` at ``batch``/``dtype`` on ``gpu``, or None.

    Args:
        model: zoo name.
        batch: samples per step.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        gpu: a GPU name ``get_gpu`` accepts (or a key of a GPU without a roofline spec).
        params: the model's build parameters; a profile made with other parameters does not match.
        directory: look here instead of ``profiler/data``.

    Raises:
        ProfilerError: the file exists but describes something else than its name says.
    """
    path = (directory or data_dir()) / profile_filename(model, batch, dtype, gpu)
    if not path.is_file():
        return None
    try:
        prof = Profile.load(path)
    except ValueError as exc:
        raise ProfilerError(
            f"committed profile {path} cannot be read ({exc}); re-make it with scripts/profile_zoo.py"
        ) from exc
    if (prof.model, prof.batch, prof.dtype, prof.device.key) != (model, batch, dtype, _gpu_key(gpu)):
        raise ProfilerError(
            f"committed profile {path.name} holds {prof.model} b{prof.batch} {prof.dtype} on {prof.device.key}; "
            "rename or re-make it"
        )
    if params is not None and dict(prof.model_params) != dict(params):
        return None
    return prof
