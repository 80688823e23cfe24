"""The ``memtune`` command line: profile, simulate, tune (engine), plus the service commands.

Every command prints a readable table by default and one JSON object with ``--json``; long work shows
rich progress bars on standard error, so standard output stays clean for scripts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from memtune.api.cli._common import GiB, check_options, err, fail, load_chain, out, parse_params, resolve_profile
from memtune.profiler import Profile, ProfilerError
from memtune.tuner import Plan, TunerError, format_bytes
from memtune.tuner.budget import bytes_unit, profile_budget

__all__ = ["app", "load_chain", "resolve_profile"]

app = typer.Typer(
    name="memtune",
    help="Find how to train a network on a GPU within a memory budget, as fast as possible.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


ModelArg = Annotated[
    str,
    typer.Argument(
        help="zoo model name (see `memtune models`), 'spec' with --spec, or a factory: 'package.module:function' or "
        "'file.py:function' returning an nn.Module (with --input-shape)"
    ),
]
SimModelArg = Annotated[
    str,
    typer.Argument(
        help="zoo model name (see `memtune models`), 'spec' with --spec, or a factory ('package.module:function' or "
        "'file.py:function') with --profile: the profile `memtune profile FACTORY --output p.json` saved"
    ),
]
BatchOpt = Annotated[int, typer.Option("--batch", "-b", min=1, help="batch size")]
DtypeOpt = Annotated[str, typer.Option(help="float32, bfloat16 or float16 (autocast)")]
GpuOpt = Annotated[str, typer.Option(help="GPU type, e.g. h200, a100-80gb, k40 (see `memtune gpus`)")]
ParamOpt = Annotated[list[str] | None, typer.Option("--param", "-p", help="model parameter KEY=VALUE")]
SpecOpt = Annotated[Path | None, typer.Option(help="JSON model spec file (model argument: spec)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object")]
OptimizerOpt = Annotated[str, typer.Option(help="sgd (momentum), adam or none: optimizer state bytes")]
BudgetOpt = Annotated[
    str,
    typer.Option(
        help="memory budget: bytes with a unit (12GiB, 800MB) or a fraction of what: '60% of peak' (the model's "
        "unconstrained peak) or '60% of gpu' (the GPU's memory)"
    ),
]
ShapeOpt = Annotated[
    str | None, typer.Option("--input-shape", help="a factory model's input, one sample: 3,224,224 or 512 (tokens)")
]
VocabOpt = Annotated[int | None, typer.Option(help="a factory model takes token ids below this")]
StagesOpt = Annotated[
    list[str] | None, typer.Option("--stage", help="a factory model's stages: module name pattern, repeatable")
]
HeldOpt = Annotated[
    bool,
    typer.Option(
        "--output-held/--output-dropped",
        help="a factory model: whether your training loop holds the model's output until its backward ends (the "
        "worst case, the default) or drops it first (docs/concepts.md, held output)",
    ),
]
InferenceOpt = Annotated[
    bool,
    typer.Option(
        "--inference",
        help="plan inference instead (mmCNN): weights prefetched from host memory and layers split by output "
        "channels so that each layer's working set fits --budget",
    ),
]
MeasureOpt = Annotated[
    bool, typer.Option("--measure", help="with --inference: measure the layers on --device and run the plan there")
]
ConvWorkspaceOpt = Annotated[
    str,
    typer.Option(
        "--conv-workspace",
        help="with --inference --measure: 'none' runs convolutions with cuDNN's workspace-free IMPLICIT_GEMM, so "
        "that the device memory is the planned working set; 'framework' (default) lets cuDNN choose",
    ),
]


@app.command()
def calibrate(
    model: Annotated[str, typer.Option(help="the zoo model measured for the calibration")] = "resnet50",
    batch: BatchOpt = 64,
    dtype: DtypeOpt = "float32",
    fractions: Annotated[str, typer.Option(help="fractions of the simulated peak to tune and run plans at")] = (
        "0.4,0.6,0.8"
    ),
    trials: Annotated[int, typer.Option(min=1, help="Optuna trials per plan")] = 100,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="write here instead of the user's calibration folder")
    ] = None,
) -> None:
    """Measure this GPU type's calibration: copy rates, compute scale, allocator headroom; the search and the guard
    then use it for this GPU type (docs/command-line.md, measure on a GPU)."""
    import optuna

    from memtune.tuner.measure.calibrate import calibrate as run_calibration
    from memtune.tuner.runtime.guard import configure_allocator

    check_options(dtype=dtype)
    try:
        shares = [float(f) for f in fractions.split(",")]
    except ValueError:
        raise fail(
            f"--fractions {fractions!r}: write fractions of the peak separated by commas, e.g. 0.5,0.6"
        ) from None
    if not shares or any(not 0 < f <= 1 for f in shares):
        raise fail(f"--fractions {fractions!r}: every fraction must be in (0, 1]")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    err.print(f"allocator: PYTORCH_CUDA_ALLOC_CONF={configure_allocator()}")
    try:
        with err.status("calibrating") as status:
            done = run_calibration(
                model=model, batch=batch, dtype=dtype, fractions=shares, trials=trials, output=output,
                progress=lambda what: status.update(f"calibrating: {what}"),
            )  # fmt: skip
    except (ProfilerError, TunerError, ValueError) as exc:
        raise fail(str(exc)) from exc
    table = Table("row", "step ms", "peak GiB", "reserved GiB", "predicted GiB", "error", title="calibration runs")
    for r in done.rows:
        table.add_row(
            r.name,
            "-" if r.step_ms is None else f"{r.step_ms:.2f}",
            "-" if r.peak_bytes is None else f"{r.peak_bytes / GiB:.2f}",
            "-" if r.reserved_bytes is None else f"{r.reserved_bytes / GiB:.2f}",
            "-" if r.predicted_peak_bytes is None else f"{r.predicted_peak_bytes / GiB:.2f}",
            (r.error or "")[:60],
        )
    out.print(table)
    d = done.data
    out.print(
        f"[bold]{d['gpu']}[/]: headroom {d['headroom']:.0%}, compute scale {next(iter(d['compute_scale'].values()))}, "
        f"copies {d['copy_gbps']['d2h']:.1f} / {d['copy_gbps']['h2d']:.1f} GB/s; written to {done.path}"
    )


@app.command()
def models() -> None:
    """List the model zoo and its parameters."""
    from memtune.profiler import ZOO_NAMES
    from memtune.profiler.zoo import zoo_params

    table = Table("model", "parameters (defaults)")
    for name in ZOO_NAMES:
        table.add_row(name, ", ".join(f"{k}={v}" for k, v in zoo_params(name).items()))
    out.print(table)


@app.command()
def gpus() -> None:
    """List the GPU types memtune knows (roofline specs), and which have measured profiles."""
    from memtune.profiler import GPUS

    table = Table("key", "name", "memory", "fp32 TFLOP/s", "bf16 TFLOP/s", "HBM GB/s", "PCIe D2H GB/s")
    for spec in GPUS.values():
        table.add_row(
            spec.key,
            spec.name,
            format_bytes(spec.memory_bytes),
            f"{spec.peak_flops['float32'] / 1e12:.1f}",
            f"{spec.peak_flops['bfloat16'] / 1e12:.1f}",
            f"{spec.memory_bandwidth / 1e9:.0f}",
            f"{spec.pcie_d2h / 1e9:.1f}",
        )
    out.print(table)


@app.command()
def profile(
    model: ModelArg,
    batch: BatchOpt = 32,
    dtype: DtypeOpt = "float32",
    gpu: Annotated[
        str | None,
        typer.Option(
            help="the GPU type a modeled or CPU profile describes (default h200); measuring on CUDA takes the present "
            "GPU's and checks it against this when given"
        ),
    ] = None,
    param: ParamOpt = None,
    spec: SpecOpt = None,
    device: Annotated[
        str,
        typer.Option(
            help="'cuda' to measure on this GPU, 'cpu' to measure compute on the CPU, 'model' for a roofline profile"
        ),
    ] = "model",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write the profile JSON here")] = None,
    input_shape: ShapeOpt = None,
    vocab: VocabOpt = None,
    stage: StagesOpt = None,
    output_held: HeldOpt = True,
    conv_algos: Annotated[
        bool,
        typer.Option(
            help="on CUDA, also time every cuDNN algorithm of every convolution (what lets a plan trade workspace "
            "for memory)"
        ),
    ] = True,
    compile_budget: Annotated[
        float | None,
        typer.Option(
            "--compile",
            min=0.0,
            max=1.0,
            help="measure every stage compiled by torch.compile under this activation-memory budget (0 to 1; "
            "--device cuda or cpu); plans tuned on the profile run compiled. No cuDNN algorithm tables then",
        ),
    ] = None,
    compiler_sweep: Annotated[
        str | None,
        typer.Option(
            help="comma-separated torch.compile activation budgets (e.g. 0,0.25,0.5,0.75,1): on CUDA also measure the "
            "whole model compiled at each, so that tune may choose to compile it whole (docs/python-api.md)",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Profile a model: per stage forward/backward ms, saved bytes, copy ms. Measured on CUDA, the profile is kept
    for this GPU type, which is calibrated first if it has no calibration (docs/command-line.md)."""
    from memtune.api.cli._cli_profile import profile_command

    profile_command(model, batch=batch, dtype=dtype, gpu=gpu, param=param, spec=spec, device=device, output=output,
                    input_shape=input_shape, vocab=vocab, stage=stage, output_held=output_held, conv_algos=conv_algos,
                    compile_budget=compile_budget, compiler_sweep=compiler_sweep, as_json=as_json)  # fmt: skip


