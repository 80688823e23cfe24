"""Spatial splitting of recompute segments: strips of rows with exact halos, their arithmetic and their price.

# NOTE [ Spatial splitting ]
Split-CNN (Jin & Hong, 2019, section 3) runs window-based layers on spatial patches so that each patch's working
memory is a fraction of the whole. It drops the rows a window reads across a patch border, which changes the
network's math. memtune keeps the math: a plan's ``spatial_splits`` maps a recompute segment ``"i-j"`` (NOTE
[ Plan semantics ]) to a number of strips s (2..64) along H, and each strip carries the rows its windows need
from its neighbours (the halo).

Rows. The segment's output rows are cut into s strips as evenly as integers allow (strip t holds rows
``t * H // s`` to ``(t + 1) * H // s - 1``). Walking the segment's modules from last to first, output rows a..b-1
of a module with window (kernel K, dilation included; stride S; padding P above) read input rows
``a*S - P .. (b-1)*S - P + K - 1``, clipped to the input (``memtune.profiler._spatial_rows.RowMap.window``): rows
outside it are padding, which a strip adds only where it touches the image's true top or bottom (zeros for a convolution
and an average pool, minus infinity for a max pool); inside, the halo rows are real rows of the neighbour. Every output
element therefore reads exactly the values it reads unsplit.

Runtime (``memtune.tuner.runtime._spatial_strips``). The segment is one autograd Function that saves only its input
x_{i-1} (as recompute does): its forward runs the strips one at a time without a graph and writes each strip's rows into
the full output; its backward re-runs each strip with a graph, back-propagates that strip's rows of the output gradient,
and adds the strip's input gradient (halo rows included: a row read by two strips gets both contributions) into the full
input gradient and its parameter gradients into theirs. Only one strip's intermediates and gradients live at a time. The
values are the unsplit run's: outputs bitwise where the convolution's algorithm does not depend on the height, gradients
up to the order of summation over strips.

Price (``memtune.tuner.simulator``). For each module of the segment, the largest strip's output rows over the module's
output rows (``StripCost.fraction``: about 1/s plus the halo) scales what one strip holds: the storages the
segment's stages make (not its output), their workspaces, the re-run's transient (``max(out[i..j]) * fraction``
instead of ``max(out[i..j])``) and the gradients between its stages. The full output, its gradient and the
input's gradient stay whole. All strips' output rows over the module's rows (``StripCost.work``: 1 plus the halo
overhead) scales the forward and backward time of every stage in the segment, in the step's forward and in the
re-run. The segment's backward is one autograd node, so the simulator holds the output's gradient to the end of
stage i's backward and makes the input's gradient at the start of stage j's, and prefetches due while the node
runs are issued at its start (the runtime marks the node as stage i's backward). Strips of a few rows launch as
many kernels as whole stages do; that fixed cost per strip is not priced, which is why the search offers 2, 4
and 8 strips only.

Where a split applies: only to chain plans (module stages run the model's own forward), on stages whose profile
records a ``RowMap`` (``StageProfile.rows``, from ``memtune.profiler.spatial_modules``: 2-D convolutions with zero
padding, max and average pools without ``ceil_mode``, pointwise modules, BatchNorm and dropout in eval mode), with at
most as many strips as the segment's output has rows.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memtune.profiler import Profile, RowMap

__all__ = [
    "MAX_STRIPS",
    "MIN_STRIPS",
    "SEARCH_STRIPS",
    "SplitPricing",
    "StripCost",
    "check_split_keys",
    "parse_segment_key",
    "segment_key",
    "spatial_refusal",
    "strip_bounds",
    "strip_cost",
    "strip_windows",
]

MIN_STRIPS = 2
MAX_STRIPS = 64
#: the strip counts the search offers a splittable segment (NOTE [ Spatial splitting ])
SEARCH_STRIPS = (2, 4, 8)

Window = tuple[int, int, int, int]
"""``(lo, hi, top, bottom)``: input rows lo..hi-1 and the rows of padding above and below them"""


def segment_key(first: int, last: int) -> str:
    """The ``spatial_splits`` key of recompute segment ``first..last``: ``"first-last"``."""
    return f"{first}-{last}"


def parse_segment_key(key: str) -> tuple[int, int]:
    """``"3-7"`` -> ``(3, 7)``.

    Raises:
        ValueError: the key is not two stage indices ``first-last`` with first <= last (names the key).
    """
    first, sep, last = key.partition("-")
    if not sep or not first.isdigit() or not last.isdigit() or int(first) > int(last):
        raise ValueError(f"spatial_splits key {key!r} is not a segment 'first-last' of stage indices (e.g. '3-7')")
    return int(first), int(last)


def strip_bounds(rows: int, strips: int) -> list[tuple[int, int]]:
    """``strips`` consecutive row ranges ``(first, end)`` covering ``rows`` rows as evenly as integers allow.

    Raises:
        ValueError: fewer rows than strips, or fewer than one strip.
    """
    if not 1 <= strips <= rows:
        raise ValueError(f"cannot cut {rows} rows into {strips} strips (1 to {rows} strips)")
    return [(t * rows // strips, (t + 1) * rows // strips) for t in range(strips)]


def strip_windows(maps: Sequence[RowMap], strips: int) -> list[list[Window]]:
    """Per strip of the last map's output rows, the window each map reads of its input, in run order."""
    out: list[list[Window]] = []
    for a, b in strip_bounds(maps[-1].out_rows, strips):
        wins: list[Window] = []
        for m in reversed(maps):
            w = m.window(a, b)
            wins.append(w)
            a, b = w[0], w[1]
        out.append(wins[::-1])
    return out


