"""A host byte pool that offloaded storages are copied into, allocated once and reused every step.

Allocating pinned (page-locked) host memory costs milliseconds per call (``cudaHostAlloc``), far more
than copying one activation, so the offload runtime never allocates one host tensor per saved tensor.
``HostPool`` hands out byte ranges from a few large chunks with a bump pointer. During the first step
it grows (each new chunk at least doubles the capacity); the first ``reset`` after a step that needed
more than one chunk replaces them with a single chunk of the step's high-water size; from then on a
step with the same shapes allocates nothing. A ``reserve_bytes`` hint (e.g. the simulator's
``d2h_bytes``) makes even the first step allocate once.

The pool knows nothing about streams or autograd: its owner calls ``reset`` only when no range handed
out earlier is still needed (see ``memtune.tuner.runtime.offload``).
"""

from __future__ import annotations

import torch

__all__ = ["HostPool"]

_ALIGN_BYTES = 512
_MIN_CHUNK_BYTES = 1 << 20


def _align(n: int) -> int:
    return (n + _ALIGN_BYTES - 1) // _ALIGN_BYTES * _ALIGN_BYTES


class HostPool:
    """Bump allocator over host byte chunks (pinned when ``pin_memory``).

    Not thread safe: the offload runtime calls it under its own lock.

    Args:
        pin_memory: allocate page-locked memory (needs CUDA); False for the CPU runtime.
        reserve_bytes: allocate one chunk of this many bytes up front (0: grow on demand).
    """

    def __init__(self, *, pin_memory: bool, reserve_bytes: int = 0) -> None:
        if reserve_bytes < 0:
            raise ValueError(f"reserve_bytes must be >= 0, got {reserve_bytes}")
        self.pin_memory = pin_memory
        self._chunks: list[torch.Tensor] = []
        self._chunk = 0  # index of the chunk the cursor is in
        self._offset = 0  # bytes used in that chunk
        self._used = 0  # bytes handed out since the last reset (aligned)
        self.high_water_bytes = 0
        """Most bytes handed out between two resets (aligned)."""
        self.allocations = 0
        """How many host allocations the pool has made in its life."""
        if reserve_bytes:
            self._new_chunk(_align(reserve_bytes))

    # ---- inspection --------------------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int:
        """Total bytes of the chunks held now."""
        return sum(c.numel() for c in self._chunks)

    @property
    def used_bytes(self) -> int:
        """Bytes handed out since the last reset (aligned to 512 bytes per range)."""
        return self._used

    @property
    def chunk_pointers(self) -> tuple[int, ...]:
        """Host addresses of the chunks (stable while the pool is reused)."""
        return tuple(c.data_ptr() for c in self._chunks)

    # ---- allocation --------------------------------------------------------------------------------
    def _new_chunk(self, nbytes: int) -> None:
        self._chunks.append(torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin_memory))
        self.allocations += 1

    def alloc(self, nbytes: int) -> torch.Tensor:
        """A 1-D uint8 host tensor of ``nbytes`` bytes, valid until the next ``reset``."""
        if nbytes <= 0:
            raise ValueError(f"HostPool.alloc needs a positive byte count, got {nbytes}")
        size = _align(nbytes)
        while self._chunk < len(self._chunks):
            chunk = self._chunks[self._chunk]
            if self._offset + size <= chunk.numel():
                break
            self._chunk += 1
            self._offset = 0
        else:
            self._new_chunk(max(size, _MIN_CHUNK_BYTES, self.capacity_bytes))
        out = self._chunks[self._chunk][self._offset : self._offset + nbytes]
        self._offset += size
        self._used += size
        self.high_water_bytes = max(self.high_water_bytes, self._used)
        return out

    def reset(self) -> None:
        """Make every byte free again (the chunks are kept for the next step).

        Call only when no range handed out before is still read or written (no live offload entry,
        no copy in flight).
        """
        self._chunk = 0
        self._offset = 0
        self._used = 0

    def release(self) -> None:
        """Drop every chunk (the memory goes back to the host allocator)."""
        self._chunks = []
        self._chunk = 0
        self._offset = 0
        self._used = 0
