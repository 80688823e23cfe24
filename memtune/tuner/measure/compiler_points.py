"""Measure the whole model compiled at several activation budgets: the compiler points of a profile (NOTE
[ Whole-model compile ] in ``memtune.tuner._whole``).

# NOTE [ Compiler points of a module ]
A zoo chain is rebuilt in a fresh process for each budget (NOTE [ Bench isolation ]); a user's module cannot be, so
``measure_module_points`` compiles it in the caller's process, once per budget (one backend object per budget keeps
one compiled graph each, ``memtune.profiler.compiled.budget_backend``), and trains it ``warmup`` + ``iters`` steps with
the profile's optimizer on the example inputs: forward, the loss, backward, the update. The step is the median of the
timed steps, the update inside them timed too (``CompilerPoint.update_ms``, NOTE [ The optimizer's update ] in
``memtune.tuner._whole``). The peak is metered over the timed steps above what was live before them
(``memtune.profiler.memory_meter.metered``: CUDA's statistics, or the CPU allocator's events), plus what a step holds
resident in the simulator's terms: the parameters and their optimizer state, and the batch. Whatever else the caller
keeps on the device is left out, as the simulator leaves it out. The reserved peak is not recorded (the cache of the
caller's process is not the step's), so a point fits a budget by its allocated peak and the headroom
(``CompilerPoint.fits``). On the CPU the same loop runs under CPU inductor, for tests. A zoo chain's points (``bench``
rows, in fresh processes) time the update the same way (``BenchRow.update_ms``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

import torch
from torch import nn

from memtune.profiler import CompilerPoint, ModelChain, Profile
from memtune.profiler.compiled import CompiledStage
from memtune.profiler.module_profile import as_inputs, default_loss
from memtune.profiler.module_stages import call_model
from memtune.tuner.measure.bench import BenchRow, bench_plans
from memtune.tuner.measure.step_timing import time_steps, update_timer
from memtune.tuner.simulator import OPTIMIZERS

__all__ = ["compiler_points", "measure_compiler_points", "measure_module_points", "with_compiler_points"]


def compiler_points(rows: Sequence[BenchRow]) -> tuple[CompilerPoint, ...]:
    """The compiler points of the ``torch.compile`` peer rows of ``rows`` that ran (rows with an error are left
    out), in the order of ``rows``."""
    return tuple(
        CompilerPoint(
            activation_budget=r.compile_budget,
            step_ms=r.step_ms,
            peak_bytes=r.peak_bytes,
            reserved_bytes=r.reserved_bytes,
            update_ms=r.update_ms,
        )
        for r in rows
        if r.kind == "compiler" and r.compile_budget is not None and r.step_ms and r.peak_bytes and not r.error
    )


def with_compiler_points(profile: Profile, points: Sequence[CompilerPoint]) -> Profile:
    """``profile`` with ``points`` added; a point at a budget already measured replaces the old one. Sorted by
    budget."""
    by_budget = {p.activation_budget: p for p in (*profile.compiler_points, *points)}
    return profile.model_copy(update={"compiler_points": tuple(by_budget[b] for b in sorted(by_budget))})


def measure_compiler_points(
    chain_factory: Callable[[], ModelChain],
    profile: Profile,
    budgets: Sequence[float],
    *,
    warmup: int = 2,
    iters: int = 5,
    progress: Callable[[str], None] | None = None,
    on_row: Callable[[BenchRow], None] | None = None,
) -> tuple[tuple[CompilerPoint, ...], list[BenchRow]]:
    """Compile the whole model at each activation budget and measure a training step of the profile's batch, each
    in a fresh process (NOTE [ Bench isolation ]; the warm-up steps compile). CUDA only.

    Args:
        chain_factory: a picklable callable that builds the model (``functools.partial(zoo.build, name, params)``).
        profile: the model's profile (batch and dtype come from it).
        budgets: activation budgets, each 0 to 1.
        warmup, iters: warm-up (compiling) and timed steps per budget.
        progress: called with each row's name as it starts; on_row: with each row as it is measured.

    Returns:
        The points that ran, and every row (a row that failed keeps its error).

    Raises:
        ValueError: a budget outside 0..1.
        RuntimeError: no CUDA device.
    """
    bad = [b for b in budgets if not 0.0 <= b <= 1.0]
    if bad:
        raise ValueError(f"activation budgets are shares from 0 to 1, not {bad}")
    if not torch.cuda.is_available():
        raise RuntimeError("compiler points are measured on a CUDA GPU, and none is visible")
    rows = bench_plans(
        None,
        profile,
        profile.batch,
        profile.dtype,
        torch.cuda.get_device_properties(0).total_memory,  # uncapped: the compiler's own peak is the point
        [],
        pytorch_builtins=False,
        warmup=warmup,
        iters=iters,
        progress=progress,
        on_row=on_row,
        chain_factory=chain_factory,
        unconstrained=False,
        compiler_budgets=budgets,
    )
    return compiler_points(rows), rows


def measure_module_points(
    model: nn.Module,
    example_inputs: Any,
    profile: Profile,
    budgets: Sequence[float],
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: str = "sgd",
    warmup: int = 2,
    iters: int = 5,
    progress: Callable[[int, int, str], None] | None = None,
) -> tuple[tuple[CompilerPoint, ...], dict[float, str]]:
    """Compile ``model`` whole at each activation budget and measure its training step here (NOTE [ Compiler points
    of a module ]).

    Args:
        model: the module ``profile`` was made of, on its device; the loop updates it with a learning rate of 0, so
            its parameters are left as they were, and its buffers (running statistics) are restored after each
            budget; gradients are cleared.
        example_inputs: the batch ``profile`` was measured on (anything ``memtune.profile`` takes).
        profile: the module's profile (its dtype sets autocast; its parameter and input bytes the resident part).
        budgets: activation budgets, each 0 to 1.
        loss_fn: the step's loss over the output (default ``memtune.profiler.module_profile.default_loss``).
        optimizer: ``sgd`` (momentum), ``adam`` (AdamW) or ``none``.
        warmup, iters: untimed steps (the first compiles) and timed steps per budget.
        progress: called with (budgets done, budgets, text) before each budget and at the end.

    Returns:
        The points measured, and the error of each budget whose compile or step failed (the others stand).

    Raises:
        ValueError: a budget outside 0..1, or an unknown optimizer.
    """
    bad = [b for b in budgets if not 0.0 <= b <= 1.0]
    if bad:
        raise ValueError(f"activation budgets are shares from 0 to 1, not {bad}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, not {optimizer!r}")
    loss = loss_fn or default_loss
    points: list[CompilerPoint] = []
    errors: dict[float, str] = {}
    buffers = [(b, b.detach().clone()) for b in model.buffers()]  # running statistics, restored after each budget
    for k, budget in enumerate(budgets):
        if progress is not None:
            progress(k, len(budgets), f"activation budget {budget:g}")
        try:
            ms, peak, update = _compiled_step(model, example_inputs, profile, budget, loss, optimizer, warmup, iters)
        except Exception as exc:  # the compiler's errors have no common type; the eager plans still stand
            errors[budget] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc) else ''}"
            continue
        finally:
            for p in model.parameters():
                p.grad = None
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
        named = cast(Literal["sgd", "adam", "none"], optimizer)  # checked against OPTIMIZERS above
        points.append(
            CompilerPoint(activation_budget=budget, step_ms=ms, peak_bytes=peak, optimizer=named, update_ms=update)
        )
    if progress is not None:
        progress(len(budgets), len(budgets), "done")
    return tuple(points), errors


def _compiled_step(
    model: nn.Module,
    example_inputs: Any,
    profile: Profile,
    budget: float,
    loss_fn: Callable[[Any], torch.Tensor],
    optimizer: str,
    warmup: int,
    iters: int,
) -> tuple[float, int, float | None]:
    """The median step ms, the peak bytes and the median update ms of ``model`` compiled at ``budget`` (NOTE
    [ Compiler points of a module ]; the update's by NOTE [ The optimizer's update ] in ``memtune.tuner._whole``)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    run = CompiledStage(model, budget)
    params = [p for p in model.parameters() if p.requires_grad]
    opt: torch.optim.Optimizer | None = None
    # a learning rate of 0 runs the update's kernels and leaves every parameter as it was
    if optimizer == "adam":
        opt = torch.optim.AdamW(params, lr=0.0)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=0.0, momentum=0.9)
    args = as_inputs(example_inputs)
    half = profile.dtype != "float32"
    autocast = torch.autocast(device.type, dtype=getattr(torch, profile.dtype)) if half else contextlib.nullcontext()

    def step() -> None:
        with autocast:
            out = call_model(run, args)
            value = loss_fn(out)
        value.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)

    with update_timer(opt, cuda=device.type == "cuda") as updates:
        timing = time_steps(step, warmup=warmup, steps=iters, device=device, peak="metered")
    resident = int(profile.param_bytes * (1.0 + OPTIMIZERS[optimizer])) + profile.input_bytes
    return timing.step_ms, timing.peak_bytes + resident, updates.median_ms(iters)
