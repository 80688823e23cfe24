"""The training step's loss: its definition, its measured time and its roofline estimate.

Every step memtune measures or simulates ends in the same loss (NOTE [ Bench step ] in ``memtune.tuner.measure.bench``):
cross-entropy in fp32 over the model's output, ``(batch, classes)`` logits against class labels or
``(batch, tokens, vocab)`` logits against next tokens. For 1000 ImageNet classes it costs microseconds; for
a language model's logits it is several memory-bound passes over gigabytes (measured on the H200: about
11 ms of a 141 ms GPT step at batch 16), so the profile carries its time (``Profile.loss_ms``) and the
simulator adds it between forward and backward (NOTE [ Loss memory ] in ``memtune.tuner.simulator`` counts its bytes).

Where no measurement exists (profiles made on the CPU or from the roofline), the simulator estimates it from the
bytes its kernels move: that model needs no torch and lives in ``memtune.profiler.loss_model`` (``modeled_loss_ms``,
``profile_loss_ms``), which this module re-exports.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from memtune.profiler.loss_model import loss_bytes_moved, modeled_loss_ms, profile_loss_ms

# torch is imported where it is used, so that importing this module stays light; the simulator's loss time
# (``profile_loss_ms``) lives in the torch-free ``memtune.profiler.loss_model``
if TYPE_CHECKING:
    import torch

    from memtune.profiler.chain import ModelChain

__all__ = [
    "loss_bytes_moved",
    "loss_classes",
    "measure_loss_ms",
    "modeled_loss_ms",
    "output_shape",
    "profile_loss_ms",
    "step_loss",
]


def step_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in fp32: ``out`` ``(batch, classes)`` with labels ``y`` ``(batch,)``, or ``(batch, tokens,
    vocab)`` with next tokens ``y`` ``(batch, tokens)``."""
    import torch.nn.functional as F

    if out.dim() == 3:
        return F.cross_entropy(out.float().flatten(0, 1), y.flatten())
    return F.cross_entropy(out.float(), y)


def loss_classes(chain: ModelChain) -> int:
    """How many classes the loss scores: the vocabulary of a token model, else ``num_classes`` (default 1000)."""
    if chain.input_kind == "tokens":
        return int(chain.vocab_size)
    return int(chain.params.get("num_classes", 1000))


def output_shape(chain: ModelChain, batch: int) -> tuple[int, ...]:
    """The shape of the model output the loss reads: ``(batch, tokens, vocab)`` or ``(batch, classes)``."""
    if chain.input_kind == "tokens":
        return (batch, *chain.input_shape, loss_classes(chain))
    return (batch, loss_classes(chain))


def measure_loss_ms(
    output_shape: Sequence[int],
    classes: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    warmup: int = 2,
    repeats: int = 5,
) -> float:
    """Median ms of ``step_loss`` forward + backward on CUDA for a random output of ``output_shape`` in
    ``dtype`` (the model output's dtype: the autocast dtype, or fp32), with random targets below ``classes``.

    Raises:
        ValueError: ``device`` is not a CUDA device, or ``output_shape`` is not 2-D or 3-D.
    """
    if device.type != "cuda":
        raise ValueError(f"measure_loss_ms times CUDA kernels; got device {device}")
    if len(output_shape) not in (2, 3):
        raise ValueError(f"the output must be (batch, classes) or (batch, tokens, vocab), got {tuple(output_shape)}")
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    out = torch.randn(*output_shape, generator=g).to(device=device, dtype=dtype).requires_grad_()
    y = torch.randint(0, classes, tuple(output_shape[:-1]), generator=g).to(device)
    times: list[float] = []
    for i in range(warmup + repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step_loss(out, y).backward()
        end.record()
        end.synchronize()
        out.grad = None
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)
