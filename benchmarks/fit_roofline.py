"""Fit the roofline's constants (NOTE [ Roofline ] in ``memtune.profiler.modeled``) to the measured profiles of the zoo.

    python -m benchmarks.fit_roofline

For every committed measured profile ``memtune/profiler/data/<model>-b<batch>-<dtype>-<gpu>.json`` (the H100 and the
H200) the zoo model is traced once on the meta device (``memtune.profiler.modeled.meta_facts``: its ATen ops, FLOPs,
bytes and channels per stage) and the roofline is evaluated with candidate constants, by the same code
``modeled_profile`` runs (``memtune.profiler.modeled.roofline_ms``). The targets are the measured times as the simulator
uses them: each stage's forward and backward and the loss times the profile's compute scale (NOTE [ Compute scale ] in
``memtune.tuner.calibration``; 1 where the GPU type's calibration has none for it), and the simulated unconstrained
step.

Two bounded least-squares fits (``scipy.optimize.least_squares``), from fixed starting values, not from the
committed constants:

1. the loss: ``loss_memory_efficiency`` and ``loss_launch_ms`` on log(modeled / measured loss);
2. the stages: every other constant on, per profile, each stage's forward and backward error over the measured
   step ((modeled - measured) / step: a stage counts as much as it weighs in the step) and the log of the modeled
   over the measured step.

It prints the constants as ``memtune/profiler/modeled.py`` spells them (paste them there, the two ``LOSS_`` ones into
``memtune/profiler/loss_model.py``; nothing is written), the error of every profile's step, and two hold-outs: the
constants fitted on one GPU type alone and the errors they give on the other, and, for each model, the constants fitted
without it and the errors they give on its profiles. Tracing the models takes about half a minute, each fit a few
seconds.

The objective is only piecewise smooth (the max of compute and memory, the launch queue), so the fit finds a nearby
minimum, not necessarily the lowest: the step errors are stable, but the split of host time between
``backward_launch_factor`` and the per-stage overheads is weakly determined by these profiles (other starting values
move them by up to a third at the same cost).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
from scipy.optimize import least_squares

from memtune.profiler import GPUSpec, Profile, build, get_gpu
from memtune.profiler.library import list_profiles
from memtune.profiler.loss_model import roofline_loss_ms
from memtune.profiler.modeled import ROOFLINE, Roofline, meta_facts, roofline_ms
from memtune.profiler.stagefacts import ChainFacts
from memtune.tuner import Plan, Simulator
from memtune.tuner.calibration import calibration_for

__all__ = [
    "LOSS_FIELDS",
    "STAGE_FIELDS",
    "Sample",
    "fit",
    "fit_loss",
    "fit_stages",
    "load_samples",
    "main",
    "modeled_step_ms",
    "python_constants",
    "stage_error",
    "step_errors",
    "summary",
]


# (field of Roofline, start, lower bound, upper bound); the starts are round numbers, not the committed constants
STAGE_FIELDS: tuple[tuple[str, float, float, float], ...] = (
    ("tensor_efficiency", 0.5, 0.01, 1.0),
    ("conv_efficiency", 0.5, 0.01, 1.0),
    ("conv_half_channels", 100.0, 0.0, 4096.0),
    ("simt_efficiency", 0.5, 0.01, 1.0),
    ("few_channel_efficiency", 0.5, 0.01, 1.0),
    ("memory_efficiency", 0.5, 0.01, 1.0),
    ("pool_efficiency", 0.5, 0.01, 1.0),
    ("batch_norm_ns", 1.0, 0.0, 20.0),
    ("batch_norm_low_ns", 1.0, 0.0, 20.0),
    ("backward_traffic_factor", 2.0, 1.0, 5.0),
    ("launch_ms", 0.02, 0.0, 0.5),
    ("backward_launch_factor", 1.0, 0.1, 4.0),
    ("stage_forward_ms", 0.05, 0.0, 1.0),
    ("stage_backward_ms", 0.05, 0.0, 1.0),
)
LOSS_FIELDS: tuple[tuple[str, float, float, float], ...] = (
    ("loss_memory_efficiency", 0.5, 0.01, 1.0),
    ("loss_launch_ms", 0.01, 0.0, 0.5),
)


@dataclass(frozen=True)
class Sample:
    """One measured profile, with its model's meta facts and the times the fit aims at.

    Attributes:
        gpu: the GPU type's key (``h200``).
        model: the zoo model's name.
        batch: samples per step.
        dtype: ``float32`` or the autocast dtype.
        spec: the GPU type's roofline numbers.
        facts: the model's meta facts at this batch and dtype (the same for every GPU type).
        forward_ms: measured forward of each stage times the compute scale, ms.
        backward_ms: measured backward of each stage times the compute scale, ms.
        loss_ms: measured loss times the compute scale, ms.
        step_ms: the measured profile's simulated unconstrained step (with the compute scale), ms.
        stages_ms: the sum of its timed stages and loss, without the compute scale, ms.
        scale: the compute scale (1.0 where not calibrated).
    """

    gpu: str
    model: str
    batch: int
    dtype: str
    spec: GPUSpec
    facts: ChainFacts
    forward_ms: tuple[float, ...]
    backward_ms: tuple[float, ...]
    loss_ms: float
    step_ms: float
    stages_ms: float
    scale: float

    @property
    def name(self) -> str:
        """``gpu model bBATCH dtype``."""
        return f"{self.gpu} {self.model} b{self.batch} {self.dtype}"


def load_samples(gpus: Iterable[str] | None = None, models: Iterable[str] | None = None) -> list[Sample]:
    """Every committed measured zoo profile (of ``gpus`` and ``models``, default all), sorted by GPU, model, batch
    and dtype. Tracing the models takes about a second per model, batch and dtype."""
    gpu_set = set(gpus) if gpus is not None else None
    model_set = set(models) if models is not None else None
    cache: dict[tuple[str, str, int, str], ChainFacts] = {}
    out = []
    for entry in sorted(list_profiles(), key=lambda e: e.path.name):
        m = {"model": entry.model, "gpu": entry.gpu}
        if entry.compile_budget is not None or (gpu_set is not None and entry.gpu not in gpu_set):
            continue  # the roofline models eager stages
        if model_set is not None and entry.model not in model_set:
            continue
        measured = Profile.from_json(entry.path.read_bytes())
        if measured.source != "measured":
            continue
        key = (m["model"], repr(sorted(measured.model_params.items())), measured.batch, measured.dtype)
        if key not in cache:
            cache[key] = meta_facts(build(m["model"], dict(measured.model_params)), measured.batch, measured.dtype)
        scale = calibration_for(m["gpu"]).compute_scale_for(measured)
        loss = measured.loss_ms or 0.0
        out.append(
            Sample(
                gpu=m["gpu"],
                model=m["model"],
                batch=measured.batch,
                dtype=measured.dtype,
                spec=get_gpu(m["gpu"]),
                facts=cache[key],
                forward_ms=tuple(s.forward_ms * scale for s in measured.stages),
                backward_ms=tuple(s.backward_ms * scale for s in measured.stages),
                loss_ms=loss * scale,
                step_ms=Simulator(measured).run(Plan.uniform(measured.n_stages)).step_ms,
                stages_ms=sum(s.forward_ms + s.backward_ms for s in measured.stages) + loss,
                scale=scale,
            )
        )
    return sorted(out, key=lambda s: (s.gpu, s.model, s.batch, s.dtype))


def modeled_loss_ms(s: Sample, rl: Roofline) -> float:
    """The roofline's loss for ``s``, ms."""
    return roofline_loss_ms(s.facts.stages[-1].output_bytes, s.dtype, s.spec, rl)


