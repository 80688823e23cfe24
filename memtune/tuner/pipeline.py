"""Profiles to plans: the arguments checked, the budget read once, the search at the default headroom, the bounds.

``memtune.tune`` (``memtune.tuner.measure.tune_module``, which measures a model first) and ``memtune tune`` (the
command line, ``memtune.api.cli._tune``) both go through here, each with its own progress display; a benchmark that
measures once and tunes at several budgets calls ``tune_profiles`` directly. Pure Python (no torch).

# NOTE [ One pipeline ]
A budget is read once, by ``check_arguments`` (which refuses it before any profiling), and resolved in bytes once, by
``memtune.tuner.budget.profile_budget`` on the profile searched; the headroom a search keeps free is the caller's or,
left out, ``search_headroom``'s (the GPU type's calibration widened by the profile's self-check); the advice to
calibrate a GPU type is ``calibration_advice``'s. The Python face and the command line print differently (a ``Tuned``
and its ``str``; tables on the console), but decide the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, overload

from memtune.tuner._peak_check import planning_headroom
from memtune.tuner._tuner_errors import BoundError, TunerError
from memtune.tuner.budget import Budget
from memtune.tuner.simulator import OPTIMIZERS, Simulator
from memtune.tuner.tuned import Tuned

if TYPE_CHECKING:
    from memtune.profiler import Profile
    from memtune.profiler.region_profile import RegionProfile
    from memtune.tuner._search_results import Mode
    from memtune.tuner.bound import StepBound
    from memtune.tuner.search import Candidate, TuneResult

__all__ = [
    "DTYPES",
    "calibration_advice",
    "check_arguments",
    "progress_bar",
    "search_headroom",
    "search_plans",
    "tune_profiles",
]

#: the dtypes a step is profiled in: ``float32``, or ``bfloat16``/``float16`` under autocast
DTYPES = ("float32", "bfloat16", "float16")


@overload
def check_arguments(
    *,
    budget: str | int | Budget,
    optimizer: str | None = None,
    dtype: str | None = None,
    gpu: str | None = None,
    trials: int | None = None,
    headroom: float | None = None,
) -> Budget: ...


@overload
def check_arguments(
    *,
    budget: None = None,
    optimizer: str | None = None,
    dtype: str | None = None,
    gpu: str | None = None,
    trials: int | None = None,
    headroom: float | None = None,
) -> None: ...


def check_arguments(
    *,
    budget: str | int | Budget | None = None,
    optimizer: str | None = None,
    dtype: str | None = None,
    gpu: str | None = None,
    trials: int | None = None,
    headroom: float | None = None,
) -> Budget | None:
    """Refuse a bad argument before any profiling, each error naming the argument and what it accepts; ``None``
    skips a check. ``tune`` and the command line call it first, so a typo costs no minutes of measuring.

    Returns:
        ``budget`` read (NOTE [ One pipeline ]): resolve it in bytes with ``profile_budget``; None without one.

    Raises:
        BudgetError: ``budget`` is not in the grammar (NOTE [ Budget grammar ]).
        UnknownGPUError: ``gpu`` is no GPU type memtune knows (the message lists them).
        TunerError: ``optimizer``, ``dtype``, ``trials`` or ``headroom`` is not one the search takes.
    """
    wanted = Budget.parse(budget) if budget is not None else None
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise TunerError(f"optimizer {optimizer!r} is not known: use sgd (momentum), adam or none")
    if dtype is not None and dtype not in DTYPES:
        raise TunerError(f"dtype {dtype!r} is not known: use float32, bfloat16 or float16 (autocast)")
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
        raise TunerError(f"trials must be a whole number of at least 1, not {trials!r}")
    if headroom is not None and not 0.0 <= headroom < 1.0:
        raise TunerError(f"headroom {headroom!r} is not a fraction of the budget in [0, 1), e.g. 0.1")
    if gpu is not None:
        from memtune.profiler import get_gpu

        get_gpu(gpu)
    return wanted


def search_headroom(profile: Profile, headroom: float | None) -> float:
    """The share of the budget a search of ``profile`` keeps free for the caching allocator: ``headroom`` where
    given, else ``planning_headroom`` (the GPU type's calibration, widened by the simulator's measured
    under-prediction of the profile's unplanned step; NOTE [ Profile self-check ])."""
    return planning_headroom(profile) if headroom is None else headroom


def calibration_advice(profile: Profile, headroom: float | None) -> str | None:
    """What to do about a measured profile whose GPU type has no calibration, as advice to print; None where it has
    one, the profile is modeled, or ``headroom`` was given (the calibration's is not used then)."""
    from memtune.tuner.calibration import missing_calibration

    return missing_calibration(profile) if headroom is None else None


@contextmanager
def progress_bar(label: str, enabled: bool) -> Iterator[Callable[[int, int, str], None]]:
    """A rich progress bar on standard error; yields ``update(done, total, text)`` (a no-op when not ``enabled``)."""
    if not enabled:
        yield lambda _done, _total, _text: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(f"[bold]{label}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("", total=None)
        yield lambda done, total, text: bar.update(task, completed=done, total=total, description=text)


def search_plans(
    profile: Profile,
    budget_bytes: int,
    *,
    trials: int,
    seed: int,
    optimizer: str,
    headroom: float | None,
    progress: Callable[[int, int, Candidate | None], None] | None = None,
    mode: Mode = "fastest",
    storage: str | None = None,
    study_name: str | None = None,
) -> TuneResult:
    """The search (``memtune.tuner.search.tune``) of ``profile`` within ``budget_bytes`` at ``search_headroom``;
    ``progress``, ``mode``, ``storage`` and ``study_name`` as that function takes them."""
    import optuna

    from memtune.tuner.search import tune as run_tune

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return run_tune(
        profile,
        budget_bytes,
        trials=trials,
        mode=mode,
        seed=seed,
        storage=storage,
        study_name=study_name,
        optimizer=optimizer,
        progress=progress,
        headroom=search_headroom(profile, headroom),
    )


def tune_profiles(
    prof: Profile,
    budget_bytes: int,
    *,
    regions: Sequence[RegionProfile] = (),
    trials: int = 300,
    seed: int = 0,
    optimizer: str = "sgd",
    headroom: float | None = None,
    progress: bool = True,
) -> Tuned:
    """The search half of ``tune``, on profiles already measured (NOTE [ Compiled-region candidates ] in
    ``memtune.tuner.region_plans``): ``prof`` (eager, with any compiler points) and each compiled-region profile of
    ``regions``, each searched within ``budget_bytes``; the fastest best plan of them all is served. A benchmark that
    measures once and tunes at several budgets calls it directly.

    Args:
        prof: the eager profile.
        budget_bytes: bytes one step may use.
        regions: compiled-region profiles (``memtune.profiler.region_profile.profile_regions``); failed ones are listed.
        trials, seed, optimizer, headroom, progress: as ``tune``.
    """
    from memtune.tuner.bound import step_lower_bound
    from memtune.tuner.compiled_bound import compiled_lower_bound
    from memtune.tuner.region_plans import fastest, weigh_all

    def search(p: Profile, label: str) -> TuneResult:
        with progress_bar(label, progress) as update:
            return search_plans(
                p,
                budget_bytes,
                trials=trials,
                seed=seed,
                optimizer=optimizer,
                headroom=headroom,
                progress=lambda done, total, best: update(
                    done, total, f"best {best.step_ms:.2f} ms" if best is not None else "no feasible plan yet"
                ),
            )

    results, trials_done = weigh_all(  # NOTE [ Compiled-region candidates ] (memtune.tuner.region_plans)
        search(prof, "tuning"), regions, lambda run, p: search(p, f"tuning regions at {run.policy}")
    )
    result = fastest(results)
    try:
        bound: StepBound | None = step_lower_bound(Simulator(result.profile, optimizer), budget_bytes)
    except BoundError:  # the solver gave no answer: the plan stands without its bound
        bound = None
    compiled = [prof] + [run.profile for run in regions if run.profile is not None]
    return Tuned(
        result, bound, tuple(trials_done), compiled_lower_bound(compiled, budget_bytes, optimizer), tuple(results)
    )
