"""``memtune bench``: measure plans side by side with PyTorch's own tools, and the simulator beside them.

In one process on the GPU it measures, for one model, batch and dtype: the unconstrained step; every
baseline policy's plan and the tuned plan (through ``planned``, each under ``budget_guard``); PyTorch's
``save_on_cpu(pin_memory=True)`` and ``checkpoint_sequential`` with √n segments (through PyTorch's APIs,
not ours). Each row: median step ms over timed steps after warm-up (CUDA events), peak bytes from
``max_memory_allocated``, samples per second, slowdown versus unconstrained, whether it fits, and for our
plans the simulator's prediction beside the measurement (the fidelity figures).

# NOTE [ Bench step ]
A step is forward, loss (cross-entropy against random labels or next tokens), backward and an SGD
momentum update with ``zero_grad(set_to_none=True)``; that is what the simulator's ``sgd`` optimizer
accounts for. ``max_memory_allocated`` is reset before the timed steps, so the peak is the steady state's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import math
import statistics
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from profiler.chain import ModelChain
from profiler.loss import loss_classes, step_loss
from profiler.profile import Profile
from tuner.placement import allocator_cost
from tuner.plan import Plan
from tuner.runtime.conv import apply_conv_choices
from tuner.runtime.errors import PlanOutOfMemoryError
from tuner.runtime.guard import budget_guard
from tuner.runtime.planned import PlannedModel, planned
from tuner.simulator import simulate

__all__ = ["BenchRow", "bench_plans", "make_batch", "measure_step"]


@dataclass(frozen=True)
class BenchRow:
    """One measured configuration. Times ms, sizes bytes; ``error`` says why it did not run."""

    name: str
    kind: str  # "unconstrained", "policy", "tuned", "pytorch"
    step_ms: float | None
    peak_bytes: int | None
    samples_per_s: float | None
    fits: bool | None
    predicted_step_ms: float | None = None
    predicted_peak_bytes: int | None = None
    budget_bytes: int | None = None
    plan: str | None = None
    error: str | None = None
    offload_stats: dict[str, float] | None = None
    """the runtime's offload counters per timed step (``OffloadStats``), for our plans"""
    reserved_bytes: int | None = None
    """peak bytes the caching allocator reserved from the GPU (``max_memory_reserved``): what the cap sees"""
    alloc_retries: float | None = None
    """allocations per step (warm-up included) that failed under the cap and succeeded only after the caching
    allocator released its cached blocks (``num_alloc_retries``); each costs a device synchronization and
    re-mapping memory (NOTE [ Allocator retries ])"""
    leaked_bytes: int | None = None
    """bytes still allocated after the row was measured and cleaned up, above what was allocated before it"""
    plan_json: dict[str, Any] | None = None
    """the whole plan (``Plan`` as JSON), so its prediction can be recomputed when the simulator changes"""
    predicted_retries: float | None = None
    """allocator retries per step (warm-up included) that the placement model predicts under the budget
    (NOTE [ Allocator placement ]), beside ``alloc_retries``"""
    predicted_allocator_ms: float | None = None
    """of ``predicted_step_ms``, what those retries are predicted to cost (``tuner.calibration``), ms"""

    @property
    def step_error(self) -> float | None:
        """(predicted − measured) / measured step time."""
        if self.step_ms is None or self.predicted_step_ms is None:
            return None
        return (self.predicted_step_ms - self.step_ms) / self.step_ms

    @property
    def peak_error(self) -> float | None:
        """(predicted − measured) / measured peak bytes."""
        if self.peak_bytes is None or self.predicted_peak_bytes is None:
            return None
        return (self.predicted_peak_bytes - self.peak_bytes) / self.peak_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["step_error"] = self.step_error
        d["peak_error"] = self.peak_error
        return d


