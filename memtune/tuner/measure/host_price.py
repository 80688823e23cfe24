"""The host's time to issue a step of a profile's stages under memtune's runtime, per action (NOTE [ Host issue time ]
in ``memtune.tuner._host_time``), measured on the model's CUDA device.

# NOTE [ Host prices ]
Seven plans of the profile run through ``memtune.planned``: every stage kept; every stage, the even stages and the odd
stages offloaded; every stage, the even stages and the odd stages recomputed. They are planned together, so each
region compiles once, and stepped in turn, one step of each plan a round, two untimed rounds and then ``steps`` timed
ones, so that a drift of the host's pace (another process, the garbage collector's full passes) falls on all of them
alike. A timed step is the forward, the loss and the backward (no update, as the simulator's step), from its start
until its Python returns, the GPU synchronised only after: with the GPU behind, the host never waits for it, so the
time is the host's own work. The kept plan's median is ``HostPrices.keep_ms``.

What offloading a stage adds is fitted as a fixed part per stage plus a part per storage it saves first: a fixed part
for the hooks, events and stream waits around the stage's call, whatever it saves, and a part for each storage packed,
copied and fetched. The three offloaded plans give three sums over their stages (each plan's median less the kept
one), and the two parts are their least squares, neither below 0. Recomputing is fitted the same way, a fixed part
(the checkpoint around the call, the re-run's guards and wrappers) plus a part in proportion to the stage's forward
ms (the kernels the re-run issues again). Measured on the H200 (ResNet-50, ten regions), one plan of each action
cannot tell the parts apart: shared by the storages alone, the three offloaded regions of a served plan were priced
0.4 ms where the host took about 10 ms more. Where the stages' weights are all equal the parts cannot be told apart and
are not needed: the sum is shared evenly.

A plan that fails (a stage that refuses a checkpoint, an out-of-memory) leaves its action unpriced, with a warning
that says which and why (where the kept plan fails, the profile gets no prices), and a non-CUDA device gets no prices
at all: a CPU's step is synchronous, its time is not the host's.

Where the GPU falls more than its launch queue behind the host, the host blocks and the measured time reads the GPU's
pace; the simulator takes the larger of host and GPU, so such a price stands for a measured step, not below it.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from memtune.profiler import HostPrices, Profile
from memtune.profiler.module_profile import as_inputs, default_loss, left_as_found
from memtune.profiler.region_profile import RegionProfile
from memtune.tuner.measure.step_timing import training_step
from memtune.tuner.plan import Action, Plan
from memtune.tuner.runtime._planned import planned

__all__ = [
    "HOST_STEPS",
    "fixed_and_scaled",
    "host_priced",
    "issue_ms",
    "measure_host_prices",
    "shares",
    "with_host_prices",
]

HOST_STEPS = 5
"""Timed rounds (after two untimed ones); a plan's host time is the median of its steps in them."""


def shares(total_ms: float, weights: Sequence[float]) -> tuple[float, ...]:
    """``total_ms`` (at least 0) shared among the stages in proportion to ``weights``; evenly where they sum to 0."""
    total_ms = max(0.0, total_ms)
    whole = sum(weights)
    if whole <= 0:
        return tuple(total_ms / len(weights) for _ in weights)
    return tuple(total_ms * w / whole for w in weights)


