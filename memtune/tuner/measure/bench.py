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
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn

from memtune.profiler import ModelChain, Profile
from memtune.profiler.loss import loss_classes, step_loss
from memtune.tuner.capped import predict_capped
from memtune.tuner.measure._isolate import IsolatedProcessError, run_isolated
from memtune.tuner.measure._peers import OffloadActivations, compiled_model
from memtune.tuner.measure.step_timing import time_steps, update_timer
from memtune.tuner.plan import Plan
from memtune.tuner.runtime._planned import PlannedBase, planned
from memtune.tuner.runtime._run_errors import PlanOutOfMemoryError
from memtune.tuner.runtime.conv import apply_conv_choices
from memtune.tuner.runtime.guard import budget_guard
from memtune.tuner.simulator import SimResult, simulate

__all__ = ["BenchRow", "RowSpec", "bench_plans", "checkpoint_segments", "make_batch", "measure_step", "row_specs"]


@dataclass(frozen=True)
class BenchRow:
    """One measured configuration. Times ms, sizes bytes; ``error`` says why it did not run."""

    name: str
    kind: str  # "unconstrained", "policy", "tuned", "pytorch"
    step_ms: float | None
    peak_bytes: int | None
    samples_per_s: float | None  # images per second; for a token model, tokens per second
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
    """of ``predicted_step_ms``, what those retries are predicted to cost (``memtune.tuner.calibration``), ms"""
    compile_budget: float | None = None
    """a ``torch.compile`` peer's activation budget (``RowSpec.compile_budget``)"""
    predicted_fallbacks: int | None = None
    """convolutions left to PyTorch that are predicted to fall back to a smaller workspace under the cap
    (NOTE [ Framework fallback ] in ``memtune.tuner.capped``); the prediction is for the plan with those algorithms"""
    update_ms: float | None = None
    """of ``step_ms``, the optimizer's update: its median over the timed steps, ms (NOTE [ The optimizer's update ] in
    ``memtune.tuner._whole``)"""

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

    Times with CUDA events around each step; resets the peak statistics after warm-up (NOTE [ Step timing ] in
    ``memtune.tuner.measure.step_timing``).
    """
    timing = time_steps(step, warmup=warmup, steps=iters)
    return timing.step_ms, timing.peak_bytes, timing.reserved_bytes


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


Builtin = Literal["save_on_cpu", "checkpoint_sequential", "compile", "offload_activations"]


@dataclass(frozen=True)
class RowSpec:
    """One configuration to measure: a plan of ours (``plan``), one of PyTorch's tools or a peer (``builtin``) or,
    with neither, the unconstrained step. ``capped``: run under ``budget_guard`` (our plans always are).
    ``compile_budget``: the ``compile`` peer's activation budget. ``profile``: what prices ``plan`` when it is not
    the bench's profile (a compiled plan's compiled profile, NOTE [ Compiled stages ])."""

    name: str
    kind: str  # "unconstrained", "policy", "tuned", "compiled-tuned", "variant", "pytorch", "compiler"
    plan: Plan | None = None
    builtin: Builtin | None = None
    capped: bool = False
    compile_budget: float | None = None
    profile: Profile | None = None


def checkpoint_segments(chain: ModelChain) -> int:
    """Segments of the ``checkpoint_sequential`` row: √n of the chain's n stages (Chen et al.)."""
    return max(1, round(math.sqrt(len(chain))))