@dataclass(frozen=True)
class StripCost:
    """What splitting a run of row maps into strips costs (NOTE [ Spatial splitting ]).

    Attributes:
        strips: the number of strips.
        fraction: per map, the largest strip's output rows over the map's output rows (about 1/strips plus halo).
        work: per map, every strip's output rows together over the map's output rows (1 plus the halo overhead).
        input_fraction: the largest strip's rows of the first map's input over its rows.
    """

    strips: int
    fraction: tuple[float, ...]
    work: tuple[float, ...]
    input_fraction: float


@functools.lru_cache(maxsize=4096)
def strip_cost(maps: tuple[RowMap, ...], strips: int) -> StripCost:
    """The ``StripCost`` of ``maps`` run one after the other on ``strips`` strips of the last one's output rows."""
    wins = strip_windows(maps, strips)
    bounds = strip_bounds(maps[-1].out_rows, strips)
    n = len(maps)
    largest = [0] * n
    total = [0] * n
    largest_in = 0
    for t, w in enumerate(wins):
        for m in range(n):
            lo, hi = (w[m + 1][0], w[m + 1][1]) if m + 1 < n else bounds[t]
            largest[m] = max(largest[m], hi - lo)
            total[m] += hi - lo
        largest_in = max(largest_in, w[0][1] - w[0][0])
    rows = [m.out_rows for m in maps]
    return StripCost(
        strips=strips,
        fraction=tuple(min(1.0, x / r) for x, r in zip(largest, rows, strict=True)),
        work=tuple(x / r for x, r in zip(total, rows, strict=True)),
        input_fraction=min(1.0, largest_in / maps[0].in_rows),
    )


def spatial_refusal(profile: Profile, first: int, last: int, strips: int) -> str | None:
    """Why ``profile`` cannot price or run segment ``first..last`` in ``strips`` strips, or None when it can."""
    key = segment_key(first, last)
    if profile.modules:
        return (
            f"spatial_splits {key!r}: the profile's stages are modules run by the model's own forward; spatial "
            "splitting applies to chain plans only"
        )
    if last >= profile.n_stages:
        return f"spatial_splits {key!r}: the profile has stages 0..{profile.n_stages - 1}"
    for k in range(first, last + 1):
        st = profile.stages[k]
        if st.rows is None:
            return (
                f"spatial_splits {key!r}: stage {k} ({st.name}, {st.kind}) cannot run on strips of rows with the same "
                "math, or the profile does not say (StageProfile.rows is unset: profile the model again with this "
                "version); split a segment of convolutions, pools and pointwise stages only"
            )
    rows = profile.stages[last].rows
    assert rows is not None
    if strips > rows.out_rows:
        return (
            f"spatial_splits {key!r}: {strips} strips, but stage {last}'s output has {rows.out_rows} rows; "
            f"use at most {rows.out_rows} strips"
        )
    return None


