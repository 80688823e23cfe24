"""A plan's gradients judged against float64: the rule PyTorch's own compiler benchmarks judge accuracy by.

# NOTE [ Gradients against float64 ]
Two float32 runs of one model differ by rounding wherever they sum in another order: other kernels, other fusions,
other convolution algorithms. Compared with each other, a gradient whose entries nearly cancel shows a large relative
error from rounding alone, and a second run's spread is one sample of that rounding. PyTorch's compiler benchmarks
judge a compiled run instead against the same step in float64 (``torch._dynamo.utils.same`` with ``fp64_ref``): the
compiled result's root-mean-square error against float64 may be at most ``multiplier`` times the eager result's, with
``multiplier`` 2 for float32 (3 for tensors of fewer than 1,000 entries and for 1 x 1 kernels, where noise dominates).

memtune judges a plan the same way against the run it replaces, the unplanned compiled step: per gradient, the plan's
RMSE against a float64 eager step of the same parameters, buffers, inputs and seed, at most that multiplier times the
unplanned compiled step's RMSE (``same(reference, plan, fp64_ref=truth, tol=0)``: no absolute tolerance, so only
the ratio decides). A plan within it rounds no worse than the compiler does. The float64 step is an eager run of a
float64 copy of the model (``float64_step``); random draws (dropout) must match the float32 runs', so the judgement
also keeps the float64 loss's relative error against the reference's (``loss_error``) and the judged run's own loss
error against the reference's (``run_loss_error``): where either drew other masks the loss moves by far more than
rounding, and the judgement is not comparable (``comparable``). On an H200 rounding moved the loss by 1.0e-8 to 5.5e-8
(BERT, EfficientNet-B0, ViT-B/16 against float64), other draws by 9.9e-5 (BERT's eager attention, whose fused kernel
draws its dropout itself, against the compiled run) and 6.0e-4 (EfficientNet-B0 before ``Float32Draws``); the line
(``COMPARABLE_LOSS_ERROR``) lies between.

NOTE [ Float32 draws in the float64 step ]
A CUDA kernel that draws random numbers maps them to elements by how it unrolls its loop, which depends on the dtype:
EfficientNet-B0's dropout and stochastic depth drew other masks in its float64 step than in float32 on an H200 (the
float64 loss 6.0e-4 off), so none of its plans could be judged. So the float64 step draws as float32 does
(``Float32Draws``, a dispatch mode around it): a ``bernoulli`` on a float64 tensor draws on a float32 tensor of its
shape and device and is copied back; a ``native_dropout`` of a float64 input (CUDA's dropout) draws its mask by a
float32 ``native_dropout`` of ones of the input's shape and scales the float64 input by it. The draws then consume the
generator as the float32 run's did, op for op and shape for shape; the loss check above still decides whether they
matched. On the CPU, whose draws do not depend on the dtype, nothing changes.

NOTE: ``torch._dynamo.utils.same(ref, res, fp64_ref=..., tol=..., log_error=...)`` and ``rmse``, read in torch 2.13's
``torch/_dynamo/utils.py``; its float64 rule and these arguments date from torch 2.1, so torch 2.11 (the GPU image)
has them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from memtune.tuner.runtime.verify import ReferenceStep, reference_step, relative_error

__all__ = [
    "COMPARABLE_LOSS_ERROR",
    "Float32Draws",
    "Float64Judgement",
    "fitting_float64_step",
    "float64_step",
    "judge_against_float64",
]

COMPARABLE_LOSS_ERROR = 1e-6
"""The largest relative error of the float64 loss, and of the judged run's loss, against the float32 reference's for
the judgement to stand: rounding is more than ten times below it, other dropout masks more than ten times above (NOTE
[ Gradients against float64 ])."""


@dataclass(frozen=True)
class Float64Judgement:
    """A run's gradients against float64, beside the reference run's (NOTE [ Gradients against float64 ]).

    Attributes:
        within: every gradient passes PyTorch's float64 rule.
        ratio: the largest of (the run's RMSE against float64) / (the reference's), over the gradients; ``worst``
            names its parameter.
        errors: each gradient's RMSE against float64, in the parameters' order; ``reference_errors`` the reference's.
        loss_error: the reference loss's relative error against the float64 loss.
        run_loss_error: the judged run's loss, relative error against the reference's (0 where not given).
    """

    within: bool
    ratio: float
    worst: str
    errors: tuple[float, ...]
    reference_errors: tuple[float, ...]
    loss_error: float
    run_loss_error: float = 0.0

    @property
    def comparable(self) -> bool:
        """Whether the float64 step and the judged run drew the reference's random numbers
        (``COMPARABLE_LOSS_ERROR``)."""
        return max(self.loss_error, self.run_loss_error) <= COMPARABLE_LOSS_ERROR

    def summary(self) -> dict[str, Any]:
        """The judgement without its per-gradient errors, JSON-ready: ``within``, ``ratio``, ``worst``, ``loss_error``,
        ``run_loss_error`` and ``comparable``."""
        return {"within": self.within, "ratio": self.ratio, "worst": self.worst, "loss_error": self.loss_error,
                "run_loss_error": self.run_loss_error, "comparable": self.comparable}  # fmt: skip


def float64_step(
    model: nn.Module, inputs: Any, *, loss_fn: Callable[[Any], torch.Tensor], seed: int = 0
) -> ReferenceStep:
    """One eager training step of a float64 copy of ``model`` on ``inputs`` (floating tensors made float64), from the
    model's parameters and buffers and ``seed``; the model itself is untouched. Its memory is freed when it returns but
    for the gradients and buffers it records."""
    twin = copy.deepcopy(model).double()
    with Float32Draws():  # NOTE [ Float32 draws in the float64 step ]
        return reference_step(twin, tree_map_only(torch.Tensor, _float64, inputs), loss_fn=loss_fn, seed=seed)


def fitting_float64_step(
    model: nn.Module, inputs: Any, *, loss_fn: Callable[[Any], torch.Tensor], seed: int = 0
) -> tuple[ReferenceStep | None, str | None]:
    """``float64_step``, or why it could not run: it holds twice a float32 step's activations (four times a bfloat16
    one's), and where that does not fit the GPU the step is None and the text says so."""
    try:
        return float64_step(model, inputs, loss_fn=loss_fn, seed=seed), None
    except torch.cuda.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        return None, f"the float64 step does not fit the GPU: {str(exc).splitlines()[0][:200]}"


