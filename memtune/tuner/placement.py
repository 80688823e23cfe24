"""Where the caching allocator puts each tensor, and when a capped step has to give memory back.

# NOTE [ Allocator placement ]
The simulator's peak counts live bytes. Under ``budget_guard`` (``set_per_process_memory_fraction``) PyTorch's
caching allocator must also find each request a *contiguous* range, and it never moves a block. With
expandable segments (memtune's setting, NOTE [ Allocator retries ] in ``memtune.tuner.runtime.guard``) a request
that no free block holds is served by mapping new 20 MiB pages at the segment's unmapped end, and the cap is
checked against every mapped byte (``reserved``) plus the whole request. When that check fails the allocator
*retries*: it synchronizes, unmaps every whole free page of the cache and tries again. On the H200 each retry
cost VGG-16 5-37 ms (NOTE [ Allocator retries ]); a plan whose live bytes fit can still pay several per
step when its free memory is scattered in holes smaller than its next large request.

``AllocatorModel`` replays a sequence of allocations and frees with the rules of PyTorch's
``CUDACachingAllocator`` (c10/cuda/CUDACachingAllocator.cpp, torch 2.11) that matter for large tensors:

- sizes round up to 512 B; requests up to 1 MiB use the small pool (2 MiB pages), the rest the large one
  (20 MiB pages), each one expandable segment (one stream);
- a request first takes the best-fitting free mapped block (smallest size, then lowest address), preferring
  among equal fits a block that is not followed by unmapped space (``get_free_block``); the block is split
  when more than 1 MiB (large pool) is left over, the front part being used;
- else, if ``reserved + allocation size`` is within the cap, the lowest-address run of free and unmapped
  space long enough is mapped page by page (``find_expandable_block``, ``try_allocate_expandable_block``);
  the allocation size is the request rounded up to 2 MiB (``get_allocation_size``), even when part of the
  run is already mapped;
- else one retry: every whole free page is unmapped (``release_cached_blocks``) and the mapping is tried again;
  if that fails too the step is out of memory;
- a freed block merges with free neighbours (mapped with mapped only).

Validated against the allocator's own event trace of a capped VGG-16 fp32 step on the H200
(``benchmarks/results/allocator/events-vgg16-256-float32-0.7.json.gz``, 1,638 events, 17 retries over
three steps): replaying its exact requests, the model retries at 15 of the 17 requests that retried, with
one retry the GPU did not have (``tests/unit/tuner/test_placement.py``). Not modelled:
``garbage_collection_threshold`` (it frees only blocks with no neighbour, which an expandable segment never
has), CUDA-event-delayed frees (a block is free when the event stream says it is) and other streams.

``predict_retries`` builds the request sequence of a plan from the simulator's tensor-by-tensor events
(``SimResult.blocks``) for a few consecutive training steps, the way ``memtune bench`` runs them: the batch and
parameters first, momentum buffers after the first backward, gradients freed by ``zero_grad``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

from memtune.profiler import Profile
from memtune.tuner.plan import Plan

if TYPE_CHECKING:
    from memtune.tuner.calibration import Calibration

__all__ = [
    "AllocatorModel",
    "AllocatorOutOfMemory",
    "AllocatorPricer",
    "PlacementResult",
    "allocator_cost",
    "predict_retries",
]

MIN_BLOCK = 512  #: bytes; every request rounds up to a multiple
SMALL_SIZE = 1 << 20  #: requests up to this many bytes use the small pool
SMALL_PAGE = 2 << 20  #: small pool mapping granularity, bytes
LARGE_PAGE = 20 << 20  #: large pool mapping granularity, bytes
MIN_LARGE_ALLOC = 10 << 20  #: large requests below this reserve a whole large page
ROUND_LARGE = 2 << 20  #: large requests' allocation size rounds up to a multiple, bytes
_SPAN = 1 << 44  #: virtual address span of a segment (far beyond any GPU's memory), bytes


def round_size(nbytes: int) -> int:
    """A request's block size, bytes (``round_size``)."""
    return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def allocation_size(size: int) -> int:
    """Bytes the cap check counts for a request of ``size`` block bytes (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_PAGE
    if size < MIN_LARGE_ALLOC:
        return LARGE_PAGE
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class AllocatorOutOfMemory(Exception):
    """The request did not fit even after a retry."""


@dataclass
class _Block:
    start: int  # byte offset in the segment
    size: int  # bytes
    state: str  # "alloc", "free" (mapped) or "unmapped"


_START = attrgetter("start")


class _Segment:
    """One expandable segment: blocks in address order that tile its whole virtual span, and its free blocks by
    start (``free``, kept with ``blocks``: the best fit looks only at free blocks). Code that edits ``blocks``
    directly calls ``index_free`` after."""

    def __init__(self, page: int, large: bool) -> None:
        self.page = page
        self.large = large
        self.blocks = [_Block(0, _SPAN, "unmapped")]
        self.free: dict[int, _Block] = {}

    def index_free(self) -> None:
        """Make ``free`` again from ``blocks``."""
        self.free = {b.start: b for b in self.blocks if b.state == "free"}

    def find(self, block: _Block) -> int:
        return bisect_left(self.blocks, block.start, key=_START)

    def merge(self, i: int) -> int:
        """Merge block ``i`` with neighbours of the same free or unmapped state; returns its new index."""
        bl = self.blocks
        state = bl[i].state
        if i + 1 < len(bl) and bl[i + 1].state == state:
            if state == "free":
                del self.free[bl[i + 1].start]
            bl[i].size += bl[i + 1].size
            del bl[i + 1]
        if i > 0 and bl[i - 1].state == state:
            if state == "free":
                del self.free[bl[i].start]
            bl[i - 1].size += bl[i].size
            del bl[i]
            i -= 1
        return i


class AllocatorModel:
    """Replays allocations and frees like PyTorch's caching allocator with expandable segments under a cap.

    Args:
        cap_bytes: the per-process limit (``set_per_process_memory_fraction`` x device memory), bytes.

    Attributes:
        reserved: mapped bytes, both pools.
        retries: requests that needed a retry.
        remapped_bytes: bytes unmapped by retries.
    """

    def __init__(self, cap_bytes: int) -> None:
        self.cap = cap_bytes
        self.reserved = 0
        self.retries = 0
        self.remapped_bytes = 0
        self._small = _Segment(SMALL_PAGE, large=False)
        self._large = _Segment(LARGE_PAGE, large=True)
        self._live: dict[Hashable, tuple[_Segment, _Block]] = {}

    # ---- requests ---------------------------------------------------------------------------------
    def malloc(self, key: Hashable, nbytes: int) -> bool:
        """Allocate ``nbytes`` for ``key``; True when it took a retry. Raises AllocatorOutOfMemory."""
        if key in self._live:
            raise ValueError(f"allocation {key!r} is already live")
        size = round_size(nbytes)
        seg = self._small if size <= SMALL_SIZE else self._large
        i = self._best_fit(seg, size)
        retried = False
        if i is None:
            i = self._expand(seg, size)
            if i is None:
                self._release_free_pages()
                self.retries += 1
                retried = True
                i = self._expand(seg, size)
                if i is None:
                    raise AllocatorOutOfMemory(
                        f"{nbytes} bytes for {key!r}: {self.reserved} bytes mapped of a {self.cap}-byte cap"
                    )
        self._live[key] = (seg, self._take(seg, i, size))
        return retried

    def free(self, key: Hashable) -> None:
        """Free ``key``'s block (it merges with free neighbours)."""
        if key not in self._live:
            raise ValueError(f"no live allocation {key!r} to free")
        seg, block = self._live.pop(key)
        block.state = "free"
        seg.free[block.start] = block
        seg.merge(seg.find(block))

    def live(self, key: Hashable) -> bool:
        """True while ``key`` holds a block."""
        return key in self._live

    # ---- the allocator's rules --------------------------------------------------------------------
    def _best_fit(self, seg: _Segment, size: int) -> int | None:
        """The index of the free block a request of ``size`` bytes takes, or None (``get_free_block``)."""
        fits = [(b.size, b.start) for b in seg.free.values() if b.size >= size]
        if not fits:
            return None
        bl = seg.blocks
        if len(fits) == 1:
            return bisect_left(bl, fits[0][1], key=_START)
        first = min(fits)
        i = bisect_left(bl, first[1], key=_START)
        if i + 1 == len(bl) or bl[i + 1].state != "unmapped":
            return i  # it cannot grow, so no later fit grows less than it: the loop below would stop at once
        fits.sort()

        def expandable(i: int) -> int:  # a block followed by unmapped space counts as able to grow into it
            nxt = bl[i + 1] if i + 1 < len(bl) else None
            return bl[i].size + (nxt.size if nxt is not None and nxt.state == "unmapped" else 0)

        i = bisect_left(bl, fits[0][1], key=_START)
        for _, start in fits[1:]:
            j = bisect_left(bl, start, key=_START)
            if expandable(j) >= expandable(i):
                break
            i = j
        return i

    def _take(self, seg: _Segment, i: int, size: int) -> _Block:
        block = seg.blocks[i]
        del seg.free[block.start]
        rest = block.size - size
        if rest > SMALL_SIZE if seg.large else rest >= MIN_BLOCK:
            after = _Block(block.start + size, rest, "free")
            seg.blocks.insert(i + 1, after)
            seg.free[after.start] = after
            block.size = size
        block.state = "alloc"
        return block

    def _map(self, seg: _Segment, i: int, size: int) -> int:
        """Map the first ``size`` bytes (whole pages) of unmapped block ``i``; the index of the free result."""
        block = seg.blocks[i]
        n = min(block.size, -(-size // seg.page) * seg.page)
        self.reserved += n
        if n < block.size:
            seg.blocks.insert(i + 1, _Block(block.start + n, block.size - n, "unmapped"))
            block.size = n
        block.state = "free"
        seg.free[block.start] = block
        return seg.merge(i)

    def _expand(self, seg: _Segment, size: int) -> int | None:
        if self.reserved + allocation_size(size) > self.cap:
            return None
        bl = seg.blocks
        for i, block in enumerate(bl):
            if block.state != "unmapped":
                continue
            c = i - 1 if i > 0 and bl[i - 1].state == "free" else i
            room, j = 0, c
            while room < size and j < len(bl) and bl[j].state != "alloc":
                room += bl[j].size
                j += 1
            if room < size:
                continue
            if bl[c].state == "unmapped":
                c = self._map(seg, c, size)
            while bl[c].size < size:
                c = self._map(seg, c + 1, size - bl[c].size)
            return c
        return None

    def _release_free_pages(self) -> None:
        for seg in (self._large, self._small):
            out: list[_Block] = []
            for b in seg.blocks:
                lo = -(-b.start // seg.page) * seg.page
                hi = (b.start + b.size) // seg.page * seg.page
                if b.state != "free" or hi <= lo:
                    out.append(b)
                    continue
                self.reserved -= hi - lo
                self.remapped_bytes += hi - lo
                if lo > b.start:
                    out.append(_Block(b.start, lo - b.start, "free"))
                out.append(_Block(lo, hi - lo, "unmapped"))
                if b.start + b.size > hi:
                    out.append(_Block(hi, b.start + b.size - hi, "free"))
            merged: list[_Block] = []
            for b in out:
                if merged and merged[-1].state == b.state == "unmapped":
                    merged[-1].size += b.size
                else:
                    merged.append(b)
            seg.blocks = merged
            seg.index_free()


@dataclass(frozen=True)
class PlacementResult:
    """What the allocator model predicts for a plan's training steps under a cap.

    Attributes:
        retries: retries in each simulated step (the first includes the momentum buffers' creation).
        remapped_bytes: bytes unmapped by retries in each step.
        reserved_bytes: mapped bytes at the end of the last step.
        out_of_memory: the request that did not fit even after a retry, if any.
    """

    retries: tuple[int, ...]
    remapped_bytes: tuple[int, ...]
    reserved_bytes: int
    out_of_memory: str | None = None

    @property
    def mean_retries(self) -> float:
        """Mean retries per step over every simulated step (as ``memtune bench`` counts, warm-up included)."""
        return sum(self.retries) / len(self.retries) if self.retries else 0.0

    @property
    def steady_retries(self) -> float:
        """Mean retries per step after the first (which also creates the optimizer state)."""
        later = self.retries[1:] or self.retries
        return sum(later) / len(later) if later else 0.0

    @property
    def steady_remapped_bytes(self) -> float:
        """Mean bytes unmapped by retries per step after the first."""
        later = self.remapped_bytes[1:] or self.remapped_bytes
        return sum(later) / len(later) if later else 0.0

    def cost_ms(self, remap_ms_per_gib: float) -> float:
        """Predicted ms per step the retries add, at ``remap_ms_per_gib`` (``memtune.tuner.calibration``)."""
        return self.steady_remapped_bytes / 2**30 * remap_ms_per_gib


def _replay(model: AllocatorModel, events: Iterable[tuple[str, object, int]], tag: int) -> None:
    for op, key, nbytes in events:
        if nbytes <= 0:
            continue
        k = (tag, key)
        if op == "alloc":
            model.malloc(k, nbytes)
        elif model.live(k):
            model.free(k)


def predict_retries(
    profile: Profile,
    plan: Plan,
    cap_bytes: int,
    *,
    steps: int = 6,
    optimizer: str = "sgd",
    calibration: Calibration | None = None,
    block_scale: float = 1.0,
) -> PlacementResult:
    """Replay ``steps`` training steps of ``plan`` through ``AllocatorModel`` under ``cap_bytes``.

    Each step's tensors come from the simulator (``SimResult.blocks``, unmerged storages). The batch and
    each stage's parameters are allocated first; the optimizer's state after the first step's backward;
    each step ends with its parameter gradients freed (``zero_grad(set_to_none=True)``). ``calibration`` is the
    simulator's (None: ``calibration_for``, NOTE [ Calibration is an input ] in ``memtune.tuner.calibration``).
    ``block_scale`` multiplies every one of the step's blocks (a margin for the simulator's error: how much larger
    its tensors may be before the plan no longer places).
    """
    from memtune.tuner.simulator import Simulator

    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    if block_scale <= 0:
        raise ValueError(f"block_scale must be positive, not {block_scale}")
    sim = Simulator(profile, optimizer, merge=False, calibration=calibration).run(plan, timeline=True)
    blocks = sim.blocks if block_scale == 1.0 else [(k, key, round(n * block_scale)) for k, key, n in sim.blocks]
    return _place(profile, blocks, cap_bytes, steps, optimizer)


def _place(
    profile: Profile, blocks: Sequence[tuple[str, object, int]], cap_bytes: int, steps: int, optimizer: str
) -> PlacementResult:
    """``predict_retries`` of a plan whose step allocates and frees ``blocks`` (``SimResult.blocks``)."""
    from memtune.tuner.simulator import OPTIMIZERS

    model = AllocatorModel(cap_bytes)
    retries: list[int] = []
    remapped: list[int] = []
    try:
        model.malloc("input", profile.input_bytes)
        if profile.resident_bytes:  # NOTE [ Memory held before the step ]
            model.malloc("resident", profile.resident_bytes)
        for stage in profile.stages:
            if stage.param_bytes:
                model.malloc(("param", stage.index), stage.param_bytes)
        for step in range(steps):
            r0, m0 = model.retries, model.remapped_bytes
            _replay(model, blocks, step)
            if step == 0 and OPTIMIZERS[optimizer]:
                for stage in profile.stages:
                    if stage.param_bytes:
                        model.malloc(("state", stage.index), int(stage.param_bytes * OPTIMIZERS[optimizer]))
            for stage in profile.stages:  # zero_grad(set_to_none=True)
                if model.live((step, ("p", stage.index))):
                    model.free((step, ("p", stage.index)))
            retries.append(model.retries - r0)
            remapped.append(model.remapped_bytes - m0)
    except AllocatorOutOfMemory as exc:
        return PlacementResult(tuple(retries), tuple(remapped), model.reserved, out_of_memory=str(exc))
    return PlacementResult(tuple(retries), tuple(remapped), model.reserved)


def allocator_cost(
    profile: Profile,
    plan: Plan,
    cap_bytes: int,
    *,
    steps: int = 6,
    optimizer: str = "sgd",
    calibration: Calibration | None = None,
) -> tuple[PlacementResult, float | None]:
    """``predict_retries`` and what the retries cost per step at the calibration's price, ms (None where it has no
    price, ``memtune.tuner.calibration``). ``calibration`` None: the GPU type's, looked up once here with
    ``calibration_for`` (NOTE [ Calibration is an input ])."""
    from memtune.tuner.calibration import calibration_for

    cal = calibration if calibration is not None else calibration_for(profile.device.key)
    placed = predict_retries(profile, plan, cap_bytes, steps=steps, optimizer=optimizer, calibration=cal)
    price = cal.remap_ms_per_gib
    return placed, placed.cost_ms(price) if price is not None else None


class AllocatorPricer:
    """``allocator_cost`` of many plans of one profile under one cap, as a search asks for them.

    Two plans whose steps allocate and free the same tensors in the same order (``SimResult.blocks``: plans that
    differ in a knob the memory events do not see, such as a prefetch lookahead that moves no fetch across an
    allocation) place the same, so each sequence of events is replayed once; on VGG-16 at 13 GiB a search prices
    about 240 plans with 180 sequences. The simulator of the events is made once, not per plan.

    Args:
        profile: the profile whose plans are priced.
        cap_bytes: the per-process limit, bytes (``predict_retries``).
        steps: training steps replayed per plan.
        optimizer: ``sgd``, ``adam`` or ``none`` (the optimizer state allocated after the first step).
        calibration: the calibration whose price the retries pay (a search passes its simulator's); None: the GPU
            type's, looked up once here (NOTE [ Calibration is an input ] in ``memtune.tuner.calibration``).
    """

    def __init__(
        self,
        profile: Profile,
        cap_bytes: int,
        *,
        steps: int = 6,
        optimizer: str = "sgd",
        calibration: Calibration | None = None,
    ) -> None:
        from memtune.tuner.simulator import Simulator

        if steps < 1:
            raise ValueError(f"steps must be at least 1, not {steps}")
        self.profile = profile
        self.cap_bytes = cap_bytes
        self.steps = steps
        self.optimizer = optimizer
        self._sim = Simulator(profile, optimizer, merge=False, calibration=calibration)
        self.calibration = self._sim.calibration
        self._price = self.calibration.remap_ms_per_gib
        self._by_events: dict[tuple[tuple[str, object, int], ...], PlacementResult] = {}

    def cost(self, plan: Plan) -> tuple[PlacementResult, float | None]:
        """What ``allocator_cost(profile, plan, cap_bytes, steps=steps, optimizer=optimizer, calibration=calibration)``
        returns."""
        blocks = tuple(self._sim.run(plan, timeline=True).blocks)
        placed = self._by_events.get(blocks)
        if placed is None:
            placed = _place(self.profile, blocks, self.cap_bytes, self.steps, self.optimizer)
            self._by_events[blocks] = placed
        return placed, placed.cost_ms(self._price) if self._price is not None else None
