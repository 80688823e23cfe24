"""Measure every convolution stage's lean transients into committed H200 profiles (NOTE [ Lean transients ]).

    python3 scripts/lean_transients.py memtune/profiler/data/resnet50-b256-float32-h200.json ...

For each profile (on a GPU of the profile's type): rebuild its model, feed each stage the input the chain gives
it, and measure its backward as a chain runs it into ``StageProfile.chained_backward_bytes``; where the profile has
cuDNN algorithm tables, swap every convolution for the memory-optimal one of its table and measure the forward
and backward transients again into ``StageProfile.lean_{forward,backward}_workspace_bytes``
(``memtune.tuner.measure.lean.measure_lean_transients``). Every other number stays as measured; the file is rewritten in
place.
"""

from __future__ import annotations

from configs import rewrite_profiles

from memtune.profiler import Profile, build
from memtune.tuner.measure.lean import measure_lean_transients


def measure(prof: Profile) -> tuple[Profile, str]:
    """``prof`` with its chained and lean transients measured, and a summary line (the largest lean ones)."""
    out = measure_lean_transients(build(prof.model, prof.model_params), prof)
    rows = [
        (s.name, s.backward_workspace_bytes, s.lean_backward_workspace_bytes or 0)
        for s in out.stages
        if s.lean_backward_workspace_bytes is not None
    ]
    if not rows:
        return out, f"chained transients of {out.n_stages} stages (no algorithm tables: no lean ones)"
    top = sorted(rows, key=lambda r: r[2], reverse=True)[:4]
    shown = ", ".join(f"{name} {w / 2**20:.0f}->{lean / 2**20:.0f} MiB" for name, w, lean in top)
    return out, f"{len(rows)} stages; largest lean backward transients: {shown}"


if __name__ == "__main__":
    rewrite_profiles(__doc__ or "", measure)
