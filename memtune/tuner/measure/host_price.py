"""The host's time to issue a step of a profile's stages under memtune's runtime, per action (NOTE [ Host issue time ]
in ``memtune.tuner._host_time``), measured on the model's CUDA device.

# NOTE [ Host prices ]
Three plans of the profile run through ``memtune.planned``, each for two untimed steps and then ``steps`` timed ones:
every stage kept, every stage offloaded, every stage recomputed. A timed step is the forward, the loss and the
backward (no update, as the simulator's step), from its start until its Python returns, the GPU synchronised only
after: with the GPU behind, the host never waits for it, so the time is the host's own work. The kept plan's median
is ``HostPrices.keep_ms``; what the offloaded plan's median adds is shared among the stages by the storages each saves
first (what an offloaded stage packs, copies and fetches), what the recomputed plan's adds by their forward ms (what a
re-run issues again). A plan that fails (a stage that refuses a checkpoint, an out-of-memory) leaves its action
unpriced, with a warning that says which and why (where the kept plan fails, the profile gets no prices), and a
non-CUDA device gets no prices at all: a CPU's step is synchronous, its time is not the host's.

Where the GPU falls more than its launch queue behind the host, the host blocks and the measured time reads the GPU's
pace; the simulator takes the larger of host and GPU, so such a price stands for a measured step, not below it.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from memtune.profiler import HostPrices, Profile
from memtune.profiler.module_profile import as_inputs, default_loss, left_as_found
from memtune.profiler.region_profile import RegionProfile
from memtune.tuner.measure.step_timing import training_step
from memtune.tuner.plan import Action, Plan
from memtune.tuner.runtime._planned import planned

__all__ = ["HOST_STEPS", "host_priced", "issue_ms", "measure_host_prices", "shares", "with_host_prices"]

HOST_STEPS = 5
"""Timed steps per plan (after two untimed ones); their median is the plan's host time."""


def shares(total_ms: float, weights: Sequence[float]) -> tuple[float, ...]:
    """``total_ms`` (at least 0) shared among the stages in proportion to ``weights``; evenly where they sum to 0."""
    total_ms = max(0.0, total_ms)
    whole = sum(weights)
    if whole <= 0:
        return tuple(total_ms / len(weights) for _ in weights)
    return tuple(total_ms * w / whole for w in weights)


def _first_saved(profile: Profile) -> list[int]:
    """Per stage, how many storages it saves first (what offloading it packs)."""
    counts = [0] * len(profile.stages)
    for s in profile.storages:
        if s.saved_by:
            counts[min(s.saved_by)] += 1
    return counts


def issue_ms(
    model: nn.Module, run: nn.Module, inputs: Any, loss_fn: Callable[[Any], torch.Tensor], dtype: str,
    output_held: bool, steps: int,
) -> float:  # fmt: skip
    """The median host time of ``steps`` steps of the planned model ``run`` after two untimed ones (NOTE [ Host
    prices ]), ms; the gradients dropped after each step."""
    step = training_step(run, as_inputs(inputs), loss_fn, None, output_held=output_held,
                         autocast=None if dtype == "float32" else getattr(torch, dtype))  # fmt: skip
    times: list[float] = []
    for k in range(2 + steps):
        began = time.perf_counter()
        step()
        if k >= 2:
            times.append((time.perf_counter() - began) * 1e3)
        torch.cuda.synchronize()
        for p in model.parameters():
            p.grad = None
    return statistics.median(times)


def _host_bound(device: torch.device) -> bool:
    """Whether a step on ``device`` returns before its work is done, so that its time is the host's: CUDA's."""
    return device.type == "cuda"


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
    base = Plan.uniform(profile.n_stages).named(profile)
    unpriced = {  # what a failed plan leaves unpriced, said in its warning
        Action.KEEP: ("kept", "the profile gets no host prices: its plans are priced by GPU time alone"),
        Action.OFFLOAD: ("offloaded", "offloading adds nothing to the host's time in its plans"),
        Action.RECOMPUTE: ("recomputed", "recomputing adds nothing to the host's time in its plans"),
    }
    # planned together, the three share each region's compiled callables: compiled once, not once per plan (NOTE
    # [ Regions are wrapped once ] in memtune.profiler.region_tree)
    runs = {a: planned(model, base.with_(actions=(a,) * profile.n_stages)) for a in (Action.KEEP, Action.OFFLOAD,
                                                                                   Action.RECOMPUTE)}  # fmt: skip

    def host_ms(action: Action) -> float | None:
        try:
            return issue_ms(model, runs[action], example_inputs, loss_fn, profile.dtype, output_held, steps)
        except Exception as exc:  # an action the model refuses, an out-of-memory: that action stays unpriced
            done, left = unpriced[action]
            why = str(exc).splitlines()[0] if str(exc) else "no message"
            warnings.warn(f"host prices: the step with every stage {done} failed ({type(exc).__name__}: {why}); {left}",
                          stacklevel=3)  # fmt: skip
            return None
        finally:
            torch.cuda.empty_cache()

    with left_as_found(model, device):
        try:
            keep = host_ms(Action.KEEP)  # where it fails, the others are not tried: nothing would price them
            offload, recompute = (None, None) if keep is None else (host_ms(Action.OFFLOAD), host_ms(Action.RECOMPUTE))
        finally:
            for run in runs.values():
                run.release()
            runs.clear()
            gc.collect()
    if keep is None:  # the profile's own regions do not run here: no prices
        return None
    off = None if offload is None else shares(offload - keep, _first_saved(profile))
    rec = None if recompute is None else shares(recompute - keep, [s.forward_ms for s in profile.stages])
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
