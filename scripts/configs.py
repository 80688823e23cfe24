"""The ``model:batch:dtype:frac`` configurations the GPU scripts take, read into a model, profile and budget."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memtune.api.cli import resolve_profile
from memtune.profiler import ModelChain, Profile, build
from memtune.tuner import Plan, simulate

__all__ = ["Config", "read_config", "rewrite_profiles"]


@dataclass(frozen=True)
class Config:
    """One configuration: the zoo model, its committed H200 profile, and the budget (bytes) at ``frac`` of the
    unconstrained simulated peak."""

    model: str
    batch: int
    dtype: str
    chain: ModelChain
    profile: Profile
    budget_bytes: int


def read_config(text: str) -> Config:
    """Read ``model:batch:dtype:frac`` (e.g. ``vgg16:256:bfloat16:0.7``).

    Raises:
        SystemExit: the text does not have those four fields.
    """
    fields = text.split(":")
    if len(fields) != 4:
        raise SystemExit(f"{text!r}: expected model:batch:dtype:frac, e.g. vgg16:256:bfloat16:0.7")
    model, batch_s, dtype, frac_s = fields
    chain = build(model, {})
    profile = resolve_profile(chain, int(batch_s), dtype, "h200")
    peak = simulate(profile, Plan.uniform(profile.n_stages)).peak_bytes
    return Config(model, int(batch_s), dtype, chain, profile, int(float(frac_s) * peak))


def rewrite_profiles(usage: str, measure: Callable[[Profile], tuple[Profile, str]]) -> None:
    """For each profile file named on the command line: check it is of this GPU's type, ``measure`` it into a new
    profile and a summary line, write the new one in place, and print the line with the time it took.

    Raises:
        SystemExit: no file named (``usage`` is printed), or a profile of another GPU type.
    """
    from memtune.profiler.identity import cuda_identity

    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        raise SystemExit(usage)
    here = cuda_identity().key
    for path in paths:
        started = time.monotonic()
        prof = Profile.from_json(path.read_text())
        if prof.device.key != here:
            raise SystemExit(f"{path}: a {prof.device.key} profile, but this GPU is a {here}")
        out, line = measure(prof)
        out.save(path)
        print(f"{path.name}: {line}, {time.monotonic() - started:.1f} s", flush=True)
