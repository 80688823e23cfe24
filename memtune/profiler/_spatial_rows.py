"""How a stage's output rows depend on its input rows: the profile's fact behind spatial splitting.

A stage that maps an image to an image row window by row window (a convolution, a pooling window, a pointwise
function) can run on horizontal strips of its input, each strip carrying the rows its windows overlap into
(the halo). ``RowMap`` records that window along H for one stage; the tuner prices and checks splits with it
(NOTE [ Spatial splitting ] in ``memtune.tuner._spatial``), and ``memtune.profiler.spatial_modules`` derives it from the
stage's modules. Torch-free: the tuner's decision code reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RowMap", "compose_rows"]


class RowMap(BaseModel):
    """Stage output row ``r`` reads input rows ``r * stride - padding`` to ``r * stride - padding + kernel - 1``;
    rows outside ``0 .. in_rows - 1`` are the stage's padding (zeros, or nothing for a max-pool).

    Attributes:
        kernel: input rows one output row reads, dilation included (``dilation * (k - 1) + 1``); 1 for a pointwise
            stage.
        stride: input rows between consecutive output rows.
        padding: rows of padding above the first input row.
        in_rows / out_rows: H of the stage's input and output, rows.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kernel: int = Field(ge=1, description="input rows one output row reads, dilation included")
    stride: int = Field(ge=1, description="input rows between consecutive output rows")
    padding: int = Field(ge=0, description="rows of padding above the first input row")
    in_rows: int = Field(ge=1, description="H of the stage's input, rows")
    out_rows: int = Field(ge=1, description="H of the stage's output, rows")

    def window(self, first: int, end: int) -> tuple[int, int, int, int]:
        """The input rows output rows ``first .. end - 1`` read: ``(lo, hi, top, bottom)``, input rows ``lo .. hi -
        1`` and the rows of padding above and below them (non-zero only at the image's true borders)."""
        start = first * self.stride - self.padding
        stop = (end - 1) * self.stride - self.padding + self.kernel
        lo, hi = max(0, start), min(self.in_rows, stop)
        return lo, hi, lo - start, stop - hi


def compose_rows(maps: Sequence[RowMap]) -> RowMap:
    """The row map of ``maps`` run one after the other (each one's output is the next one's input).

    A composed window reads the rows its parts read in turn: ``stride = s1 * s2``, ``padding = p2 * s1 + p1``,
    ``kernel = (k2 - 1) * s1 + k1``. The padding of an inner map lands on rows the outer one made, so the composed
    map bounds the rows read (what pricing needs); running a split applies each part's own padding.

    Raises:
        ValueError: ``maps`` is empty.
    """
    if not maps:
        raise ValueError("compose_rows needs at least one row map")
    out = maps[0]
    for m in maps[1:]:
        out = RowMap(
            kernel=(m.kernel - 1) * out.stride + out.kernel,
            stride=out.stride * m.stride,
            padding=m.padding * out.stride + out.padding,
            in_rows=out.in_rows,
            out_rows=m.out_rows,
        )
    return out
