"""The ``memtune`` command line: profile, simulate, tune (engine), plus the service commands.

Every command prints a readable table by default and one JSON object with ``--json``; long work shows
rich progress bars on standard error, so standard output stays clean for scripts.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from memtune.profiler import Profile, ProfilerError
from memtune.tuner import Action, Plan, TunerError, format_bytes, planning_headroom
from memtune.tuner.budget import Budget, bytes_unit, profile_budget, search_budget
from memtune.tuner.calibration import calibration_for

if TYPE_CHECKING:
    from memtune.api.bound_beside import BoundBeside
    from memtune.profiler import ModelChain

__all__ = ["app", "load_chain", "resolve_profile"]

app = typer.Typer(
    name="memtune",
    help="Find how to train a network on a GPU within a memory budget, as fast as possible.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

GiB = float(1 << 30)


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _parse_params(items: list[str] | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"--param {item!r}: write KEY=VALUE, e.g. --param image_size=224")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def load_chain(model: str, params: dict[str, Any] | None = None, spec: Path | None = None) -> ModelChain:
    """Build a zoo model by name, or a JSON spec file's model."""
    if spec is not None:
        from memtune.profiler import from_spec

        try:
            data = json.loads(spec.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise _fail(f"cannot read the spec {spec}: {exc}") from exc
        return from_spec(data)
    from memtune.profiler import build

    return build(model, params or {})


def resolve_profile(
    chain: ModelChain,
    batch: int,
    dtype: str,
    gpu: str,
    profile_file: Path | None = None,
    allow_measured: bool = True,
) -> Profile:
    """The profile to tune with: a given file, a committed measured one, else a modeled one."""
    if profile_file is not None:
        return Profile.load(profile_file)
    if allow_measured and not chain.name.startswith("spec:"):
        from memtune.profiler import find_profile

        found = find_profile(chain.name, batch, dtype, gpu, params=chain.params)
        if found is not None:
            return found
    from memtune.profiler import modeled_profile

    return modeled_profile(chain, batch, dtype, gpu)


def _gpu_torch() -> bool:
    """Whether the installed torch may see a GPU: False for a CPU build (its ``torch/version.py`` names neither a CUDA
    nor a ROCm version) or no torch, read without importing torch (NOTE [ Zoo names without torch ] in
    ``memtune.profiler.zoo``); True where it cannot tell."""
    if "torch" in sys.modules:
        return True
    try:
        found = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return False
    if found is None or not found.submodule_search_locations:
        return False
    try:
        tree = ast.parse((Path(next(iter(found.submodule_search_locations))) / "version.py").read_text())
    except (OSError, SyntaxError):
        return True
    versions: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        else:
            continue
        if name in ("cuda", "hip"):
            try:
                versions[name] = ast.literal_eval(value)
            except ValueError:
                return True
    return "cuda" not in versions or "hip" not in versions or any(v is not None for v in versions.values())


def _tune_profile(
    model: str,
    batch: int,
    dtype: str,
    gpu: str | None,
    params: dict[str, Any] | None,
    spec: Path | None,
    profile_file: Path | None,
) -> Profile:
    """What ``tune`` searches: a given file; on a CUDA machine, unless another GPU type is named, the measured profile
    of this GPU (measured now on first use, NOTE [ First use of a GPU type ]); else a shipped measured or a modeled
    profile of ``gpu`` (default h200). A given file stands for the model whatever it is (a factory's profile saved by
    ``memtune profile --output`` too), so the model is not loaded then."""
    if profile_file is not None:
        return Profile.load(profile_file)
    if spec is None and not _gpu_torch():  # NOTE [ Zoo names without torch ] in memtune.profiler.zoo
        from memtune.profiler import find_profile
        from memtune.profiler.zoo import resolve_zoo

        name, resolved = resolve_zoo(model, params)
        found = find_profile(name, batch, dtype, gpu or "h200", params=resolved)
        if found is not None:
            return found
    import torch

    if spec is not None:
        chain = load_chain(model, params, spec)
    else:  # a zoo model's name and parameters find its profile: built on the meta device, no weights are made
        with torch.device("meta"):
            chain = load_chain(model, params)
    # present_gpu's own test first: the measuring code it lives with takes a second or more to import
    if not chain.name.startswith("spec:") and torch.cuda.is_available():
        from memtune.profiler import get_gpu
        from memtune.tuner.runtime.first_use import present_gpu, zoo_profile

        present = present_gpu()
        if present is not None and (gpu is None or get_gpu(gpu).key == present.key):
            return zoo_profile(model, params, batch, dtype, progress=lambda what: err.print(f"{what} …"))
    if spec is None:
        from memtune.profiler import find_profile

        found = find_profile(chain.name, batch, dtype, gpu or "h200", params=chain.params)
        if found is not None:
            return found
        chain = load_chain(model, params)  # the weights, to model its profile
    return resolve_profile(chain, batch, dtype, gpu or "h200", profile_file)


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

    from memtune.tuner.runtime.calibrate import calibrate as run_calibration
    from memtune.tuner.runtime.guard import configure_allocator

    _check_arguments(dtype=dtype)
    try:
        shares = [float(f) for f in fractions.split(",")]
    except ValueError:
        raise _fail(
            f"--fractions {fractions!r}: write fractions of the peak separated by commas, e.g. 0.5,0.6"
        ) from None
    if not shares or any(not 0 < f <= 1 for f in shares):
        raise _fail(f"--fractions {fractions!r}: every fraction must be in (0, 1]")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    err.print(f"allocator: PYTORCH_CUDA_ALLOC_CONF={configure_allocator()}")
    try:
        with err.status("calibrating") as status:
            done = run_calibration(
                model=model, batch=batch, dtype=dtype, fractions=shares, trials=trials, output=output,
                progress=lambda what: status.update(f"calibrating: {what}"),
            )  # fmt: skip
    except (ProfilerError, TunerError, ValueError) as exc:
        raise _fail(str(exc)) from exc
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


def _activation_budgets(text: str, option: str) -> list[float]:
    """A comma-separated list of torch.compile activation budgets (0 to 1); ValueError names the option."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r}: give comma-separated numbers from 0 to 1, e.g. 0,0.5,1") from None
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad:
        raise ValueError(f"{option}: activation budgets are shares from 0 to 1, not {bad[0]:g}")
    return values


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
        from memtune.tuner.runtime.first_use import ensure_calibration, present_gpu

        present = present_gpu()
        if present is not None and gpu is not None and get_gpu(gpu).key != present.key:
            raise _fail(f"--gpu {gpu!r} was given but this device is {present.name!r} ({present.key}); leave it out")
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
            from memtune.tuner.runtime.first_use import measure_zoo_profile

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
    from memtune.tuner.runtime.whole import measure_compiler_points, with_compiler_points

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


def _factory_bench(
    model: str,
    batch: int,
    budget: str,
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
    """``memtune bench`` for a factory model: NOTE [ Module bench ] at ``budget`` (a fraction of the peak), then the
    model's peers with ``peer_budgets`` as the compiler's sweep (None: no peers; NOTE [ Module peers ]); ``run`` is
    the NOTE [ Run record ] its JSON carries."""
    import torch

    from memtune.profiler import build_factory
    from memtune.profiler.factory import factory_inputs
    from memtune.tuner.runtime.guard import configure_allocator
    from memtune.tuner.runtime.module_bench import bench_module

    if not torch.cuda.is_available():
        raise _fail("memtune bench measures on a CUDA GPU and none is available here; use `memtune tune` on a CPU")
    try:
        wanted = Budget.parse(budget)
    except TunerError as exc:
        raise _fail(str(exc)) from exc
    if wanted.kind != "peak":
        raise _fail(
            f"--budget {budget!r}: a factory model is benched at a fraction of its measured peak, '60% of peak'"
        )
    fraction = wanted.value
    import optuna

    shape = _shape(input_shape)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    err.print(f"allocator: PYTORCH_CUDA_ALLOC_CONF={configure_allocator()}")
    try:
        net = build_factory(model, params).cuda()
        x = factory_inputs(batch, shape, vocab=vocab, device="cuda")
        with err.status("measuring") as status:
            row = bench_module(net, x, stages=stages, fraction=fraction, trials=trials, warmup=warmup, steps=iters,
                               progress=lambda what: status.update(f"measuring: {what}"))  # fmt: skip
            if peer_budgets is not None:
                from memtune.api.cli_peers import bench_peers

                row["peers"] = bench_peers(net, x, peer_budgets, warmup=warmup, steps=iters, stages=stages,
                                           progress=lambda what: status.update(f"measuring peer: {what}"))  # fmt: skip
    except (ProfilerError, TunerError, ValueError) as exc:
        raise _fail(str(exc)) from exc
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
        from memtune.api.cli_peers import peer_table

        out.print(peer_table(row["peers"], row.get("unplanned"), f"peers of {model} batch {batch}"))
    if "error" in row:
        raise _fail(f"{row['error']} within {fraction:.0%} of the measured peak", code=1)
    out.print(
        f"plan {row['plan']} at {format_bytes(row['budget_bytes'])}; gradients within {row['equality']['grad']:.1e} "
        f"of the unplanned step's (its own run-to-run spread {row['spread']['grad']:.1e})"
    )


def _shape(input_shape: str | None) -> tuple[int, ...]:
    if input_shape is None:
        raise _fail("a factory model needs --input-shape (one sample, e.g. 3,224,224)")
    try:
        return tuple(int(d) for d in input_shape.split(","))
    except ValueError:
        raise _fail(f"--input-shape {input_shape!r}: write sizes separated by commas, e.g. 3,224,224") from None


def _factory_profile(
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
    """Build a factory model and measure it stage by stage on ``device`` (NOTE [ Module stages ])."""
    from memtune.api.python import profile as measure_module
    from memtune.profiler import build_factory
    from memtune.profiler.factory import factory_inputs

    if device not in ("cpu", "cuda"):
        raise _fail(f"--device {device!r}: a factory model is measured; use cpu or cuda")
    if device == "cuda":  # NOTE [ First use of a GPU type ]: calibrated in children, before this process uses CUDA
        from memtune.tuner.runtime.first_use import ensure_calibration

        with err.status("calibrating") as status:
            ensure_calibration(progress=lambda what: status.update(what))
    shape = _shape(input_shape)
    net = build_factory(model, params).to(device)
    x = factory_inputs(batch, shape, vocab=vocab, device=device)
    return measure_module(
        net, x, stages=stages, dtype=dtype, gpu=gpu, progress=err.is_terminal, output_held=output_held
    )


def _factory_compiler_points(
    model: str,
    batch: int,
    device: str,
    params: dict[str, Any],
    input_shape: str | None,
    vocab: int | None,
    prof: Profile,
    optimizer: str,
) -> Profile:
    """``prof`` with the factory model compiled whole at activation budgets 1, 0.5 and 0.25, measured on ``device``
    (NOTE [ Compiler points of a module ]); a budget that fails to compile is reported and left out."""
    from memtune.api.python import COMPILE_BUDGETS
    from memtune.profiler import build_factory
    from memtune.profiler.factory import factory_inputs
    from memtune.tuner.runtime.whole import measure_module_points, with_compiler_points

    net = build_factory(model, params).to(device)  # the same architecture: the points do not depend on the weights
    x = factory_inputs(batch, _shape(input_shape), vocab=vocab, device=device)
    with err.status("compiling the whole model") as status:
        points, errors = measure_module_points(
            net, x, prof, COMPILE_BUDGETS, optimizer=optimizer, progress=lambda _d, _t, what: status.update(what)
        )
    for budget, error in errors.items():
        err.print(f"[yellow]warning:[/] compiling at activation budget {budget:g} failed ({error}); plans stay eager")
    return with_compiler_points(prof, points)


def _check_arguments(**arguments: Any) -> None:
    """Refuse a bad --budget, --optimizer, --dtype, --gpu or --headroom at once, before any profiling
    (``memtune.api.python.check_arguments``: each message names the option and what it takes)."""
    from memtune.api.python import check_arguments

    try:
        check_arguments(**arguments)
    except (ProfilerError, TunerError) as exc:
        message = str(exc).strip("\"'")
        named = next((name for name in arguments if message.startswith(f"{name} ")), None)
        raise _fail(f"--{message}" if named else message) from exc


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
    from memtune.profiler.factory import is_factory

    _check_arguments(dtype=dtype, gpu=gpu)
    described = gpu or "h200"  # what a modeled or CPU profile describes; on CUDA the device says
    if compile_budget is not None and (device == "model" or is_factory(model)):
        raise _fail("--compile measures compiled stages: use --device cuda or cpu, with a zoo model or a spec")
    if compiler_sweep is not None and (device != "cuda" or is_factory(model) or compile_budget is not None):
        raise _fail("--compiler-sweep measures the whole model compiled on this GPU: use --device cuda with a zoo "
                    "model or a spec, without --compile")  # fmt: skip
    try:
        whole_budgets = _activation_budgets(compiler_sweep or "", "--compiler-sweep")
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    try:
        if is_factory(model):
            prof = _factory_profile(
                model, batch, dtype, described if device != "cuda" else gpu, "cpu" if device == "model" else device,
                _parse_params(param),
                input_shape, vocab, stage, output_held,
            )  # fmt: skip
        elif device == "model":
            chain = load_chain(model, _parse_params(param), spec)
            from memtune.profiler import modeled_profile

            prof = modeled_profile(chain, batch, dtype, described)
        elif device in ("cpu", "cuda"):
            chain = load_chain(model, _parse_params(param), spec)
            on = gpu if device == "cuda" else described
            prof = _measure_chain(
                chain, batch, dtype, device, on, conv_algos and compile_budget is None, compile_budget
            )
            if whole_budgets:
                prof = _measure_compiler_points(model, _parse_params(param), spec, prof, whole_budgets)
        else:
            raise _fail(f"--device {device!r}: use cuda, cpu or model")
    except (ProfilerError, TunerError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    if output is not None:
        prof.save(output)
        err.print(f"wrote {output}")
    if as_json:
        sys.stdout.write(prof.to_json() + "\n")
        return
    from memtune.api.python import compute_words, device_label

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
    _print_peak_check(prof)


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

    _check_arguments(dtype=dtype, gpu=gpu, budget=budget, optimizer=optimizer)
    if profile_file is None and is_factory(model):
        raise _fail(
            f"a factory model is simulated from its saved profile: `memtune profile {model} --device cpu "
            "--input-shape … --output p.json`, then `memtune simulate … --profile p.json`"
        )
    try:
        if profile_file is not None:  # the file stands for the model, a factory's too
            prof = Profile.load(profile_file)
        else:
            prof = resolve_profile(load_chain(model, _parse_params(param), spec), batch, dtype, gpu)
        budget_bytes = profile_budget(budget, prof, optimizer)
        if plan_file is not None:
            plan = Plan.model_validate_json(plan_file.read_text())
        else:
            name = policy or "none"
            if name not in POLICIES:
                raise _fail(f"--policy {name!r} is not known; choose one of {', '.join(POLICIES)}")
            plan = POLICIES[name](prof, budget_bytes)
        base = run_sim(prof, Plan.uniform(prof.n_stages), optimizer=optimizer)
        r = run_sim(prof, plan, optimizer=optimizer)
        priced = _priced(prof, plan, budget_bytes, optimizer, r.step_ms, r.fits(budget_bytes))
    except (ProfilerError, TunerError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from exc
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
        from memtune.api.python import retries_words

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


def _policy_table(result: Any, unit: str, size: int) -> Table:
    base = result.unconstrained.step_ms
    table = Table(
        "policy",
        "step ms",
        "slowdown",
        f"peak {unit}",
        "feasible",
        title=f"budget {result.budget_bytes / size:.2f} {unit}, unconstrained {base:.1f} ms / "
        f"{result.unconstrained.peak_bytes / size:.2f} {unit}",
    )
    rows = sorted(result.policies, key=lambda c: (not c.feasible, c.step_ms))
    best = result.best
    if result.no_choice is not None:  # NOTE [ Measured selection ]: the plan to measure beside the best
        rows = [result.no_choice, *rows]
    if best is not None and best.name == "optuna":
        rows = [best, *rows]
    for c in rows:
        style = "bold green" if best is not None and c is best else ("" if c.feasible else "dim")
        table.add_row(
            c.name,
            f"{c.step_ms:.2f}",
            f"{c.step_ms / base:.2f}x",
            f"{c.peak_bytes / size:.2f}",
            "yes" if c.feasible else "no",
            style=style,
        )
    return table


def _lookahead_text(plan: Plan) -> str:
    """The plan's prefetch lookahead: one number, or the per-stage range (NOTE [ Prefetch lookahead ])."""
    per_stage = plan.prefetch_lookaheads
    if per_stage is None:
        return str(plan.prefetch_lookahead)
    return f"per stage {min(per_stage)}-{max(per_stage)}"


def _plan_table(prof: Profile, plan: Plan) -> Table:
    table = Table(
        "#",
        "stage",
        "kind",
        "action",
        "saved MiB",
        "fwd ms",
        "D2H ms",
        title=f"best plan: lookahead {_lookahead_text(plan)}, sync {plan.sync}, convolutions {_conv_text(plan)}",
    )
    colors = {"keep": "white", "offload": "cyan", "recompute": "magenta"}
    for s, a in zip(prof.stages, plan.actions, strict=True):
        table.add_row(
            str(s.index),
            s.name,
            s.kind,
            f"[{colors[a.value]}]{a.value}[/]",
            f"{s.saved_bytes / 2**20:.1f}",
            f"{s.forward_ms:.3f}",
            f"{s.d2h_ms:.3f}",
        )
    return table


def _print_peak_check(prof: Profile) -> None:
    """The profile's self-check (NOTE [ Profile self-check ] in ``memtune.tuner.peak_check``), in red where it is
    off."""
    from memtune.tuner import peak_check

    check = peak_check(prof)
    if check is not None:
        out.print(f"[{'bold red' if check.reported else 'dim'}]memory check: {check}[/]")


def _print_tuned(
    result: Any, prof: Profile, budget_bytes: int, optimizer: str, pareto: bool, bound: BoundBeside | None = None
) -> None:
    """``tune``'s report: the baselines, the best plan in words or stage by stage, its bound (``bound``'s where
    given, NOTE [ Bound beside the search ]), the Pareto front; every size in one unit, the table's."""
    from memtune.api.python import bound_words, compute_words, device_label, retries_words
    from memtune.tuner import Simulator
    from memtune.tuner.bound import step_lower_bound

    unit, size = bytes_unit(budget_bytes, result.unconstrained.peak_bytes, *(c.peak_bytes for c in result.policies))

    def fmt(n: float) -> str:
        return f"{n / size:.2f} {unit}" if n >= size / 100 else format_bytes(n)

    out.print(
        f"[bold]{prof.model}[/] batch {prof.batch} {prof.dtype} {device_label(prof)} — profile {prof.source} "
        f"({compute_words(prof)}); {result.n_trials} trials, seed {result.seed}"
    )
    _print_peak_check(prof)
    out.print(_policy_table(result, unit, size))
    fit = fmt(search_budget(budget_bytes, result.headroom))
    if result.headroom:
        out.print(
            f"plans must fit {fit}, {1 - result.headroom:.0%} of the budget ({result.headroom:.0%} is kept free as "
            "headroom for the caching allocator; --headroom to change it)"
        )
    if result.best is None:
        smallest = fmt(min(c.peak_bytes for c in result.pareto))
        out.print(f"[bold red]no plan fits {fit}[/]: the smallest peak found is {smallest}")
        raise typer.Exit(1)
    best = result.best
    if best.plan.whole_compile is None:
        out.print(_plan_table(prof, best.plan))
    else:  # NOTE [ Whole-model compile ]: no action per stage; the compiler partitions the whole model
        out.print(
            f"best plan: the whole model compiled by torch.compile with activation_memory_budget "
            f"{best.plan.whole_compile:g}, measured on this GPU type (`memtune profile --compiler-sweep`); every "
            "stage kept, the compiler deciding what to recompute"
        )
    out.print(
        f"[bold green]best: {best.name}[/] {best.step_ms:.2f} ms "
        f"({best.step_ms / result.unconstrained.step_ms:.2f}x unconstrained), peak {fmt(best.peak_bytes)}"
    )
    if best.alloc_retries:
        out.print(f"  [dim]{retries_words(best.step_ms - best.allocator_ms, best.allocator_ms, best.alloc_retries)}[/]")
    try:
        lower = bound.result() if bound is not None else step_lower_bound(Simulator(prof, optimizer), budget_bytes)
        out.print(f"  [dim]{bound_words(lower, fmt(budget_bytes))}[/]")
    except RuntimeError as exc:  # the solver gave no answer: the plan stands, without its bound
        out.print(f"  [dim]no lower bound: {exc}[/]")
    if pareto:
        table = Table("step ms", f"peak {unit}", "plan", title="Pareto front (time vs memory)")
        for c in result.pareto:
            table.add_row(f"{c.step_ms:.2f}", f"{c.peak_bytes / size:.2f}", c.name)
        out.print(table)


def _inference_chain(model: str, param: list[str] | None, spec: Path | None) -> ModelChain:
    """The chain ``tune --inference`` plans: a zoo model or a JSON spec (NOTE [ Inference plans ])."""
    from memtune.profiler.factory import is_factory

    if is_factory(model):
        raise _fail("--inference plans zoo models and JSON specs (--spec); describe a factory's model as a spec")
    try:
        return load_chain(model, _parse_params(param), spec)
    except (ProfilerError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from exc


def _run_inference(
    chain: ModelChain,
    batch: int,
    dtype: str,
    budget: str,
    device: str,
    measure: bool,
    conv_workspace: str,
    profile: Callable[[], Profile],
    as_json: bool,
    plan_out: Path | None,
) -> None:
    """``tune --inference``: plan, price and (``measure``) run ``chain``'s forward pass
    (``memtune.api.cli_inference``)."""
    from memtune.api.cli_inference import tune_inference

    try:
        tune_inference(chain, batch=batch, dtype=dtype, budget=budget, device=device, measure=measure, profile=profile,
                       as_json=as_json, plan_out=plan_out, out=out, err=err, conv_workspace=conv_workspace)  # fmt: skip
    except (ProfilerError, TunerError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from exc


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
) -> None:
    """Search the fastest plan within a budget (or the Pareto front) and compare every baseline; with --inference,
    plan the forward pass alone within a working-set budget per layer."""
    import optuna

    from memtune.profiler.factory import is_factory
    from memtune.tuner import tune as run_tune

    _check_arguments(dtype=dtype, gpu=gpu, budget=budget, optimizer=optimizer, headroom=headroom)
    if measure and not inference:
        raise _fail("--measure runs an inference plan: add --inference (`memtune bench` measures training plans)")
    if compile_whole not in ("auto", "on", "off"):
        raise _fail(f"--compile {compile_whole!r}: use auto, on or off")
    if compile_whole == "on" and (profile_file is not None or not is_factory(model)):
        raise _fail(
            "--compile on measures a factory model compiled whole; a zoo model's or a spec's compiler points come "
            "from `memtune profile --device cuda --compiler-sweep 1,0.5,0.25 --output p.json`, then --profile p.json"
        )
    if inference:  # NOTE [ Inference plans ] in memtune.tuner.inference.plan
        chain = _inference_chain(model, param, spec)
        profile = functools.partial(resolve_profile, chain, batch, dtype, gpu or "h200", profile_file)
        _run_inference(chain, batch, dtype, budget, device, measure, conv_workspace, profile, as_json, plan_out)
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from memtune.tuner.calibration import missing_calibration

    beside: BoundBeside | None = None
    try:
        if profile_file is None and is_factory(model):
            described = (gpu or "h200") if device == "cpu" else None  # on CUDA the device is the GPU type
            prof = _factory_profile(
                model, batch, dtype, described, device, _parse_params(param), input_shape, vocab, stage, output_held
            )
        else:
            prof = _tune_profile(model, batch, dtype, gpu, _parse_params(param), spec, profile_file)
        budget_bytes = profile_budget(budget, prof, optimizer)  # a bad budget is refused before compiling
        compiles = compile_whole == "on" or (compile_whole == "auto" and device == "cuda")
        if profile_file is None and is_factory(model) and compiles:
            prof = _factory_compiler_points(
                model, batch, device, _parse_params(param), input_shape, vocab, prof, optimizer
            )
        advice = missing_calibration(prof) if headroom is None else None
        if advice:
            err.print(f"[yellow]warning:[/] {advice}")
        if not as_json:  # NOTE [ Bound beside the search ]
            from memtune.api.bound_beside import BoundBeside

            beside = BoundBeside(prof, optimizer, budget_bytes)
        with Progress(
            TextColumn("[bold]tuning[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[best]}"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
            disable=not err.is_terminal and as_json,
        ) as bar:
            task = bar.add_task(f"{prof.model} b{prof.batch}", total=trials, best="")

            def tick(done: int, total: int, best: Any) -> None:
                shown = f"best {best.step_ms:.2f} ms" if best is not None else "no feasible plan yet"
                bar.update(task, completed=done, total=total, best=shown)

            result = run_tune(
                prof,
                budget_bytes,
                trials=trials,
                mode="pareto" if pareto else "fastest",
                seed=seed,
                storage=storage,
                study_name=study,
                optimizer=optimizer,
                progress=tick,
                headroom=planning_headroom(prof) if headroom is None else headroom,
            )
    except (ProfilerError, TunerError, ValueError, OSError) as exc:
        if beside is not None:
            beside.close()
        raise _fail(str(exc)) from exc
    except BaseException:
        if beside is not None:
            beside.close()
        raise
    if plan_out is not None and result.best is not None:
        plan_out.write_text(result.best.plan.model_dump_json(indent=1) + "\n")
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict()) + "\n")
        return
    try:
        _print_tuned(result, prof, budget_bytes, optimizer, pareto, beside)
    finally:
        if beside is not None:
            beside.close()


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
    import optuna
    import torch

    from memtune.profiler.factory import is_factory
    from memtune.profiler.provenance import run_record

    _check_arguments(dtype=dtype, budget=budget)
    run = run_record()  # NOTE [ Run record ]: what the JSON says made it
    if is_factory(model):
        try:
            sweep_budgets = _activation_budgets(compiler_sweep, "--compiler-sweep") if compiler_sweep else None
        except ValueError as exc:
            raise _fail(str(exc)) from exc
        if peers and sweep_budgets is None:
            from memtune.tuner.runtime.module_peers import COMPILER_SWEEP

            sweep_budgets = list(COMPILER_SWEEP)
        _factory_bench(model, batch, budget, trials, _parse_params(param), input_shape, vocab, stage, iters, warmup,
                       json_out, run, sweep_budgets if peers else None)  # fmt: skip
        return

    from memtune.tuner import POLICIES
    from memtune.tuner import simulate as run_sim
    from memtune.tuner import tune as run_tune
    from memtune.tuner.runtime.bench import BenchRow, bench_plans
    from memtune.tuner.runtime.whole import measure_compiler_points, with_compiler_points

    if not torch.cuda.is_available():
        raise _fail("memtune bench measures on a CUDA GPU and none is available here; use `memtune simulate` on a CPU")
    from memtune.tuner.runtime.guard import configure_allocator

    err.print(f"allocator: PYTORCH_CUDA_ALLOC_CONF={configure_allocator()}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from memtune.tuner.runtime.first_use import present_gpu, zoo_profile

    ident = present_gpu()
    assert ident is not None  # CUDA is available (checked above)
    params = _parse_params(param)
    chain = load_chain(model, params)
    from memtune.profiler import build as build_chain

    factory = functools.partial(build_chain, model, params or {}) if isolate else None
    try:
        if profile_file is not None:
            prof = Profile.load(profile_file)
            if prof.device.key != ident.key or (prof.batch, prof.dtype) != (batch, dtype):
                raise _fail(
                    f"--profile {profile_file}: it describes {prof.model} batch {prof.batch} {prof.dtype} on "
                    f"{prof.device.key}, not batch {batch} {dtype} on this {ident.key}"
                )
        else:  # NOTE [ First use of a GPU type ]: measured in a child, so this process holds no GPU memory
            prof = zoo_profile(model, params, batch, dtype, progress=lambda what: err.print(f"{what} …"))
    except (ProfilerError, TunerError) as exc:
        raise _fail(str(exc)) from exc
    base_peak = run_sim(prof, Plan.uniform(prof.n_stages)).peak_bytes
    try:
        fractions = [float(f) for f in sweep.split(",")] if sweep else []
        headrooms = [float(h) for h in headroom.split(",")] if headroom else []
        compile_budgets = _activation_budgets(compiled, "--compiled")
        compiler_budgets = _activation_budgets(compiler_sweep, "--compiler-sweep")
        text = budget.strip()
        main_budget = Budget.parse(text).resolve(gpu_memory_bytes=ident.memory_bytes, peak_bytes=base_peak)
    except (ValueError, TunerError) as exc:
        raise _fail(str(exc)) from exc
    plans: list[tuple[str, str, Plan]] = [
        (name, "policy", fn(prof, main_budget)) for name, fn in POLICIES.items() if policies and name != "none"
    ]
    calibrated = calibration_for(ident.key).headroom
    if no_choice and not prof.has_conv_algos:
        err.print(f"--no-choice: the {prof.model} profile has no cuDNN algorithm tables; there is no choice to compare")
    plain_profile = prof.without_conv_algos() if no_choice and prof.has_conv_algos else None
    if no_selective and not prof.has_selective:
        err.print(
            f"--no-selective: the {prof.model} profile has no selective measurements; there is nothing to compare"
        )
    unselective = prof.without_selective() if no_selective and prof.has_selective else None
    done: list[BenchRow] = []

    def save(row: BenchRow) -> None:
        """Write every row measured so far, so that an interrupted run still leaves its results."""
        done.append(row)
        if json_out is not None:
            json_out.write_text(
                json.dumps(
                    {
                        "model": prof.model,
                        "batch": batch,
                        "dtype": dtype,
                        "device": prof.device.model_dump(),
                        "unconstrained_simulated_peak_bytes": base_peak,
                        # NOTE [ Batch split ]: what fastest_within could choose (benchmarks.retry_cost.read_run)
                        "profile_split_rows": prof.has_split_rows,
                        "run": run,
                        "rows": [r.to_dict() for r in done],
                    },
                    indent=1,
                )
                + "\n"
            )

    def show(name: str) -> None:
        err.print(f"  measuring {name}")

    compiler_rows: list[BenchRow] = []
    if compiler_budgets:  # NOTE [ Whole-model compile ]: measured first, so that memtune's plans may compile whole
        err.print(f"  the whole model compiled at activation budgets {', '.join(f'{b:g}' for b in compiler_budgets)}")
        if factory is None:
            raise _fail("--compiler-sweep measures each budget in a fresh process: leave out --no-isolate")
        points, compiler_rows = measure_compiler_points(
            factory, prof, compiler_budgets, warmup=warmup, iters=iters, progress=show, on_row=save
        )
        prof = with_compiler_points(prof, points)
    try:  # NOTE [ Compiled stages ]: measured in children and kept, as the eager profile
        compiled_profiles = {
            b: zoo_profile(model, params, batch, dtype, compile_budget=b, progress=lambda w: err.print(f"{w} …"))
            for b in compile_budgets
        }
    except (ProfilerError, TunerError) as exc:
        raise _fail(str(exc)) from exc

    def tuned_compiled(budget_bytes: int) -> Plan | None:
        """memtune's fastest compiled plan within the budget over every compiled profile (its budget chosen too)."""
        found = [run_tune(p, budget_bytes, trials=trials, headroom=calibrated).best for p in compiled_profiles.values()]
        best = min((c for c in found if c is not None), key=lambda c: c.step_ms, default=None)
        return None if best is None else best.plan

    #: (budget, plan) of every tuned plan found with algorithm choice and without, at the calibrated headroom: a
    #: larger budget's search starts from those of smaller ones, which fit it too
    found_at: list[tuple[int, Plan]] = []

    def tuned(profile_: Profile, budget_bytes: int, h: float) -> Plan | None:
        seeds = [p for b, p in found_at if b <= budget_bytes] if h == calibrated else []
        found = run_tune(profile_, budget_bytes, trials=trials, headroom=h, seeds=seeds).best
        if found is None:
            return None
        if h == calibrated:
            found_at.append((budget_bytes, found.plan))
        return found.plan

    def tuned_without_choice(budget_bytes: int, h: float) -> Plan | None:
        """The best plan without algorithm choice (``--no-choice``), or None (not asked, or nothing fits)."""
        return None if plain_profile is None else tuned(plain_profile, budget_bytes, h)

    for h in sorted({calibrated, *headrooms}):
        plain = tuned_without_choice(main_budget, h)  # first: a seed of the joint search
        unsel = None if unselective is None else tuned(unselective, main_budget, h)
        best = tuned(prof, main_budget, h)
        if best is None:
            err.print(f"  no plan fits {format_bytes(main_budget)} at headroom {h:.0%}")
        else:
            knobs = f"{best.sync}, la {best.prefetch_lookahead}, {best.conv_rule}"
            plans.append((f"tuned (headroom {h:.0%}; {knobs})", "tuned", best))
            if plain is not None:
                plans.append((f"tuned (headroom {h:.0%}), no algorithm choice", "tuned", plain))
            if unsel is not None:
                plans.append((f"tuned (headroom {h:.0%}), no selective stages", "tuned", unsel))
            if variants:
                plans.append((f"tuned {h:.0%}, sync layer", "variant", best.with_(sync="layer")))
                plans.append((f"tuned {h:.0%}, lookahead 8", "variant", best.with_(prefetch_lookahead=8)))
    if compiled_profiles and (fast := tuned_compiled(main_budget)) is not None:
        plans.append((f"memtune compiled@{fast.compile_budget:g} (headroom {calibrated:.0%})", "compiled-tuned", fast))
    elif compiled_profiles:
        err.print(f"  no compiled plan fits {format_bytes(main_budget)}")
    if variants:
        every = Plan.uniform(prof.n_stages, Action.OFFLOAD, label="all offload")
        plans += [
            ("all offload, deferred", "variant", every),
            ("all offload, layer", "variant", every.with_(sync="layer")),
        ]

    def measure_more(
        budget_bytes: int,
        more: list[tuple[str, str, Plan]],
        *,
        pytorch_builtins: bool = False,
        progress: Callable[[str], None] | None = None,
        peers: bool = False,
    ) -> list[BenchRow]:
        """Rows at another budget, or PyTorch's built-ins (the unconstrained row is measured once, first)."""
        return bench_plans(
            chain,
            prof,
            batch,
            dtype,
            budget_bytes,
            more,
            pytorch_builtins=pytorch_builtins,
            capped_builtins=cap_builtins,
            warmup=warmup,
            iters=iters,
            progress=progress,
            on_row=save,
            chain_factory=factory,
            unconstrained=False,
            compiled_profiles=compiled_profiles,
            compiler_budgets=(),
            offload_peer=offload_peer and peers,
        )

    rows = bench_plans(
        chain,
        prof,
        batch,
        dtype,
        main_budget,
        plans,
        pytorch_builtins=False,
        warmup=warmup,
        iters=iters,
        progress=show,
        on_row=save,
        chain_factory=factory,
        compiled_profiles=compiled_profiles,
    )
    for frac in sorted(fractions):
        b = int(frac * base_peak)
        plain = tuned_without_choice(b, calibrated)
        unsel = None if unselective is None else tuned(unselective, b, calibrated)
        found = tuned(prof, b, calibrated)
        at_budget = []
        if found is None:
            err.print(f"  no plan fits {frac:.0%} of the peak ({format_bytes(b)})")
        else:
            at_budget.append((f"tuned@{frac:.0%} (headroom {calibrated:.0%})", "tuned", found))
        if plain is not None:
            at_budget.append((f"tuned@{frac:.0%}, no algorithm choice", "tuned", plain))
        elif plain_profile is not None:
            err.print(f"  without algorithm choice no plan fits {frac:.0%} of the peak ({format_bytes(b)})")
        if unsel is not None:
            at_budget.append((f"tuned@{frac:.0%}, no selective stages", "tuned", unsel))
        if compiled_profiles and (fast := tuned_compiled(b)) is not None:
            at_budget.append((f"memtune compiled@{fast.compile_budget:g}, {frac:.0%}", "compiled-tuned", fast))
        elif compiled_profiles:
            err.print(f"  no compiled plan fits {frac:.0%} of the peak ({format_bytes(b)})")
        if not at_budget:
            continue
        rows += measure_more(b, at_budget)
    rows[1:1] = compiler_rows  # after the unconstrained row, which the table's ratios divide by
    if builtins or offload_peer:
        # last: a built-in that fails in backward (checkpoint_sequential on in-place ReLU) has been seen to leave
        # memory behind for the rows after it (bench_plans reports it as leaked_bytes)
        rows += measure_more(main_budget, [], pytorch_builtins=builtins, progress=show, peers=True)
    base = rows[0].step_ms or float("nan")
    table = Table(
        "configuration",
        "budget GiB",
        "step ms",
        "x unconstr.",
        "peak GiB",
        "tokens/s" if chain.input_kind == "tokens" else "samples/s",  # BenchRow.samples_per_s counts tokens there
        "fits",
        "sim ms",
        "sim err",
        "sim peak GiB",
        "peak err",
        "retries",
        title=f"{prof.model} batch {batch} {dtype} on {ident.name} (torch {torch.__version__})",
        caption="retries: allocations per step that fit the cap only after the allocator released its cache, "
        "measured / predicted by the placement model (its calibrated cost is in sim ms)",
    )
    for row in rows:
        table.add_row(
            row.name,
            _fmt(row.budget_bytes / GiB if row.budget_bytes else None, ".2f"),
            _fmt(row.step_ms, ".1f"),
            _fmt(row.step_ms / base if row.step_ms else None, ".2f"),
            _fmt(row.peak_bytes / GiB if row.peak_bytes else None, ".2f"),
            _fmt(row.samples_per_s, ",.0f"),
            "-" if row.fits is None else ("yes" if row.fits else "no"),
            _fmt(row.predicted_step_ms, ".1f"),
            _fmt(row.step_error, "+.1%"),
            _fmt(row.predicted_peak_bytes / GiB if row.predicted_peak_bytes else None, ".2f"),
            _fmt(row.peak_error, "+.1%"),
            _retries_text(row.alloc_retries, row.predicted_retries),
        )
        if row.error:
            table.add_row(f"  [dim]{row.error}[/]")
        if row.leaked_bytes:
            table.add_row(f"  [yellow]{format_bytes(row.leaked_bytes)} stayed allocated after this row[/]")
    out.print(table)


def _retries_text(measured: float | None, predicted: float | None) -> str:
    """Measured allocator retries per step, and the placement model's prediction where there is one."""
    return _fmt(measured, ".1f") + (f" / {predicted:.1f}" if predicted is not None else "")


def _conv_text(plan: Plan) -> str:
    if plan.conv_rule == "fastest_within" and plan.conv_workspace_limit_bytes is not None:
        return f"fastest within {format_bytes(plan.conv_workspace_limit_bytes)} of workspace"
    return {"default": "framework's choice", "fastest": "fastest", "memory_optimal": "memory-optimal"}[plan.conv_rule]


def _fmt(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _attach_service_commands() -> None:
    import importlib.util

    if importlib.util.find_spec("memtune.api.cli_service") is None:
        return
    from memtune.api.cli_service import register

    register(app)


_attach_service_commands()
