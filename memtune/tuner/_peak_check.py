"""A profile checks itself: the unplanned step's measured peak beside the simulator's prediction of it.

# NOTE [ Profile self-check ]
A plan that memtune says fits must fit, so the simulator's memory model is checked on every measured profile of a
model's module stages: the profiler runs one unplanned step under the allocator's meter (NOTE [ Allocator meters ]
in ``memtune.profiler.memory_meter``) and keeps its peak (``Profile.step_peak``: allocated and reserved bytes above what
was resident before, parameters and batch), and ``peak_check`` simulates the same step (every stage ``keep``, no
optimizer state, the output held or dropped as measured) and compares the two. A difference above
``GAP_TOLERANCE`` (3%) is reported by ``memtune.profile`` (a warning), ``memtune.tune`` (its printout), the
command line and the job page; it is never silent.

The gap also sets the headroom: where the simulator under-predicts the unplanned step by a fraction g of its
predicted activation bytes, a plan is searched against ``budget x (1 - h) / (1 + g)`` instead of ``budget x (1 -
h)``, h the GPU type's calibrated headroom (NOTE [ Headroom ] in ``memtune.tuner.search``): ``planning_headroom``
returns ``1 - (1 - h) / (1 + g)``. An over-prediction leaves h as it is. The headroom comes from what was measured, not
from a constant.

Before this check the language models were the ones to miss: on a CPU, where the allocator's events time every
allocation, a small ``BertForMaskedLM`` (hidden 128, 4 layers, vocabulary 30,522, batch 8 x 256) was simulated at
0.73 of its measured peak, 0.57 with its output held: the loss's backward (the gradient of the log-softmax, one
logits tensor) was measured on CUDA only, and a loop holding the model's output keeps one more logits tensor (NOTE
[ Held output ] in ``memtune.tuner.simulator``). With both measured the two agree to within 0.1% on the language models
of the test set (``tests/unit/modules/test_peak_oracle.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from memtune.profiler import Profile
from memtune.tuner.budget import format_bytes
from memtune.tuner.calibration import Calibration, calibration_for
from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import Simulator

__all__ = ["GAP_TOLERANCE", "PeakCheck", "peak_check", "planning_headroom"]

#: a measured and a simulated unplanned peak further apart than this fraction are reported
GAP_TOLERANCE = 0.03


@dataclass(frozen=True)
class PeakCheck:
    """The unplanned step of a profile, measured and simulated; bytes above what was resident before the step.

    Attributes:
        measured_bytes: the allocator's peak of allocated bytes.
        reserved_bytes: the caching allocator's peak reservation (the CPU's equals ``measured_bytes``).
        predicted_bytes: the simulator's peak of the same step.
        output_held: whether the step held the model's output through its backward.
        device: where it was measured: the profile's GPU, or the CPU for a profile made there for a GPU.
    """

    measured_bytes: int
    reserved_bytes: int
    predicted_bytes: int
    output_held: bool
    device: str

    @property
    def gap(self) -> float:
        """(measured - predicted) / predicted: positive where the simulator under-predicts."""
        return (self.measured_bytes - self.predicted_bytes) / max(1, self.predicted_bytes)

    @property
    def reported(self) -> bool:
        """Whether the two differ by more than ``GAP_TOLERANCE``."""
        return abs(self.gap) > GAP_TOLERANCE

    def __str__(self) -> str:
        held = "output held through the backward" if self.output_held else "output dropped before the backward"
        head = (
            f"unplanned step ({held}): measured peak {format_bytes(self.measured_bytes)} "
            f"(reserved {format_bytes(self.reserved_bytes)}) on {self.device}, simulated "
            f"{format_bytes(self.predicted_bytes)} ({self.gap:+.1%})"
        )
        if not self.reported:
            return head
        side = "under" if self.gap > 0 else "over"
        return f"{head}: the simulator {side}-predicts this model by more than {GAP_TOLERANCE:.0%}" + (
            "; plans are searched with the gap added to the headroom" if self.gap > 0 else ""
        )


def peak_check(profile: Profile, *, calibration: Calibration | None = None) -> PeakCheck | None:
    """The profile's measured unplanned peak beside the simulator's; None where the profile measured none
    (NOTE [ Profile self-check ]). ``calibration`` is the simulator's (None: ``calibration_for``, NOTE [ Calibration
    is an input ] in ``memtune.tuner.calibration``)."""
    measured = profile.step_peak
    if measured is None:
        return None
    sim = Simulator(profile, "none", calibration=calibration).run(Plan.uniform(profile.n_stages, Action.KEEP))
    return PeakCheck(
        measured_bytes=measured.allocated_bytes,
        reserved_bytes=measured.reserved_bytes,
        predicted_bytes=sim.peak_bytes - sim.base_bytes,
        output_held=measured.output_held,
        device=profile.device.name if profile.source == "measured" else "the CPU",
    )


def planning_headroom(profile: Profile, *, calibration: Calibration | None = None) -> float:
    """The headroom a search uses by default: the calibration's headroom widened by the simulator's measured
    under-prediction of this profile's unplanned step (NOTE [ Profile self-check ]). ``calibration`` None: the GPU
    type's, looked up once here with ``calibration_for`` (NOTE [ Calibration is an input ] in
    ``memtune.tuner.calibration``)."""
    cal = calibration if calibration is not None else calibration_for(profile.device.key)
    headroom = cal.headroom
    check = peak_check(profile, calibration=cal)
    if check is None or check.gap <= 0:
        return headroom
    return min(0.95, 1.0 - (1.0 - headroom) / (1.0 + check.gap))
