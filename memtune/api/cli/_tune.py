"""``memtune tune``'s body: find the profile to search (a given file, this GPU's measured on first use, a shipped or a
modeled one, or a factory model measured here), search the fastest plan within the budget (or the Pareto front) and
print the baselines, the best plan, its lower bound and the front; ``--inference`` goes to ``cli_inference``.

``memtune.api.cli._commands`` keeps the Typer command (its options and help) and calls ``tune_command``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from memtune.api.cli._cli_profile import factory_profile
from memtune.api.cli._common import (
    check_options,
    err,
    fail,
    load_chain,
    out,
    parse_params,
    print_profile_checks,
    resolve_profile,
    sample_shape,
)
from memtune.profiler import Profile, ProfilerError
from memtune.tuner import BoundError, Plan, TunerError, format_bytes
from memtune.tuner.budget import bytes_unit, profile_budget, search_budget
from memtune.tuner.pipeline import calibration_advice, search_plans
from memtune.tuner.plan import PlanKind

if TYPE_CHECKING:
    from memtune.api.cli._bound_beside import BoundBeside
    from memtune.profiler import ModelChain
    from memtune.profiler.region_profile import RegionProfile
    from memtune.tuner import TuneResult
    from memtune.tuner.budget import Budget
    from memtune.tuner.finalists import Finalist
    from memtune.tuner.region_plans import RegionTrial

__all__ = ["tune_command"]


def tune_command(
    model: str,
    *,
    batch: int,
    dtype: str,
    gpu: str | None,
    budget: str,
    trials: int,
    pareto: bool,
    seed: int,
    param: list[str] | None,
    spec: Path | None,
    profile_file: Path | None,
    optimizer: str,
    storage: str | None,
    study: str | None,
    plan_out: Path | None,
    headroom: float | None,
    device: str,
    input_shape: str | None,
    vocab: int | None,
    stage: list[str] | None,
    output_held: bool,
    as_json: bool,
    inference: bool,
    measure: bool,
    conv_workspace: str,
    compile_whole: str,
    finalists: int = 3,
) -> None:
    """``memtune tune``: the options as the command takes them (batch in samples, ``headroom`` a share of the
    budget); prints the search's report, or its JSON, and writes the best plan to ``plan_out`` where given."""
    import optuna

    from memtune.profiler.factory import is_factory

    wanted = check_options(dtype=dtype, gpu=gpu, budget=budget, optimizer=optimizer, headroom=headroom)
    assert wanted is not None  # --budget is required
    if measure and not inference:
        raise fail("--measure runs an inference plan: add --inference (`memtune bench` measures training plans)")
    if compile_whole not in ("auto", "on", "off"):
        raise fail(f"--compile {compile_whole!r}: use auto, on or off")
    if compile_whole == "on" and (profile_file is not None or not is_factory(model)):
        raise fail(
            "--compile on measures a factory model compiled whole; a zoo model's or a spec's compiler points come "
            "from `memtune profile --device cuda --compiler-sweep 1,0.5,0.25 --output p.json`, then --profile p.json"
        )
    if inference:  # NOTE [ Inference plans ] in memtune.tuner.inference._inference_plan
        chain = _inference_chain(model, param, spec)
        profile = functools.partial(resolve_profile, chain, batch, dtype, gpu or "h200", profile_file)
        _run_inference(chain, batch, dtype, budget, device, measure, conv_workspace, profile, as_json, plan_out)
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    beside: BoundBeside | None = None
    try:  # NOTE [ One pipeline ] in memtune.tuner.pipeline: the profile, its budget, the advice, the search, the bound
        prof, budget_bytes, regions, live = _searched_profile(
            model, batch, dtype, gpu, wanted, param, spec, profile_file, optimizer, device, input_shape, vocab, stage,
            output_held, compile_whole,
        )  # fmt: skip
        advice = calibration_advice(prof, headroom)
        if advice:
            err.print(f"[yellow]warning:[/] {advice}")
        if not as_json:  # NOTE [ Bound beside the search ]
            from memtune.api.cli._bound_beside import BoundBeside

            beside = BoundBeside(prof, optimizer, budget_bytes)
        result = _search(prof, budget_bytes, trials=trials, pareto=pareto, seed=seed, storage=storage, study=study,
                         optimizer=optimizer, headroom=headroom, as_json=as_json)  # fmt: skip
        result, trials_done, results = _with_regions(result, regions, budget_bytes, trials, seed, optimizer, headroom)
        measured: tuple[Finalist, ...] = ()
        if live is not None:  # NOTE [ Measured finalists ] in memtune.tuner.finalists
            result, measured = _finalists(live, result, results, optimizer, output_held, finalists)
    except (ProfilerError, TunerError, ValueError, OSError) as exc:
        if beside is not None:
            beside.close()
        raise fail(str(exc)) from exc
    except BaseException:
        if beside is not None:
            beside.close()
        raise
    if plan_out is not None and result.best is not None:
        plan_out.write_text(result.best.plan.model_dump_json(indent=1) + "\n")
    if as_json:
        regions_json = {"compiled_regions": [t.line() for t in trials_done]} if trials_done else {}
        finals = {"finalists": [dataclasses.asdict(f) for f in measured]} if measured else {}
        sys.stdout.write(json.dumps({**result.to_dict(), **regions_json, **finals}) + "\n")
        return
    if measured and result.best is None:  # NOTE [ Measured finalists ], step 5: none ran, none served
        _print_measured(measured)
        if beside is not None:
            beside.close()
        raise fail(f"no plan ran within {format_bytes(budget_bytes)} on this GPU (above); none is served")
    try:
        region_profiles = [r.profile for r in regions if r.profile is not None]
        _print_tuned(result, prof, budget_bytes, optimizer, pareto, beside, trials_done, region_profiles)
        if measured:  # NOTE [ Measured finalists ] in memtune.tuner.finalists
            _print_measured(measured)
    finally:
        if beside is not None:
            beside.close()