def make_batch(chain: ModelChain, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A random input batch and targets for the chain (images and labels, or tokens and next tokens)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    if chain.input_kind == "tokens":
        x = torch.randint(0, chain.vocab_size, (batch, *chain.input_shape), generator=g)
        y = torch.randint(0, chain.vocab_size, (batch, *chain.input_shape), generator=g)
    else:
        x = torch.randn(batch, *chain.input_shape, generator=g)
        y = torch.randint(0, loss_classes(chain), (batch,), generator=g)
    return x.to(device), y.to(device)


_LEAK_SLACK_BYTES = 64 << 20  # the caching allocator's small blocks and cuDNN's handles come and go


def measure_step(step: Callable[[], None], *, warmup: int = 3, iters: int = 10) -> tuple[float, int, int]:
    """Median ms of ``step`` over ``iters`` timed runs after ``warmup`` runs, the peak bytes allocated and
    the peak bytes reserved by the caching allocator.

    Times with CUDA events around each step; resets the peak statistics after warm-up.
    """
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


@contextlib.contextmanager
def _autocast(dtype: str) -> Iterator[None]:
    if dtype == "float32":
        yield
    else:
        with torch.autocast("cuda", dtype=getattr(torch, dtype)):
            yield


def _clean() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def bench_plans(
    chain: ModelChain,
    profile: Profile,
    batch: int,
    dtype: str,
    budget_bytes: int,
    plans: Sequence[tuple[str, str, Plan]],
    *,
    pytorch_builtins: bool = True,
    capped_builtins: bool = False,
    warmup: int = 3,
    iters: int = 10,
    progress: Callable[[str], None] | None = None,
    on_row: Callable[[BenchRow], None] | None = None,
) -> list[BenchRow]:
    """Measure the unconstrained step, each ``(name, kind, plan)`` and PyTorch's built-ins on CUDA.

    Args:
        chain: the model (moved to CUDA here).
        profile: the profile the plans were made for (the simulator's predictions use it).
        batch: batch size; dtype: ``float32`` or an autocast dtype.
        budget_bytes: the budget each plan runs under (``budget_guard``) and ``fits`` is judged by.
        plans: ``(name, kind, plan)`` triples, e.g. every baseline policy and the tuned plan.
        pytorch_builtins: also measure ``save_on_cpu(pin_memory=True)`` and ``checkpoint_sequential``.
        capped_builtins: run those under ``budget_guard`` too (as our plans run); by default they run uncapped.
        warmup, iters: warm-up and timed steps per configuration.
        progress: called with the name of each configuration as it starts.
        on_row: called with each row as soon as it is measured (e.g. to save partial results).

    Returns:
        One row per configuration, the unconstrained one first.
    """
    device = torch.device("cuda")
    # parameters and the batch go into fresh segments: carved out of blocks cached by earlier work, they would
    # pin those whole segments, which no later empty_cache can release and which count against every cap
    _clean()
    seq = chain.as_sequential().to(device)
    x, y = make_batch(chain, batch, device)
    per_sample = batch * (math.prod(chain.input_shape) if chain.input_kind == "tokens" else 1)
    rows: list[BenchRow] = []
    baseline: int | None = None  # allocated after the first row: libraries keep their workspaces from then on

    def run(
        name: str,
        kind: str,
        model: nn.Module,
        ctx: Callable[[], Any] = contextlib.nullcontext,
        guard: Callable[[], Any] = contextlib.nullcontext,
        plan: Plan | None = None,
        guarded: bool = False,
    ) -> None:
        if progress is not None:
            progress(name)
        opt = torch.optim.SGD(seq.parameters(), lr=1e-4, momentum=0.9)

        def step() -> None:
            with ctx(), _autocast(dtype):
                loss = step_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        predicted = simulate(profile, plan) if plan is not None else None
        # NOTE [ Allocator placement ]: under the cap (every row but the unconstrained one) the retries the
        # placement model predicts, and their calibrated cost, join the prediction
        placed, alloc_ms = (
            allocator_cost(profile, plan, budget_bytes, steps=warmup + iters) if plan and guarded else (None, None)
        )
        predicted_ms = predicted.step_ms + (alloc_ms or 0.0) if predicted is not None else None
        predicted_retries = placed.mean_retries if placed is not None else None

        def failed(error: str) -> BenchRow:
            return BenchRow(
                name,
                kind,
                None,
                None,
                None,
                False,
                predicted_ms,
                predicted.peak_bytes if predicted else None,
                budget_bytes,
                plan.compact() if plan else None,
                error=error,
                plan_json=plan.model_dump(mode="json") if plan else None,
                predicted_retries=predicted_retries,
                predicted_allocator_ms=alloc_ms,
            )

        try:
            with guard():
                before = dataclasses.asdict(model.stats) if isinstance(model, PlannedModel) else None
                retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
                ms, peak, reserved = measure_step(step, warmup=warmup, iters=iters)
                retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries
                stats = None
                if before is not None and isinstance(model, PlannedModel):
                    after = dataclasses.asdict(model.stats)
                    stats = {k: (after[k] - before[k]) / (warmup + iters) for k in after}
            rows.append(
                BenchRow(
                    name,
                    kind,
                    ms,
                    peak,
                    per_sample / (ms / 1e3),
                    peak <= budget_bytes,
                    predicted_ms,
                    predicted.peak_bytes if predicted else None,
                    budget_bytes,
                    plan.compact() if plan else None,
                    offload_stats=stats,
                    reserved_bytes=reserved,
                    alloc_retries=retries / (warmup + iters),
                    plan_json=plan.model_dump(mode="json") if plan else None,
                    predicted_retries=predicted_retries,
                    predicted_allocator_ms=alloc_ms,
                )
            )
        except (PlanOutOfMemoryError, torch.OutOfMemoryError) as exc:
            # the allocator's own numbers (tried to allocate, allocated vs reserved) are the diagnosis: keep them
            text = str(exc).split(" If reserved but unallocated")[0][:600]
            where = exc.reserved if isinstance(exc, PlanOutOfMemoryError) else ""  # where reserved memory sat
            if where and where not in text:
                text += f" Reserved at the failure: {where}."
            rows.append(failed(f"out of memory: {text}"))
        except RuntimeError as exc:  # e.g. checkpoint_sequential on in-place ReLU
            rows.append(failed(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
        finally:
            opt.zero_grad(set_to_none=True)
            opt.state.clear()  # the momentum buffers
            _clean()
        nonlocal baseline
        if baseline is None:
            baseline = torch.cuda.memory_allocated()
        elif (left := torch.cuda.memory_allocated() - baseline) > _LEAK_SLACK_BYTES:
            rows[-1] = dataclasses.replace(rows[-1], leaked_bytes=left)
        if on_row is not None:
            on_row(rows[-1])

    run("unconstrained", "unconstrained", seq, plan=Plan.uniform(profile.n_stages, label="none"))
    for name, kind, plan in plans:
        chooses = plan.conv_rule != "default" or bool(plan.conv_algos)
        with (
            apply_conv_choices(chain, plan, profile) if chooses else contextlib.nullcontext(),
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", message=".*are not applied by planned", category=UserWarning)
            pm = planned(chain, plan)  # built inside the block: it sees the chosen convolutions
            run(name, kind, pm, guard=functools.partial(budget_guard, budget_bytes, pm), plan=plan, guarded=True)
            del pm
    if pytorch_builtins:
        # uncapped by default (PyTorch's tools as users run them); capped_builtins runs them under our plans' cap
        cap = functools.partial(budget_guard, budget_bytes) if capped_builtins else contextlib.nullcontext
        under = " under the cap" if capped_builtins else ""
        save_on_cpu = functools.partial(torch.autograd.graph.save_on_cpu, pin_memory=True)
        run(f"torch save_on_cpu{under}", "pytorch", seq, ctx=save_on_cpu, guard=cap)
        segs = max(1, round(math.sqrt(len(chain))))

        class _Seq(nn.Module):
            def forward(self, inp: torch.Tensor) -> torch.Tensor:
                return torch.utils.checkpoint.checkpoint_sequential(seq, segs, inp, use_reentrant=False)

        run(f"torch checkpoint_sequential ({segs}){under}", "pytorch", _Seq(), guard=cap)
    return rows
