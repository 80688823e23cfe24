"""Calibration of the cost model from measurements on a GPU type (committed as data in ``memtune/tuner/data``).

A calibration file ``memtune/tuner/data/calibration-<gpu key>.json`` holds what ``memtune bench`` taught us
about a GPU type, with the command and date that measured it: the budget headroom of NOTE [ Headroom ]
(``memtune.tuner.search``), the time an allocator retry costs per byte it unmaps (NOTE [ Allocator placement ] in
``memtune.tuner.placement``) and, per measured profile, the factor between its whole unconstrained step and the sum of
its stages (NOTE [ Compute scale ]). ``python -m benchmarks.calibrate`` derives the last two from committed
``memtune bench`` runs. A GPU type without a file gets no correction.

Where ``calibration_for`` finds a GPU type's calibration, first found wins:

1. one installed in this process (``install_calibration``, for a program that got calibrations from elsewhere; the
   service's workers install none: they pass each job's to its search, NOTE [ Calibrations in the service ] in
   ``memtune.api.service.worker``);
2. this user's file (``memtune calibrate`` writes it, ``user_calibration_dir``);
3. the committed file in ``memtune/tuner/data``, unless ``MEMTUNE_SHIPPED_DATA=0``
(``memtune.profiler.library.shipped_data``);
4. none: an empty calibration (headroom 0, ``source`` ``none``).

A calibration is JSON data (``Calibration.from_data`` checks it): ``gpu``, ``headroom``, ``remap_ms_per_gib``,
``compute_scale``, ``copy_gbps``, ``shared_link_gbps`` and ``allreduce_gbps`` (the host link several GPUs share and
the all-reduce rate between them, ``memtune.tuner._link``), ``source`` and whatever else a newer ``memtune calibrate``
writes, which is kept as it came (``Calibration.data``, ``to_data``) and passed on unread.

# NOTE [ Calibration is an input ]
The calibration is an input of the simulator, like its profile: ``Simulator(profile, ..., calibration=cal)`` keeps
it as ``Simulator.calibration``, and everything downstream of a simulator (``memtune.tuner.search.tune``, the fast
path, the placement pricer, the peak check, ``memtune.tuner._ranks``) reads it from the simulator or from its own
``calibration=`` parameter. ``calibration_for`` is only the default lookup at the edges: a ``calibration`` of None
is looked up once, where the simulator (or the function) is made, and never again below it. So two calibrations of
one GPU type can price one profile side by side in one process (a service's jobs, a test), and no job's prices
depend on what another installed. The registry (``install_calibration``) stays for the edges that have no
calibration in hand.

# NOTE [ Compute scale ]
The profiler times each stage alone (forward, then backward, synchronised around each); a training step runs
them back to back, so launch gaps overlap and caches stay warm. On the H200 every measured profile's simulated
unconstrained step was 2-8% longer than the measured one (GPT bf16: 120.7 against 112.0 ms). The simulator
multiplies every compute time of a profile (stages, convolution algorithms, loss; not copies) by measured /
simulated unconstrained step, the median over the committed bench runs of that profile. It is one number per
profile, measured on one plan (no plan at all), and applied to every other.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from memtune.profiler import Profile
from memtune.profiler.library import shipped_data, user_data_dir
from memtune.tuner._link import SharedLink, allreduce_table
from memtune.tuner._tuner_errors import CalibrationError

__all__ = [
    "Calibration",
    "CalibrationOrigin",
    "calibration_for",
    "install_calibration",
    "installed_calibrations",
    "missing_calibration",
    "profile_key",
    "uninstall_calibrations",
    "user_calibration_dir",
]

CalibrationOrigin = Literal["installed", "user file", "committed", "none"]
"""Where ``calibration_for`` found a calibration (see the module's docstring for the order)."""


@dataclass(frozen=True)
class Calibration:
    """Corrections for one GPU type.

    Attributes:
        gpu: the GPU key (``h200``).
        headroom: fraction of the budget left free for the caching allocator, in [0, 1).
        remap_ms_per_gib: ms a capped step loses per GiB an allocator retry unmaps (and maps again); None
            when not measured on this GPU type.
        source: where the numbers came from (command, date), or ``none``.
        compute_scale: measured / simulated unconstrained step per measured profile (see below).
        origin: where ``calibration_for`` found it; ``installed`` for one made with ``from_data``.
        data: the calibration's whole JSON object as it came, fields this class does not read included (``to_data``
            gives a copy); empty for the empty calibration.
    """

    gpu: str
    headroom: float = 0.0
    remap_ms_per_gib: float | None = None
    source: str = "none"
    compute_scale: dict[str, float] = field(default_factory=dict)
    """measured / simulated unconstrained step per measured profile, keyed ``model-bBATCH-dtype``"""
    origin: CalibrationOrigin = "none"
    data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_data(
        cls, data: Mapping[str, Any], *, gpu: str | None = None, origin: CalibrationOrigin = "installed"
    ) -> Calibration:
        """The calibration in a JSON object (a calibration file's content, or a row of the service's database).

        Rules: ``gpu`` a non-empty string (``gpu`` given here fills it in, and must agree with it); ``headroom`` (0
        when absent) a number in [0, 1); ``remap_ms_per_gib`` absent, null or a number >= 0 (ms per GiB);
        ``compute_scale`` an object of numbers > 0; ``copy_gbps`` absent, null or an object of numbers > 0 (GB/s);
        ``shared_link_gbps`` and ``allreduce_gbps`` absent, null or as ``memtune.tuner._link`` says (GB/s per GPU by
        GPUs copying at once, the row '1' required; bus GB/s by ranks >= 2);
        ``source`` and ``remap_source`` strings; every number finite, the whole object JSON. Other fields are kept
        unread.

        Raises:
            CalibrationError: a rule is broken; the message and ``field`` name the field.
        """
        if not isinstance(data, Mapping):
            raise CalibrationError(f"a calibration is a JSON object, not {type(data).__name__}")
        key = _gpu_of(data, gpu)
        headroom = _number(data, "headroom", default=0.0)
        if not 0.0 <= headroom < 1.0:
            raise CalibrationError(
                f"calibration of {key!r}: field 'headroom' must be in [0, 1) (a share of the budget), got {headroom}",
                field="headroom",
            )
        remap = None if data.get("remap_ms_per_gib") is None else _number(data, "remap_ms_per_gib")
        if remap is not None and remap < 0:
            raise CalibrationError(
                f"calibration of {key!r}: field 'remap_ms_per_gib' must be >= 0 (ms per GiB), got {remap}",
                field="remap_ms_per_gib",
            )
        scale = _positive_table(data, "compute_scale", key, "factors")
        _positive_table(data, "copy_gbps", key, "GB/s by direction (d2h, h2d)")
        if data.get("shared_link_gbps") is not None:  # NOTE [ Shared host link ] in memtune.tuner._ranks
            SharedLink.from_table(data["shared_link_gbps"], gpu=key)
        allreduce_table(data.get("allreduce_gbps"), gpu=key)
        sources = [_text(data, "source", key), _text(data, "remap_source", key)]
        try:
            raw = json.loads(json.dumps({**data, "gpu": key}, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise CalibrationError(f"calibration of {key!r} is not JSON data: {e}") from e
        return cls(
            gpu=key,
            headroom=headroom,
            remap_ms_per_gib=remap,
            source="; ".join(s for s in sources if s) or "none",
            compute_scale=scale,
            origin=origin,
            data=raw,
        )

    def to_data(self) -> dict[str, Any]:
        """The calibration as a JSON object: a copy of ``data``, or for one made field by field, its fields."""
        if self.data:
            return copy.deepcopy(self.data)
        out: dict[str, Any] = {"gpu": self.gpu, "headroom": self.headroom, "source": self.source}
        if self.remap_ms_per_gib is not None:
            out["remap_ms_per_gib"] = self.remap_ms_per_gib
        out["compute_scale"] = dict(self.compute_scale)
        return out

    @property
    def shared_link(self) -> SharedLink | None:
        """The measured per-GPU copy rates by GPUs copying at once (``shared_link_gbps``), or None."""
        table = self.data.get("shared_link_gbps")
        return None if table is None else SharedLink.from_table(table, gpu=self.gpu)

    def allreduce_gbps(self, ranks: int) -> float | None:
        """NCCL's bus GB/s of an all-reduce among ``ranks`` GPUs of one host (``allreduce_gbps``), or None."""
        return allreduce_table(self.data.get("allreduce_gbps"), gpu=self.gpu).get(ranks)

    def compute_scale_for(self, profile: Profile) -> float:
        """The factor on ``profile``'s compute times (NOTE [ Compute scale ]); 1.0 when not calibrated."""
        if profile.source != "measured" or profile.device.key != self.gpu or profile.modules:
            return 1.0  # a profile of module stages adds up to its own measured step (NOTE [ Time outside stages ])
        return self.compute_scale.get(profile_key(profile), 1.0)


def _gpu_of(data: Mapping[str, Any], gpu: str | None) -> str:
    given = data.get("gpu")
    if given is None and gpu is None:
        raise CalibrationError("a calibration needs field 'gpu' (the GPU type's key, e.g. 'h200')", field="gpu")
    if given is not None and (not isinstance(given, str) or not given.strip()):
        raise CalibrationError(f"field 'gpu' must be a GPU type's key (e.g. 'h200'), got {given!r}", field="gpu")
    if given is not None and gpu is not None and given != gpu:
        raise CalibrationError(f"field 'gpu' is {given!r}, but this calibration is for {gpu!r}", field="gpu")
    return str(given if given is not None else gpu)


def _finite(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a finite number (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _number(data: Mapping[str, Any], name: str, *, default: float | None = None) -> float:
    if name not in data and default is not None:
        return default
    number = _finite(data.get(name))
    if number is None:
        raise CalibrationError(f"field {name!r} must be a finite number, got {data.get(name)!r}", field=name)
    return number


def _positive_table(data: Mapping[str, Any], name: str, gpu: str, what: str) -> dict[str, float]:
    """The object ``data[name]`` of finite numbers > 0 (empty when absent or null)."""
    table = data.get(name)
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise CalibrationError(
            f"calibration of {gpu!r}: field {name!r} must be an object of {what}, got {table!r}", field=name
        )
    out: dict[str, float] = {}
    for k, v in table.items():
        number = _finite(v)
        if number is None or number <= 0:
            raise CalibrationError(
                f"calibration of {gpu!r}: field '{name}.{k}' must be a finite number > 0 ({what}), got {v!r}",
                field=f"{name}.{k}",
            )
        out[str(k)] = number
    return out


def _text(data: Mapping[str, Any], name: str, gpu: str) -> str:
    value = data.get(name, "")
    if not isinstance(value, str):
        raise CalibrationError(f"calibration of {gpu!r}: field {name!r} must be text, got {value!r}", field=name)
    return value


def missing_calibration(profile: Profile) -> str | None:
    """What a measured profile's GPU type lacks, as advice to print, or None when it is calibrated (or modeled)."""
    cal = calibration_for(profile.device.key)
    if profile.source != "measured" or cal.source != "none":
        return None
    return (
        f"no calibration for GPU type {profile.device.key!r}: plans are searched right up to the budget and may run "
        "out of memory under it; run `memtune calibrate` on this GPU once (docs/command-line.md, measure on a GPU)"
    )


def profile_key(profile: Profile) -> str:
    """``model-bBATCH-dtype`` (``…-compiledB`` for a compiled profile): how the calibration names a profile."""
    compiled = "" if profile.compile_budget is None else f"-compiled{profile.compile_budget:g}"
    return f"{profile.model}-b{profile.batch}-{profile.dtype}{compiled}"


def user_calibration_dir() -> Path:
    """Where ``memtune calibrate`` writes a GPU type's calibration for this user: ``$MEMTUNE_CALIBRATION_DIR``, else
    ``user_data_dir() / "calibrations"`` (``~/.local/share/memtune/calibrations``; NOTE [ Measured data per GPU
    type ] in ``memtune.profiler.library``)."""
    chosen = os.environ.get("MEMTUNE_CALIBRATION_DIR")
    return Path(chosen) if chosen else user_data_dir() / "calibrations"


_installed: dict[str, Calibration] = {}
_installed_lock = threading.Lock()


def install_calibration(data: Mapping[str, Any]) -> Calibration:
    """Make ``calibration_for(data["gpu"])`` answer with this calibration in this process, before any file.

    For a process that got calibrations from elsewhere (a program of its own, a test). Installing the
    same GPU type again replaces it. Thread safe.

    Raises:
        CalibrationError: ``data`` is malformed (``Calibration.from_data``); nothing is installed.
    """
    cal = Calibration.from_data(data, origin="installed")
    with _installed_lock:
        _installed[cal.gpu] = cal
    return cal


def installed_calibrations() -> dict[str, Calibration]:
    """The calibrations installed in this process, by GPU type key."""
    with _installed_lock:
        return dict(_installed)


def uninstall_calibrations(*gpus: str) -> None:
    """Forget the installed calibrations of ``gpus`` (every one when none is named); files are read again."""
    with _installed_lock:
        for key in gpus or list(_installed):
            _installed.pop(key, None)


@functools.cache
def _file_calibration(gpu: str) -> Calibration:
    user = user_calibration_dir() / f"calibration-{gpu}.json"
    origin: CalibrationOrigin = "user file" if user.is_file() else "committed"
    path: Any = user if user.is_file() else files("memtune.tuner").joinpath("data", f"calibration-{gpu}.json")
    if not path.is_file() or (origin == "committed" and not shipped_data()):
        return Calibration(gpu)
    try:
        return Calibration.from_data(json.loads(path.read_text()), gpu=gpu, origin=origin)
    except (CalibrationError, json.JSONDecodeError) as e:
        raise CalibrationError(f"{path}: {e}", field=getattr(e, "field", None)) from e


class _CalibrationLookup:
    """The type of ``calibration_for``: a function with ``cache_clear``, like ``functools.cache`` gives."""

    def __call__(self, gpu: str) -> Calibration:
        """The calibration of ``gpu``: the one installed in this process (``install_calibration``), else the user's
        (``memtune calibrate``, ``user_calibration_dir``), else the committed one, else an empty one. Files are read
        once per process: ``calibration_for.cache_clear()`` after writing one (installed ones stay installed).

        Raises:
            CalibrationError: the file found is malformed (the message names the file and the field).
        """
        installed = _installed.get(gpu)
        return installed if installed is not None else _file_calibration(gpu)

    def cache_clear(self) -> None:
        """Read the calibration files again on the next call (after writing one)."""
        _file_calibration.cache_clear()


calibration_for = _CalibrationLookup()
