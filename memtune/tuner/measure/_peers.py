"""The peers ``memtune bench`` measures beside memtune's plans: the whole model compiled under the compiler's
activation budget, and activation offloading as torchtune does it.

# NOTE [ Peers ]
A peer is a way to train within less memory that a user could pick instead of a memtune plan, applied to the
whole model with no profile and no search:

* ``compiled_model``: ``torch.compile`` of the whole model with ``activation_memory_budget`` (0 to 1) patched
  while it compiles; AOTAutograd's partitioner then chooses what to recompute (NOTE [ Compiled stages ]).
* ``OffloadActivations``: every saved activation of at least ``min_offload_bytes`` goes to pinned host memory
  in the forward, on a side stream, and comes back when backward unpacks it, in the manner of torchtune's
  ``torchtune.training.OffloadActivations`` (written anew here; it keeps strides, which a compiled backward
  asserts, and copies a storage shared by several saved tensors once).

Neither changes the math: offloading is a copy (gradients bitwise equal to the run without it), compiling is
the compiler's lowering of the same operations (equal up to floating-point reassociation).

# NOTE [ Peer offload ]
Pack copies the saved tensor's whole untyped storage (not only its elements) to the host and returns a handle
(dtype, storage offset, size, stride); unpack rebuilds the tensor on a device copy of that storage with
``set_``, so views keep their layout, and saved tensors that share a storage (a chunked projection's q, k, v;
an in-place ReLU's output saved by it and by the next layer) share one copy. The copy is keyed by the
storage's address and the tensor's version; a weak reference to the storage tells a reused address from the
same storage. On CUDA with ``use_streams`` the device-to-host copy runs on a side stream that first waits for
the compute stream; the device storage is held until the compute stream has waited for the copy's event (at
most ``max_fwd_stash`` copies are in flight; older ones are waited for and dropped at the next pack, all of
them when the context exits), so the caching allocator never hands the block out again while the copy reads
it, without ``record_stream``. Unpack copies the storage back on the compute stream (non-blocking from pinned
memory), once per storage while the restored copy is alive; a storage whose copy is still in flight is used
in place. Assumption, as autograd's own: a saved tensor is not modified in place between pack and unpack.
"""

from __future__ import annotations

import collections
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memtune.profiler.compiled import CompiledStage
from memtune.tuner.runtime.offload import bytes_view, resident_storage_ptrs

__all__ = ["OffloadActivations", "OffloadActivationsStats", "compiled_model"]

MiB = 1 << 20


def compiled_model(module: nn.Module, activation_budget: float) -> nn.Module:
    """``module`` compiled whole with ``torch.compile`` under the activation budget (NOTE [ Peers ]).

    Args:
        module: the model; its parameters and buffers are shared, not copied.
        activation_budget: ``torch._functorch.config.activation_memory_budget`` while it compiles, a share from
            0 (the fewest saved bytes, the most recomputation) to 1 (the compiler's default partition).

    Returns:
        A ``memtune.profiler.compiled.CompiledStage`` around the whole model.

    Raises:
        ValueError: ``activation_budget`` is outside 0..1.
    """
    return CompiledStage(module, activation_budget)


@dataclass
class OffloadActivationsStats:
    """What an ``OffloadActivations`` did since it was made (bytes are storage bytes)."""

    offloaded_tensors: int = 0
    """saved tensors replaced by a handle to a host copy (those sharing a copy included)"""
    offloaded_bytes: int = 0
    """bytes copied device to host"""
    copies: int = 0
    """storages copied device to host"""
    deduped: int = 0
    """saved tensors whose storage had already been copied at the same version"""
    passed_through: int = 0
    """saved tensors left as they were: parameters, buffers, small or foreign tensors, CPU tensors"""
    restored_bytes: int = 0
    """bytes copied host to device by unpack"""
    reused_on_device: int = 0
    """unpacks served by the device storage itself, its copy still in flight"""