def _print_measured(measured: tuple[Finalist, ...]) -> None:
    """The finalists (and fallbacks) measured before serving, one line each."""
    out.print("measured before serving (training steps under the budget's cap, the update included):")
    for f in measured:
        out.print(f"  {f.line()}", markup=False)


def _searched_profile(
    model: str,
    batch: int,
    dtype: str,
    gpu: str | None,
    budget: Budget,
    param: list[str] | None,
    spec: Path | None,
    profile_file: Path | None,
    optimizer: str,
    device: str,
    input_shape: str | None,
    vocab: int | None,
    stage: list[str] | None,
    output_held: bool,
    compile_whole: str,
) -> tuple[Profile, int, list[RegionProfile], tuple[Any, Any] | None]:
    """The profile ``tune`` searches, its budget in bytes, the compiled-region profiles beside it and, for a factory
    model compiled on CUDA, the model and its batch (its finalists are measured on them, NOTE [ Measured finalists ]):
    a factory model measured on ``device`` (and, as ``compile_whole`` says, compiled whole and in regions too, NOTE
    [ Compiled-region candidates ] in ``memtune.tuner.region_plans``), else ``_tune_profile``'s and no regions; a bad
    budget is refused before compiling."""
    from memtune.profiler.factory import is_factory

    if profile_file is None and is_factory(model):
        described = (gpu or "h200") if device == "cpu" else None  # on CUDA the device is the GPU type
        prof = factory_profile(
            model, batch, dtype, described, device, parse_params(param), input_shape, vocab, stage, output_held
        )
    else:
        prof = _tune_profile(model, batch, dtype, gpu, parse_params(param), spec, profile_file)
    budget_bytes = profile_budget(budget, prof, optimizer)  # a bad budget is refused before compiling
    compiles = compile_whole == "on" or (compile_whole == "auto" and device == "cuda")
    if profile_file is None and is_factory(model) and compiles:
        prof, regions, live = _factory_compiled(
            model, batch, device, parse_params(param), input_shape, vocab, prof, optimizer, stage, dtype, output_held
        )
        return prof, budget_bytes, regions, live if device == "cuda" else None
    return prof, budget_bytes, [], None


def _search(
    prof: Profile,
    budget_bytes: int,
    *,
    trials: int,
    pareto: bool,
    seed: int,
    storage: str | None,
    study: str | None,
    optimizer: str,
    headroom: float | None,
    as_json: bool,
) -> TuneResult:
    """The search (``memtune.tuner.pipeline.search_plans``) within ``budget_bytes``, with a progress bar on standard
    error showing the best step in ms; ``headroom`` (a share of the budget) None takes the profile's planning
    headroom."""
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

        return search_plans(
            prof,
            budget_bytes,
            trials=trials,
            mode="pareto" if pareto else "fastest",
            seed=seed,
            storage=storage,
            study_name=study,
            optimizer=optimizer,
            progress=tick,
            headroom=headroom,
        )


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
        from memtune.tuner.measure.first_use import present_gpu, zoo_profile

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


