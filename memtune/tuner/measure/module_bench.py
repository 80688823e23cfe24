"""Measuring any model's training step on its CUDA device, unplanned, tuned under a cap and beside built-ins: what
``memtune bench`` does for a factory model and ``benchmarks.your_models`` tabulates.

# NOTE [ Module bench ]
One process, in this order: the unplanned step (median of ``steps`` after ``warmup``, CUDA events, SGD with momentum,
peak allocated and reserved bytes, allocator retries); the profile by module stages
(``memtune.profiler.module_profile``); the search at ``fraction`` x the unplanned peak, ``headroom`` of it kept free;
the best plan under ``budget_guard``
at that budget (an out-of-memory is a result), again without the cap, and the stages wrapped with every action
``keep`` (what wrapping costs by itself); the simulator's prediction; the largest relative loss, gradient and buffer
errors of the plan against the unplanned step beside those of a second unplanned step (the run-to-run spread); the
plan's gradients against a float64 step beside the unplanned step's (NOTE [ Gradients against float64 ] in
``memtune.tuner.runtime.float64``; an ``error`` where the float64 step does not fit the GPU); and each given built-in
(a module sharing the model's parameters, e.g. ``checkpoint_sequential`` over a trunk), uncapped.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from memtune.profiler import profile_module
from memtune.profiler.module_profile import as_inputs, default_loss
from memtune.tuner.measure.step_timing import time_steps, training_step, update_timer
from memtune.tuner.plan import Plan
from memtune.tuner.runtime._planned import planned
from memtune.tuner.runtime.guard import budget_guard
from memtune.tuner.runtime.verify import check_equivalence, reference_step
from memtune.tuner.search import tune
from memtune.tuner.simulator import Simulator

__all__ = ["bench_module", "measure_step"]

Loss = Callable[[Any], torch.Tensor]


def measure_step(
    model: nn.Module,
    run: nn.Module,
    inputs: Any,
    loss_fn: Loss,
    *,
    warmup: int,
    steps: int,
    output_held: bool = False,
    optimizer: str = "sgd",
    dtype: str = "float32",
) -> dict[str, Any]:
    """Train ``run`` (which shares ``model``'s parameters) for ``warmup + steps`` steps with SGD and momentum (AdamW
    with ``optimizer="adam"``, SGD without state with ``"none"``) at learning rate 0, so the update's kernels run and
    the parameters stay as they were: the median step ms and the process's peaks of the timed steps, allocator
    retries per step (NOTE [ Step timing ] in ``memtune.tuner.measure.step_timing``) and the median ms of the
    optimizer's update inside the timed steps (``update_ms``, NOTE [ The optimizer's update ] in
    ``memtune.tuner._whole``). ``output_held``: the loop holds the model's output until its backward ends (NOTE
    [ Held output ] in ``memtune.tuner.simulator``). ``dtype``: ``float32``, or ``bfloat16``/``float16`` for the
    forward under autocast, as a profile of that dtype was measured."""
    if optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.0 if optimizer == "none" else 0.9)
    cast = None if dtype == "float32" else getattr(torch, dtype)
    step = training_step(run, as_inputs(inputs), loss_fn, opt, output_held=output_held, autocast=cast)
    try:
        with update_timer(opt, cuda=any(p.is_cuda for p in model.parameters())) as updates:
            timing = time_steps(step, warmup=warmup, steps=steps, release_first=True)
    finally:  # an out-of-memory too leaves no gradient nor momentum behind
        for p in model.parameters():
            p.grad = None
        opt.state.clear()
    return {
        "step_ms": timing.step_ms,
        "peak_bytes": timing.peak_bytes,
        "reserved_bytes": timing.reserved_bytes,
        "alloc_retries_per_step": timing.alloc_retries_per_step,
        "update_ms": updates.median_ms(steps),
    }


def bench_module(
    model: nn.Module,
    inputs: Any,
    *,
    loss_fn: Loss | None = None,
    stages: list[str] | None = None,
    fraction: float = 0.6,
    headroom: float = 0.05,
    trials: int = 150,
    warmup: int = 3,
    steps: int = 10,
    builtins: Mapping[str, nn.Module] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One row of NOTE [ Module bench ] for ``model`` on its CUDA device: a JSON-ready dict.

    Raises:
        TunerError: CUDA is not available or the model is not on it.
    """
    from memtune.tuner._tuner_errors import TunerError

    if not torch.cuda.is_available() or not any(p.is_cuda for p in model.parameters()):
        raise TunerError("bench measures on a GPU: put the model and its inputs on a CUDA device")
    loss = loss_fn or default_loss
    note = progress or (lambda _what: None)
    row: dict[str, Any] = {"fraction": fraction, "headroom": headroom, "torch": torch.__version__}
    note("unplanned step")
    row["unplanned"] = measure_step(model, model, inputs, loss, warmup=warmup, steps=steps)
    note("profile")
    t0 = time.perf_counter()
    prof = profile_module(model, inputs, loss_fn=loss, stages=stages)
    row["profile_s"] = round(time.perf_counter() - t0, 1)
    row.update(stages=prof.n_stages, stage_names=[s.name for s in prof.stages], device=prof.device.name)
    row["profile"] = json.loads(prof.to_json())
    budget = int(fraction * row["unplanned"]["peak_bytes"])
    row["budget_bytes"] = budget
    note("tune")
    result = tune(prof, budget, trials=trials, seed=0, headroom=headroom)
    if result.best is None:
        row["error"] = "no plan fits"
        return row
    plan = result.best.plan
    keep = plan.with_(actions=("keep",) * prof.n_stages)
    sim = Simulator(prof)
    predicted = sim.run(plan)
    row.update(
        plan=plan.compact(),
        plan_json=plan.model_dump(mode="json"),
        predicted={"step_ms": predicted.step_ms, "peak_bytes": predicted.peak_bytes},
        unplanned_simulated={"step_ms": sim.run(keep).step_ms},
    )
    note("planned steps")
    _planned_rows(row, model, inputs, loss, plan, keep, budget, warmup, steps)
    note("gradients")
    ref = reference_step(model, inputs, loss_fn=loss)
    same, _ = check_equivalence(model, keep, inputs, loss_fn=loss, reference=ref, steps=1)
    eq, _ = check_equivalence(model, plan, inputs, loss_fn=loss, reference=ref, steps=1)
    row["spread"] = {"loss": same.loss, "grad": same.grad, "buffer": same.buffer}
    row["equality"] = {"loss": eq.loss, "grad": eq.grad, "buffer": eq.buffer, "worst": eq.worst_grad}
    note("gradients against float64")
    row["float64"] = _against_float64(model, inputs, loss, ref, eq.loss)
    for name, peer in (builtins or {}).items():
        note(name)
        row[name] = measure_step(model, peer, inputs, loss, warmup=warmup, steps=steps)
    return row


