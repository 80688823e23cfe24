"""The ``model:batch:dtype:frac`` configurations the GPU scripts take, read into a model, profile and budget."""

from __future__ import annotations

from dataclasses import dataclass

from api.cli import resolve_profile
from profiler.chain import ModelChain
from profiler.profile import Profile
from profiler.zoo import build
from tuner.plan import Plan
from tuner.simulator import simulate

__all__ = ["Config", "read_config"]


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
