"""Buffers kept as they were across a recompute's re-run (NOTE [ Buffers during recompute ] in
``memtune.tuner.runtime._segments``): one piece of code for a chain's segments and a module's stages. Each buffer is
cloned before the re-run and copied back after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["buffers_kept"]


@contextlib.contextmanager
def buffers_kept(buffers: Iterable[torch.Tensor]) -> Iterator[None]:
    """Put ``buffers`` back as they are now when the block ends, by error too (NOTE [ Buffers during recompute ]),
    bit for bit and in place. Runs outside any dispatch mode (selective checkpointing's refuses operations the first
    forward did not run)."""
    with _disable_current_modes():
        kept = [(b, b.detach().clone()) for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad(), _disable_current_modes():
            for b, old in kept:
                b.copy_(old)