_aten = torch.ops.aten
_DRAWN_IN_PLACE = (_aten.bernoulli_.float, _aten.bernoulli_.Tensor)
_DRAWN = (_aten.bernoulli.default, _aten.bernoulli.p)


class Float32Draws(TorchDispatchMode):
    """Random draws on float64 tensors made as on float32 ones (NOTE [ Float32 draws in the float64 step ]).

    Attributes:
        drawn: how many draws it made in float32 for a float64 tensor.
    """

    def __init__(self) -> None:
        super().__init__()
        self.drawn = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        first = args[0] if args else None
        if not isinstance(first, torch.Tensor) or first.dtype != torch.float64:
            return func(*args, **kwargs)
        if func in _DRAWN_IN_PLACE:
            self.drawn += 1
            draw = torch.empty(first.shape, dtype=torch.float32, device=first.device)
            rest = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args[1:]]
            func(draw, *rest, **kwargs)
            return first.copy_(draw)
        if func in _DRAWN:
            self.drawn += 1
            return func(first.float(), *args[1:], **kwargs).to(torch.float64)
        if func is _aten.native_dropout.default:
            p = float(args[1] if len(args) > 1 else kwargs["p"])
            train = args[2] if len(args) > 2 else kwargs.get("train")
            if train is not False and p > 0:  # aten drops where ``train`` is None or True
                self.drawn += 1
                _, mask = func(torch.ones(first.shape, dtype=torch.float32, device=first.device), p, train)
                return first * mask * (0.0 if p >= 1 else 1.0 / (1.0 - p)), mask
        return func(*args, **kwargs)


def _float64(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def judge_against_float64(
    grads: Sequence[torch.Tensor | None],
    reference: ReferenceStep,
    truth: ReferenceStep,
    names: Sequence[str],
    *,
    run_loss_error: float = 0.0,
) -> Float64Judgement:
    """``grads`` (a planned step's, in the parameters' order) judged against ``truth`` (``float64_step``) beside
    ``reference`` (the unplanned step), by ``torch._dynamo.utils.same`` with no absolute tolerance. ``run_loss_error``:
    the planned step's loss, relative error against the reference's (``check_equivalence``'s ``loss``), which decides
    with the float64 loss's whether the judgement is comparable.

    Raises:
        ValueError: the steps hold different numbers of gradients.
    """
    from torch._dynamo.utils import rmse, same

    if not len(grads) == len(reference.grads) == len(truth.grads) == len(names):
        raise ValueError(f"{len(grads)}, {len(reference.grads)} and {len(truth.grads)} gradients for {len(names)}")
    within, ratio, worst = True, 0.0, ""
    errors: list[float] = []
    reference_errors: list[float] = []
    for name, g, r, t in zip(names, grads, reference.grads, truth.grads, strict=True):
        if g is None or r is None or t is None:
            errors.append(0.0 if g is None and r is None else math.inf)
            reference_errors.append(0.0)
            within = within and g is None and r is None
            continue
        e, re_ = float(rmse(t, g)), float(rmse(t, r))
        errors.append(e)
        reference_errors.append(re_)
        within = within and bool(same(r, g, fp64_ref=t, tol=0.0, log_error=lambda *_: None))
        share = e / re_ if re_ > 0 else (0.0 if e == 0 else math.inf)
        if not worst or share > ratio:
            ratio, worst = share, name
    loss_error = relative_error(reference.loss.double(), truth.loss)
    return Float64Judgement(within, ratio, worst, tuple(errors), tuple(reference_errors), loss_error, run_loss_error)
