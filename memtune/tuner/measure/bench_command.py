"""``memtune bench``'s measuring body for a zoo model: which plans to measure (every baseline policy, memtune's tuned
plans at each headroom and each fraction of the peak, with and without algorithm choice or selective stages, compiled
plans, diagnosis variants) and their measurement on this GPU (``bench_plans``), each row written to the JSON file as
it comes.

``memtune.api.cli._cli_bench`` finds the profile, parses the options, calls ``measure_bench`` and prints its rows. What
the closures of the command shared is explicit here: ``Searching`` (the searches' settings and the plans found so far)
and ``Measuring`` (what every ``bench_plans`` call of one run takes).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtune.profiler import Profile, ProfilerError
from memtune.tuner._tuner_errors import TunerError
from memtune.tuner.budget import format_bytes
from memtune.tuner.calibration import calibration_for
from memtune.tuner.measure.bench import BenchRow, bench_plans
from memtune.tuner.measure.compiler_points import measure_compiler_points, with_compiler_points
from memtune.tuner.measure.first_use import zoo_profile
from memtune.tuner.plan import Action, Plan
from memtune.tuner.policies import POLICIES
from memtune.tuner.search import tune as run_tune

if TYPE_CHECKING:
    from memtune.profiler import ModelChain

__all__ = ["BenchOptions", "BenchRefused", "Measuring", "Searching", "measure_bench", "measure_more", "tuned"]

#: a plan to measure: (row name, row kind, plan)
Named = tuple[str, str, Plan]


class BenchRefused(TunerError):
    """The run cannot go on as asked (``--compiler-sweep`` without isolation, a compiled profile that could not be
    measured); the message says why, as the command prints it."""


@dataclass(frozen=True)
class BenchOptions:
    """What ``memtune bench`` measures, as its options say.

    ``fractions``: fractions of the unconstrained simulated peak to tune and measure at; ``headrooms``: extra
    headrooms (shares of the budget) at the main budget; ``compile_budgets`` and ``compiler_budgets``: torch.compile
    activation budgets (0 to 1) of compiled profiles and of the whole model compiled; ``warmup`` and ``iters``: steps
    per row; ``trials``: Optuna trials per tuned plan.
    """

    trials: int
    warmup: int
    iters: int
    fractions: Sequence[float] = ()
    headrooms: Sequence[float] = ()
    compile_budgets: Sequence[float] = ()
    compiler_budgets: Sequence[float] = ()
    policies: bool = True
    variants: bool = False
    builtins: bool = True
    cap_builtins: bool = False
    no_choice: bool = False
    no_selective: bool = False
    offload_peer: bool = False


@dataclass
class Searching:
    """The searches of one run: ``trials`` each, ``calibrated`` the GPU type's headroom (a share of the budget),
    ``compiled_profiles`` by activation budget; ``found_at``: (budget bytes, plan) of every tuned plan found at the
    calibrated headroom, with algorithm choice and without: a larger budget's search starts from those of smaller
    ones, which fit it too."""

    trials: int
    calibrated: float
    compiled_profiles: Mapping[float, Profile]
    found_at: list[tuple[int, Plan]] = field(default_factory=list)


@dataclass(frozen=True)
class Measuring:
    """What every ``bench_plans`` call of one run takes besides its budget and plans (NOTE [ Bench isolation ]:
    ``factory`` builds the model in each row's fresh process; None runs the rows here)."""

    chain: ModelChain
    profile: Profile
    batch: int
    dtype: str
    warmup: int
    iters: int
    cap_builtins: bool
    offload_peer: bool
    on_row: Callable[[BenchRow], None]
    factory: Callable[[], ModelChain] | None
    compiled_profiles: Mapping[float, Profile]


def save_rows(path: Path | None, header: Mapping[str, Any], done: list[BenchRow], row: BenchRow) -> None:
    """Keep ``row`` in ``done`` and write every row measured so far under ``header`` to ``path`` (where given), so
    that an interrupted run still leaves its results."""
    done.append(row)
    if path is not None:
        path.write_text(json.dumps({**header, "rows": [r.to_dict() for r in done]}, indent=1) + "\n")


def announce(note: Callable[[str], None], name: str) -> None:
    """Say that row ``name`` is being measured."""
    note(f"  measuring {name}")


def tuned(search: Searching, profile: Profile | None, budget_bytes: int, headroom: float) -> Plan | None:
    """memtune's fastest plan of ``profile`` within ``budget_bytes`` at ``headroom`` (a share of the budget), or None
    (no profile, or nothing fits); at the calibrated headroom seeded by and kept in ``search.found_at``."""
    if profile is None:
        return None
    seeds = [p for b, p in search.found_at if b <= budget_bytes] if headroom == search.calibrated else []
    found = run_tune(profile, budget_bytes, trials=search.trials, headroom=headroom, seeds=seeds).best
    if found is None:
        return None
    if headroom == search.calibrated:
        search.found_at.append((budget_bytes, found.plan))
    return found.plan


def tuned_compiled(search: Searching, budget_bytes: int) -> Plan | None:
    """memtune's fastest compiled plan within the budget over every compiled profile (its budget chosen too)."""
    found = [
        run_tune(p, budget_bytes, trials=search.trials, headroom=search.calibrated).best
        for p in search.compiled_profiles.values()
    ]
    best = min((c for c in found if c is not None), key=lambda c: c.step_ms, default=None)
    return None if best is None else best.plan


def measure_more(
    measuring: Measuring,
    budget_bytes: int,
    more: list[Named],
    *,
    pytorch_builtins: bool = False,
    progress: Callable[[str], None] | None = None,
    peers: bool = False,
) -> list[BenchRow]:
    """Rows at another budget, or PyTorch's built-ins (the unconstrained row is measured once, first)."""
    m = measuring
    return bench_plans(
        m.chain,
        m.profile,
        m.batch,
        m.dtype,
        budget_bytes,
        more,
        pytorch_builtins=pytorch_builtins,
        capped_builtins=m.cap_builtins,
        warmup=m.warmup,
        iters=m.iters,
        progress=progress,
        on_row=m.on_row,
        chain_factory=m.factory,
        unconstrained=False,
        compiled_profiles=m.compiled_profiles,
        compiler_budgets=(),
        offload_peer=m.offload_peer and peers,
    )


def measure_bench(
    model: str,
    params: dict[str, Any],
    chain: ModelChain,
    prof: Profile,
    *,
    batch: int,
    dtype: str,
    gpu_key: str,
    main_budget: int,
    base_peak: int,
    factory: Callable[[], ModelChain] | None,
    options: BenchOptions,
    json_out: Path | None,
    run: dict[str, Any],
    note: Callable[[str], None],
) -> list[BenchRow]:
    """Measure ``model``'s rows at ``main_budget`` and each fraction of ``base_peak`` (the unconstrained simulated
    peak; both bytes) on this GPU (type ``gpu_key``), the unconstrained row first; ``note`` takes what is said on the
    way, ``run`` is the NOTE [ Run record ] the JSON carries.

    Raises:
        BenchRefused: ``--compiler-sweep`` without ``factory``, or a compiled profile could not be measured.
    """
    o = options
    plans: list[Named] = [
        (name, "policy", fn(prof, main_budget)) for name, fn in POLICIES.items() if o.policies and name != "none"
    ]
    calibrated = calibration_for(gpu_key).headroom
    if o.no_choice and not prof.has_conv_algos:
        note(f"--no-choice: the {prof.model} profile has no cuDNN algorithm tables; there is no choice to compare")
    plain_profile = prof.without_conv_algos() if o.no_choice and prof.has_conv_algos else None
    if o.no_selective and not prof.has_selective:
        note(f"--no-selective: the {prof.model} profile has no selective measurements; there is nothing to compare")
    unselective = prof.without_selective() if o.no_selective and prof.has_selective else None
    header = {
        "model": prof.model,
        "batch": batch,
        "dtype": dtype,
        "device": prof.device.model_dump(),
        "unconstrained_simulated_peak_bytes": base_peak,
        # NOTE [ Batch split ]: what fastest_within could choose (benchmarks.retry_cost.read_run)
        "profile_split_rows": prof.has_split_rows,
        "run": run,
    }
    save = functools.partial(save_rows, json_out, header, [])
    show = functools.partial(announce, note)
    compiler_rows: list[BenchRow] = []
    if o.compiler_budgets:  # NOTE [ Whole-model compile ]: measured first, so that memtune's plans may compile whole
        note(f"  the whole model compiled at activation budgets {', '.join(f'{b:g}' for b in o.compiler_budgets)}")
        if factory is None:
            raise BenchRefused("--compiler-sweep measures each budget in a fresh process: leave out --no-isolate")
        points, compiler_rows = measure_compiler_points(
            factory, prof, o.compiler_budgets, warmup=o.warmup, iters=o.iters, progress=show, on_row=save
        )
        prof = with_compiler_points(prof, points)
    try:  # NOTE [ Compiled stages ]: measured in children and kept, as the eager profile
        compiled_profiles = {
            b: zoo_profile(model, params, batch, dtype, compile_budget=b, progress=lambda w: note(f"{w} …"))
            for b in o.compile_budgets
        }
    except (ProfilerError, TunerError) as exc:
        raise BenchRefused(str(exc)) from exc
    search = Searching(o.trials, calibrated, compiled_profiles)
    plans += _main_budget_plans(search, prof, plain_profile, unselective, main_budget, o, note)
    measuring = Measuring(chain, prof, batch, dtype, o.warmup, o.iters, o.cap_builtins, o.offload_peer, save, factory,
                          compiled_profiles)  # fmt: skip
    rows = bench_plans(chain, prof, batch, dtype, main_budget, plans, pytorch_builtins=False, warmup=o.warmup,
                       iters=o.iters, progress=show, on_row=save, chain_factory=factory,
                       compiled_profiles=compiled_profiles)  # fmt: skip
    for frac in sorted(o.fractions):
        rows += _rows_at_fraction(search, measuring, plain_profile, unselective, frac, base_peak, note)
    rows[1:1] = compiler_rows  # after the unconstrained row, which the table's ratios divide by
    if o.builtins or o.offload_peer:
        # last: a built-in that fails in backward (checkpoint_sequential on in-place ReLU) has been seen to leave
        # memory behind for the rows after it (bench_plans reports it as leaked_bytes)
        rows += measure_more(measuring, main_budget, [], pytorch_builtins=o.builtins, progress=show, peers=True)
    return rows


def _main_budget_plans(
    search: Searching,
    prof: Profile,
    plain_profile: Profile | None,
    unselective: Profile | None,
    main_budget: int,
    options: BenchOptions,
    note: Callable[[str], None],
) -> list[Named]:
    """memtune's plans at the main budget (bytes): tuned at the calibrated and each asked headroom (without
    algorithm choice and without selective stages too, where asked), compiled, and the diagnosis variants."""
    plans: list[Named] = []
    calibrated = search.calibrated
    for h in sorted({calibrated, *options.headrooms}):
        plain = tuned(search, plain_profile, main_budget, h)  # first: a seed of the joint search
        unsel = tuned(search, unselective, main_budget, h)
        best = tuned(search, prof, main_budget, h)
        if best is None:
            note(f"  no plan fits {format_bytes(main_budget)} at headroom {h:.0%}")
        else:
            knobs = f"{best.sync}, la {best.prefetch_lookahead}, {best.conv_rule}"
            plans.append((f"tuned (headroom {h:.0%}; {knobs})", "tuned", best))
            if plain is not None:
                plans.append((f"tuned (headroom {h:.0%}), no algorithm choice", "tuned", plain))
            if unsel is not None:
                plans.append((f"tuned (headroom {h:.0%}), no selective stages", "tuned", unsel))
            if options.variants:
                plans.append((f"tuned {h:.0%}, sync layer", "variant", best.with_(sync="layer")))
                plans.append((f"tuned {h:.0%}, lookahead 8", "variant", best.with_(prefetch_lookahead=8)))
    if search.compiled_profiles and (fast := tuned_compiled(search, main_budget)) is not None:
        plans.append((f"memtune compiled@{fast.compile_budget:g} (headroom {calibrated:.0%})", "compiled-tuned", fast))
    elif search.compiled_profiles:
        note(f"  no compiled plan fits {format_bytes(main_budget)}")
    if options.variants:
        every = Plan.uniform(prof.n_stages, Action.OFFLOAD, label="all offload")
        plans += [
            ("all offload, deferred", "variant", every),
            ("all offload, layer", "variant", every.with_(sync="layer")),
        ]
    return plans


def _rows_at_fraction(
    search: Searching,
    measuring: Measuring,
    plain_profile: Profile | None,
    unselective: Profile | None,
    frac: float,
    base_peak: int,
    note: Callable[[str], None],
) -> list[BenchRow]:
    """memtune's plans tuned at ``frac`` of ``base_peak`` (bytes) at the calibrated headroom, measured; none where
    none fits."""
    b = int(frac * base_peak)
    calibrated = search.calibrated
    plain = tuned(search, plain_profile, b, calibrated)
    unsel = tuned(search, unselective, b, calibrated)
    found = tuned(search, measuring.profile, b, calibrated)
    at_budget: list[Named] = []
    if found is None:
        note(f"  no plan fits {frac:.0%} of the peak ({format_bytes(b)})")
    else:
        at_budget.append((f"tuned@{frac:.0%} (headroom {calibrated:.0%})", "tuned", found))
    if plain is not None:
        at_budget.append((f"tuned@{frac:.0%}, no algorithm choice", "tuned", plain))
    elif plain_profile is not None:
        note(f"  without algorithm choice no plan fits {frac:.0%} of the peak ({format_bytes(b)})")
    if unsel is not None:
        at_budget.append((f"tuned@{frac:.0%}, no selective stages", "tuned", unsel))
    if search.compiled_profiles and (fast := tuned_compiled(search, b)) is not None:
        at_budget.append((f"memtune compiled@{fast.compile_budget:g}, {frac:.0%}", "compiled-tuned", fast))
    elif search.compiled_profiles:
        note(f"  no compiled plan fits {frac:.0%} of the peak ({format_bytes(b)})")
    if not at_budget:
        return []
    return measure_more(measuring, b, at_budget)
