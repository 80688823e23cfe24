"""Modeled against measured profiles: how far the roofline's unconstrained step and peak are from a measured
profile's, for every committed measured zoo profile (H200 and H100).

    python -m benchmarks.modeled_vs_measured

For each ``memtune/profiler/data/<model>-b<batch>-<dtype>-<gpu>.json``: the zoo model is built, profiled by the roofline
(``memtune.profiler.modeled.modeled_profile``, the same GPU type, batch and dtype) and both are simulated with every
activation kept. The measured side is the measured profile's own simulated step: the sum of its timed stages and
loss times its GPU type's compute scale where the calibration has one for that profile (NOTE [ Compute scale ] in
``memtune.tuner.calibration``), as ``memtune tune`` would use it. The error is (modeled - measured) / measured. The
roofline's constants (NOTE [ Roofline ] in ``memtune.profiler.modeled``) were fitted to these same profiles by
``python -m benchmarks.fit_roofline``, which also reports how well constants fitted on one GPU type predict the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.common import environment
from memtune.profiler import Profile, build, modeled_profile
from memtune.profiler.library import list_profiles
from memtune.tuner import Plan, Simulator
from memtune.tuner.calibration import calibration_for

__all__ = ["LIMIT", "Row", "main", "rows", "summary"]

LIMIT = 0.15  # the step error the roofline aims to stay within


@dataclass(frozen=True)
class Row:
    """One measured profile beside its modeled twin. Times in ms, peaks in bytes.

    Attributes:
        model: zoo model.
        batch: samples per step.
        dtype: ``float32`` or the autocast dtype.
        gpu: GPU type key.
        measured_ms: the measured profile's simulated unconstrained step (compute scale applied).
        modeled_ms: the modeled profile's simulated unconstrained step.
        measured_peak: the measured profile's simulated peak.
        modeled_peak: the modeled profile's simulated peak.
        scale: the compute scale applied to the measured profile (1.0 where not calibrated).
        stages_ms: the sum of the measured profile's timed stages and loss (no compute scale).
    """

    model: str
    batch: int
    dtype: str
    gpu: str
    measured_ms: float
    modeled_ms: float
    measured_peak: int
    modeled_peak: int
    scale: float
    stages_ms: float

    @property
    def error(self) -> float:
        """(modeled - measured) / measured step."""
        return (self.modeled_ms - self.measured_ms) / self.measured_ms

    @property
    def peak_error(self) -> float:
        """(modeled - measured) / measured peak."""
        return (self.modeled_peak - self.measured_peak) / self.measured_peak


def rows() -> list[Row]:
    """One ``Row`` per committed measured zoo profile, sorted by GPU, model, batch and dtype."""
    out = []
    for entry in sorted(list_profiles(), key=lambda e: e.path.name):
        if entry.compile_budget is not None:
            continue  # the roofline models eager stages
        m = {"model": entry.model, "gpu": entry.gpu}
        measured = Profile.from_json(entry.path.read_bytes())
        if measured.source != "measured":
            continue
        chain = build(m["model"], dict(measured.model_params))
        modeled = modeled_profile(chain, measured.batch, measured.dtype, m["gpu"])
        a = Simulator(measured).run(Plan.uniform(measured.n_stages))
        b = Simulator(modeled).run(Plan.uniform(modeled.n_stages))
        out.append(
            Row(
                model=m["model"],
                batch=measured.batch,
                dtype=measured.dtype,
                gpu=m["gpu"],
                measured_ms=a.step_ms,
                modeled_ms=b.step_ms,
                measured_peak=a.peak_bytes,
                modeled_peak=b.peak_bytes,
                scale=calibration_for(m["gpu"]).compute_scale_for(measured),
                stages_ms=sum(s.forward_ms + s.backward_ms for s in measured.stages) + (measured.loss_ms or 0.0),
            )
        )
    return sorted(out, key=lambda r: (r.gpu, r.model, r.batch, r.dtype))


def summary(on_gpu: list[Row], limit: float = LIMIT) -> str:
    """How many steps are within ``limit``, and the three worst, as one line."""
    within = sum(abs(r.error) <= limit for r in on_gpu)
    worst = sorted(on_gpu, key=lambda r: -abs(r.error))[:3]
    named = ", ".join(f"{r.model} b{r.batch} {r.dtype} {r.error:+.1%}" for r in worst)
    peak = max(abs(r.peak_error) for r in on_gpu)
    return f"{within}/{len(on_gpu)} steps within {limit:.0%}; worst {named}; peaks within {peak:.1%}"


def main() -> None:
    gib = float(1 << 30)
    table = rows()
    print(f"environment: {environment()}")
    print(
        "measured step: the measured profile's simulated unconstrained step, its stages and loss times the GPU type's "
        "compute scale where calibrated; modeled step: the roofline profile's (constants from benchmarks.fit_roofline)"
    )
    print("| GPU | model | batch | dtype | measured step ms | modeled step ms | step error | measured peak GiB | "
          "modeled peak GiB | peak error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(
            f"| {r.gpu} | {r.model} | {r.batch} | {r.dtype} | {r.measured_ms:.1f} | {r.modeled_ms:.1f} | "
            f"{r.error:+.1%} | {r.measured_peak / gib:.2f} | {r.modeled_peak / gib:.2f} | {r.peak_error:+.1%} |"
        )
    print()
    for gpu in sorted({r.gpu for r in table}):
        print(f"{gpu}: {summary([r for r in table if r.gpu == gpu])}")
    for r in table:
        if r.scale != 1.0:
            off = (r.modeled_ms - r.stages_ms) / r.stages_ms
            print(
                f"compute scale {r.scale:.4g} on {r.gpu} {r.model} b{r.batch} {r.dtype}: against its timed stages' sum "
                f"({r.stages_ms:.1f} ms) the modeled step is {off:+.1%}"
            )


if __name__ == "__main__":
    main()
