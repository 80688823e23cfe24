"""The random state a recomputed stage replays: CPU and every CUDA device the stage touches.

# NOTE [ Random state under recompute ]
A ``recompute`` or ``selective`` stage runs its forward twice: once in the forward pass, once in the backward. Its
dropout, stochastic depth and any other random op must draw the same numbers both times, or the backward
differentiates another function than the forward computed: the loss is identical and the gradients are silently
wrong. Non-reentrant ``torch.utils.checkpoint`` stashes the random state only of the devices of the tensors among
its *positional* arguments. A module stage is often called with keyword arguments only (Hugging Face's T5 calls its
encoder as ``encoder(input_ids=..., attention_mask=...)``), so checkpoint saw no CUDA tensor and replayed only the
CPU generator: on an H100 a T5 with its default dropout of 0.1 gave relative gradient errors of 0.17-0.89 with a
recomputed stage, exact on the CPU (where the CPU generator is the one dropout uses).

The runtime therefore stashes the state itself, before the first run, of the CPU generator and of every CUDA device
that the stage's arguments (positional or keyword, nested in lists, dicts or model outputs), its parameters or its
buffers live on, plus the current CUDA device (where a stage makes tensors from nothing). The re-run forks those
generators, sets the stashed states, runs, and leaves the generators as they were, so the rest of the backward
draws what it would without the plan. ``checkpoint`` is called with ``preserve_rng_state=False``: one stash, not two.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = ["RandomState"]


@dataclass(frozen=True)
class RandomState:
    """The CPU generator's state and those of some CUDA devices, captured at one moment (NOTE [ Random state under
    recompute ])."""

    cpu: torch.Tensor
    cuda: tuple[tuple[int, torch.Tensor], ...]

    @classmethod
    def capture(cls, tensors: Iterable[torch.Tensor]) -> RandomState:
        """The state now of the CPU generator and of the CUDA devices of ``tensors`` and the current device.

        Devices are only read where CUDA is already initialized, so capturing never starts a CUDA context."""
        devices: set[int] = set()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            devices.add(torch.cuda.current_device())
            devices.update(t.device.index or 0 for t in tensors if t.device.type == "cuda")
        return cls(torch.get_rng_state(), tuple((d, torch.cuda.get_rng_state(d)) for d in sorted(devices)))

    @contextmanager
    def replayed(self) -> Iterator[None]:
        """Run the body with the captured states; every generator is restored to its state before the body after."""
        with torch.random.fork_rng(devices=[d for d, _ in self.cuda], device_type="cuda"):
            torch.set_rng_state(self.cpu)
            for d, state in self.cuda:
                torch.cuda.set_rng_state(state, d)
            yield
