"""Gradients judged against float64 (NOTE [ Gradients against float64 ] in ``memtune.tuner.runtime.float64``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from memtune.tuner.runtime import float64_step, judge_against_float64, reference_step
from memtune.tuner.runtime.float64 import COMPARABLE_LOSS_ERROR


def _model() -> tuple[nn.Module, torch.Tensor, list[str]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return model, torch.randn(16, 3, 8, 8), names


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.square().mean()


def test_the_float64_step_leaves_the_model_as_it_was_and_agrees_with_float32_to_rounding() -> None:
    model, x, names = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    truth = float64_step(model, x, loss_fn=_loss)
    assert all(g is not None and g.dtype == torch.float64 for g in truth.grads)
    assert all(p.dtype == torch.float32 and p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # buffers restored too
    ref = reference_step(model, x, loss_fn=_loss)
    judged = judge_against_float64(ref.grads, ref, truth, names)
    assert judged.comparable and judged.loss_error < 1e-6
    assert judged.within and judged.ratio == 1.0  # the reference against itself
    assert all(0 < e < 1e-5 for e in judged.errors)
    assert judged.summary() == {"within": True, "ratio": 1.0, "worst": judged.worst, "loss_error": judged.loss_error,
                               "run_loss_error": 0.0, "comparable": True}  # fmt: skip


def test_a_gradient_further_from_float64_than_twice_the_references_error_fails_and_is_named() -> None:
    model, x, names = _model()
    truth = float64_step(model, x, loss_fn=_loss)
    ref = reference_step(model, x, loss_fn=_loss)
    k = names.index("4.weight")  # the classifier's
    grads = list(ref.grads)
    t, r = truth.grads[k], ref.grads[k]
    assert t is not None and r is not None
    grads[k] = (t + 3 * (r.double() - t)).float()  # three times the reference's error, entry by entry
    judged = judge_against_float64(grads, ref, truth, names)
    assert not judged.within
    assert judged.worst == names[k] and 2.5 < judged.ratio < 3.5
    halfway = list(ref.grads)
    halfway[k] = (t + 0.5 * (r.double() - t)).float()  # nearer float64 than the reference: within
    assert judge_against_float64(halfway, ref, truth, names).within


def test_a_float64_step_that_drew_other_random_numbers_is_not_comparable() -> None:
    model, x, names = _model()
    truth = float64_step(model, x, loss_fn=_loss)
    ref = reference_step(model, x, loss_fn=_loss)
    other = dataclasses.replace(truth, loss=truth.loss * (1 + 100 * COMPARABLE_LOSS_ERROR))
    assert not judge_against_float64(ref.grads, ref, other, names).comparable
    # a planned run that drew other numbers than the reference (BERT's eager attention beside the compiled run: its
    # loss 9.9e-5 off on an H200) is not comparable either, whatever its gradients
    judged = judge_against_float64(ref.grads, ref, truth, names, run_loss_error=100 * COMPARABLE_LOSS_ERROR)
    assert judged.within and not judged.comparable and judged.summary()["run_loss_error"] > COMPARABLE_LOSS_ERROR


def test_the_bench_line_says_the_float64_verdict_or_why_there_is_none() -> None:
    from memtune.api.cli._cli_bench import float64_text

    assert float64_text({}) == ""
    row = {"float64": {"within": True, "ratio": 1.17, "worst": "layer2.2.bn1.bias", "loss_error": 4.9e-8,
                       "comparable": True}}  # fmt: skip
    assert "1.17x the unplanned step's (layer2.2.bn1.bias): within PyTorch's accuracy rule" in float64_text(row)
    row["float64"].update(within=False)
    assert "NOT within" in float64_text(row)
    row["float64"].update(comparable=False, loss_error=0.3)
    assert "not judged against float64: a loss is 3.0e-01 off" in float64_text(row)
    assert "does not fit" in float64_text({"float64": {"error": "the float64 step does not fit the GPU: ..."}})


def test_the_bench_judges_the_plans_gradients_held_by_the_model_against_float64() -> None:
    from memtune.tuner.measure import module_bench

    model, x, _ = _model()
    ref = reference_step(model, x, loss_fn=_loss)
    for p, g in zip(model.parameters(), ref.grads, strict=True):
        p.grad = None if g is None else g.clone()  # the planned step as the bench leaves it: here the same math
    row = module_bench._against_float64(model, x, _loss, ref, 0.0)
    assert row["within"] and row["comparable"] and row["ratio"] == 1.0, row


def test_a_float64_step_that_does_not_fit_the_gpu_says_so_instead_of_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    from memtune.tuner.runtime import float64 as f64

    def too_big(*_a: object, **_k: object) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore lines")

    model, x, _ = _model()
    monkeypatch.setattr(f64, "float64_step", too_big)
    truth, error = f64.fitting_float64_step(model, x, loss_fn=_loss)
    assert truth is None
    assert error == "the float64 step does not fit the GPU: CUDA out of memory. Tried to allocate 20.00 GiB"


class Dropping(nn.Module):
    """Dropout, a stochastic depth's per-sample draw (``bernoulli_`` in place) and ``torch.bernoulli`` of
    probabilities, the draws a float64 step must make as float32 does (``tests/gpu/test_float64_gpu.py`` too)."""

    def __init__(self, width: int = 32, hidden: int = 32) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(width, hidden), nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.dropout(torch.relu(self.a(x)), 0.3, self.training)
        keep = torch.empty(x.shape[0], 1, dtype=x.dtype, device=x.device).bernoulli_(0.8)
        gate = torch.bernoulli(torch.full_like(y, 0.6))
        return self.b(y * keep / 0.8 * gate)


def test_float64_draws_are_made_as_float32_makes_them_and_the_judgement_stays_comparable() -> None:
    """NOTE [ Float32 draws in the float64 step ]: every draw of the float64 step is made on a float32 tensor; on the
    CPU, whose draws do not depend on the dtype, its values are what they were, so the masks match either way."""
    from memtune.tuner.runtime.float64 import Float32Draws

    x = torch.randn(64, 32, dtype=torch.float64)
    torch.manual_seed(3)
    plain = nn.functional.dropout(x, 0.3, True)
    torch.manual_seed(3)
    with Float32Draws() as mode:
        drawn = nn.functional.dropout(x, 0.3, True)
        unchanged = nn.functional.dropout(x, 0.3, False)  # not training: no draw
        kept = torch.ones(8, dtype=torch.float64).bernoulli_(torch.full((8,), 0.5, dtype=torch.float64))
    assert mode.drawn == 2 and drawn.dtype == torch.float64 and kept.dtype == torch.float64
    assert torch.equal(drawn, plain) and torch.equal(unchanged, x)
    torch.manual_seed(0)
    model = Dropping()
    names = [n for n, _ in model.named_parameters()]
    inputs = torch.randn(16, 32)
    truth = float64_step(model, inputs, loss_fn=_loss)
    ref = reference_step(model, inputs, loss_fn=_loss)
    judged = judge_against_float64(ref.grads, ref, truth, names)
    assert judged.comparable and judged.within, judged.summary()