class _Copy:
    """One storage's host copy."""

    __slots__ = ("__weakref__", "device", "done", "hold", "host", "nbytes", "restored_ref", "source_ref")

    def __init__(self, storage: torch.UntypedStorage, host: torch.Tensor) -> None:
        self.source_ref: weakref.ref[torch.UntypedStorage] = weakref.ref(storage)
        self.device = storage.device
        self.nbytes = storage.nbytes()
        self.host = host
        self.done: torch.cuda.Event | None = None  # the device-to-host copy's event, on the side stream
        self.hold: torch.Tensor | None = None  # the device storage, until compute has waited for ``done``
        self.restored_ref: weakref.ref[torch.UntypedStorage] | None = None


class _Handle:
    """What autograd keeps instead of an offloaded tensor: its copy and how to view it."""

    __slots__ = ("copy", "dtype", "offset", "size", "stride")

    def __init__(self, copy: _Copy, t: torch.Tensor) -> None:
        self.copy = copy
        self.dtype = t.dtype
        self.offset = t.storage_offset()
        self.size = tuple(t.shape)
        self.stride = t.stride()


class OffloadActivations(torch.autograd.graph.saved_tensors_hooks):
    """Offload saved activations to host memory in the forward and bring them back in the backward.

    Under this context manager every tensor autograd saves whose storage has at least ``min_offload_bytes``
    is copied to (pinned) host memory and its device memory freed once the copy is done; backward copies it
    back when it needs it (NOTE [ Peer offload ]). This trades host-device traffic (PCIe time, overlapped with
    the forward's compute on a side stream) for device memory: what stays on the device is parameters,
    gradients, small tensors and the few copies in flight. Parameters and buffers (of ``module``, when given;
    otherwise ``nn.Parameter`` objects, views of them and leaves that require grad) are never offloaded.

    Args:
        min_offload_bytes: the smallest storage, in bytes, worth copying (default 1 MiB); smaller ones stay.
        use_streams: copy device to host on a side CUDA stream (else on the compute stream).
        pin_memory: allocate the host copies in page-locked memory (needed for asynchronous copies).
        max_fwd_stash: copies left in flight at a pack; older ones are waited for and their device memory
            dropped (at least 1).
        module: the model, whose parameters' and buffers' storages pass through untouched.
        force_host_copy_on_cpu: for tests: also "offload" CPU tensors, to a separate CPU copy, through the same
            pack and unpack code; without it CPU tensors pass through and this is a no-op on a CPU-only machine.

    Raises:
        ValueError: ``min_offload_bytes`` is negative or ``max_fwd_stash`` below 1.

    Example::

        with OffloadActivations(module=model):
            loss = loss_fn(model(x), y)
        loss.backward()
    """

    def __init__(
        self,
        *,
        min_offload_bytes: int = MiB,
        use_streams: bool = True,
        pin_memory: bool = True,
        max_fwd_stash: int = 5,
        module: nn.Module | None = None,
        force_host_copy_on_cpu: bool = False,
    ) -> None:
        if min_offload_bytes < 0:
            raise ValueError(f"min_offload_bytes is a size in bytes, at least 0, not {min_offload_bytes}")
        if max_fwd_stash < 1:
            raise ValueError(f"max_fwd_stash is a number of copies in flight, at least 1, not {max_fwd_stash}")
        self.min_offload_bytes = min_offload_bytes
        self.use_streams = use_streams
        self.pin_memory = pin_memory
        self.max_fwd_stash = max_fwd_stash
        self.module = module
        self.force_host_copy_on_cpu = force_host_copy_on_cpu
        self.stats = OffloadActivationsStats()
        self._lock = threading.Lock()  # pack runs on the forward's thread, unpack on autograd's device threads
        self._copies: weakref.WeakValueDictionary[tuple[int, int], _Copy] = weakref.WeakValueDictionary()
        self._in_flight: collections.deque[_Copy] = collections.deque()
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._exclude: set[int] = set()
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> None:
        self._exclude = set()
        if self.module is not None:
            tensors = [*self.module.parameters(), *self.module.buffers()]
            self._exclude = resident_storage_ptrs(tensors)
        super().__enter__()

    def __exit__(self, *args: object) -> None:
        super().__exit__(*args)
        with self._lock:
            self._settle(len(self._in_flight))

    # -------- pack --------

    def _offloadable(self, t: torch.Tensor) -> bool:
        if type(t) is not torch.Tensor or t.layout != torch.strided or t.is_conj() or t.is_neg():
            return False  # nn.Parameter is a subclass; wrapper subclasses, sparse and lazy views stay too
        if (t.is_leaf and t.requires_grad) or isinstance(t._base, nn.Parameter):
            return False
        if not (t.is_cuda or (t.device.type == "cpu" and self.force_host_copy_on_cpu)):
            return False
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        return nbytes > 0 and nbytes >= self.min_offload_bytes and storage.data_ptr() not in self._exclude

    def _pack(self, t: torch.Tensor) -> Any:
        if not self._offloadable(t):
            with self._lock:
                self.stats.passed_through += 1
            return t.detach()  # no reference cycle through a saved output's grad_fn
        storage = t.untyped_storage()
        key = (storage.data_ptr(), t._version)
        with self._lock:
            copy = self._copies.get(key)
            if copy is not None and copy.source_ref() is storage:
                self.stats.deduped += 1
            else:
                copy = self._copy_out(storage)
                self._copies[key] = copy
            self.stats.offloaded_tensors += 1
            return _Handle(copy, t)

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        return stream

    def _copy_out(self, storage: torch.UntypedStorage) -> _Copy:
        src = bytes_view(storage, storage.device)
        cuda = src.is_cuda
        host = torch.empty(src.numel(), dtype=torch.uint8, pin_memory=cuda and self.pin_memory)
        copy = _Copy(storage, host)
        if cuda and self.use_streams:
            self._settle(len(self._in_flight) - self.max_fwd_stash + 1)
            side = self._side_stream(src.device)
            side.wait_stream(torch.cuda.current_stream(src.device))  # the tensor is ready
            with torch.cuda.stream(side):
                host.copy_(src, non_blocking=self.pin_memory)
                copy.done = side.record_event()
            copy.hold = src  # NOTE [ Peer offload ]: dropped once compute has waited for ``done``
            self._in_flight.append(copy)
        else:
            # on the compute stream: a later reuse of the block on that stream is ordered after the copy
            host.copy_(src, non_blocking=cuda and self.pin_memory)
        self.stats.copies += 1
        self.stats.offloaded_bytes += copy.nbytes
        return copy

    def _settle(self, n: int) -> None:
        """Make compute wait for the ``n`` oldest copies in flight and drop their device storages."""
        for _ in range(max(0, n)):
            self._wait(self._in_flight.popleft())

    @staticmethod
    def _wait(copy: _Copy) -> None:
        if copy.hold is not None and copy.done is not None:
            torch.cuda.current_stream(copy.hold.device).wait_event(copy.done)
        copy.hold = None

    # -------- unpack --------

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        h: _Handle = packed
        copy = h.copy
        with self._lock:
            if copy.hold is not None:  # its copy is still in flight: use the device storage in place
                storage = copy.hold.untyped_storage()
                self._in_flight.remove(copy)
                self._wait(copy)  # compute may free it from here on: the copy must be done by then
                self.stats.reused_on_device += 1
            else:
                restored = copy.restored_ref() if copy.restored_ref is not None else None
                storage = restored if restored is not None else self._copy_in(copy)
        return torch.empty(0, dtype=h.dtype, device=copy.device).set_(storage, h.offset, h.size, h.stride)

    def _copy_in(self, copy: _Copy) -> torch.UntypedStorage:
        buf = torch.empty(copy.nbytes, dtype=torch.uint8, device=copy.device)
        # on the compute stream, where the buffer was allocated and where backward reads it
        buf.copy_(copy.host, non_blocking=buf.is_cuda and self.pin_memory)
        storage = buf.untyped_storage()
        copy.restored_ref = weakref.ref(storage)
        self.stats.restored_bytes += copy.nbytes
        return storage
