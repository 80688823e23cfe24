"""The compile path of a job: compiler points of its model, stored, measured on this worker's GPU, or left out as the
job's ``compile`` asks (NOTE [ Compiler points in the service ] in ``memtune.api.service.worker``).

``search_profile`` gives the profile the job is searched on; ``measure_job_compiler_points`` (the worker's default
``CompilerPointsFn``) measures the model compiled whole at ``COMPILE_BUDGETS`` (activation budgets, shares of the
activations kept); ``cuda_gpu_key`` names this process's GPU type. Step times are in milliseconds, peaks in bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from memtune.api.service._job_lease import LeaseLost, LeaseWatch
from memtune.api.service._job_profiles import load_stored_program, stored_model
from memtune.storage import Database
from memtune.storage.records import Job, ModelRecord
from memtune.storage.repositories import JobLease, JobRepository, ModelRepository, ProfileRepository

if TYPE_CHECKING:
    from memtune.profiler import CompilerPoint, Profile

__all__ = [
    "COMPILE_BUDGETS",
    "CompilerPointsFn",
    "NoCompilerPoints",
    "compile_note",
    "cuda_gpu_key",
    "measure_job_compiler_points",
    "points_text",
    "search_profile",
]

log = logging.getLogger("memtune.worker")


COMPILE_BUDGETS = (1.0, 0.5, 0.25)
"""Activation budgets at which a worker measures a job's model compiled whole (NOTE [ Compiler points in the
service ]), those of ``memtune.tune(..., compile=True)``."""


CompilerPointsFn = Callable[
    [ModelRecord, bytes | None, "Profile", str, Callable[[str], None]],
    "tuple[Sequence[CompilerPoint], Mapping[float, str]]",
]
"""Measures a model compiled whole at ``COMPILE_BUDGETS`` on this worker's GPU, called with the stored model, its
exported program's archive (None for a zoo model or a spec), the job's profile, its optimizer, and a function it calls
with progress text; returns the points measured and the error of each budget that failed.
``measure_job_compiler_points`` by default (NOTE [ Compiler points in the service ])."""


def measure_job_compiler_points(
    model: ModelRecord, archive: bytes | None, profile: Profile, optimizer: str, progress: Callable[[str], None]
) -> tuple[tuple[CompilerPoint, ...], dict[float, str]]:
    """The compiler points of ``model`` at ``COMPILE_BUDGETS``, measured on this process's CUDA device (NOTE
    [ Compiler points in the service ]), and the error of each budget that failed.

    Raises:
        RuntimeError: no CUDA device.
    """
    if model.kind == "exported":
        import torch

        from memtune.tuner.measure.compiler_points import measure_module_points

        if archive is None:
            raise ValueError(f"model {model.id} is an exported program, but its archive was not given")
        module, inputs = load_stored_program(model, archive, torch.device("cuda", 0))
        return measure_module_points(
            module,
            inputs,
            profile,
            COMPILE_BUDGETS,
            optimizer=optimizer,
            progress=lambda _done, _total, what: progress(what),
        )
    from memtune.api.service.model_refs import stored_chain_builder
    from memtune.tuner.measure.compiler_points import measure_compiler_points

    points, rows = measure_compiler_points(
        stored_chain_builder(model), profile, COMPILE_BUDGETS, progress=lambda what: progress(f"measuring {what}")
    )
    errors = {
        float(r.compile_budget): r.error
        for r in rows
        if r.kind == "compiler" and r.compile_budget is not None and r.error
    }
    return points, errors


class NoCompilerPoints(Exception):
    """A job with ``compile`` ``on`` whose points this worker can neither find nor measure: the job fails with it."""


def cuda_gpu_key() -> str | None:
    """The GPU type of this process's CUDA device 0 (``memtune.tuner.measure.first_use.present_gpu``), or None without
    CUDA."""
    from memtune.tuner.measure.first_use import present_gpu

    present = present_gpu()
    return None if present is None else present.key


def points_text(points: Sequence[CompilerPoint]) -> str:
    """Compiler points in a job's note: budget, step, peak."""
    from memtune.tuner import format_bytes

    return ", ".join(
        f"budget {p.activation_budget:g} {p.step_ms:.1f} ms at {format_bytes(p.peak_bytes)}" for p in points
    )