def modeled_step_ms(s: Sample, rl: Roofline) -> tuple[float, list[tuple[float, float]]]:
    """``(step ms, [(forward ms, backward ms) per stage])`` the roofline gives ``s`` with the constants ``rl``: the
    unconstrained step of its modeled profile (every stage's forward and backward, and the loss)."""
    per = [roofline_ms(f, s.spec, s.dtype, rl) for f in s.facts.stages]
    return sum(f + b for f, b in per) + modeled_loss_ms(s, rl), per


Fields = Sequence[tuple[str, float, float, float]]
"""``(Roofline field, start, lower bound, upper bound)`` of each constant a fit sets."""


def _least_squares(spec: Fields, base: Roofline, residuals: Callable[[Roofline], list[float]]) -> Roofline:
    """``base`` with the fields named in ``spec`` fitted to minimise the sum of squared ``residuals``."""
    names = [f[0] for f in spec]

    def f(x: np.ndarray) -> np.ndarray:
        return np.asarray(residuals(replace(base, **dict(zip(names, map(float, x), strict=True)))))

    res = least_squares(
        f, [s[1] for s in spec], bounds=([s[2] for s in spec], [s[3] for s in spec]), x_scale="jac", xtol=1e-6
    )
    return replace(base, **dict(zip(names, map(float, res.x), strict=True)))


def fit_loss(samples: Sequence[Sample], base: Roofline = ROOFLINE) -> Roofline:
    """``base`` with the loss constants fitted to the measured losses of ``samples`` (log errors)."""
    return _least_squares(
        LOSS_FIELDS, base, lambda rl: [math.log(modeled_loss_ms(s, rl) / s.loss_ms) for s in samples if s.loss_ms > 0]
    )