def fixed_and_scaled(extras: Sequence[tuple[Sequence[int], float]], weights: Sequence[float]) -> tuple[float, ...]:
    """Per stage ``a + b * weights[k]``, ms: ``a`` and ``b`` (neither below 0) the least squares of ``extras``, each a
    set of stages and what acting on them added to the kept step (NOTE [ Host prices ]). Where the weights of every
    stage are equal the two parts cannot be told apart: the first extra (every stage's) is shared evenly."""
    n = len(weights)
    if n == 0 or not extras:
        return (0.0,) * n
    if max(weights) - min(weights) <= 1e-12 * max(1.0, abs(max(weights))):
        return shares(extras[0][1], [1.0] * n)
    rows = [(float(len(stages)), float(sum(weights[k] for k in stages)), ms) for stages, ms in extras]
    ss_a, ss_b, ss_ab = (sum(c * c for c, _, _ in rows), sum(w * w for _, w, _ in rows), sum(c * w for c, w, _ in rows))
    e_a, e_b = sum(c * ms for c, _, ms in rows), sum(w * ms for _, w, ms in rows)
    det = ss_a * ss_b - ss_ab * ss_ab
    fixed, scale = ((e_a * ss_b - e_b * ss_ab) / det, (e_b * ss_a - e_a * ss_ab) / det) if det > 0 else (-1.0, -1.0)
    if fixed < 0 or scale < 0:  # the best fit with one part at 0: the other alone, whichever fits better
        alone = [(max(0.0, e_a / ss_a), 0.0), (0.0, max(0.0, e_b / ss_b) if ss_b > 0 else 0.0)]
        fixed, scale = min(alone, key=lambda f: sum((ms - f[0] * c - f[1] * w) ** 2 for c, w, ms in rows))
    return tuple(fixed + scale * w for w in weights)


def _first_saved(profile: Profile) -> list[int]:
    """Per stage, how many storages it saves first (what offloading it packs)."""
    counts = [0] * len(profile.stages)
    for s in profile.storages:
        if s.saved_by:
            counts[min(s.saved_by)] += 1
    return counts


def issue_ms(
    model: nn.Module, runs: Mapping[str, nn.Module], inputs: Any, loss_fn: Callable[[Any], torch.Tensor], dtype: str,
    output_held: bool, steps: int,
) -> tuple[dict[str, float], dict[str, str]]:  # fmt: skip
    """The median host time of each planned model of ``runs`` (by name) over ``steps`` rounds after two untimed ones,
    one step of each a round (NOTE [ Host prices ]), ms, and why each plan whose step failed did (it leaves the rounds);
    the gradients dropped after each step. Where the first plan fails, nothing more is run."""
    cast = None if dtype == "float32" else getattr(torch, dtype)
    calls = {name: training_step(run, as_inputs(inputs), loss_fn, None, output_held=output_held, autocast=cast)
             for name, run in runs.items()}  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in runs}
    failed: dict[str, str] = {}
    gc.collect()
    for k in range(2 + steps):
        for name in [n for n in calls if n not in failed]:
            began = time.perf_counter()
            try:
                calls[name]()
            except Exception as exc:  # an action the model refuses, an out-of-memory: that plan stays unpriced
                failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no message'}"
                torch.cuda.empty_cache()
                continue
            finally:
                for p in model.parameters():
                    p.grad = None
            if k >= 2:
                times[name].append((time.perf_counter() - began) * 1e3)
            torch.cuda.synchronize()
        if next(iter(calls)) in failed:
            break
    return {name: statistics.median(t) for name, t in times.items() if t and name not in failed}, failed


def _host_bound(device: torch.device) -> bool:
    """Whether a step on ``device`` returns before its work is done, so that its time is the host's: CUDA's."""
    return device.type == "cuda"


def _priced_plans(n: int) -> dict[str, tuple[Action, list[int]]]:
    """The plans that price the host (NOTE [ Host prices ]), by the name a warning gives them: the action and the
    stages it acts on."""
    every, even, odd = list(range(n)), list(range(0, n, 2)), list(range(1, n, 2))
    plans: dict[str, tuple[Action, list[int]]] = {"every stage kept": (Action.KEEP, [])}
    for action, done in ((Action.OFFLOAD, "offloaded"), (Action.RECOMPUTE, "recomputed")):
        plans[f"every stage {done}"] = (action, every)
        if n > 1:
            plans[f"the even stages {done}"] = (action, even)
            plans[f"the odd stages {done}"] = (action, odd)
    return plans