def row_specs(
    chain: ModelChain | None,
    profile: Profile,
    plans: Sequence[tuple[str, str, Plan]],
    *,
    pytorch_builtins: bool = True,
    capped_builtins: bool = False,
    unconstrained: bool = True,
    compiler_budgets: Sequence[float] = (),
    offload_peer: bool = False,
    compiled_profiles: Mapping[float, Profile] | None = None,
) -> list[RowSpec]:
    """The rows ``bench_plans`` measures, in order: unconstrained, each plan, PyTorch's built-ins, then the peers:
    ``torch.compile`` of the whole model at each of ``compiler_budgets`` and, with ``offload_peer``, activation
    offload on a side stream (``memtune.tuner.measure._peers.OffloadActivations``), uncapped as users run them.

    Raises:
        ValueError: a compiled plan whose budget has no profile in ``compiled_profiles``.
    """
    first = RowSpec("unconstrained", "unconstrained", Plan.uniform(profile.n_stages, label="none"))
    specs = [first] if unconstrained else []
    for name, kind, plan in plans:
        priced_on = None
        if plan.compile_budget is not None:
            priced_on = (compiled_profiles or {}).get(plan.compile_budget)
            if priced_on is None:
                raise ValueError(f"plan {name!r} runs compiled at budget {plan.compile_budget:g}: pass its profile")
        specs.append(RowSpec(name, kind, plan, capped=True, profile=priced_on))
    if pytorch_builtins:
        # uncapped by default (PyTorch's tools as users run them); capped_builtins runs them under our plans' cap
        under = " under the cap" if capped_builtins else ""
        if chain is None:
            raise ValueError("PyTorch's built-in rows need the model (checkpoint_sequential's segments)")
        segs = checkpoint_segments(chain)
        specs.append(RowSpec(f"torch save_on_cpu{under}", "pytorch", builtin="save_on_cpu", capped=capped_builtins))
        specs.append(
            RowSpec(
                f"torch checkpoint_sequential ({segs}){under}",
                "pytorch",
                builtin="checkpoint_sequential",
                capped=capped_builtins,
            )
        )
    specs += [
        RowSpec(f"torch.compile budget {b:g}", "compiler", builtin="compile", compile_budget=b)
        for b in compiler_budgets
    ]
    if offload_peer:
        specs.append(RowSpec("offload activations (side stream)", "pytorch", builtin="offload_activations"))
    return specs