@app.command()
def simulate(
    model: SimModelArg,
    batch: BatchOpt = 32,
    dtype: DtypeOpt = "float32",
    gpu: GpuOpt = "h200",
    budget: BudgetOpt = "100% of gpu",
    policy: Annotated[str | None, typer.Option(help="baseline policy name (see memtune.tuner.policies)")] = None,
    plan_file: Annotated[Path | None, typer.Option("--plan", help="a plan JSON file")] = None,
    param: ParamOpt = None,
    spec: SpecOpt = None,
    profile_file: Annotated[Path | None, typer.Option("--profile", help="a profile JSON file")] = None,
    optimizer: OptimizerOpt = "sgd",
    as_json: JsonOpt = False,
) -> None:
    """Simulate one training step under a policy's plan or a plan file."""
    from memtune.profiler.factory import is_factory
    from memtune.tuner import POLICIES
    from memtune.tuner import simulate as run_sim

    wanted = check_options(dtype=dtype, gpu=gpu, budget=budget, optimizer=optimizer)  # NOTE [ One pipeline ]
    assert wanted is not None  # --budget has a default; read once, resolved below
    if profile_file is None and is_factory(model):
        raise fail(
            f"a factory model is simulated from its saved profile: `memtune profile {model} --device cpu "
            "--input-shape … --output p.json`, then `memtune simulate … --profile p.json`"
        )
    try:
        if profile_file is not None:  # the file stands for the model, a factory's too
            prof = Profile.load(profile_file)
        else:
            prof = resolve_profile(load_chain(model, parse_params(param), spec), batch, dtype, gpu)
        budget_bytes = profile_budget(wanted, prof, optimizer)
        if plan_file is not None:
            plan = Plan.model_validate_json(plan_file.read_text())
        else:
            name = policy or "none"
            if name not in POLICIES:
                raise fail(f"--policy {name!r} is not known; choose one of {', '.join(POLICIES)}")
            plan = POLICIES[name](prof, budget_bytes)
        base = run_sim(prof, Plan.uniform(prof.n_stages), optimizer=optimizer)
        r = run_sim(prof, plan, optimizer=optimizer)
        priced = _priced(prof, plan, budget_bytes, optimizer, r.step_ms, r.fits(budget_bytes))
    except (ProfilerError, TunerError, ValueError, OSError) as exc:
        raise fail(str(exc)) from exc
    if as_json:
        sys.stdout.write(
            json.dumps(
                {
                    "model": prof.model,
                    "batch": prof.batch,
                    "gpu": prof.device.key,
                    "budget_bytes": budget_bytes,
                    "profile_source": prof.source,
                    "plan": plan.model_dump(mode="json"),
                    **priced,
                    "peak_bytes": r.peak_bytes,
                    "stall_ms": r.stall_ms,
                    "recompute_ms": r.recompute_ms,
                    "unconstrained": {"step_ms": base.step_ms, "peak_bytes": base.peak_bytes},
                }
            )
            + "\n"
        )
        return
    step, (unit, size) = priced["step_ms"], bytes_unit(r.peak_bytes, budget_bytes)
    out.print(f"[bold]{plan.label or 'plan'}[/] on {prof.model} batch {prof.batch} ({prof.device.key}, {prof.source})")
    out.print(
        f"  step {step:.2f} ms ({step / base.step_ms:.2f}x), peak {r.peak_bytes / size:.2f} {unit} "
        f"({'fits' if priced['feasible'] else 'does not fit'} {budget_bytes / size:.2f} {unit}), "
        f"stalls {r.stall_ms:.2f} ms, recompute {r.recompute_ms:.2f} ms"
    )
    if priced.get("alloc_retries"):
        from memtune.tuner.tuned import retries_words

        out.print(f"  {retries_words(r.step_ms, priced['allocator_ms'], priced['alloc_retries'])}")
    out.print(f"  actions {plan.compact()}  (k keep, o offload, r recompute, s selective)")


