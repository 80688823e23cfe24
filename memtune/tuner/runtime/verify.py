"""Checking that a plan does not change the math: one planned step against the unplanned one.

Used by the tests (CPU and GPU) and by anyone validating a plan before trusting it: the same model,
input and RNG seed run once plainly (``reference_step``) and ``steps`` times planned (buffers restored
in between, no optimizer step), and the loss, every parameter gradient and every buffer are compared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memtune.profiler import ModelChain
from memtune.profiler.module_stages import call_model
from memtune.tuner.plan import Plan
from memtune.tuner.runtime._planned import PlannedBase, planned

__all__ = [
    "Equivalence",
    "ReferenceStep",
    "check_equivalence",
    "compare_steps",
    "deterministic_math",
    "reference_step",
    "relative_error",
]

LossFn = Callable[[Any], torch.Tensor]


@contextlib.contextmanager
def deterministic_math() -> Iterator[None]:
    """cuDNN deterministic and not autotuned, TF32 off for convolutions and matrix products; the flags restored after.

    Inside it, two runs of the same math give the same bits, and fp32 is fp32: what a comparison of gradients needs.
    """
    flags = (
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        (
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark,
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
        ) = flags


def _default_loss(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().square().mean()
    from memtune.profiler.module_profile import default_loss  # structured outputs (module stages)

    return default_loss(out)


def _call(run: nn.Module, inputs: Any) -> Any:
    """``run`` on ``inputs``: a tensor, a tuple of arguments, a dict of keyword arguments or ``(args, kwargs)``."""
    if isinstance(inputs, torch.Tensor):
        return run(inputs)
    from memtune.profiler.module_profile import as_inputs

    return call_model(run, as_inputs(inputs))


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|`` (0 when equal, inf when only ``expected`` is zero)."""
    a = actual.detach()
    e = expected.detach().to(a.device)
    if a.shape != e.shape:
        return float("inf")
    if torch.equal(a, e) or a.numel() == 0:
        return 0.0
    if not a.is_floating_point():
        a, e = a.double(), e.double()
    diff = float((a - e).abs().max())
    scale = float(e.abs().max())
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0.0 else float("inf")


def _grad_error(actual: torch.Tensor | None, expected: torch.Tensor | None) -> float:
    if actual is None or expected is None:
        return 0.0 if actual is None and expected is None else float("inf")
    return relative_error(actual, expected)


@dataclass(frozen=True)
class Equivalence:
    """Largest relative errors of a planned run against the unplanned one (see ``relative_error``).

    Attributes:
        loss: of the loss.
        grad: over every parameter gradient; ``worst_grad`` names the parameter.
        buffer: over every buffer after the step (BatchNorm running statistics).
        steps: planned steps compared.
        grads: each gradient's error, in the parameters' order (the largest over the steps); empty where not kept.
    """

    loss: float
    grad: float
    buffer: float
    worst_grad: str
    steps: int
    grads: tuple[float, ...] = ()

    def ok(self, rtol: float = 1e-6) -> bool:
        """True when every error is at most ``rtol``."""
        return max(self.loss, self.grad, self.buffer) <= rtol


def _module(model: ModelChain | nn.Module) -> nn.Module:
    return model.as_sequential() if isinstance(model, ModelChain) else model


@dataclass(frozen=True)
class ReferenceStep:
    """One unplanned training step to compare planned steps against (see ``reference_step``).

    Attributes:
        loss: the loss.
        grads: every trainable parameter's gradient (None where it got none), in parameter order.
        buffers: every buffer after the step; ``start_buffers``: before it.
        seed: the RNG seed the step ran with.
    """

    loss: torch.Tensor
    grads: tuple[torch.Tensor | None, ...]
    buffers: dict[str, torch.Tensor]
    start_buffers: dict[str, torch.Tensor]
    seed: int


