"""What the CUDA caching allocator holds: a short account of reserved segments for out-of-memory errors.

When a planned step runs out of memory with much memory "reserved but unallocated", the question is where
that memory sits: in segments a live tensor pins (non-expandable segments are released only whole), on
another stream (blocks are reused only on the stream that freed them), or in the small pool. This module
groups ``torch.cuda.memory_snapshot()`` segments by (stream, pool, expandable) and says so in one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SegmentGroup", "describe_reserved", "group_segments", "reserved_summary"]


@dataclass(frozen=True)
class SegmentGroup:
    """Segments of one stream, pool and kind, summed (bytes)."""

    stream: int
    pool: str
    """``large`` or ``small``"""
    expandable: bool
    segments: int
    reserved_bytes: int
    allocated_bytes: int

    @property
    def unallocated_bytes(self) -> int:
        """Reserved bytes no live block uses (cached, or stranded beside live blocks)."""
        return self.reserved_bytes - self.allocated_bytes


def group_segments(segments: Iterable[Mapping[str, Any]]) -> list[SegmentGroup]:
    """Group ``memory_snapshot()`` segment dicts by (stream, pool, expandable); most unallocated first."""
    acc: dict[tuple[int, str, bool], list[int]] = {}
    for seg in segments:
        key = (int(seg.get("stream", 0)), str(seg.get("segment_type", "large")), bool(seg.get("is_expandable", False)))
        row = acc.setdefault(key, [0, 0, 0])
        row[0] += 1
        row[1] += int(seg["total_size"])
        row[2] += int(seg["allocated_size"])
    groups = [SegmentGroup(s, p, e, n, r, a) for (s, p, e), (n, r, a) in acc.items()]
    return sorted(groups, key=lambda g: (-g.unallocated_bytes, -g.reserved_bytes))


def describe_reserved(groups: Iterable[SegmentGroup]) -> str:
    """One line: per group, reserved and allocated GiB, e.g. ``stream 0 large expandable: 3 segments ...``."""
    parts = [
        f"stream {g.stream:#x} {g.pool}{' expandable' if g.expandable else ''}: {g.segments} segment(s), "
        f"{g.reserved_bytes / 2**30:.2f} GiB reserved, {g.allocated_bytes / 2**30:.2f} GiB allocated"
        for g in groups
    ]
    return "; ".join(parts) if parts else "no segments reserved"


def reserved_summary(device: int | None = None) -> str:
    """``describe_reserved`` of this process's CUDA segments now (on ``device``, default all); "" without CUDA."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return ""
    segs = torch.cuda.memory_snapshot()
    if device is not None:
        segs = [s for s in segs if int(s.get("device", 0)) == device]
    return describe_reserved(group_segments(segs))
