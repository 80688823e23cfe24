"""Measure every stage's inline backward transient into committed H200 profiles (NOTE [ Inline fetches ]).

    python3 scripts/inline_transients.py memtune/profiler/data/*-h200.json

For each profile (on a GPU of the profile's type): rebuild its model, feed each stage the input the chain
gives it, and measure ``memtune.profiler.measure.inline_backward_bytes`` (the stage's backward with every saved
activation fetched from host memory on demand) into ``StageProfile.backward_inline_bytes``. Every other number
of the profile stays as it was measured; the file is rewritten in place. Profiles measured after this field
existed have it already (``memtune profile --device cuda``).
"""

from __future__ import annotations

import torch
from configs import rewrite_profiles

from memtune.profiler import Profile, build
from memtune.profiler.measure import chain_inline_backward_bytes


def measure(prof: Profile) -> tuple[Profile, str]:
    """``prof`` with every stage's inline transient measured (bytes), and a summary line."""
    chain = build(prof.model, prof.model_params)
    dev = torch.device("cuda")
    for stage in chain.stages:
        stage.module.to(dev).train()
    values = chain_inline_backward_bytes(chain, prof.batch, prof.dtype, dev)
    del chain
    stages = tuple(s.model_copy(update={"backward_inline_bytes": v}) for s, v in zip(prof.stages, values, strict=True))
    line = f"{len(values)} stages, largest {max(values) / 2**30:.2f} GiB"
    return prof.model_copy(update={"stages": stages}), line


if __name__ == "__main__":
    rewrite_profiles(__doc__ or "", measure)
