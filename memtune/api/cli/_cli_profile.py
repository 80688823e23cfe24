"""``memtune profile``'s body: measure a model here (on CUDA or the CPU, a factory model stage by stage) or model its
roofline profile, keep it, and print it stage by stage; also the factory-model profiling ``memtune tune`` shares.

``memtune.api.cli._commands`` keeps the Typer command (its options and help) and calls ``profile_command``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from memtune.api.cli._common import (
    activation_budgets,
    check_options,
    err,
    fail,
    load_chain,
    out,
    parse_params,
    print_profile_checks,
    sample_shape,
)
from memtune.profiler import ProfilerError
from memtune.tuner import TunerError, format_bytes

if TYPE_CHECKING:
    from memtune.profiler import ModelChain, Profile

__all__ = ["factory_profile", "profile_command"]


def profile_command(
    model: str,
    *,
    batch: int,
    dtype: str,
    gpu: str | None,
    param: list[str] | None,
    spec: Path | None,
    device: str,
    output: Path | None,
    input_shape: str | None,
    vocab: int | None,
    stage: list[str] | None,
    output_held: bool,
    conv_algos: bool,
    compile_budget: float | None,
    compiler_sweep: str | None,
    as_json: bool,
) -> None:
    """``memtune profile``: the options as the command takes them (batch in samples; ``compile_budget`` and the
    ``compiler_sweep`` budgets are shares of activation memory, 0 to 1); prints the profile, or its JSON."""
    from memtune.profiler.factory import is_factory

    check_options(dtype=dtype, gpu=gpu)
    described = gpu or "h200"  # what a modeled or CPU profile describes; on CUDA the device says
    if compile_budget is not None and (device == "model" or is_factory(model)):
        raise fail("--compile measures compiled stages: use --device cuda or cpu, with a zoo model or a spec")
    if compiler_sweep is not None and (device != "cuda" or is_factory(model) or compile_budget is not None):
        raise fail("--compiler-sweep measures the whole model compiled on this GPU: use --device cuda with a zoo "
                   "model or a spec, without --compile")  # fmt: skip
    try:
        whole_budgets = activation_budgets(compiler_sweep or "", "--compiler-sweep")
    except ValueError as exc:
        raise fail(str(exc)) from exc
    try:
        if is_factory(model):
            prof = factory_profile(
                model, batch, dtype, described if device != "cuda" else gpu, "cpu" if device == "model" else device,
                parse_params(param),
                input_shape, vocab, stage, output_held,
            )  # fmt: skip
        elif device == "model":
            chain = load_chain(model, parse_params(param), spec)
            from memtune.profiler import modeled_profile

            prof = modeled_profile(chain, batch, dtype, described)
        elif device in ("cpu", "cuda"):
            chain = load_chain(model, parse_params(param), spec)
            on = gpu if device == "cuda" else described
            prof = _measure_chain(
                chain, batch, dtype, device, on, conv_algos and compile_budget is None, compile_budget
            )
            if whole_budgets:
                prof = _measure_compiler_points(model, parse_params(param), spec, prof, whole_budgets)
        else:
            raise fail(f"--device {device!r}: use cuda, cpu or model")
    except (ProfilerError, TunerError, ValueError) as exc:
        raise fail(str(exc)) from exc
    if output is not None:
        prof.save(output)
        err.print(f"wrote {output}")
    if as_json:
        sys.stdout.write(prof.to_json() + "\n")
        return
    _print_profile(prof)


def _print_profile(prof: Profile) -> None:
    """The profile stage by stage (times in ms, saved bytes in MiB), its totals and its self-check."""
    from memtune.tuner.tuned import compute_words, device_label

    table = Table(
        "#",
        "stage",
        "kind",
        "fwd ms",
        "bwd ms",
        "saved MiB",
        "D2H ms",
        "D2H/fwd",
        title=(
            f"{prof.model} batch {prof.batch} {prof.dtype} {device_label(prof)} ({prof.source}: "
            f"compute {compute_words(prof)}, transfers {prof.transfer_source})"
            + (
                ""
                if prof.compile_budget is None
                else f"; compiled under activation budget {prof.compile_budget:g} in {prof.compile_seconds or 0:.0f} s"
            )
        ),
    )
    for s in prof.stages:
        ratio = f"{s.d2h_ms / s.forward_ms:.1f}" if s.forward_ms > 0 and s.saved_bytes else "-"
        table.add_row(
            str(s.index),
            s.name,
            s.kind,
            f"{s.forward_ms:.3f}",
            f"{s.backward_ms:.3f}",
            f"{s.saved_bytes / 2**20:.1f}",
            f"{s.d2h_ms:.3f}",
            ratio,
        )
    out.print(table)
    out.print(f"saved {format_bytes(prof.saved_bytes)}, parameters {format_bytes(prof.param_bytes)}")
    print_profile_checks(prof)


def _measure_chain(
    chain: ModelChain,
    batch: int,
    dtype: str,
    device: str,
    gpu: str | None,
    conv_algos: bool,
    compile_budget: float | None = None,
) -> Profile:
    """Measure a chain here with a progress bar; on CUDA calibrate the GPU type first when it has no calibration,
    take the cuDNN algorithm tables when ``conv_algos`` (an eager profile), and keep the profile (NOTE [ First use
    of a GPU type ]); ``compile_budget``: every stage compiled under it (NOTE [ Compiled stages ])."""
    from memtune.profiler.measure import profile as measure

    if device == "cuda":
        from memtune.profiler import get_gpu
        from memtune.tuner.measure.first_use import ensure_calibration, present_gpu

        present = present_gpu()
        if present is not None and gpu is not None and get_gpu(gpu).key != present.key:
            raise fail(f"--gpu {gpu!r} was given but this device is {present.name!r} ({present.key}); leave it out")
        with err.status("calibrating") as status:
            ensure_calibration(progress=lambda what: status.update(what))
    with Progress(
        TextColumn("[bold]profiling[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(chain.name, total=len(chain))

        def tick(name: str, i: int, n: int) -> None:
            bar.update(task, completed=i, total=n, description=name)

        if device == "cuda":
            from memtune.tuner.measure.first_use import measure_zoo_profile

            return measure_zoo_profile(
                chain, batch, dtype, conv_algos=conv_algos, progress=tick, note=err.print, compile_budget=compile_budget
            )
        return measure(chain, batch, dtype, device=device, gpu=gpu, progress=tick, compile_budget=compile_budget)


def _measure_compiler_points(
    model: str, params: dict[str, Any] | None, spec: Path | None, prof: Profile, budgets: list[float]
) -> Profile:
    """``prof`` with the whole model compiled at each budget measured (each in a fresh process) and kept in this GPU
    type's profile library beside it (NOTE [ Whole-model compile ])."""
    from memtune.profiler.library import profile_filename, user_profile_dir
    from memtune.tuner.measure.compiler_points import measure_compiler_points, with_compiler_points

    factory = functools.partial(load_chain, model, params, spec)
    with err.status("compiling the whole model") as status:
        points, rows = measure_compiler_points(
            factory, prof, budgets, progress=lambda what: status.update(f"measuring {what} (the first steps compile)")
        )
    for row in rows:
        if row.error:
            err.print(f"  {row.name}: {row.error}")
    prof = with_compiler_points(prof, points)
    path = user_profile_dir() / profile_filename(prof.model, prof.batch, prof.dtype, prof.device.key)
    prof.save(path)
    measured = ", ".join(
        f"budget {p.activation_budget:g} {p.step_ms:.1f} ms at {format_bytes(p.peak_bytes)}" for p in points
    )
    err.print(f"compiled whole: {measured}; kept in {path}")
    return prof


