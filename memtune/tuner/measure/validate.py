"""Measured validation: run a few chosen plans on this process's CUDA GPU and measure them.

The search ranks plans by the simulator; validation runs the top ones for real, so that what is served
as ``measured`` is what the GPU did. It reuses ``memtune.tuner.measure.bench.bench_plans`` (without PyTorch's
built-ins): the unplanned step first (the reference, measured without a cap), then each plan built with
``planned`` inside its cuDNN algorithm choices and run under ``budget_guard`` at the job's budget, timed
with ``measure_step`` (CUDA events after warm-up, median of the timed steps; the step is NOTE
[ Bench step ] there: forward, loss, backward, SGD momentum update). A plan that runs out of memory or
fails comes back as a row with ``error`` set (``PlanOutOfMemoryError`` names the plan and the stage), not
as an exception.

Given a picklable function that builds the model, validation measures each configuration in a fresh process
(NOTE [ Bench isolation ] in ``memtune.tuner.measure.bench``): cuDNN keeps the fallback algorithm a capped plan ran and
would hand it to the next plan of the same process, so plans measured in one process are not independent. The
worker passes ``memtune.api.service.model_refs.stored_chain_builder``'s builder, so a job's measured numbers are what
its plans do in a training job of their own.

Validation refuses (``ValidationUnavailable``) when this process has no CUDA device, or when its GPU is
not of the GPU type the plans were made for: measured numbers for an H200 plan must come from an H200.
"""

from __future__ import annotations

import gc
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from memtune.profiler import DeviceIdentity, ModelChain, Profile, ProfilerError
from memtune.profiler.identity import cuda_identity
from memtune.tuner._tuner_errors import TunerError
from memtune.tuner.measure.bench import BenchRow, bench_plans
from memtune.tuner.plan import Plan
from memtune.tuner.runtime.guard import configure_allocator

__all__ = ["ValidationRun", "ValidationUnavailable", "check_validation_device", "validate_plans"]

ValidationProgress = Callable[[int, int, str, DeviceIdentity], None]
"""``(index, total, name, device)``: index 0 is the unplanned reference step, 1..total the plans."""


class ValidationUnavailable(TunerError):
    """Plans cannot be measured in this process: there is no CUDA device, or it is another GPU type.

    Args:
        reason: what is missing or mismatched and what to do (e.g. run a worker on that GPU type).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ValidationRun:
    """What ``validate_plans`` measured. Times ms, sizes bytes (see ``BenchRow``).

    Attributes:
        device: the GPU the numbers come from.
        unconstrained: the unplanned step (no plan, no cap): the reference the plans are compared with.
        rows: one row per plan measured, in the order given; a row with ``error`` set did not run
            (out of memory, or a runtime error) and has no step ms or peak bytes.
        stopped: ``should_stop`` asked to stop before every plan was measured (``rows`` is shorter).
    """

    device: DeviceIdentity
    unconstrained: BenchRow
    rows: list[BenchRow]
    stopped: bool


class _Stop(Exception):
    """Raised from ``bench_plans``'s ``on_row`` to stop between two plans."""


def check_validation_device(gpu_key: str, *, device_index: int | None = None) -> DeviceIdentity:
    """The identity of this process's CUDA device, when it is of GPU type ``gpu_key``.

    Args:
        gpu_key: the GPU type the plans were made for (``h200``; ``memtune.profiler.devices.gpu_key``).
        device_index: the CUDA device (default: the current one).

    Raises:
        ValidationUnavailable: CUDA is not available, or the device is another GPU type.
    """
    if not torch.cuda.is_available():
        raise ValidationUnavailable(
            f"no CUDA device in this process (torch.cuda.is_available() is False); measured numbers for a "
            f"{gpu_key} plan need a {gpu_key}: run a worker on a {gpu_key} host (memtune worker --gpu {gpu_key})"
        )
    index = torch.cuda.current_device() if device_index is None else device_index
    try:
        ident = cuda_identity(index)
    except ProfilerError as e:
        raise ValidationUnavailable(f"cannot read the CUDA device's identity: {e}") from e
    if ident.key != gpu_key:
        raise ValidationUnavailable(
            f"this process's GPU is {ident.name} (GPU type {ident.key!r}), not {gpu_key!r}; measured numbers for "
            f"a {gpu_key} plan must come from a {gpu_key}: run a worker on a {gpu_key} host "
            f"(memtune worker --gpu {gpu_key})"
        )
    return ident