def _factory_compiled(
    model: str,
    batch: int,
    device: str,
    params: dict[str, Any],
    input_shape: str | None,
    vocab: int | None,
    prof: Profile,
    optimizer: str,
    stage: list[str] | None,
    dtype: str,
    output_held: bool,
) -> tuple[Profile, list[RegionProfile], tuple[Any, Any]]:
    """``prof`` with the factory model compiled whole at activation budgets 1, 0.5 and 0.25, measured on ``device``
    (NOTE [ Compiler points of a module ]), and the model's region partitions profiled compiled at those budgets and
    under memtune's save rules (NOTE [ Compiled-region candidates ]), and the model and batch measured; what fails to
    compile is reported and left out."""
    from memtune.profiler import build_factory
    from memtune.profiler.factory import factory_inputs
    from memtune.profiler.region_profile import profile_regions
    from memtune.tuner.measure.compiler_points import measure_module_points, with_compiler_points
    from memtune.tuner.measure.host_price import host_priced
    from memtune.tuner.measure.tune_module import COMPILE_BUDGETS

    net = build_factory(model, params).to(device)  # the same architecture: the points do not depend on the weights
    x = factory_inputs(batch, sample_shape(input_shape), vocab=vocab, device=device)
    with err.status("compiling the whole model") as status:
        points, errors = measure_module_points(
            net, x, prof, COMPILE_BUDGETS, optimizer=optimizer, progress=lambda _d, _t, what: status.update(what)
        )
    for budget, error in errors.items():
        err.print(f"[yellow]warning:[/] compiling at activation budget {budget:g} failed ({error}); plans stay eager")
    described = None if device == "cuda" else prof.device.key  # a CPU profile describes a GPU (NOTE [ Regions ])
    with err.status("compiling regions") as status:
        regions = profile_regions(
            net, x, COMPILE_BUDGETS, stages=stage, dtype=dtype, gpu=described, output_held=output_held,
            progress=lambda done, total, what: status.update(f"compiling regions {done + 1}/{total}: {what}"),
        )  # fmt: skip
    for run in regions:
        if run.error is not None:
            err.print(
                f"[yellow]warning:[/] compiled regions {run.partition.label} at {run.policy} failed ({run.error})"
            )
    with err.status("pricing the host") as status:  # NOTE [ Host prices ]; nothing off CUDA
        regions = host_priced(net, x, regions, output_held=output_held,
                              progress=lambda done, total, what: status.update(f"pricing the host {done + 1}/{total}: "
                                                                               f"{what}"))  # fmt: skip
    return with_compiler_points(prof, points), regions, (net, x)


def _with_regions(
    result: TuneResult,
    regions: list[RegionProfile],
    budget_bytes: int,
    trials: int,
    seed: int,
    optimizer: str,
    headroom: float | None,
) -> tuple[TuneResult, list[RegionTrial], list[TuneResult]]:
    """``result`` or, where a compiled-region profile's best plan is faster, that search's result; with every region
    profile's line (NOTE [ Compiled-region candidates ] in ``memtune.tuner.region_plans``) and every search's result,
    ``result``'s first."""
    from memtune.tuner.region_plans import fastest, weigh_all

    def search(run: RegionProfile, profile: Profile) -> TuneResult:
        with err.status(f"tuning regions {run.partition.label} at {run.policy}"):
            return search_plans(profile, budget_bytes, trials=trials, seed=seed, optimizer=optimizer,
                                headroom=headroom)  # fmt: skip

    results, trials_done = weigh_all(result, regions, search)
    return fastest(results), trials_done, results


def _finalists(
    live: tuple[Any, Any],
    result: TuneResult,
    results: list[TuneResult],
    optimizer: str,
    output_held: bool,
    limit: int,
) -> tuple[TuneResult, tuple[Finalist, ...]]:
    """The result to serve and the finalists measured on the factory model ``live`` (model, batch) on its CUDA device
    (NOTE [ Measured finalists ] in ``memtune.tuner.finalists``); ``result`` and none where ``limit`` is 0 or no plan
    fits."""
    from memtune.profiler.module_profile import default_loss
    from memtune.tuner.finalists import none_ran
    from memtune.tuner.measure.finalists import measure_finalists
    from memtune.tuner.tuned import Tuned

    if not limit or result.best is None:
        return result, ()
    net, x = live
    with err.status("measuring finalists") as status:
        tuned = measure_finalists(net, x, Tuned(result, None, searched=tuple(results)), default_loss,
                                  optimizer=optimizer, output_held=output_held, limit=limit,
                                  progress=lambda done, total, what: status.update(
                                      f"measuring finalist {min(done + 1, total)}/{total}: {what}"))  # fmt: skip
    note = none_ran(tuned.measured)
    if note is not None:
        err.print(f"[yellow]warning:[/] {escape(note)}")
    return tuned.result, tuned.measured


