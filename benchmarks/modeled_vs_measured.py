"""Modeled against measured profiles: how far the roofline's unconstrained step and peak are from a measured
profile's, for every committed measured zoo profile (H200 and H100).

    python -m benchmarks.modeled_vs_measured

For each ``profiler/data/<model>-b<batch>-<dtype>-<gpu>.json``: the zoo model is built, profiled by the roofline
(``profiler.modeled.modeled_profile``, the same GPU type, batch and dtype) and both are simulated with every
activation kept (the measured one with its GPU type's compute scale where calibrated, NOTE [ Compute scale ]). The
error is (modeled - measured) / measured. Nothing is fitted here: the table is what the roofline constants of
NOTE [ Roofline ] give today.
"""

from __future__ import annotations

import re
from importlib.resources import files

from benchmarks.common import environment
from profiler.modeled import modeled_profile
from profiler.profile import Profile
from profiler.zoo import build
from tuner.plan import Plan
from tuner.simulator import Simulator

_NAME = re.compile(r"^(?P<model>[a-z0-9]+)-b(?P<batch>\d+)-(?P<dtype>float32|bfloat16|float16)-(?P<gpu>[a-z0-9-]+)$")


def rows() -> list[tuple[str, int, str, str, float, float, int, int]]:
    """``(model, batch, dtype, gpu, measured ms, modeled ms, measured peak, modeled peak)`` per committed profile."""
    out = []
    for path in sorted(files("profiler").joinpath("data").iterdir(), key=lambda p: p.name):
        m = _NAME.match(path.name.removesuffix(".json"))
        if m is None:
            continue
        measured = Profile.from_json(path.read_bytes())
        if measured.source != "measured":
            continue
        chain = build(m["model"], dict(measured.model_params))
        modeled = modeled_profile(chain, measured.batch, measured.dtype, m["gpu"])
        a = Simulator(measured).run(Plan.uniform(measured.n_stages))
        b = Simulator(modeled).run(Plan.uniform(modeled.n_stages))
        out.append(
            (m["model"], measured.batch, measured.dtype, m["gpu"], a.step_ms, b.step_ms, a.peak_bytes, b.peak_bytes)
        )
    return out


def main() -> None:
    gib = float(1 << 30)
    print(f"environment: {environment()}")
    print("| GPU | model | batch | dtype | measured step ms | modeled step ms | step error | measured peak GiB | "
          "modeled peak GiB | peak error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model, batch, dtype, gpu, ms_a, ms_b, pk_a, pk_b in sorted(rows(), key=lambda r: (r[3], r[0], r[1], r[2])):
        print(
            f"| {gpu} | {model} | {batch} | {dtype} | {ms_a:.1f} | {ms_b:.1f} | {(ms_b - ms_a) / ms_a:+.1%} | "
            f"{pk_a / gib:.2f} | {pk_b / gib:.2f} | {(pk_b - pk_a) / pk_a:+.1%} |"
        )


if __name__ == "__main__":
    main()
