"""The host link that the GPUs of one host share: each GPU's pinned copy rate by how many GPUs copy at once.

A GPU type's calibration may carry the table (``shared_link_gbps``, written by ``python -m benchmarks.shared_link``)
and the gradient all-reduce rate between its GPUs (``allreduce_gbps``); ``memtune.tuner._ranks`` prices data-parallel
plans with them (NOTE [ Shared host link ] there). Without a measured table the rate is shared fairly: each of c GPUs
copying at once gets 1/c of one GPU's rate.

The calibration's JSON::

    "shared_link_gbps": {"1": {"d2h": 53.2, "h2d": 54.3, "both_d2h": 38.1, "both_h2d": 38.9},
                         "2": {"d2h": 41.0, "h2d": 44.2}},
    "allreduce_gbps": {"2": 180.0, "4": 160.0}

Keys of ``shared_link_gbps`` are how many GPUs copy at once ("1" is required: every profile's copy times are
one GPU's); ``d2h`` and ``h2d`` are GB/s (1e9 bytes per second) *per GPU* while that many copy one way at once;
``both_d2h``/``both_h2d`` (optional) the same while each also copies the other way. Keys of ``allreduce_gbps`` are
ranks (2 or more); values are NCCL's bus bandwidth in GB/s, so a ring all-reduce of B bytes takes
2 (N - 1) / N * B / rate.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from memtune.tuner._tuner_errors import CalibrationError

__all__ = ["Direction", "LinkSource", "SharedLink", "allreduce_table", "ring_allreduce_ms"]

Direction = Literal["d2h", "h2d"]
LinkSource = Literal["measured", "fair share"]
_OPTIONAL = ("both_d2h", "both_h2d")


@dataclass(frozen=True)
class SharedLink:
    """Per-GPU pinned copy rates by how many GPUs copy at once (``copiers``).

    Attributes:
        d2h_gbps / h2d_gbps: ``(copiers, GB/s per GPU)`` points, ascending in copiers, the first at 1.
        source: ``measured`` (a calibration's table) or ``fair share`` (one GPU's rate split evenly).
        both_gbps: per copiers, ``(d2h, h2d)`` GB/s per GPU while each GPU copies both ways at once, where measured;
            kept for the record (the model prices each direction on its own, NOTE [ Shared host link ]).
    """

    d2h_gbps: tuple[tuple[int, float], ...]
    h2d_gbps: tuple[tuple[int, float], ...]
    source: LinkSource
    both_gbps: tuple[tuple[int, float, float], ...] = ()

    @classmethod
    def fair_share(cls, d2h_gbps: float, h2d_gbps: float) -> SharedLink:
        """One GPU's rates, split evenly among the GPUs copying at once (no measured table)."""
        if not (d2h_gbps > 0 and h2d_gbps > 0):
            raise CalibrationError(f"copy rates must be > 0 GB/s, got d2h {d2h_gbps}, h2d {h2d_gbps}")
        return cls(((1, d2h_gbps),), ((1, h2d_gbps),), "fair share")

    @classmethod
    def from_table(cls, table: Any, *, gpu: str = "?") -> SharedLink:
        """The link of a calibration's ``shared_link_gbps`` object (rules in the module docstring).

        Raises:
            CalibrationError: a rule is broken; ``field`` names the entry (``shared_link_gbps.2.d2h``).
        """
        name = "shared_link_gbps"
        if not isinstance(table, Mapping) or not table:
            raise CalibrationError(
                f"calibration of {gpu!r}: field {name!r} must be an object keyed by GPUs copying at once "
                f"('1', '2', ...), got {table!r}",
                field=name,
            )
        points: dict[int, dict[str, float]] = {}
        for key, row in table.items():
            copiers = _count(key, f"{name}.{key}", gpu, least=1)
            if not isinstance(row, Mapping):
                raise CalibrationError(
                    f"calibration of {gpu!r}: field '{name}.{key}' must be an object of GB/s per GPU "
                    f"({{'d2h': ..., 'h2d': ...}}), got {row!r}",
                    field=f"{name}.{key}",
                )
            rates = {d: _rate(row.get(d), f"{name}.{key}.{d}", gpu) for d in ("d2h", "h2d")}
            rates |= {d: _rate(row[d], f"{name}.{key}.{d}", gpu) for d in _OPTIONAL if row.get(d) is not None}
            points[copiers] = rates
        if 1 not in points:
            raise CalibrationError(
                f"calibration of {gpu!r}: field {name!r} needs the row '1' (one GPU copying alone): profiles' copy "
                "times are one GPU's; run python -m benchmarks.shared_link on the host",
                field=name,
            )
        order = sorted(points)
        both = tuple(
            (c, points[c]["both_d2h"], points[c]["both_h2d"]) for c in order if set(_OPTIONAL) <= set(points[c])
        )
        return cls(
            tuple((c, points[c]["d2h"]) for c in order),
            tuple((c, points[c]["h2d"]) for c in order),
            "measured",
            both,
        )

    def gbps(self, direction: Direction, copiers: float) -> float:
        """GB/s each GPU gets while ``copiers`` GPUs (>= 1, fractional for a time average) copy ``direction`` at once.

        Linear between measured counts; past the largest measured count c_max, what c_max GPUs get together is
        shared fairly (rate(c_max) * c_max / copiers).
        """
        if copiers < 1:
            raise ValueError(f"copiers must be >= 1 (this GPU copies), got {copiers}")
        points = self.d2h_gbps if direction == "d2h" else self.h2d_gbps
        last_c, last_r = points[-1]
        if copiers >= last_c:
            return last_r * last_c / copiers
        for (c0, r0), (c1, r1) in itertools.pairwise(points):
            if c0 <= copiers <= c1:
                return r0 + (r1 - r0) * (copiers - c0) / (c1 - c0)
        return points[0][1]  # unreachable: points start at 1

    def slowdown(self, direction: Direction, copiers: float) -> float:
        """How much longer a copy takes while ``copiers`` GPUs copy at once than alone (>= 0; 1 alone)."""
        return self.gbps(direction, 1) / self.gbps(direction, copiers)

    def to_data(self) -> dict[str, dict[str, float]]:
        """The calibration's ``shared_link_gbps`` object of this link (a fair share gives only the row '1')."""
        both = {c: (d, h) for c, d, h in self.both_gbps}
        out: dict[str, dict[str, float]] = {}
        for (c, d), (_, h) in zip(self.d2h_gbps, self.h2d_gbps, strict=True):
            row = {"d2h": d, "h2d": h}
            if c in both:
                row |= {"both_d2h": both[c][0], "both_h2d": both[c][1]}
            out[str(c)] = row
        return out