def factory_profile(
    model: str,
    batch: int,
    dtype: str,
    gpu: str | None,
    device: str,
    params: dict[str, Any],
    input_shape: str | None,
    vocab: int | None,
    stages: list[str] | None,
    output_held: bool = True,
) -> Profile:
    """Build a factory model and measure it stage by stage on ``device`` (NOTE [ Module stages ]); ``batch`` in
    samples, ``input_shape`` one sample's sizes."""
    from memtune.profiler import build_factory
    from memtune.profiler.factory import factory_inputs
    from memtune.tuner.measure.tune_module import profile as measure_module

    if device not in ("cpu", "cuda"):
        raise fail(f"--device {device!r}: a factory model is measured; use cpu or cuda")
    if device == "cuda":  # NOTE [ First use of a GPU type ]: calibrated in children, before this process uses CUDA
        from memtune.tuner.measure.first_use import ensure_calibration

        with err.status("calibrating") as status:
            ensure_calibration(progress=lambda what: status.update(what))
    shape = sample_shape(input_shape)
    net = build_factory(model, params).to(device)
    x = factory_inputs(batch, shape, vocab=vocab, device=device)
    return measure_module(
        net, x, stages=stages, dtype=dtype, gpu=gpu, progress=err.is_terminal, output_held=output_held
    )
