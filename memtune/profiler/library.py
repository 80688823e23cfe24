"""The library of measured profiles: those shipped with memtune in ``memtune/profiler/data/``, and this user's.

Files are named ``<model>-b<batch>-<dtype>-<gpu>.json`` (``vgg16-b256-float32-h200.json``) and hold one
``Profile`` each, made on the real GPU by ``scripts/profile_zoo.py``. The tuner prefers them to modeled
profiles: ``find_profile`` returns one when it exists.

# NOTE [ Measured data per GPU type ]
What memtune measures on a GPU type is kept per user and reused: profiles (``memtune profile --device cuda``, and
the profiles ``tune`` and ``bench`` measure when none exists) in ``user_data_dir() / "profiles"``, calibrations
(``memtune.tuner.calibration``) in ``user_data_dir() / "calibrations"``. The user's files are read before the shipped
ones, so a GPU type memtune ships no data for is measured once, on first use, and a shipped GPU type can be re-measured
on this machine's driver and libraries. ``MEMTUNE_SHIPPED_DATA=0`` ignores the shipped measured profiles and
calibrations (what a GPU type without shipped data sees; the GPU tests of that flow use it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from memtune.profiler._profile import Profile
from memtune.profiler.devices import get_gpu
from memtune.profiler.profiler_errors import ProfilerError, UnknownGPUError

__all__ = [
    "LibraryEntry",
    "data_dir",
    "find_profile",
    "list_profiles",
    "profile_filename",
    "shipped_data",
    "user_data_dir",
    "user_profile_dir",
]

_NAME = re.compile(
    r"^(?P<model>.+)-b(?P<batch>\d+)-(?P<dtype>float32|bfloat16|float16)-(?P<gpu>[a-z0-9][a-z0-9-]*?)"
    r"(?:-compiled(?P<compiled>[0-9.]+))?\.json$"
)


@dataclass(frozen=True)
class LibraryEntry:
    """One committed profile file: what its name says, and where it is."""

    model: str
    batch: int
    dtype: str
    gpu: str
    path: Path
    compile_budget: float | None = None
    """a compiled profile's activation budget (NOTE [ Compiled stages ] in ``memtune.profiler.compiled``); None:
    eager"""


def data_dir() -> Path:
    """The folder of committed profiles (``memtune/profiler/data``)."""
    return Path(str(files("memtune.profiler").joinpath("data")))


def user_data_dir() -> Path:
    """This user's measured data (NOTE [ Measured data per GPU type ]): ``$MEMTUNE_DATA_DIR``, else
    ``$XDG_DATA_HOME/memtune`` (``~/.local/share/memtune``)."""
    chosen = os.environ.get("MEMTUNE_DATA_DIR")
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "memtune"


def user_profile_dir() -> Path:
    """Where profiles measured on this machine are kept (``user_data_dir() / "profiles"``)."""
    return user_data_dir() / "profiles"


def shipped_data() -> bool:
    """False when ``MEMTUNE_SHIPPED_DATA`` is ``0``/``false``/``no``: shipped measured data is then ignored."""
    return os.environ.get("MEMTUNE_SHIPPED_DATA", "1").strip().lower() not in ("0", "false", "no", "off")


def _gpu_key(gpu: str) -> str:
    try:
        return get_gpu(gpu).key
    except UnknownGPUError:
        return gpu.strip().lower()


def profile_filename(model: str, batch: int, dtype: str, gpu: str, compile_budget: float | None = None) -> str:
    """``<model>-b<batch>-<dtype>-<gpu key>.json``; ``…-compiled<budget>.json`` for a compiled profile (NOTE
    [ Compiled stages ] in ``memtune.profiler.compiled``)."""
    compiled = "" if compile_budget is None else f"-compiled{compile_budget:g}"
    return f"{model}-b{batch}-{dtype}-{_gpu_key(gpu)}{compiled}.json"


def list_profiles(directory: Path | None = None) -> list[LibraryEntry]:
    """Every committed profile, sorted by model, GPU, dtype and batch (files with other names are ignored)."""
    root = directory or data_dir()
    if not root.is_dir():
        return []
    out = []
    for path in root.iterdir():
        m = _NAME.match(path.name)
        if m:
            compiled = None if m["compiled"] is None else float(m["compiled"])
            out.append(LibraryEntry(m["model"], int(m["batch"]), m["dtype"], m["gpu"], path, compiled))
    return sorted(out, key=lambda e: (e.model, e.gpu, e.dtype, e.batch))


def find_profile(
    model: str,
    batch: int,
    dtype: str,
    gpu: str,
    *,
    params: Mapping[str, object] | None = None,
    directory: Path | None = None,
    compile_budget: float | None = None,
) -> Profile | None:
    """The measured profile of ``model`` at ``batch``/``dtype`` on ``gpu``, or None: this user's
    (``user_profile_dir``), else the shipped one unless ``shipped_data()`` is off (NOTE [ Measured data per GPU
    type ]).

    Args:
        model: zoo name.
        batch: samples per step.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        gpu: a GPU name ``get_gpu`` accepts (or a key of a GPU without a roofline spec).
        params: the model's build parameters; a profile made with other parameters does not match.
        directory: look only here.
        compile_budget: the compiled profile measured under this activation budget; None: the eager one.

    Raises:
        ProfilerError: a file exists but describes something else than its name says.
    """
    name = profile_filename(model, batch, dtype, gpu, compile_budget)
    folders = [directory] if directory is not None else [user_profile_dir(), *([data_dir()] if shipped_data() else [])]
    for folder in folders:
        prof = _read_entry(folder / name, (model, batch, dtype, _gpu_key(gpu)))
        if prof is None or prof.compile_budget != compile_budget:
            continue
        if params is None or dict(prof.model_params) == dict(params):
            return prof
    return None


def _read_entry(path: Path, expect: tuple[str, int, str, str]) -> Profile | None:
    if not path.is_file():
        return None
    try:
        prof = Profile.load(path)
    except ValueError as exc:
        raise ProfilerError(f"profile {path} cannot be read ({exc}); delete it or measure it again") from exc
    if (prof.model, prof.batch, prof.dtype, prof.device.key) != expect:
        raise ProfilerError(
            f"profile {path} holds {prof.model} b{prof.batch} {prof.dtype} on {prof.device.key}; rename or re-make it"
        )
    return prof
