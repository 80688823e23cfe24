"""The step loss's time model, without torch: the bytes its kernels move and its roofline time over a profile.

The loss itself (``step_loss``) and its measurement (``measure_loss_ms``) live in ``memtune.profiler.loss``; this module
is what the simulator needs when a profile carries no measured ``loss_ms`` (``profile_loss_ms``), and what the
roofline (``memtune.profiler.modeled``) prices the loss by. It imports neither torch nor ``memtune.profiler.loss`` /
``memtune.profiler.modeled``: both of those import it, the tuner reads ``profile_loss_ms`` and must run without torch
(tests/unit/test_torch_free.py runs a simulation and a search with torch blocked).

Where no measurement exists (profiles made on the CPU or from the roofline), ``modeled_loss_ms`` estimates the loss
from the bytes its kernels move: under autocast the cast of the output to fp32 (read 2, write 4 bytes per
element), log-softmax (read and write 4), its backward (read the saved output and the incoming gradient,
write the gradient: 12), the NLL backward's gradient (write 4) and the cast of the gradient back (read 4,
write 2); in fp32 there are no casts. The kernels are bandwidth-bound, so bytes / memory bandwidth.
``roofline_loss_ms`` prices those bytes at ``LOSS_MEMORY_EFFICIENCY`` of the bandwidth, at least ``LOSS_KERNELS``
x ``LOSS_LAUNCH_MS`` (NOTE [ Roofline ] in ``memtune.profiler.modeled``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from memtune.profiler.devices import GPUSpec, get_gpu
from memtune.profiler.profiler_errors import UnknownGPUError

if TYPE_CHECKING:
    from memtune.profiler._profile import Profile

__all__ = [
    "LOSS_KERNELS",
    "LOSS_LAUNCH_MS",
    "LOSS_MEMORY_EFFICIENCY",
    "LossConstants",
    "loss_bytes_moved",
    "modeled_loss_ms",
    "profile_loss_ms",
    "roofline_loss_ms",
]

# Fitted by ``python -m benchmarks.fit_roofline`` with the roofline's other constants (``memtune.profiler.modeled``);
# paste the two ``LOSS_`` lines it prints here.
LOSS_MEMORY_EFFICIENCY = 0.595
LOSS_LAUNCH_MS = 0.0204

# Structural, not fitted.
LOSS_KERNELS = 10  # casts, log-softmax, NLL and their backwards (memtune.profiler.loss)


class LossConstants(Protocol):
    """The loss's fitted constants, as ``memtune.profiler.modeled.Roofline`` holds them."""

    @property
    def loss_memory_efficiency(self) -> float:
        """The loss's kernels, fraction of the memory bandwidth."""
        ...

    @property
    def loss_launch_ms(self) -> float:
        """The loss's time per kernel when its kernels are small, ms."""
        ...


def loss_bytes_moved(numel: int, itemsize: int) -> int:
    """Bytes the loss's forward and backward kernels read and write for an output of ``numel`` elements of
    ``itemsize`` bytes (see the module docstring)."""
    per_element = 4 + 4 + 12 + 4  # log-softmax, its backward, the NLL gradient (fp32)
    if itemsize != 4:
        per_element += (itemsize + 4) * 2  # the casts to fp32 and back
    return numel * per_element


def modeled_loss_ms(numel: int, itemsize: int, memory_bandwidth: float) -> float:
    """Roofline estimate of the loss's forward + backward, ms, at ``memory_bandwidth`` bytes/s."""
    return loss_bytes_moved(numel, itemsize) / memory_bandwidth * 1e3


def roofline_loss_ms(output_bytes: int, dtype: str, spec: GPUSpec, rl: LossConstants | None = None) -> float:
    """The step loss's forward + backward over an output of ``output_bytes`` on ``spec``, ms: bytes moved
    (``loss_bytes_moved``) at ``loss_memory_efficiency`` of the bandwidth, at least ``LOSS_KERNELS`` x
    ``loss_launch_ms`` (NOTE [ Roofline ] in ``memtune.profiler.modeled``).

    ``rl`` holds the constants (a ``memtune.profiler.modeled.Roofline`` when fitting them); None: the committed ones,
    ``LOSS_MEMORY_EFFICIENCY`` and ``LOSS_LAUNCH_MS``.
    """
    efficiency = LOSS_MEMORY_EFFICIENCY if rl is None else rl.loss_memory_efficiency
    launch_ms = LOSS_LAUNCH_MS if rl is None else rl.loss_launch_ms
    itemsize = 4 if dtype == "float32" else 2
    memory_ms = modeled_loss_ms(output_bytes // itemsize, itemsize, spec.memory_bandwidth * efficiency)
    return max(memory_ms, LOSS_KERNELS * launch_ms)


def profile_loss_ms(profile: Profile) -> float:
    """The loss time a simulation uses, ms: the profile's measured ``loss_ms``, else the roofline estimate
    (``roofline_loss_ms``) on the profile's GPU when it is a known one, else 0."""
    if profile.loss_ms is not None:
        return profile.loss_ms
    try:
        spec = get_gpu(profile.device.key)
    except UnknownGPUError:
        return 0.0
    return roofline_loss_ms(profile.stages[-1].output_bytes, profile.dtype, spec)
