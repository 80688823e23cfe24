"""Offloading saved tensors to host memory during a planned step, and bringing them back.

# NOTE [ Offload runtime ]
This is the ``offload`` action of NOTE [ Plan semantics ] (``memtune.tuner.plan``) on a live model.

* Packing. Around the forward of an ``offload`` stage (and around the checkpoint call of a segment
  whose input stage i-1 is ``offload``) a ``saved_tensors_hooks`` pair is active. Its pack hook copies
  the saved tensor's whole *storage* (the unit of NOTE [ Saved storages ]) into a range of the
  ``HostPool`` and returns a small handle (dtype, offset, size, stride) instead of the tensor, so
  autograd no longer holds the device memory. Storages are deduplicated per step: a storage already
  packed in this step at the same version is not copied twice (a conv's output is saved by the
  in-place ReLU after it and by the next conv). Parameters, buffers and the model input are never
  offloaded (the input is resident by definition); their pack returns them unchanged.
* CUDA copies. The copy runs on a dedicated device-to-host stream that first waits for the compute
  stream (the tensor is ready), into pinned memory with ``non_blocking=True``; the runtime holds the
  storage until compute has waited for that copy (a stream wait, no host sync) and only then drops it
  (NOTE [ Deferred frees ] in ``memtune.tuner.simulator``, NOTE [ No record_stream ] below). ``sync`` decides
  where compute waits: ``layer`` at the end of the stage that issued copies, ``deferred`` at the end of
  stage P + ``sync_delay`` for a storage packed in stage P (never, if that is past the forward: the
  storage stays and backward uses it in place), ``points`` at the end of each stage in ``sync_points``
  (for every copy issued so far); ``inline`` copies synchronously on the compute stream (like PyTorch's
  ``save_on_cpu``) and fetches only on demand (lookahead 0). The host never polls copies: it runs ahead
  of the GPU, so what it would see depends on timing, and the frees must be where the simulator has them.
* Prefetch. Each handle records the backward stage that first needs it (the stage itself, or a
  segment's last stage for a segment input). A backward pre-hook on the autograd node of every stage's
  output calls ``on_backward(k)`` when backward reaches stage k; it issues, on a host-to-device stream
  that waits for the entry's D2H event, the copies of every entry first needed at a stage j with
  ``j + L_j >= k`` that is not back yet, L_j being the plan's lookahead for stage j (NOTE [ Prefetch lookahead ]
  in ``memtune.tuner.plan``: ``Plan.stage_lookaheads``, the global ``prefetch_lookahead`` or per stage). The buffer is
  allocated on the compute stream (the copy stream waits for compute first), so the caching allocator accounts it in
  compute-stream order, where the simulator does, and reuses its block for compute: a block allocated on a copy stream
  lives in that stream's pool, which compute cannot use, and under a memory cap the allocator then frees and
  synchronises (measured on the H200, ``scripts/cap_experiment.py``: the tuned ResNet-50 plan ran 221 ms capped against
  132 ms uncapped before, 137 ms capped after). Unpack makes the compute stream wait for that copy's event; without a
  prefetch it copies on demand. The device buffer is dropped once every handle of the storage has been unpacked.
* A storage that is still alive on the device when unpacked (a ``keep`` stage holds it too: the
  wasted-copy case of the plan semantics, or deferred sync past the forward's end) is used in place, with
  no host-to-device copy, once compute has waited for its device-to-host copy.
* On CPU there are no streams: pack copies into the pool synchronously and unpack copies back into a
  fresh tensor, so the same hook machinery runs (and is tested) without a GPU.
* The pool is reset at the start of a step only when no entry of an earlier step is alive (their
  handles die with the autograd graph); otherwise it grows, which keeps overlapping steps (gradient
  accumulation over two forwards) correct.

Assumption, as autograd's own: a storage's content does not change between its pack and its unpack
(autograd's version counter rejects such programs in an unplanned run; a new version is a new copy).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from memtune.tuner.runtime._pool import HostPool

__all__ = ["OffloadRuntime", "OffloadStats", "StepState", "bytes_view", "resident_storage_ptrs"]

_SYNC_MODES = ("layer", "deferred", "points", "inline")


def resident_storage_ptrs(tensors: Iterable[torch.Tensor]) -> set[int]:
    """The data pointers of the storages that ``tensors`` live in: what a pack hook leaves on the device.

    A ``DTensor`` (a parameter sharded by FSDP2's ``fully_shard``) has no storage of its own; its local shard's is
    taken. Parameters FSDP2 gathers for a module's forward are plain tensors in storages of their own, allocated
    when gathered: they are known only while the module runs (NOTE [ Sharded parameters ] in
    ``memtune.tuner.runtime._planned_module``).
    """
    ptrs = set()
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        ptrs.add(local.untyped_storage().data_ptr())
    return ptrs


@dataclass
class OffloadStats:
    """Counters of the offload runtime since it was made (bytes are storage bytes)."""

    d2h_copies: int = 0
    d2h_bytes: int = 0
    h2d_copies: int = 0
    h2d_bytes: int = 0
    prefetched: int = 0
    """host-to-device copies issued ahead of need by a backward pre-hook"""
    on_demand: int = 0
    """host-to-device copies issued by unpack because no prefetch had brought the storage back"""
    reused_on_device: int = 0
    """unpacks served by the original device storage, still alive (a keep reference holds it)"""
    deduped: int = 0
    """packs of a storage already copied in the same step"""
    passed_through: int = 0
    """packs left on the device: parameters, buffers, the model input, foreign tensors"""
    pool_resets: int = 0


class _Entry:
    """One offloaded storage in one step."""

    __slots__ = (
        "d2h_done",
        "device_buf",
        "due",
        "fetched",
        "h2d_done",
        "handles",
        "hold",
        "host",
        "nbytes",
        "need",
        "pending",
        "storage_ref",
    )

    def __init__(self, storage: torch.UntypedStorage, host: torch.Tensor, need: int) -> None:
        self.storage_ref: weakref.ref[torch.UntypedStorage] = weakref.ref(storage)
        self.nbytes = storage.nbytes()
        self.host: torch.Tensor | None = host
        self.need = need
        self.d2h_done: torch.cuda.Event | None = None
        self.device_buf: torch.Tensor | None = None
        self.h2d_done: torch.cuda.Event | None = None
        self.fetched = False
        self.handles = 0  # live handles
        self.pending = 0  # handles not unpacked yet
        self.hold: torch.Tensor | None = None  # the device storage, until compute has waited for its copy
        self.due = 0  # deferred sync: the forward stage at whose end compute waits for the copy


class _Handle:
    """What autograd stores instead of an offloaded tensor: a view description plus its entry."""

    __slots__ = ("__weakref__", "dtype", "entry", "offset", "runtime", "size", "stride", "unpacked")

    def __init__(self, runtime: OffloadRuntime, entry: _Entry, t: torch.Tensor) -> None:
        self.runtime = runtime
        self.entry = entry
        self.dtype = t.dtype
        self.offset = t.storage_offset()
        self.size = tuple(t.shape)
        self.stride = t.stride()
        self.unpacked = False
        entry.handles += 1
        entry.pending += 1

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown there is nothing to release
            self.runtime._handle_dead(self)


def _wait_copy(entry: _Entry) -> None:
    """Make compute wait for the entry's device-to-host copy, then drop the runtime's hold on its storage.

    After this the storage may be freed on the compute stream at any time (NOTE [ No record_stream ]).
    """
    hold = entry.hold
    if hold is None:
        return
    if entry.d2h_done is not None:
        torch.cuda.current_stream(hold.device).wait_event(entry.d2h_done)
    entry.hold = None


def bytes_view(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """``storage`` on ``device`` as a flat uint8 tensor, no copy: what a copy of a whole storage reads or writes."""
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


class StepState:
    """Per-forward state: the dedupe map, the entries to prefetch, where the step is (for errors).

    Made by ``OffloadRuntime.begin_step``; the hooks and backward pre-hooks of one forward close over
    it, so two forwards whose backwards overlap do not mix.
    """

    def __init__(
        self,
        runtime: OffloadRuntime,
        device: torch.device,
        *,
        sync: str,
        sync_delay: int,
        sync_points: Iterable[int],
        lookahead: int,
        exclude_ptrs: set[int],
        lookaheads: Sequence[int] | None = None,
    ) -> None:
        self.runtime = runtime
        self.device = device
        self.sync = sync
        self.sync_delay = sync_delay
        self.sync_points = frozenset(sync_points)
        self.lookahead = 0 if sync == "inline" else lookahead
        # NOTE [ Prefetch lookahead ]: per need stage, else the global one
        self.lookaheads: tuple[int, ...] | None = None if lookaheads is None or sync == "inline" else tuple(lookaheads)
        self.exclude_ptrs = exclude_ptrs
        self.entries: dict[tuple[int, int], _Entry] = {}
        self.all_entries: list[_Entry] = []
        self._order: list[_Entry] | None = None
        self._cursor = 0
        self.last_d2h: torch.cuda.Event | None = None
        self._region_event: torch.cuda.Event | None = None
        self._region_entries: list[_Entry] = []
        self._region_stage = 0
        self.held: list[_Entry] = []  # entries whose device storage is still held (NOTE [ Deferred frees ])
        self.forward_stage: int | None = None
        self.backward_stage: int | None = None
        self.forward_ended = False  # the model's forward has returned (the loss runs, or the backward)
        self.cuda = device.type == "cuda"

    # ---- forward -------------------------------------------------------------------------------
    def hooks(self, stage: int, need: int) -> torch.autograd.graph.saved_tensors_hooks:
        """Offload hooks for the region starting at forward ``stage`` (the pack stage of what it saves);
        ``need`` is the backward stage that first reads what it saves."""
        self._region_event = None
        self._region_entries = []
        self._region_stage = stage
        return torch.autograd.graph.saved_tensors_hooks(functools.partial(self._pack, need), self._unpack)

    def _pack(self, need: int, t: torch.Tensor) -> Any:
        rt = self.runtime
        if (
            type(t) is not torch.Tensor
            or t.device != self.device
            or t.layout != torch.strided
            or t.is_conj()
            or t.is_neg()
        ):
            rt.stats.passed_through += 1
            return t.detach()
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if storage.nbytes() == 0 or ptr in self.exclude_ptrs:
            rt.stats.passed_through += 1
            return t.detach()
        key = (ptr, t._version)
        with rt.lock:
            entry = self.entries.get(key)
            if entry is not None and entry.host is not None and entry.storage_ref() is storage:
                rt.stats.deduped += 1
                entry.need = max(entry.need, need)
                if entry.handles == 0:
                    # every earlier handle already died (a segment that saves nothing drops its
                    # input's handle at once); the host copy is still valid within this step
                    rt.live_entries += 1
            else:
                entry = self._copy_out(storage, need)
                self.entries[key] = entry
                self.all_entries.append(entry)
            return _Handle(rt, entry, t)

    def _copy_out(self, storage: torch.UntypedStorage, need: int) -> _Entry:
        rt = self.runtime
        host = rt.pool_for(self.device).alloc(storage.nbytes())
        entry = _Entry(storage, host, need)
        rt.live_entries += 1
        src = bytes_view(storage, self.device)
        if self.cuda and self.sync != "inline":
            d2h = rt.d2h_stream(self.device)
            d2h.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(d2h):
                host.copy_(src, non_blocking=True)
                done = torch.cuda.Event()
                done.record(d2h)
            # NOTE [ No record_stream ]: the allocator's record_stream makes a freed block wait for the copy
            # stream's tail at free time, i.e. for every copy queued behind this one; with a long deferred
            # queue those blocks stay reserved, the budget cap is reached and the allocator synchronises
            # (measured: benchmarks/results/h200-cap-experiment.txt). Instead the runtime holds the storage
            # until compute has waited for its copy (_release, _wait_copy), so the block is safe to reuse
            # on the compute stream the moment it is freed. A storage used in place by backward makes compute
            # wait for its copy at its first unpack: the copy must never read a block that the allocator
            # has handed out again or unmapped (expandable segments unmap under a memory cap, and a copy
            # from unmapped memory is a launch failure, seen on the H200).
            entry.d2h_done = done
            entry.due = self._region_stage + self.sync_delay
            entry.hold = src  # NOTE [ Deferred frees ] in memtune.tuner.simulator: dropped by _release/_wait_copy
            self.held.append(entry)
            self._region_entries.append(entry)
            self.last_d2h = done
            self._region_event = done
        else:
            host.copy_(src)  # CPU, or inline: synchronous on the compute stream
        rt.stats.d2h_copies += 1
        rt.stats.d2h_bytes += entry.nbytes
        return entry

    def end_stage(self, stage: int, *, offloading: bool) -> None:
        """Apply the sync knob at the end of ``stage``'s forward (``offloading``: it ran under hooks)."""
        if not self.cuda:
            return
        compute = torch.cuda.current_stream(self.device)
        if self.sync == "layer" and offloading and self._region_event is not None:
            compute.wait_event(self._region_event)
            # compute waits for these copies: any later reuse on the compute stream is ordered after them
            self._release(self._region_entries)
        elif self.sync == "points" and stage in self.sync_points and self.last_d2h is not None:
            compute.wait_event(self.last_d2h)
            self._release(list(self.held))
        elif self.sync == "deferred" and self.held:
            due = [e for e in self.held if e.due <= stage]
            if due:
                # the copy stream runs its copies in issue order: the last due one's event covers them all
                last = due[-1].d2h_done
                if last is not None:
                    compute.wait_event(last)
                self._release(due)
        if offloading:
            self._region_event = None
            self._region_entries = []

    def _release(self, entries: list[_Entry]) -> None:
        for entry in entries:
            entry.hold = None
        self.held = [e for e in self.held if e.hold is not None]

    def end_forward(self) -> None:
        """The forward is over: the dedupe map is no longer needed."""
        self.entries = {}
        self.forward_stage = None
        self.forward_ended = True

    # ---- backward ------------------------------------------------------------------------------
    def trigger(self, need: int) -> int:
        """The backward stage whose pre-hook prefetches an entry first needed at stage ``need``: ``need`` plus that
        stage's lookahead (NOTE [ Prefetch lookahead ]; past the last stage it fires at the first pre-hook)."""
        las = self.lookaheads
        return need + (las[need] if las is not None and 0 <= need < len(las) else self.lookahead)

    def on_backward(self, stage: int) -> None:
        """Backward has reached ``stage``: prefetch every entry whose trigger (``trigger``) is ``stage`` or later."""
        self.backward_stage = stage
        if self.sync == "inline":
            return
        # no poll here: a storage still held after the forward stays until its backward uses it in place,
        # as the simulator has it (dropping it now would cost a copy back)
        with self.runtime.lock:
            if self._order is None:
                self._order = sorted(self.all_entries, key=lambda e: self.trigger(e.need), reverse=True)
                self.all_entries = []
            order = self._order
            due: list[_Entry] = []
            while self._cursor < len(order) and self.trigger(order[self._cursor].need) >= stage:
                due.append(order[self._cursor])
                self._cursor += 1
            # NOTE [ Prefetch lookahead ]: of the copies issued together, the one needed first goes first
            for entry in sorted(due, key=lambda e: e.need, reverse=True):
                if entry.host is not None and not entry.fetched and entry.pending:
                    self._fetch(entry, prefetch=True)

    def _fetch(self, entry: _Entry, *, prefetch: bool) -> None:
        rt = self.runtime
        entry.fetched = True
        storage = entry.storage_ref()
        if storage is not None:
            # still on the device (a keep reference or the runtime's hold keeps it): keep it until unpack uses
            # it in place, as the simulator does, even if that other reference dies first
            entry.device_buf = bytes_view(storage, self.device)
            return
        host = entry.host
        assert host is not None
        if self.cuda and self.sync != "inline":
            h2d = rt.h2d_stream(self.device)
            compute = torch.cuda.current_stream(self.device)
            # allocated on the compute stream (see the module docstring); the copy waits for compute so it
            # cannot write the block before compute's earlier users of it are done
            buf = torch.empty(entry.nbytes, dtype=torch.uint8, device=self.device)
            h2d.wait_stream(compute)
            with torch.cuda.stream(h2d):
                if entry.d2h_done is not None:
                    h2d.wait_event(entry.d2h_done)
                buf.copy_(host, non_blocking=True)
                done = torch.cuda.Event()
                done.record(h2d)
            entry.h2d_done = done
        else:
            # CPU: a fresh tensor; inline: an asynchronous copy on the compute stream, ordered
            # before the backward kernels that read it (the pinned source is not rewritten before
            # the next step's blocking copies, which run on that same stream)
            buf = host.to(self.device, copy=True, non_blocking=self.cuda)
        entry.device_buf = buf
        rt.stats.h2d_copies += 1
        rt.stats.h2d_bytes += entry.nbytes
        if prefetch:
            rt.stats.prefetched += 1
        else:
            rt.stats.on_demand += 1

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        h: _Handle = packed
        entry = h.entry
        rt = self.runtime
        with rt.lock:
            storage = entry.storage_ref()
            if storage is not None:
                rt.stats.reused_on_device += 1
                _wait_copy(entry)
            else:
                if entry.device_buf is None:
                    if entry.host is None:
                        raise RuntimeError(
                            "memtune runtime: an offloaded tensor was unpacked after its step was "
                            "abandoned (out-of-memory cleanup); run the step again"
                        )
                    self._fetch(entry, prefetch=False)
                buf = entry.device_buf
                assert buf is not None
                if entry.h2d_done is not None:
                    # the buffer belongs to the compute stream's pool: this wait is all the ordering it needs
                    torch.cuda.current_stream(self.device).wait_event(entry.h2d_done)
                storage = buf.untyped_storage()
            out = torch.empty(0, dtype=h.dtype, device=self.device).set_(storage, h.offset, h.size, h.stride)
            if not h.unpacked:
                h.unpacked = True
                entry.pending -= 1
                if entry.pending == 0:
                    entry.hold = None
                    entry.device_buf = None  # autograd's tensor keeps it alive as long as needed
                    entry.fetched = False
                    entry.h2d_done = None
            return out


class OffloadRuntime:
    """Owns the host pool, the copy streams, the counters and the count of live entries.

    One per ``PlannedChain``. Thread safety: the pack hook runs in the forward thread, unpack and
    pre-hooks in autograd's threads, handle finalizers anywhere; shared state is guarded by ``lock``.

    Args:
        reserve_bytes: host bytes to allocate up front (0: grow during the first step).
    """

    #: the per-forward state ``begin_step`` makes (``memtune.tuner.runtime._stagger`` makes one that staggers its
    #: copies)
    step_type: type[StepState] = StepState

    def __init__(self, *, reserve_bytes: int = 0) -> None:
        self.lock = threading.RLock()
        self.stats = OffloadStats()
        self.live_entries = 0
        self._reserve_bytes = reserve_bytes
        self._pools: dict[bool, HostPool] = {}
        self._d2h: dict[int, torch.cuda.Stream] = {}
        self._h2d: dict[int, torch.cuda.Stream] = {}

    # ---- resources -------------------------------------------------------------------------------
    def pool_for(self, device: torch.device) -> HostPool:
        """The host pool used for ``device`` (pinned for CUDA, pageable for CPU)."""
        pinned = device.type == "cuda"
        pool = self._pools.get(pinned)
        if pool is None:
            pool = self._pools[pinned] = HostPool(pin_memory=pinned, reserve_bytes=self._reserve_bytes)
        return pool

    @property
    def pool(self) -> HostPool | None:
        """The pool in use (pinned if a CUDA step ran, else the CPU one), or None before any offload."""
        return self._pools.get(True) or self._pools.get(False)

    def d2h_stream(self, device: torch.device) -> torch.cuda.Stream:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        if idx not in self._d2h:
            self._d2h[idx] = torch.cuda.Stream(device=idx)
        return self._d2h[idx]

    def h2d_stream(self, device: torch.device) -> torch.cuda.Stream:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        if idx not in self._h2d:
            self._h2d[idx] = torch.cuda.Stream(device=idx)
        return self._h2d[idx]

    # ---- steps -----------------------------------------------------------------------------------
    def begin_step(
        self,
        device: torch.device,
        *,
        sync: str,
        sync_delay: int,
        sync_points: Iterable[int],
        lookahead: int,
        exclude_ptrs: set[int],
        lookaheads: Sequence[int] | None = None,
    ) -> StepState:
        """Start a forward; reset the pool if nothing of an earlier step is still alive."""
        if sync not in _SYNC_MODES:
            raise ValueError(f"sync must be one of {_SYNC_MODES}, got {sync!r}")
        with self.lock:
            if self.live_entries == 0 and self._pools:
                if device.type == "cuda":
                    # host ranges are rewritten by this step's D2H copies: order them after any
                    # H2D copy of an earlier step that is still reading them
                    self.d2h_stream(device).wait_stream(self.h2d_stream(device))
                for pool in self._pools.values():
                    if pool.used_bytes:
                        pool.reset()
                        self.stats.pool_resets += 1
        return self.step_type(
            self,
            device,
            sync=sync,
            sync_delay=sync_delay,
            sync_points=sync_points,
            lookahead=lookahead,
            exclude_ptrs=exclude_ptrs,
            lookaheads=lookaheads,
        )

    def _handle_dead(self, h: _Handle) -> None:
        with self.lock:
            entry = h.entry
            if not h.unpacked:
                entry.pending -= 1
            entry.handles -= 1
            if entry.handles == 0 and entry.host is not None:
                # the host range stays referenced for this forward's dedupe map (the pool is reset
                # only when a step begins), but no longer counts as live
                if entry.device_buf is not None and entry.h2d_done is not None:
                    # a prefetch nobody unpacked: compute must not reuse its block before the copy lands
                    torch.cuda.current_stream(entry.device_buf.device).wait_event(entry.h2d_done)
                _wait_copy(entry)
                entry.device_buf = None
                entry.h2d_done = None
                self.live_entries -= 1

    def abandon(self, step: StepState | None) -> None:
        """Drop a failed step's in-flight state (after an out-of-memory error).

        Waits for the copy streams, forgets the step's entries (their host ranges and device buffers)
        and lets the pool reset at the next step even if the failed graph is still referenced.
        """
        with self.lock:
            for stream in [*self._d2h.values(), *self._h2d.values()]:
                stream.synchronize()
            if step is not None:
                entries = [*step.entries.values(), *step.all_entries, *(step._order or ())]
                step.entries = {}
                step.all_entries = []
                step._order = []
                step.held = []
                for entry in {id(e): e for e in entries}.values():
                    entry.hold = None
                    if entry.host is not None and entry.handles > 0:
                        self.live_entries -= 1
                    entry.host = None
                    entry.device_buf = None
                    entry.h2d_done = None