def _against_float64(model: nn.Module, inputs: Any, loss: Loss, ref: Any, loss_error: float) -> dict[str, Any]:
    """The planned step whose gradients ``model`` holds (its loss ``loss_error`` off the reference's, relative),
    judged against a float64 step beside the unplanned step ``ref`` (NOTE [ Gradients against float64 ] in
    ``memtune.tuner.runtime.float64``): a JSON-ready dict, or its ``error`` where the float64 step does not fit the GPU
    (it holds twice the unplanned step's activations)."""
    from memtune.tuner.runtime.float64 import fitting_float64_step, judge_against_float64

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = [None if p.grad is None else p.grad.detach().clone() for _, p in params]
    truth, error = fitting_float64_step(model, inputs, loss_fn=loss, seed=ref.seed)
    if truth is None:
        return {"error": error}
    return judge_against_float64(grads, ref, truth, [n for n, _ in params], run_loss_error=loss_error).summary()


def _planned_rows(
    row: dict[str, Any],
    model: nn.Module,
    inputs: Any,
    loss: Loss,
    plan: Plan,
    keep: Plan,
    budget: int,
    warmup: int,
    steps: int,
) -> None:
    pm = planned(model, plan)
    try:
        with budget_guard(budget, pm):
            row["planned"] = measure_step(model, pm, inputs, loss, warmup=warmup, steps=steps)
    except Exception as exc:  # an out-of-memory under the cap is a result, reported as such
        row["planned"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    row["planned_uncapped"] = measure_step(model, pm, inputs, loss, warmup=warmup, steps=steps)
    row["planned_keep"] = measure_step(model, planned(model, keep), inputs, loss, warmup=warmup, steps=steps)
    row["planned_stats"] = {k: v for k, v in vars(pm.stats).items() if isinstance(v, (int, float))}
    del pm
    gc.collect()
    torch.cuda.empty_cache()
