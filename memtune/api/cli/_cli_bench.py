"""``memtune bench``'s body on the command's side: check the options, find this GPU's profile of the model, hand the
measuring to ``memtune.tuner.measure.bench_command`` and print its rows as a table; a factory model is benched here
(NOTE [ Module bench ], its peers through ``cli_peers``).

``memtune.api.cli._commands`` keeps the Typer command (its options and help) and calls ``bench_command``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from memtune.api.cli._common import (
    GiB,
    activation_budgets,
    check_options,
    err,
    fail,
    fmt,
    load_chain,
    out,
    parse_params,
    sample_shape,
)
from memtune.profiler import Profile, ProfilerError
from memtune.tuner import Plan, TunerError, format_bytes
from memtune.tuner.budget import Budget

if TYPE_CHECKING:
    from memtune.tuner.measure.bench import BenchRow
    from memtune.tuner.measure.first_use import PresentGPU

__all__ = ["bench_command", "float64_text"]


def bench_command(
    model: str,
    *,
    batch: int,
    dtype: str,
    budget: str,
    sweep: str | None,
    trials: int,
    param: list[str] | None,
    iters: int,
    warmup: int,
    builtins: bool,
    json_out: Path | None,
    headroom: str,
    policies: bool,
    variants: bool,
    cap_builtins: bool,
    no_choice: bool,
    no_selective: bool,
    isolate: bool,
    input_shape: str | None,
    vocab: int | None,
    stage: list[str] | None,
    profile_file: Path | None,
    compiled: str,
    compiler_sweep: str,
    offload_peer: bool,
    peers: bool,
) -> None:
    """``memtune bench``: the options as the command takes them (batch in samples; ``sweep`` fractions of the
    unconstrained peak, ``headroom`` shares of the budget, ``compiled`` and ``compiler_sweep`` activation budgets, each
    comma-separated); measures on this GPU and prints the rows, writing them to ``json_out`` as they come."""
    import optuna
    import torch

    from memtune.profiler.factory import is_factory
    from memtune.profiler.provenance import run_record

    wanted = check_options(dtype=dtype, budget=budget)  # the budget read once (NOTE [ One pipeline ])
    assert wanted is not None  # --budget is required
    run = run_record()  # NOTE [ Run record ]: what the JSON says made it
    if is_factory(model):
        try:
            sweep_budgets = activation_budgets(compiler_sweep, "--compiler-sweep") if compiler_sweep else None
        except ValueError as exc:
            raise fail(str(exc)) from exc
        if peers and sweep_budgets is None:
            from memtune.tuner.measure.module_peers import COMPILER_SWEEP

            sweep_budgets = list(COMPILER_SWEEP)
        _factory_bench(model, batch, wanted, trials, parse_params(param), input_shape, vocab, stage, iters, warmup,
                       json_out, run, sweep_budgets if peers else None)  # fmt: skip
        return

    from memtune.tuner import simulate as run_sim
    from memtune.tuner.measure.bench_command import BenchOptions, BenchRefused, measure_bench

    if not torch.cuda.is_available():
        raise fail("memtune bench measures on a CUDA GPU and none is available here; use `memtune simulate` on a CPU")
    from memtune.tuner.runtime.guard import configure_allocator

    err.print(f"allocator: PYTORCH_CUDA_ALLOC_CONF={configure_allocator()}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from memtune.tuner.measure.first_use import present_gpu

    ident = present_gpu()
    assert ident is not None  # CUDA is available (checked above)
    params = parse_params(param)
    chain = load_chain(model, params)
    from memtune.profiler import build as build_chain

    factory = functools.partial(build_chain, model, params or {}) if isolate else None
    prof = _bench_profile(model, params, batch, dtype, profile_file, ident)
    base_peak = run_sim(prof, Plan.uniform(prof.n_stages)).peak_bytes
    try:
        options = BenchOptions(
            trials=trials, warmup=warmup, iters=iters,
            fractions=[float(f) for f in sweep.split(",")] if sweep else [],
            headrooms=[float(h) for h in headroom.split(",")] if headroom else [],
            compile_budgets=activation_budgets(compiled, "--compiled"),
            compiler_budgets=activation_budgets(compiler_sweep, "--compiler-sweep"),
            policies=policies, variants=variants, builtins=builtins, cap_builtins=cap_builtins, no_choice=no_choice,
            no_selective=no_selective, offload_peer=offload_peer,
        )  # fmt: skip
        main_budget = wanted.resolve(gpu_memory_bytes=ident.memory_bytes, peak_bytes=base_peak)
    except (ValueError, TunerError) as exc:
        raise fail(str(exc)) from exc
    try:
        rows = measure_bench(model, params, chain, prof, batch=batch, dtype=dtype, gpu_key=ident.key,
                             main_budget=main_budget, base_peak=base_peak, factory=factory, options=options,
                             json_out=json_out, run=run, note=err.print)  # fmt: skip
    except BenchRefused as exc:
        raise fail(str(exc)) from exc
    title = f"{prof.model} batch {batch} {dtype} on {ident.name} (torch {torch.__version__})"
    out.print(_bench_table(rows, chain.input_kind, title))


def _bench_profile(
    model: str, params: dict[str, Any], batch: int, dtype: str, profile_file: Path | None, ident: PresentGPU
) -> Profile:
    """The profile the bench plans with: ``profile_file``, which must describe this batch, dtype and GPU type, else
    this GPU's measured profile of the zoo model (NOTE [ First use of a GPU type ]: measured in a child, so this
    process holds no GPU memory)."""
    from memtune.tuner.measure.first_use import zoo_profile

    try:
        if profile_file is not None:
            prof = Profile.load(profile_file)
            if prof.device.key != ident.key or (prof.batch, prof.dtype) != (batch, dtype):
                raise fail(
                    f"--profile {profile_file}: it describes {prof.model} batch {prof.batch} {prof.dtype} on "
                    f"{prof.device.key}, not batch {batch} {dtype} on this {ident.key}"
                )
        else:  # NOTE [ First use of a GPU type ]: measured in a child, so this process holds no GPU memory
            prof = zoo_profile(model, params, batch, dtype, progress=lambda what: err.print(f"{what} …"))
    except (ProfilerError, TunerError) as exc:
        raise fail(str(exc)) from exc
    return prof


def _bench_table(rows: list[BenchRow], input_kind: str, title: str) -> Table:
    """The measured rows beside their predictions: times in ms, sizes in GiB, ratios to the first (unconstrained)
    row; ``input_kind`` ``tokens`` counts tokens per second instead of samples."""
    base = rows[0].step_ms or float("nan")
    table = Table(
        "configuration",
        "budget GiB",
        "step ms",
        "x unconstr.",
        "peak GiB",
        "tokens/s" if input_kind == "tokens" else "samples/s",  # BenchRow.samples_per_s counts tokens there
        "fits",
        "sim ms",
        "sim err",
        "sim peak GiB",
        "peak err",
        "retries",
        title=title,
        caption="retries: allocations per step that fit the cap only after the allocator released its cache, "
        "measured / predicted by the placement model (its calibrated cost is in sim ms)",
    )
    for row in rows:
        table.add_row(
            row.name,
            fmt(row.budget_bytes / GiB if row.budget_bytes else None, ".2f"),
            fmt(row.step_ms, ".1f"),
            fmt(row.step_ms / base if row.step_ms else None, ".2f"),
            fmt(row.peak_bytes / GiB if row.peak_bytes else None, ".2f"),
            fmt(row.samples_per_s, ",.0f"),
            "-" if row.fits is None else ("yes" if row.fits else "no"),
            fmt(row.predicted_step_ms, ".1f"),
            fmt(row.step_error, "+.1%"),
            fmt(row.predicted_peak_bytes / GiB if row.predicted_peak_bytes else None, ".2f"),
            fmt(row.peak_error, "+.1%"),
            _retries_text(row.alloc_retries, row.predicted_retries),
        )
        if row.error:
            table.add_row(f"  [dim]{row.error}[/]")
        if row.leaked_bytes:
            table.add_row(f"  [yellow]{format_bytes(row.leaked_bytes)} stayed allocated after this row[/]")
    return table


def _factory_bench(
    model: str,
    batch: int,
    budget: Budget,
    trials: int,
    params: dict[str, Any],
    input_shape: str | None,
    vocab: int | None,
    stages: list[str] | None,
    iters: int,
    warmup: int,
    json_out: Path | None,
    run: dict[str, Any],
    peer_budgets: list[float] | None = None,
) -> None:
    """``memtune bench`` for a factory model: NOTE [ Module bench ] at ``budget`` (as ``check_options`` read it; a
    fraction of the peak), then the model's peers with ``peer_budgets`` as the compiler's sweep (None: no peers; NOTE
    [ Module peers ]); ``run`` is the NOTE [ Run record ] its JSON carries."""
    import torch

    from memtune.profiler import build_factory
    from memtune.profiler.factory import factory_inputs
    from memtune.tuner.measure.module_bench import bench_module
    from memtune.tuner.runtime.guard import configure_allocator

    if not torch.cuda.is_available():
        raise fail("memtune bench measures on a CUDA GPU and none is available here; use `memtune tune` on a CPU")
    if budget.kind != "peak":
        raise fail(
            f"--budget {budget.text!r}: a factory model is benched at a fraction of its measured peak, '60% of peak'"
        )
    fraction = budget.value
    import optuna

    shape = sample_shape(input_shape)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    err.print(f"allocator: PYTORCH_CUDA_ALLOC_CONF={configure_allocator()}")
    try:
        net = build_factory(model, params).cuda()
        x = factory_inputs(batch, shape, vocab=vocab, device="cuda")
        with err.status("measuring") as status:
            row = bench_module(net, x, stages=stages, fraction=fraction, trials=trials, warmup=warmup, steps=iters,
                               progress=lambda what: status.update(f"measuring: {what}"))  # fmt: skip
            if peer_budgets is not None:
                from memtune.api.cli._cli_peers import bench_peers

                row["peers"] = bench_peers(net, x, peer_budgets, warmup=warmup, steps=iters, stages=stages,
                                           progress=lambda what: status.update(f"measuring peer: {what}"))  # fmt: skip
    except (ProfilerError, TunerError, ValueError) as exc:
        raise fail(str(exc)) from exc
    row = {"model": model, "batch": batch, **row, "run": run}
    if json_out is not None:
        json_out.write_text(json.dumps(row, indent=1) + "\n")
    table = Table("row", "step ms", "peak GiB", "retries/step", title=f"{model} batch {batch} on {row.get('device')}")
    for name in ("unplanned", "planned", "planned_uncapped", "planned_keep", "predicted"):
        r = row.get(name)
        if not r:
            continue
        if "error" in r:
            table.add_row(name, r["error"][:60], "-", "-")
            continue
        retries = r.get("alloc_retries_per_step")
        table.add_row(
            name, f"{r['step_ms']:.2f}", f"{r['peak_bytes'] / GiB:.2f}", "-" if retries is None else f"{retries:.2f}"
        )
    out.print(table)
    if "peers" in row:
        from memtune.api.cli._cli_peers import peer_table

        out.print(peer_table(row["peers"], row.get("unplanned"), f"peers of {model} batch {batch}"))
    if "error" in row:
        raise fail(f"{row['error']} within {fraction:.0%} of the measured peak", code=1)
    out.print(
        f"plan {row['plan']} at {format_bytes(row['budget_bytes'])}; gradients within {row['equality']['grad']:.1e} "
        f"of the unplanned step's (its own run-to-run spread {row['spread']['grad']:.1e}){float64_text(row)}"
    )


def float64_text(row: dict[str, Any]) -> str:
    """The bench row's judgement against float64, in words after a semicolon (NOTE [ Gradients against float64 ] in
    ``memtune.tuner.runtime.float64``); empty for a row measured without it."""
    f = row.get("float64")
    if f is None:
        return ""
    if "error" in f:
        return f"; not judged against float64: {f['error']}"
    if not f["comparable"]:
        off = max(f["loss_error"], f.get("run_loss_error", 0.0))
        return f"; not judged against float64: a loss is {off:.1e} off (dropout drew otherwise)"
    verdict = "within" if f["within"] else "NOT within"
    return (
        f"; against float64 its largest gradient error is {f['ratio']:.2f}x the unplanned step's ({f['worst']}): "
        f"{verdict} PyTorch's accuracy rule"
    )


def _retries_text(measured: float | None, predicted: float | None) -> str:
    """Measured allocator retries per step, and the placement model's prediction where there is one."""
    return fmt(measured, ".1f") + (f" / {predicted:.1f}" if predicted is not None else "")
