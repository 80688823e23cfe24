"""Measure the batch-split runs of every convolution into committed H200 profiles (NOTE [ Batch split ]).

    python3 scripts/split_algos.py memtune/profiler/data/vgg16-b256-float32-h200.json ...

For each profile with cuDNN algorithm tables (on a GPU of the profile's type): for every convolution, run
``memtune.profiler.conv_split.enumerate_splits`` at the batch, shapes and dtype its table was measured at, and add the
split rows to the table (earlier split rows are replaced). Nothing else in the profile changes; the file is
rewritten in place. Profiles measured with ``conv_algos=True`` after this existed have the rows already.
"""

from __future__ import annotations

from configs import rewrite_profiles

from memtune.profiler import Profile
from memtune.profiler.conv_split import profile_with_splits


def measure(prof: Profile) -> tuple[Profile, str]:
    """``prof`` with the split runs of its convolutions measured, and a summary line."""
    if not prof.has_conv_algos:
        raise SystemExit(f"{prof.model}: no cuDNN algorithm tables to split (profile it with conv_algos=True)")
    out = profile_with_splits(prof, progress=lambda line: print(f"  {line}", flush=True))
    n = sum(a.split > 1 and a.status == "ok" for s in out.stages for c in s.convs for a in c.algos)
    return out, f"{n} working split runs"


if __name__ == "__main__":
    rewrite_profiles(__doc__ or "", measure)