def measure_host_prices(
    model: nn.Module,
    example_inputs: Any,
    profile: Profile,
    loss_fn: Callable[[Any], torch.Tensor],
    *,
    output_held: bool = True,
    steps: int = HOST_STEPS,
) -> HostPrices | None:
    """The host prices of ``profile``'s stages on ``model`` (NOTE [ Host prices ]); None off CUDA or where the kept
    plan itself fails. The model is left as found (``left_as_found``)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if not _host_bound(device) or not profile.modules:
        return None
    n = profile.n_stages
    base = Plan.uniform(n).named(profile)
    plans = _priced_plans(n)
    # planned together, the plans share each region's compiled callables: compiled once, not once per plan (NOTE
    # [ Regions are wrapped once ] in memtune.profiler.region_tree)
    runs = {name: planned(model, base.with_(actions=[action if k in on else Action.KEEP for k in range(n)]))
            for name, (action, on) in plans.items()}  # fmt: skip
    with left_as_found(model, device):
        try:
            medians, failed = issue_ms(model, runs, example_inputs, loss_fn, profile.dtype, output_held, steps)
        finally:
            for run in runs.values():
                run.release()
            runs.clear()
            gc.collect()
            torch.cuda.empty_cache()
    keep = medians.get("every stage kept")
    if keep is None:  # the profile's own regions do not run here: no prices
        warnings.warn(f"host prices: the profile gets none, its plans are priced by GPU time alone: the step with "
                      f"every stage kept failed ({failed.get('every stage kept')})", stacklevel=2)  # fmt: skip
        return None

    def fitted(action: Action, weights: Sequence[float]) -> tuple[float, ...] | None:
        names = [name for name, (a, _) in plans.items() if a is action]
        why = next(((name, failed[name]) for name in names if name in failed), None)
        if why is not None:
            warnings.warn(f"host prices: {action.value} adds nothing to the host's time in this profile's plans: the "
                          f"step with {why[0]} failed ({why[1]})", stacklevel=3)  # fmt: skip
            return None
        return fixed_and_scaled([(plans[name][1], medians[name] - keep) for name in names], weights)

    off = fitted(Action.OFFLOAD, [float(c) for c in _first_saved(profile)])
    rec = fitted(Action.RECOMPUTE, [s.forward_ms for s in profile.stages])
    return HostPrices(keep_ms=keep, recompute_ms=rec, offload_ms=off, steps=steps)


def with_host_prices(
    model: nn.Module,
    example_inputs: Any,
    profile: Profile,
    loss_fn: Callable[[Any], torch.Tensor],
    *,
    output_held: bool = True,
) -> Profile:
    """``profile`` with its host prices measured on ``model``; as it was where none could be measured."""
    host = measure_host_prices(model, example_inputs, profile, loss_fn, output_held=output_held)
    return profile if host is None else profile.model_copy(update={"host": host})


def host_priced(
    model: nn.Module,
    example_inputs: Any,
    runs: Sequence[RegionProfile],
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    *,
    output_held: bool = True,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[RegionProfile]:
    """``runs`` (``memtune.profiler.region_profile.profile_regions``'s) with their profiles' host prices measured on
    ``model`` (NOTE [ Host prices ]); unchanged off CUDA. ``loss_fn`` None: the default loss, as profiled;
    ``progress(done, total, what)`` before each and at the end."""
    on_cuda = any(p.device.type == "cuda" for p in model.parameters())
    out: list[RegionProfile] = []
    for k, run in enumerate(runs):
        if progress is not None:
            progress(k, len(runs), f"{run.partition.label} at {run.policy}")
        if on_cuda and run.profile is not None:
            priced = with_host_prices(model, example_inputs, run.profile, loss_fn or default_loss,
                                      output_held=output_held)  # fmt: skip
            run = dataclasses.replace(run, profile=priced)
        out.append(run)
    if progress is not None:
        progress(len(runs), len(runs), "done")
    return out