def _count(key: Any, field: str, gpu: str, *, least: int) -> int:
    text = str(key)
    if not text.isdigit() or int(text) < least:
        raise CalibrationError(
            f"calibration of {gpu!r}: key {field!r} must be a whole number >= {least} (GPUs), got {key!r}", field=field
        )
    return int(text)


def _rate(value: Any, field: str, gpu: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < float(value) < float("inf")
    if not ok:
        raise CalibrationError(
            f"calibration of {gpu!r}: field {field!r} must be a finite number > 0 (GB/s), got {value!r}", field=field
        )
    return float(value)


def allreduce_table(table: Any, *, gpu: str = "?") -> dict[int, float]:
    """A calibration's ``allreduce_gbps`` object as ``{ranks: bus GB/s}`` (empty when absent or null).

    Raises:
        CalibrationError: not an object, a key below 2 ranks, or a rate not a finite number > 0.
    """
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise CalibrationError(
            f"calibration of {gpu!r}: field 'allreduce_gbps' must be an object of bus GB/s keyed by ranks "
            f"('2', '4', ...), got {table!r}",
            field="allreduce_gbps",
        )
    return {
        _count(k, f"allreduce_gbps.{k}", gpu, least=2): _rate(v, f"allreduce_gbps.{k}", gpu) for k, v in table.items()
    }


def ring_allreduce_ms(nbytes: int, ranks: int, bus_gbps: float) -> float:
    """ms a ring all-reduce of ``nbytes`` (per rank) takes among ``ranks`` at NCCL bus bandwidth ``bus_gbps``.

    Each rank sends and receives 2 (N - 1) / N of the buffer; the bus bandwidth is that traffic over the time, as
    ``nccl-tests`` reports it. 0 for one rank.
    """
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * nbytes / (bus_gbps * 1e6)