def _trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def _step(
    module: nn.Module, run: nn.Module, inputs: Any, loss_fn: LossFn, seed: int, start: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    with torch.no_grad():
        for n, b in module.named_buffers():
            b.copy_(start[n])
        for _, p in _trainable(module):
            if p.grad is not None:
                p.grad.zero_()  # reuse the gradient memory: 0 + g == g exactly
    torch.manual_seed(seed)
    loss = loss_fn(_call(run, inputs))
    loss.backward()
    return loss.detach(), {n: b.detach().clone() for n, b in module.named_buffers()}


def reference_step(
    model: ModelChain | nn.Module,
    inputs: Any,
    *,
    loss_fn: LossFn = _default_loss,
    seed: int = 0,
    run: nn.Module | None = None,
) -> ReferenceStep:
    """Run one unplanned step (gradients reset first) and record loss, gradients and buffers.

    Pass it to ``check_equivalence(..., reference=...)`` to compare several plans against one run. ``run``: what
    computes the step instead of the model itself, sharing its parameters and buffers (the model compiled, NOTE
    [ Compiled stages ] in ``memtune.profiler.compiled``: plans run compiled are compared with the unplanned compiled
    run).
    """
    module = _module(model)
    start = {n: b.detach().clone() for n, b in module.named_buffers()}
    for _, p in _trainable(module):
        p.grad = None
    loss, buffers = _step(module, module if run is None else run, inputs, loss_fn, seed, start)
    grads = tuple(None if p.grad is None else p.grad.detach().clone() for _, p in _trainable(module))
    return ReferenceStep(loss, grads, buffers, start, seed)


def compare_steps(step: ReferenceStep, reference: ReferenceStep, names: Sequence[str] | None = None) -> Equivalence:
    """The largest relative errors of one recorded step against another of the same model and inputs (loss, every
    gradient, every buffer after the step), ``worst_grad`` named from ``names`` (the trainable parameters' names, in
    order; their indices without). ``steps`` is 1. Two ``reference_step`` runs of one compiled model give its
    run-to-run spread; an eager run against a compiled one, what compiling changes.

    Raises:
        ValueError: the steps hold different numbers of gradients.
    """
    if len(step.grads) != len(reference.grads):
        raise ValueError(f"{len(step.grads)} gradients against {len(reference.grads)}")
    labels = list(names) if names is not None else [str(i) for i in range(len(step.grads))]
    errors = tuple(_grad_error(g, r) for g, r in zip(step.grads, reference.grads, strict=True))
    grad_err, worst = 0.0, ""
    for name, err in zip(labels, errors, strict=True):
        if not worst or err > grad_err:
            grad_err, worst = err, name
    buffer_err = max((relative_error(b, reference.buffers[n]) for n, b in step.buffers.items()), default=0.0)
    return Equivalence(relative_error(step.loss, reference.loss), grad_err, buffer_err, worst, 1, errors)


def check_equivalence(
    model: ModelChain | nn.Module,
    plan: Plan,
    inputs: Any,
    *,
    loss_fn: LossFn = _default_loss,
    seed: int = 0,
    steps: int = 2,
    reference: ReferenceStep | None = None,
    **planned_kwargs: Any,
) -> tuple[Equivalence, PlannedBase]:
    """Run ``steps`` planned training steps and compare each with one unplanned step.

    Each step starts from the same buffers with ``torch.manual_seed(seed)``, so dropout draws the same
    masks. Parameters are not updated; gradients are zeroed before each step.

    Args:
        model: the chain or module (its parameters are shared with the planned model).
        plan: the plan to check.
        inputs: the batch: a tensor, a tuple of arguments, a dict of keyword arguments or ``(args, kwargs)``.
        loss_fn: output -> scalar loss (default: mean of squares, in float32).
        seed: the RNG seed of every step (ignored when ``reference`` is given: its seed is used).
        steps: planned steps (two or more also exercise the host pool's reuse).
        reference: an earlier ``reference_step`` of the same model, inputs and loss (default: run one).
        planned_kwargs: passed to ``planned``.

    Returns:
        The largest errors over the planned steps, and the planned model (for its ``stats``/``pool``).
    """
    module = _module(model)
    ref = reference if reference is not None else reference_step(model, inputs, loss_fn=loss_fn, seed=seed)
    params = _trainable(module)
    if len(params) != len(ref.grads):
        raise ValueError(f"reference has {len(ref.grads)} gradients but the model has {len(params)} parameters")
    pm = planned(model, plan, **planned_kwargs)
    names = [n for n, _ in params]
    errors = []
    for _ in range(steps):
        loss, bufs = _step(module, pm, inputs, loss_fn, ref.seed, ref.start_buffers)
        grads = tuple(p.grad for _, p in params)
        errors.append(compare_steps(ReferenceStep(loss, grads, bufs, ref.start_buffers, ref.seed), ref, names))
    worst = max(errors, key=lambda e: e.grad, default=Equivalence(0.0, 0.0, 0.0, "", 0))
    loss_err = max((e.loss for e in errors), default=0.0)
    buf_err = max((e.buffer for e in errors), default=0.0)
    per_grad = tuple(max(column) for column in zip(*(e.grads for e in errors), strict=True)) if errors else ()
    return Equivalence(loss_err, worst.grad, buf_err, worst.worst_grad, steps, per_grad), pm
