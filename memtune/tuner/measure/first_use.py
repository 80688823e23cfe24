"""The first use of a GPU type: calibrate it and measure the profiles asked for, once, and keep them.

# NOTE [ First use of a GPU type ]
A GPU type memtune ships no data for needs two things before a plan can be trusted on it: a calibration (the
allocator headroom above all: with none, plans are searched right up to the budget and ran out of memory under it
on an H100) and a measured profile. ``memtune profile --device cuda``, ``memtune tune`` and ``memtune bench`` on a
CUDA machine, and ``memtune.tune`` of a model on a CUDA device, therefore:

1. calibrate the present GPU type when it has no calibration (``ensure_calibration``, NOTE [ Calibrating a GPU
   type ]), about four minutes on an H100, said on the terminal first;
2. take the measured profile of a zoo model from this user's folder or the shipped ones, else measure it
   (``measure_zoo_profile``): stage times, copies, and for a model with convolutions every cuDNN algorithm's time
   and workspace (without them the search cannot trade workspace for memory: VGG-16 could not be planned below 88%
   of its peak on the H100), and keep it in this user's folder (NOTE [ Measured data per GPU type ]).

Both run in child processes from the command line (``run_isolated``): the parent that then runs ``bench``'s rows, each
in a child of its own, holds no GPU memory. ``memtune.tune`` runs the calibration in its own process: a child of a
user's script would import that script again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from memtune.profiler import ModelChain, Profile, build
from memtune.profiler.cudnn import CudnnError
from memtune.profiler.devices import gpu_key
from memtune.profiler.library import profile_filename, user_profile_dir
from memtune.profiler.measure import profile as measure
from memtune.tuner._tuner_errors import TunerError
from memtune.tuner.calibration import calibration_for
from memtune.tuner.measure._isolate import run_isolated
from memtune.tuner.measure.calibrate import CalibrationRun, calibrate

__all__ = ["PresentGPU", "ensure_calibration", "measure_zoo_profile", "present_gpu", "zoo_profile"]

Note = Callable[[str], None]


@dataclass(frozen=True)
class PresentGPU:
    """The CUDA device this process would measure on, read from its properties (no copies, no allocation)."""

    key: str
    name: str
    memory_bytes: int


def present_gpu(index: int = 0) -> PresentGPU | None:
    """The GPU type of CUDA device ``index``, or None when CUDA is not available."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(index)
    return PresentGPU(gpu_key(props.name, props.total_memory), props.name, props.total_memory)


def ensure_calibration(*, progress: Note | None = None, isolate: bool = True) -> CalibrationRun | None:
    """Calibrate the present GPU type when it has none (NOTE [ First use of a GPU type ]); None when it had one.

    Raises:
        TunerError: no CUDA device, or the calibration's reference plans did not run.
    """
    gpu = present_gpu()
    if gpu is None:
        raise TunerError("calibrating a GPU type needs a CUDA device, and none is available here")
    if calibration_for(gpu.key).source != "none":
        return None
    note = progress or (lambda _what: None)
    note(f"first use of GPU type {gpu.key!r} ({gpu.name}): calibrating it once (about four minutes on an H100)")
    if isolate:
        run = run_isolated(calibrate)
        calibration_for.cache_clear()  # written by the child
        return run
    return calibrate(progress=note, isolate=False)


def _has_convs(chain: ModelChain) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for s in chain.stages for m in s.module.modules())


def measure_zoo_profile(
    chain: ModelChain,
    batch: int,
    dtype: str,
    *,
    conv_algos: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
    note: Note | None = None,
    compile_budget: float | None = None,
) -> Profile:
    """Measure ``chain`` on this GPU — with cuDNN algorithm tables and lean transients when ``conv_algos`` and the
    chain has convolutions; compiled under ``compile_budget`` when given (NOTE [ Compiled stages ], no tables) — and
    keep it in ``user_profile_dir``.

    When libcudnn cannot be loaded for the tables the profile is measured without them (said through ``note``).
    """
    algos = conv_algos and compile_budget is None and _has_convs(chain)
    try:
        prof = measure(
            chain, batch, dtype, device="cuda", progress=progress, conv_algos=algos, compile_budget=compile_budget
        )
    except CudnnError as exc:
        (note or print)(f"cuDNN algorithm tables could not be measured ({exc}); profiling without them")
        prof = measure(chain, batch, dtype, device="cuda", progress=progress)
    if prof.has_conv_algos:
        from memtune.tuner.measure.lean import measure_lean_transients

        prof = measure_lean_transients(chain, prof)
    folder = user_profile_dir()
    folder.mkdir(parents=True, exist_ok=True)
    prof.save(folder / profile_filename(chain.name, batch, dtype, prof.device.key, compile_budget))
    torch.cuda.empty_cache()
    return prof


def _measure_in_child(
    model: str, params: dict[str, object], batch: int, dtype: str, conv_algos: bool, compile_budget: float | None
) -> Profile:
    return measure_zoo_profile(build(model, params), batch, dtype, conv_algos=conv_algos, compile_budget=compile_budget)


def zoo_profile(
    model: str,
    params: dict[str, object] | None,
    batch: int,
    dtype: str,
    *,
    calibrate_first: bool = True,
    conv_algos: bool = True,
    progress: Note | None = None,
    compile_budget: float | None = None,
) -> Profile:
    """The measured profile of zoo ``model`` on the present GPU type: this user's or the shipped one, else measured
    in a child process and kept (after calibrating the GPU type when it has no calibration and ``calibrate_first``).
    ``compile_budget``: the compiled profile of that activation budget (NOTE [ Compiled stages ]).

    Raises:
        TunerError: no CUDA device, or the calibration did not run.
        ProfilerError: the model cannot be measured (a child's error is raised here as it was raised there).
    """
    from memtune.profiler import find_profile

    gpu = present_gpu()
    if gpu is None:
        raise TunerError("measuring a profile needs a CUDA device, and none is available here")
    chain_params = dict(build(model, params or {}).params)
    found = find_profile(model, batch, dtype, gpu.key, params=chain_params, compile_budget=compile_budget)
    if found is not None and found.source == "measured":
        return found
    if calibrate_first:
        ensure_calibration(progress=progress)
    what = (
        f" compiled under activation budget {compile_budget:g}"
        if compile_budget is not None
        else " with its cuDNN algorithm tables"
        if conv_algos
        else ""
    )
    (progress or (lambda _w: None))(f"profiling {model} batch {batch} {dtype} on this {gpu.name}{what}")
    return run_isolated(
        functools.partial(_measure_in_child, model, params or {}, batch, dtype, conv_algos, compile_budget)
    )