def _priced(prof: Profile, plan: Plan, budget_bytes: int, optimizer: str, step_ms: float, fits: bool) -> dict[str, Any]:
    """A simulated plan's step as ``tune`` prices it (NOTE [ Placement ranking ] in ``memtune.tuner.search``): where the
    GPU type's calibration prices allocator retries, their predicted cost under the budget's cap is part of the step,
    and a plan the allocator model cannot place does not fit. ``step_ms``, ``feasible`` and, where priced,
    ``simulated_step_ms``, ``allocator_ms`` and ``alloc_retries``: the keys of ``tune --json``'s candidates."""
    from memtune.tuner.placement import allocator_cost

    placed, cost = allocator_cost(prof, plan, budget_bytes, optimizer=optimizer)
    if cost is None:  # the GPU type has no price for retries: tune does not model them either
        return {"step_ms": step_ms, "feasible": fits}
    return {
        "step_ms": step_ms + cost,
        "feasible": fits and placed.out_of_memory is None,
        "simulated_step_ms": step_ms,
        "allocator_ms": cost,
        "alloc_retries": placed.steady_retries,
    }


@app.command()
def tune(
    model: ModelArg,
    batch: BatchOpt = 32,
    dtype: DtypeOpt = "float32",
    gpu: Annotated[
        str | None,
        typer.Option(
            help="GPU type (see `memtune gpus`); default: this machine's GPU, measured on first use, else h200"
        ),
    ] = None,
    budget: BudgetOpt = "60% of peak",
    trials: Annotated[int, typer.Option(min=1, help="Optuna trials (baselines included)")] = 300,
    pareto: Annotated[bool, typer.Option("--pareto", help="search the time–memory Pareto front")] = False,
    seed: Annotated[int, typer.Option(help="random seed (jobs of the service use the default)")] = 0,
    param: ParamOpt = None,
    spec: SpecOpt = None,
    profile_file: Annotated[Path | None, typer.Option("--profile", help="a profile JSON file")] = None,
    optimizer: OptimizerOpt = "sgd",
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL to keep the study in")] = None,
    study: Annotated[str | None, typer.Option(help="study name (with --storage)")] = None,
    plan_out: Annotated[Path | None, typer.Option("--plan-out", help="write the best plan JSON here")] = None,
    headroom: Annotated[
        float | None, typer.Option(help="fraction of the budget kept free for the allocator (default: calibrated)")
    ] = None,
    device: Annotated[
        str, typer.Option(help="a factory model (and an --inference --measure run) is measured here: cpu or cuda")
    ] = "cpu",
    input_shape: ShapeOpt = None,
    vocab: VocabOpt = None,
    stage: StagesOpt = None,
    output_held: HeldOpt = True,
    as_json: JsonOpt = False,
    inference: InferenceOpt = False,
    measure: MeasureOpt = False,
    conv_workspace: ConvWorkspaceOpt = "framework",
    compile_whole: Annotated[
        str,
        typer.Option(
            "--compile",
            help="a factory model: also measure it compiled whole at activation budgets 1, 0.5 and 0.25, so that the "
            "search may serve a compiled plan (docs/python-api.md): on, off, or auto (on with --device cuda)",
        ),
    ] = "auto",
    finalists: Annotated[
        int,
        typer.Option(
            "--finalists",
            min=0,
            help="a factory model compiled on --device cuda: measure this many of the fastest plans found (the "
            "fastest compiler point that fits among them) under the budget and serve the fastest measured (where none "
            "runs, plans of smaller peak in turn, else none); 0 serves the simulator's fastest (docs/python-api.md)",
        ),
    ] = 3,
) -> None:
    """Search the fastest plan within a budget (or the Pareto front) and compare every baseline; with --inference,
    plan the forward pass alone within a working-set budget per layer."""
    from memtune.api.cli._tune import tune_command

    tune_command(model, batch=batch, dtype=dtype, gpu=gpu, budget=budget, trials=trials, pareto=pareto, seed=seed,
                 param=param, spec=spec, profile_file=profile_file, optimizer=optimizer, storage=storage, study=study,
                 plan_out=plan_out, headroom=headroom, device=device, input_shape=input_shape, vocab=vocab,
                 stage=stage, output_held=output_held, as_json=as_json, inference=inference, measure=measure,
                 conv_workspace=conv_workspace, compile_whole=compile_whole, finalists=finalists)  # fmt: skip