class SplitPricing:
    """What a plan's spatial splits change in one simulation (NOTE [ Spatial splitting ]): scaled per-stage times,
    workspaces and storage bytes, and the gradient blocks of the split segments' backward.

    Args:
        profile: the profile (its stages' ``rows``).
        splits: ``(first, last) -> strips`` of the plan's split segments that are recompute segments of the
            simulated actions (others are the caller's to drop).
        out: each stage's output bytes.
        produced: per stage, the storages it makes; ``output_storage``: each stage's output storage.
        s_bytes: bytes per storage.
    """

    def __init__(
        self,
        profile: Profile,
        splits: Mapping[tuple[int, int], int],
        out: Sequence[int],
        produced: Sequence[Sequence[int]],
        output_storage: Sequence[int | None],
        s_bytes: Sequence[int],
    ) -> None:
        n = len(out)
        self.out = out
        self.first_of: dict[int, int] = {}
        self.cost: dict[int, StripCost] = {}  # by last stage
        #: per stage, the last stage of its split segment (-1: none)
        self.member = [-1] * n
        #: per stage, where a prefetch due at that stage is issued (the split segment's node starts at its last)
        self.lift = list(range(n))
        self.s_bytes = list(s_bytes)
        self.copy_bytes = list(s_bytes)
        self._costs: dict[int, tuple[list[float], list[float], tuple[Any, ...]]] = {}
        for (i, j), strips in splits.items():
            maps = tuple(profile.stages[k].rows for k in range(i, j + 1))
            if any(m is None for m in maps):
                continue
            c = strip_cost(maps, strips)  # type: ignore[arg-type]
            self.first_of[j], self.cost[j] = i, c
            keep = output_storage[j]
            for k in range(i, j + 1):
                self.member[k] = j
                self.lift[k] = j
                f = c.fraction[k - i]
                for sid in produced[k]:
                    self.copy_bytes[sid] = int(s_bytes[sid] * f)
                    if sid != keep:
                        self.s_bytes[sid] = self.copy_bytes[sid]

    def costs(
        self, fwd: list[float], bwd: list[float], ws_f: list[int], ws_b: list[int]
    ) -> tuple[list[float], list[float], list[int], list[int]]:
        """Per-stage forward and backward ms times their work, workspaces times their fraction; kept for the lists
        given (the simulator's are cached per convolution choice, so a search scales each once)."""
        held = self._costs.get(id(fwd))
        if held is not None and held[0] is fwd and held[1] is bwd:
            return held[2]
        out = (
            self.scale(fwd, work=True),
            self.scale(bwd, work=True),
            [int(b) for b in self.scale(ws_f, work=False)],
            [int(b) for b in self.scale(ws_b, work=False)],
        )
        self._costs[id(fwd)] = (fwd, bwd, out)
        return out

    def scale(self, per_stage: Iterable[float], *, work: bool) -> list[float]:
        """``per_stage`` with every split stage's entry times its work (``work``) or its fraction."""
        vals = list(per_stage)
        for j, c in self.cost.items():
            i = self.first_of[j]
            for k in range(i, j + 1):
                vals[k] *= c.work[k - i] if work else c.fraction[k - i]
        return vals

    def transient(self, last: int) -> int:
        """The re-run's transient of the split segment ending at ``last``: its largest strip output."""
        i, c = self.first_of[last], self.cost[last]
        return int(max(self.out[k] * c.fraction[k - i] for k in range(i, last + 1)))

    def grad_blocks(self, k: int) -> tuple[list[tuple[str, object, int]], list[tuple[str, object, int]]]:
        """Stage ``k``'s backward inside a split segment: the gradient blocks it makes and frees. Between stages a
        strip's gradient (``("gstrip", k)``); the input's gradient ``("g", i-1)`` whole from the start of the
        node (stage j's backward), freed as usual by stage i-1; the output's ``("g", j)`` to the end of stage i's."""
        j = self.member[k]
        i, c = self.first_of[j], self.cost[j]
        out = self.out

        def strip(m: int) -> int:  # bytes of one strip of stage m's output (m = i - 1: the segment input)
            return int(out[m] * (c.input_fraction if m < i else c.fraction[m - i]))

        made: list[tuple[str, object, int]] = []
        freed: list[tuple[str, object, int]] = []
        if k == j and i > 0:
            made.append(("alloc", ("g", i - 1), out[i - 1]))
        if k > 0:
            made.append(("alloc", ("gstrip", k - 1), strip(k - 1)))
        if k < j:
            freed.append(("free", ("gstrip", k), strip(k)))
        if k == i:
            if k > 0:
                freed.append(("free", ("gstrip", k - 1), strip(k - 1)))
            freed.append(("free", ("g", j), out[j]))
        return made, freed


def check_split_keys(
    splits: Mapping[str, int], segs: Sequence[tuple[int, int]], *, module_stages: bool, compiled: bool
) -> None:
    """The ``Plan`` validator's part for ``spatial_splits`` (NOTE [ Spatial splitting ]).

    Args:
        splits: the plan's ``spatial_splits``.
        segs: the plan's recompute segments (``memtune.tuner.plan.segments``).
        module_stages: the plan names module stages; compiled: it runs its stages compiled.

    Raises:
        ValueError: a key is not exactly one of ``segs``, a strip count is outside 2..64, or the plan cannot split
            (module stages, compiled stages); the message names the key.
    """
    if not splits:
        return
    if module_stages or compiled:
        what = "names module stages (run by the model's own forward)" if module_stages else "runs its stages compiled"
        raise ValueError(f"spatial_splits: the plan {what}; spatial splitting applies to eager chain plans only")
    segment_set = set(segs)
    for key, strips in splits.items():
        first, last = parse_segment_key(key)
        if (first, last) not in segment_set:
            have = ", ".join(segment_key(i, j) for i, j in segs) or "none"
            raise ValueError(
                f"spatial_splits key {key!r} is not a recompute segment of the plan (its segments: {have}); a split "
                "applies to a whole maximal run of 'recompute' stages"
            )
        if not MIN_STRIPS <= strips <= MAX_STRIPS:
            raise ValueError(
                f"spatial_splits {key!r}: {strips} strips is outside {MIN_STRIPS}..{MAX_STRIPS}; leave the key out "
                "for an unsplit segment"
            )