class _Bench:
    """The model, its batch and the measurement of one row at a time, in this process."""

    def __init__(
        self, chain: ModelChain, profile: Profile, batch: int, dtype: str, budget_bytes: int, warmup: int, iters: int
    ) -> None:
        device = torch.device("cuda")
        # parameters and the batch go into fresh segments: carved out of blocks cached by earlier work, they
        # would pin those whole segments, which no later empty_cache can release and which count against every cap
        _clean()
        self.chain, self.profile, self.dtype = chain, profile, dtype
        self.budget_bytes, self.warmup, self.iters = budget_bytes, warmup, iters
        self.seq = chain.as_sequential().to(device)
        self.x, self.y = make_batch(chain, batch, device)
        self.per_sample = batch * (math.prod(chain.input_shape) if chain.input_kind == "tokens" else 1)
        self.baseline: int | None = None  # allocated after the first row: libraries keep their workspaces from then

    def measure(self, spec: RowSpec) -> BenchRow:
        """Measure one row (NOTE [ Bench step ]); an out-of-memory or runtime error becomes the row's ``error``."""
        if spec.builtin is not None:
            cap = functools.partial(budget_guard, self.budget_bytes) if spec.capped else contextlib.nullcontext
            if spec.builtin == "compile":
                assert spec.compile_budget is not None
                return self._run(spec, compiled_model(self.seq, spec.compile_budget), guard=cap)
            if spec.builtin == "offload_activations":
                return self._run(spec, self.seq, ctx=OffloadActivations, guard=cap)
            if spec.builtin == "save_on_cpu":
                ctx = functools.partial(torch.autograd.graph.save_on_cpu, pin_memory=True)
                return self._run(spec, self.seq, ctx=ctx, guard=cap)
            segs = checkpoint_segments(self.chain)
            seq = self.seq

            class _Seq(nn.Module):
                def forward(self, inp: torch.Tensor) -> torch.Tensor:
                    return torch.utils.checkpoint.checkpoint_sequential(seq, segs, inp, use_reentrant=False)

            return self._run(spec, _Seq(), guard=cap)
        plan = spec.plan
        if plan is None or not spec.capped:
            return self._run(spec, self.seq)
        chooses = plan.conv_rule != "default" or bool(plan.conv_algos)
        with (
            apply_conv_choices(self.chain, plan, self.profile) if chooses else contextlib.nullcontext(),
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", message=".*are not applied by planned", category=UserWarning)
            pm = planned(self.chain, plan)  # built inside the block: it sees the chosen convolutions
            return self._run(spec, pm, guard=functools.partial(budget_guard, self.budget_bytes, pm))

    def _run(
        self,
        spec: RowSpec,
        model: nn.Module,
        ctx: Callable[[], Any] = contextlib.nullcontext,
        guard: Callable[[], Any] = contextlib.nullcontext,
    ) -> BenchRow:
        name, kind, plan, budget_bytes = spec.name, spec.kind, spec.plan, self.budget_bytes
        warmup, iters = self.warmup, self.iters
        opt = torch.optim.SGD(self.seq.parameters(), lr=1e-4, momentum=0.9)
        x, y, dtype = self.x, self.y, self.dtype

        def step() -> None:
            with ctx(), _autocast(dtype):
                loss = step_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        predicted, alloc_ms, predicted_ms, predicted_retries, fallbacks = self._predicted(spec)

        def failed(error: str) -> BenchRow:
            return BenchRow(
                name, kind, None, None, None, False, predicted_ms, predicted.peak_bytes if predicted else None,
                budget_bytes, plan.compact() if plan else None, error=error,
                plan_json=plan.model_dump(mode="json") if plan else None, predicted_retries=predicted_retries,
                predicted_allocator_ms=alloc_ms, predicted_fallbacks=fallbacks,
            )  # fmt: skip

        try:
            with guard(), update_timer(opt, cuda=True) as updates:
                before = dataclasses.asdict(model.stats) if isinstance(model, PlannedBase) else None
                timing = time_steps(step, warmup=warmup, steps=iters)
                ms, peak, reserved = timing.step_ms, timing.peak_bytes, timing.reserved_bytes
                stats = None
                if before is not None and isinstance(model, PlannedBase):
                    after = dataclasses.asdict(model.stats)
                    stats = {k: (after[k] - before[k]) / (warmup + iters) for k in after}
            row = BenchRow(
                name,
                kind,
                ms,
                peak,
                self.per_sample / (ms / 1e3),
                peak <= budget_bytes,
                predicted_ms,
                predicted.peak_bytes if predicted else None,
                budget_bytes,
                plan.compact() if plan else None,
                offload_stats=stats,
                reserved_bytes=reserved,
                alloc_retries=timing.alloc_retries_per_step,
                plan_json=plan.model_dump(mode="json") if plan else None,
                predicted_retries=predicted_retries,
                predicted_allocator_ms=alloc_ms,
                predicted_fallbacks=fallbacks,
                compile_budget=spec.compile_budget,
                update_ms=updates.median_ms(iters),
            )
        except (PlanOutOfMemoryError, torch.OutOfMemoryError) as exc:
            row = failed(_out_of_memory(exc))
        except RuntimeError as exc:  # e.g. checkpoint_sequential on in-place ReLU
            row = failed(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        finally:
            opt.zero_grad(set_to_none=True)
            opt.state.clear()  # the momentum buffers
            _clean()
        if self.baseline is None:
            self.baseline = torch.cuda.memory_allocated()
        elif (left := torch.cuda.memory_allocated() - self.baseline) > _LEAK_SLACK_BYTES:
            row = dataclasses.replace(row, leaked_bytes=left)
        return row

    def _predicted(
        self, spec: RowSpec
    ) -> tuple[SimResult | None, float | None, float | None, float | None, int | None]:
        """What the models predict for ``spec``'s plan: the simulated result, the allocator retries' ms, the step
        (ms, retries included), the retries per step and the framework's fallbacks; Nones where the row has no plan
        (the retries' three where it runs uncapped or compiled whole)."""
        plan, budget_bytes = spec.plan, self.budget_bytes
        # under the cap (every row of ours but the unconstrained one) the prediction is for the plan as PyTorch's
        # convolutions will run it (NOTE [ Framework fallback ]) plus the retries the placement model predicts at
        # their calibrated cost (NOTE [ Allocator placement ])
        priced_on = spec.profile or self.profile
        capped = (
            predict_capped(priced_on, plan, budget_bytes, steps=self.warmup + self.iters)
            if plan is not None and spec.capped and plan.whole_compile is None  # NOTE [ Whole-model compile ]
            else None
        )
        predicted = capped.sim if capped is not None else simulate(priced_on, plan) if plan is not None else None
        alloc_ms = capped.allocator_ms if capped is not None else None
        predicted_ms = predicted.step_ms + (alloc_ms or 0.0) if predicted is not None else None
        predicted_retries = capped.placed.mean_retries if capped is not None else None
        fallbacks = capped.fallbacks if capped is not None else None
        return predicted, alloc_ms, predicted_ms, predicted_retries, fallbacks


def _out_of_memory(exc: PlanOutOfMemoryError | torch.OutOfMemoryError) -> str:
    """A row's ``error`` for a run out of memory: the allocator's own numbers (tried to allocate, allocated vs
    reserved) are the diagnosis, so they are kept, with where reserved memory sat at the failure when known."""
    text = str(exc).split(" If reserved but unallocated")[0][:600]
    where = exc.reserved if isinstance(exc, PlanOutOfMemoryError) else ""  # where reserved memory sat
    if where and where not in text:
        text += f" Reserved at the failure: {where}."
    return f"out of memory: {text}"


def _measure_fresh(
    chain_factory: Callable[[], ModelChain],
    profile: Profile,
    batch: int,
    dtype: str,
    budget_bytes: int,
    spec: RowSpec,
    warmup: int,
    iters: int,
) -> BenchRow:
    """In a child process: build the model and measure one row (NOTE [ Bench isolation ])."""
    bench = _Bench(chain_factory(), profile, batch, dtype, budget_bytes, warmup, iters)
    return bench.measure(spec)


def bench_plans(
    chain: ModelChain | None,
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
    chain_factory: Callable[[], ModelChain] | None = None,
    unconstrained: bool = True,
    compiler_budgets: Sequence[float] = (),
    offload_peer: bool = False,
    compiled_profiles: Mapping[float, Profile] | None = None,
) -> list[BenchRow]:
    """Measure the unconstrained step, each ``(name, kind, plan)``, PyTorch's built-ins and the peers on CUDA.

    # NOTE [ Bench isolation ]
    PyTorch's cuDNN convolution caches, per shape and pass, the execution plan that last ran. When that plan's
    workspace cannot be allocated under a cap it runs the next plan of cuDNN's heuristics that can, caches that
    one, and keeps it after the cap is gone (``run_single_conv`` in ATen's ``Conv_v8.cpp``). Measured on the H200
    (``scripts/conv_cache.py``): after two capped rows of VGG-16 bf16, the *unconstrained* step of the same process
    took 457.2 ms instead of 108.0, and ``torch save_on_cpu`` 1,124.4 ms instead of 769.1. Rows measured one
    after another in one process therefore depend on the rows before them. With ``chain_factory`` every row
    runs in a fresh process (``spawn``) that builds the model anew: each row starts as a user's training job
    starts. Without it the rows share this process (faster; right for models without convolutions).

    Args:
        chain: the model (moved to CUDA here); with ``chain_factory`` only its layer count is read (for
            ``checkpoint_sequential``'s segments), and None builds it with the factory when that is needed.
        profile: the profile the plans were made for (the simulator's predictions use it).
        batch: batch size; dtype: ``float32`` or an autocast dtype.
        budget_bytes: the budget each plan runs under (``budget_guard``) and ``fits`` is judged by.
        plans: ``(name, kind, plan)`` triples, e.g. every baseline policy and the tuned plan.
        pytorch_builtins: also measure ``save_on_cpu(pin_memory=True)`` and ``checkpoint_sequential``.
        capped_builtins: run those under ``budget_guard`` too (as our plans run); by default they run uncapped.
        warmup, iters: warm-up and timed steps per configuration.
        progress: called with the name of each configuration as it starts.
        on_row: called with each row as soon as it is measured (e.g. to save partial results).
        chain_factory: a picklable callable that builds the model (e.g. ``functools.partial(zoo.build, name,
            params)``): measure each row in a fresh process (NOTE [ Bench isolation ]).
        unconstrained: measure the unconstrained step first (False: only the plans and built-ins).
        compiler_budgets, offload_peer: the peers (``row_specs``).
        compiled_profiles: the compiled profile of each compile budget a plan runs at (NOTE [ Compiled stages ]).

    Returns:
        One row per configuration, in ``row_specs``'s order (the unconstrained one first, when measured).
    """
    if chain is None:
        if chain_factory is None:
            raise ValueError("bench_plans needs the model: pass chain or chain_factory")
        if pytorch_builtins:
            chain = chain_factory()  # on the CPU, for checkpoint_sequential's segment count
    specs = row_specs(
        chain,
        profile,
        plans,
        pytorch_builtins=pytorch_builtins,
        capped_builtins=capped_builtins,
        unconstrained=unconstrained,
        compiler_budgets=compiler_budgets,
        offload_peer=offload_peer,
        compiled_profiles=compiled_profiles,
    )
    bench = None
    if chain_factory is None:
        assert chain is not None
        bench = _Bench(chain, profile, batch, dtype, budget_bytes, warmup, iters)
    rows: list[BenchRow] = []
    for spec in specs:
        if progress is not None:
            progress(spec.name)
        if bench is not None:
            row = bench.measure(spec)
        else:
            assert chain_factory is not None
            try:
                row = run_isolated(
                    _measure_fresh, chain_factory, profile, batch, dtype, budget_bytes, spec, warmup, iters
                )
            except IsolatedProcessError as exc:
                row = BenchRow(spec.name, spec.kind, None, None, None, False, budget_bytes=budget_bytes, error=str(exc))
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows
