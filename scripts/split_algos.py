"""Measure the batch-split runs of every convolution into committed H200 profiles (NOTE [ Batch split ]).

    python3 scripts/split_algos.py profiler/data/vgg16-b256-float32-h200.json ...

For each profile with cuDNN algorithm tables (on a GPU of the profile's type): for every convolution, run
``profiler.conv_split.enumerate_splits`` at the batch, shapes and dtype its table was measured at, and add the
split rows to the table (earlier split rows are replaced). Nothing else in the profile changes; the file is
rewritten in place. Profiles measured with ``conv_algos=True`` after this existed have the rows already.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from profiler.conv_split import profile_with_splits
from profiler.identity import cuda_identity
from profiler.profile import Profile


def measure_file(path: Path) -> int:
    """Measure and write one profile's split runs; returns how many working ones it has."""
    prof = Profile.from_json(path.read_text())
    here = cuda_identity().key
    if prof.device.key != here:
        raise SystemExit(f"{path}: a {prof.device.key} profile, but this GPU is a {here}")
    if not prof.has_conv_algos:
        raise SystemExit(f"{path}: no cuDNN algorithm tables to split (profile it with conv_algos=True)")
    out = profile_with_splits(prof, progress=lambda line: print(f"  {line}", flush=True))
    out.save(path)
    return sum(a.split > 1 and a.status == "ok" for s in out.stages for c in s.convs for a in c.algos)


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        raise SystemExit(__doc__)
    for path in paths:
        started = time.monotonic()
        n = measure_file(path)
        print(f"{path.name}: {n} working split runs, {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