def _inference_chain(model: str, param: list[str] | None, spec: Path | None) -> ModelChain:
    """The chain ``tune --inference`` plans: a zoo model or a JSON spec (NOTE [ Inference plans ])."""
    from memtune.profiler.factory import is_factory

    if is_factory(model):
        raise fail("--inference plans zoo models and JSON specs (--spec); describe a factory's model as a spec")
    try:
        return load_chain(model, parse_params(param), spec)
    except (ProfilerError, ValueError, OSError) as exc:
        raise fail(str(exc)) from exc


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
    (``memtune.api.cli._cli_inference``)."""
    from memtune.api.cli._cli_inference import tune_inference

    try:
        tune_inference(chain, batch=batch, dtype=dtype, budget=budget, device=device, measure=measure, profile=profile,
                       as_json=as_json, plan_out=plan_out, out=out, err=err, conv_workspace=conv_workspace)  # fmt: skip
    except (ProfilerError, TunerError, ValueError, OSError) as exc:
        raise fail(str(exc)) from exc


def _print_tuned(
    result: TuneResult,
    prof: Profile,
    budget_bytes: int,
    optimizer: str,
    pareto: bool,
    bound: BoundBeside | None = None,
    regions: Sequence[RegionTrial] = (),
    region_profiles: Sequence[Profile] = (),
) -> None:
    """``tune``'s report: the baselines, the compiled-region candidates (``regions``, measured as
    ``region_profiles``), the best plan in words or stage by stage, its bounds (``bound``'s where given, NOTE [ Bound
    beside the search ]), the Pareto front; every size in one unit, the table's."""
    from memtune.tuner import Simulator
    from memtune.tuner.bound import step_lower_bound
    from memtune.tuner.compiled_bound import compiled_lower_bound
    from memtune.tuner.tuned import bound_words, compiled_bound_words, compute_words, device_label, retries_words

    unit, size = bytes_unit(budget_bytes, result.unconstrained.peak_bytes, *(c.peak_bytes for c in result.policies))

    def fmt(n: float) -> str:
        return f"{n / size:.2f} {unit}" if n >= size / 100 else format_bytes(n)

    out.print(
        f"[bold]{prof.model}[/] batch {prof.batch} {prof.dtype} {device_label(prof)} — profile {prof.source} "
        f"({compute_words(prof)}); {result.n_trials} trials, seed {result.seed}"
    )
    print_profile_checks(prof)
    out.print(_policy_table(result, unit, size))
    if regions:  # NOTE [ Compiled-region candidates ] in memtune.tuner.region_plans
        out.print("compiled regions (each partition of the model compiled at one activation budget or save rule):")
        for trial in regions:
            out.print(f"  {trial.line()}", markup=False)
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
    if best.plan.kind is not PlanKind.WHOLE_COMPILE:
        out.print(_plan_table(result.profile, best.plan))
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
    except BoundError as exc:  # the solver gave no answer: the plan stands, without its bound
        out.print(f"  [dim]no lower bound: {exc}[/]")
    compiled = compiled_lower_bound([prof, *region_profiles], budget_bytes, optimizer)  # None: no compiled candidate
    if compiled is not None:
        out.print(f"  [dim]{compiled_bound_words(compiled, fmt(budget_bytes))}[/]")
    if pareto:
        table = Table("step ms", f"peak {unit}", "plan", title="Pareto front (time vs memory)")
        for c in result.pareto:
            table.add_row(f"{c.step_ms:.2f}", f"{c.peak_bytes / size:.2f}", c.name)
        out.print(table)


def _policy_table(result: TuneResult, unit: str, size: int) -> Table:
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


def _lookahead_text(plan: Plan) -> str:
    """The plan's prefetch lookahead: one number, or the per-stage range (NOTE [ Prefetch lookahead ])."""
    per_stage = plan.prefetch_lookaheads
    if per_stage is None:
        return str(plan.prefetch_lookahead)
    return f"per stage {min(per_stage)}-{max(per_stage)}"


def _conv_text(plan: Plan) -> str:
    if plan.conv_rule == "fastest_within" and plan.conv_workspace_limit_bytes is not None:
        return f"fastest within {format_bytes(plan.conv_workspace_limit_bytes)} of workspace"
    return {"default": "framework's choice", "fastest": "fastest", "memory_optimal": "memory-optimal"}[plan.conv_rule]