@app.command()
def bench(
    model: ModelArg,
    batch: BatchOpt = 32,
    dtype: DtypeOpt = "float32",
    budget: BudgetOpt = "60% of peak",
    sweep: Annotated[
        str | None,
        typer.Option(
            help="comma-separated fractions of the unconstrained peak: tune and measure the tuned plan at each"
        ),
    ] = None,
    trials: Annotated[int, typer.Option(min=1, help="Optuna trials per tuned plan")] = 300,
    param: ParamOpt = None,
    iters: Annotated[int, typer.Option(min=1, help="timed steps per configuration")] = 10,
    warmup: Annotated[int, typer.Option(min=0, help="warm-up steps per configuration")] = 3,
    builtins: Annotated[bool, typer.Option(help="also measure PyTorch's save_on_cpu and checkpoint_sequential")] = True,
    json_out: Annotated[Path | None, typer.Option("--json-out", help="write all rows as JSON here")] = None,
    headroom: Annotated[
        str, typer.Option(help="comma-separated budget headrooms to tune and measure at the main budget")
    ] = "",
    policies: Annotated[bool, typer.Option(help="measure every baseline policy")] = True,
    variants: Annotated[
        bool, typer.Option(help="also measure the tuned plan with layer sync and with lookahead 8 (diagnosis)")
    ] = False,
    cap_builtins: Annotated[
        bool,
        typer.Option(
            "--cap-builtins",
            help="run PyTorch's save_on_cpu and checkpoint_sequential under the budget's cap, as our plans run",
        ),
    ] = False,
    no_choice: Annotated[
        bool,
        typer.Option(
            "--no-choice",
            help="at every budget also tune and measure without cuDNN algorithm choice (profiles with tables)",
        ),
    ] = False,
    no_selective: Annotated[
        bool,
        typer.Option(
            "--no-selective",
            help="at every budget also tune and measure without selective stages (profiles that measured them)",
        ),
    ] = False,
    isolate: Annotated[
        bool,
        typer.Option(
            help="measure every row in a fresh process: PyTorch caches the convolution algorithms a capped row fell "
            "back to, and later rows of one process would run them"
        ),
    ] = True,
    input_shape: ShapeOpt = None,
    vocab: VocabOpt = None,
    stage: StagesOpt = None,
    profile_file: Annotated[
        Path | None, typer.Option("--profile", help="a measured profile JSON of this model on this GPU (no profiling)")
    ] = None,
    compiled: Annotated[
        str,
        typer.Option(
            help="comma-separated torch.compile activation budgets (e.g. 0,0.5,1): measure a compiled profile at "
            "each and, at every budget, also tune and measure memtune's best compiled plan (docs/concepts.md, plan)"
        ),
    ] = "",
    compiler_sweep: Annotated[
        str,
        typer.Option(
            help="comma-separated activation budgets at which to measure torch.compile of the whole model alone "
            "(e.g. 0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1)"
        ),
    ] = "",
    offload_peer: Annotated[
        bool, typer.Option(help="also measure activation offload on a side stream (torchtune's manner)")
    ] = False,
    peers: Annotated[
        bool,
        typer.Option(
            help="a factory model: also measure its peers, uncapped: the compiler's sweep (--compiler-sweep, default "
            "0,0.1,...,1), Hugging Face checkpointing, checkpoint_sequential and side-stream offload where each applies"
        ),
    ] = True,
) -> None:
    """Measure on this GPU: unconstrained, every baseline, PyTorch built-ins and the tuned plan, with predictions."""
    from memtune.api.cli._cli_bench import bench_command

    bench_command(model, batch=batch, dtype=dtype, budget=budget, sweep=sweep, trials=trials, param=param, iters=iters,
                  warmup=warmup, builtins=builtins, json_out=json_out, headroom=headroom, policies=policies,
                  variants=variants, cap_builtins=cap_builtins, no_choice=no_choice, no_selective=no_selective,
                  isolate=isolate, input_shape=input_shape, vocab=vocab, stage=stage, profile_file=profile_file,
                  compiled=compiled, compiler_sweep=compiler_sweep, offload_peer=offload_peer,
                  peers=peers)  # fmt: skip


def _attach_service_commands() -> None:
    import importlib.util

    if importlib.util.find_spec("memtune.api.cli.cli_service") is None:
        return
    from memtune.api.cli.cli_service import register

    register(app)


_attach_service_commands()