def search_profile(
    db: Database,
    job: Job,
    lease: JobLease,
    watch: LeaseWatch,
    profile: Profile,
    *,
    local_gpu: Callable[[], str | None],
    measure: CompilerPointsFn,
) -> Profile:
    """The profile the job is searched on, as its ``compile`` asks: without compiler points (``off``), with the
    stored ones, or with those measured here and stored with it. Raises NoCompilerPoints (``on``, nothing to
    measure on) and LeaseLost; a failed measurement is noted and no plan compiles the whole model."""
    points = profile.compiler_points
    if job.compile == "off":
        if points:
            compile_note(
                db, job, lease, watch, f"compile off: the profile's {len(points)} compiler point(s) are left out"
            )
        return profile.model_copy(update={"compiler_points": ()})
    if points:
        compile_note(db, job, lease, watch, f"the profile's compiler points are candidates: {points_text(points)}")
        return profile
    local = local_gpu()
    if local != job.gpu_key:
        where = "no CUDA GPU" if local is None else f"a GPU of type {local!r}"
        if job.compile == "on":
            raise NoCompilerPoints(
                f"compile 'on' needs compiler points (the whole model compiled by torch.compile, measured on a GPU "
                f"of type {job.gpu_key!r}), and the stored profile of this model (batch {job.batch}, {job.dtype}) "
                f"has none, while this worker has {where} to measure them on: run a worker on a {job.gpu_key} GPU "
                f"(memtune worker --gpu {job.gpu_key}), which measures them and keeps them for later jobs, or "
                "submit with compile 'auto' (eager plans where there are no points) or 'off'"
            )
        compile_note(
            db, job, lease, watch,
            f"no compiler points: the profile has none and this worker has {where}, not one of type "
            f"{job.gpu_key!r} to measure them on, so the plans are eager",
        )  # fmt: skip
        return profile
    return _measure_here(db, job, lease, watch, profile, measure)


def _measure_here(
    db: Database, job: Job, lease: JobLease, watch: LeaseWatch, profile: Profile, measure: CompilerPointsFn
) -> Profile:
    """``profile`` with the model compiled whole measured here at ``COMPILE_BUDGETS``, stored with it; ``profile``
    as it was, with the reason in the note, where nothing compiled."""
    from memtune.tuner.measure.compiler_points import with_compiler_points

    budgets = ", ".join(f"{b:g}" for b in COMPILE_BUDGETS)
    compile_note(
        db, job, lease, watch, f"compiling the whole model at activation budgets {budgets} on this worker's GPU"
    )
    try:
        model = stored_model(db, job)
        archive = None
        if model.kind == "exported":
            with db.session() as s:
                archive = ModelRepository(s).program(model.id)
        points, errors = measure(
            model,
            archive,
            profile,
            job.optimizer,
            lambda what: compile_note(db, job, lease, watch, f"compiling the whole model: {what}"),
        )
    except LeaseLost:
        raise
    except Exception as e:
        log.warning("job %s: compiling the whole model failed: %s", job.id, e, exc_info=True)
        text = f"compiling the whole model failed, so no plan compiles it whole: {type(e).__name__}: {e}"
        compile_note(db, job, lease, watch, text[:2000])
        return profile
    failed = "; ".join(f"activation budget {b:g} failed: {err}" for b, err in errors.items())
    if not points:
        log.warning("job %s: the whole model compiled at no activation budget: %s", job.id, failed)
        text = f"compiling the whole model failed at every activation budget, so no plan compiles it whole: {failed}"
        compile_note(db, job, lease, watch, text[:2000])
        return profile
    profile = with_compiler_points(profile, points)
    with db.session() as s:
        ProfileRepository(s).store(job.model_id, profile)
    text = f"measured the whole model compiled on this worker's GPU: {points_text(profile.compiler_points)}"
    text += "; kept with the profile" + (f"; {failed}" if failed else "")
    log.info("job %s: %s", job.id, text)
    compile_note(db, job, lease, watch, text[:2000])
    return profile


def compile_note(db: Database, job: Job, lease: JobLease, watch: LeaseWatch, text: str) -> None:
    """Show ``text`` as the job's compile note (the events stream shows it); a lost lease raises LeaseLost."""
    try:
        with db.session() as s:
            st = JobRepository(s).set_compile_note(lease, text)
    except Exception as e:  # like a missed heartbeat: the work goes on
        log.warning("job %s: compile note write failed: %s", job.id, e)
        return
    if st.lost:
        raise LeaseLost
    watch.note(st.lost, st.cancel)