def _stage_residuals(samples: Sequence[Sample], rl: Roofline) -> list[float]:
    out: list[float] = []
    for s in samples:
        step, per = modeled_step_ms(s, rl)
        for (f, b), yf, yb in zip(per, s.forward_ms, s.backward_ms, strict=True):
            out += [(f - yf) / s.step_ms, (b - yb) / s.step_ms]
        out.append(math.log(step / s.step_ms))
    return out


def fit_stages(samples: Sequence[Sample], base: Roofline = ROOFLINE, spec: Fields = STAGE_FIELDS) -> Roofline:
    """``base`` with the stage constants ``spec`` (default ``STAGE_FIELDS``) fitted to ``samples``; the others,
    the loss's included, are kept."""
    return _least_squares(spec, base, lambda rl: _stage_residuals(samples, rl))


def fit(samples: Sequence[Sample]) -> Roofline:
    """Every constant fitted to ``samples``: the loss first, then the stages with that loss."""
    return fit_stages(samples, fit_loss(samples))


def step_errors(samples: Sequence[Sample], rl: Roofline) -> list[tuple[Sample, float, float]]:
    """``(sample, modeled step ms, (modeled - measured) / measured)`` per sample."""
    out = []
    for s in samples:
        step, _ = modeled_step_ms(s, rl)
        out.append((s, step, (step - s.step_ms) / s.step_ms))
    return out


def stage_error(samples: Sequence[Sample], rl: Roofline) -> float:
    """Sum over every stage of |modeled - measured| (forward and backward) over the sum of the measured: how far
    the stages are off, weighted by their time."""
    off = total = 0.0
    for s in samples:
        _, per = modeled_step_ms(s, rl)
        for (f, b), yf, yb in zip(per, s.forward_ms, s.backward_ms, strict=True):
            off += abs(f - yf) + abs(b - yb)
            total += yf + yb
    return off / total if total else 0.0


def summary(errors: Sequence[tuple[Sample, float, float]], limit: float = 0.15) -> str:
    """One line: how many steps are within ``limit``, the RMS error and the worst rows."""
    if not errors:
        return "no profiles"
    within = sum(abs(e) <= limit for _, _, e in errors)
    rms = math.sqrt(sum(e * e for _, _, e in errors) / len(errors))
    worst = sorted(errors, key=lambda r: -abs(r[2]))[:3]
    named = ", ".join(f"{s.name} {e:+.1%}" for s, _, e in worst)
    return f"{within}/{len(errors)} within {limit:.0%}, RMS {rms:.1%}, worst {named}"


def python_constants(rl: Roofline) -> str:
    """``rl`` as the constant lines of ``memtune/profiler/modeled.py`` and, ``LOSS_*``,
    ``memtune/profiler/loss_model.py`` (3
    significant digits)."""
    return "\n".join(f"{f.name.upper()} = {float(f'{getattr(rl, f.name):.3g}')!r}" for f in fields(rl))


def main() -> None:
    t0 = time.perf_counter()
    samples = load_samples()
    gpus = sorted({s.gpu for s in samples})
    print(f"{len(samples)} measured profiles ({', '.join(gpus)}), meta facts in {time.perf_counter() - t0:.0f} s")
    fitted = fit(samples)
    print("\nfitted on every GPU type (memtune/profiler/modeled.py; LOSS_* in memtune/profiler/loss_model.py):")
    print(python_constants(fitted))
    if fitted != ROOFLINE:
        drift = max(
            abs(getattr(fitted, f.name) - getattr(ROOFLINE, f.name)) / max(abs(getattr(ROOFLINE, f.name)), 1e-9)
            for f in fields(fitted)
        )
        print(f"(largest relative difference to the committed constants: {drift:.1%})")
    errors = step_errors(samples, fitted)
    print("\n| GPU | model | batch | dtype | measured step ms | modeled step ms | error |")
    print("|---|---|---|---|---|---|---|")
    for s, step, e in errors:
        print(f"| {s.gpu} | {s.model} | {s.batch} | {s.dtype} | {s.step_ms:.1f} | {step:.1f} | {e:+.1%} |")
    print()
    for g in gpus:
        on_g = [s for s in samples if s.gpu == g]
        print(f"{g}: steps {summary(step_errors(on_g, fitted))}; stages off by {stage_error(on_g, fitted):.1%}")
    print("\nhold-out by GPU type: fitted on one, errors on the other")
    for g in gpus:
        alone = fit([s for s in samples if s.gpu == g])
        for other in gpus:
            on_other = [s for s in samples if s.gpu == other]
            tag = "in sample" if other == g else "held out"
            print(f"  fitted on {g}, {other} ({tag}): {summary(step_errors(on_other, alone))}")
    print("\nhold-out by model: fitted without it, errors on its profiles (both GPU types)")
    for model in sorted({s.model for s in samples}):
        without = fit([s for s in samples if s.model != model])
        print(f"  {model}: {summary(step_errors([s for s in samples if s.model == model], without))}")
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