def validate_plans(
    chain: ModelChain | Callable[[], ModelChain],
    profile: Profile,
    batch: int,
    dtype: str,
    budget_bytes: int,
    plans: Sequence[tuple[str, str, Plan]],
    *,
    gpu_key: str,
    iters: int = 6,
    warmup: int = 3,
    progress: ValidationProgress | None = None,
    should_stop: Callable[[], bool] | None = None,
    isolate: bool = True,
) -> ValidationRun:
    """Measure each plan on this process's CUDA GPU under ``budget_bytes``, after the unplanned step.

    The device is checked first (``check_validation_device``), so a CPU process refuses before it builds
    anything; then the caching allocator gets ``configure_allocator``'s settings, as for ``memtune bench``
    (NOTE [ Allocator retries ] in ``memtune.tuner.runtime.guard``; process-wide, unless ``PYTORCH_CUDA_ALLOC_CONF``
    is set). Each configuration runs ``warmup`` untimed and ``iters`` timed training steps; its row holds
    the median step ms, the peak allocated and reserved bytes, samples per second, whether the peak fits
    the budget, and the simulator's prediction for the plan (``predicted_*``).

    Args:
        chain: the model (moved to CUDA here, every configuration in this process), or a function building it.
            A function is called in a fresh process per configuration when ``isolate`` (it must be picklable:
            a module-level function or a ``functools.partial`` of one), else once here after the device check.
        profile: the profile the plans were made for (its simulated numbers become ``predicted_*``).
        batch: samples per step (the profile's batch).
        dtype: ``float32`` or an autocast dtype (the profile's dtype).
        budget_bytes: the cap each plan runs under (``budget_guard``) and ``fits`` is judged by, bytes.
        plans: ``(name, kind, plan)`` triples, in the order to measure them.
        gpu_key: the GPU type the plans were made for; the device must be of that type.
        iters: timed steps per configuration (at least 1).
        warmup: untimed steps before them.
        progress: called as each configuration starts (index 0: the unplanned step; then 1..len(plans)).
        should_stop: polled after each configuration; True stops before the next one (``stopped``).
        isolate: with a builder function for ``chain``, measure each configuration in a fresh process.

    Returns:
        A ``ValidationRun``.

    Raises:
        ValidationUnavailable: no CUDA device, or another GPU type than ``gpu_key``.
        TunerError: ``iters``/``warmup`` out of range, the profile is for another batch or dtype, or ``chain``
            is a builder that cannot be pickled while ``isolate`` is set.

    Example::

        run = validate_plans(chain, profile, 64, "float32", 6 << 30, [("optuna", "optuna", plan)], gpu_key="h200")
        print(run.rows[0].step_ms, run.rows[0].peak_bytes, run.rows[0].predicted_step_ms)
    """
    factory = _checked_factory(chain, profile, batch, dtype, iters=iters, warmup=warmup, isolate=isolate)
    device = check_validation_device(gpu_key)
    configure_allocator()
    model: ModelChain | None = None  # with a factory, each row's process builds its own
    if isinstance(chain, ModelChain):
        model = chain
    elif factory is None:
        model = chain()
    total = len(plans)
    started = [0]
    rows: list[BenchRow] = []

    def on_start(name: str) -> None:
        index = started[0]
        started[0] += 1
        if progress is not None:
            progress(index, total, name, device)

    def on_row(row: BenchRow) -> None:
        rows.append(row)
        if len(rows) <= total and should_stop is not None and should_stop():
            raise _Stop

    stopped = False
    try:
        bench_plans(
            model,
            profile,
            batch,
            dtype,
            budget_bytes,
            list(plans),
            pytorch_builtins=False,
            warmup=warmup,
            iters=iters,
            progress=on_start,
            on_row=on_row,
            chain_factory=factory,
        )
    except _Stop:
        stopped = True
    finally:
        del model
        gc.collect()
        torch.cuda.empty_cache()
    return ValidationRun(device=device, unconstrained=rows[0], rows=rows[1:], stopped=stopped)


def _checked_factory(
    chain: ModelChain | Callable[[], ModelChain],
    profile: Profile,
    batch: int,
    dtype: str,
    *,
    iters: int,
    warmup: int,
    isolate: bool,
) -> Callable[[], ModelChain] | None:
    """``validate_plans``'s settings checked before anything is built: the builder each configuration's fresh
    process calls (``chain`` when it is a function and ``isolate``), or None where this process measures them all.

    Raises:
        TunerError: ``iters``/``warmup`` out of range, the profile is for another batch or dtype, or the builder
            cannot be pickled.
    """
    if iters < 1 or warmup < 0:
        raise TunerError(f"validation needs iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")
    if profile.batch != batch or profile.dtype != dtype:
        raise TunerError(
            f"the profile is for batch {profile.batch} {profile.dtype}, not batch {batch} {dtype}: "
            "its predictions would not describe the measured step"
        )
    factory = None if isinstance(chain, ModelChain) or not isolate else chain
    if factory is not None:
        try:
            pickle.dumps(factory)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise TunerError(
                f"validation measures each plan in a fresh process, so the model builder must be picklable (a "
                f"module-level function or functools.partial of one), not {factory!r}: {e}; or pass isolate=False"
            ) from e
    return factory
