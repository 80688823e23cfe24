"""Measure every stage under selective checkpointing into committed H200 profiles (NOTE [ Selective stages ]).

    python3 scripts/selective_fields.py memtune/profiler/data/gpt-b16-bfloat16-h200.json ...

For each profile (on a GPU of the profile's type): rebuild its model, feed each stage the input the chain gives
it, and measure what a ``selective`` stage keeps (``StageProfile.selective_saved_bytes``, counted by storage and
checked against the allocator), its backward time and its backward transient as a chain runs it. The backward
and forward times are the profile's plus the difference between the selective and the plain pass timed now, one
after the other on the same input, so that the profile's other times stay comparable. Every other
number stays as measured; the file is rewritten in place.
"""

from __future__ import annotations

import torch
from configs import rewrite_profiles

from memtune.profiler import Profile, build
from memtune.profiler.measure import model_input, selective_held_bytes, time_stage
from memtune.profiler.selective import selective_saved_bytes
from memtune.profiler.stagefacts import torch_dtype


def measure(prof: Profile) -> tuple[Profile, str]:
    """``prof`` with its selective fields measured, and a summary line (counted against allocated bytes)."""
    chain = build(prof.model, prof.model_params)
    dev = torch.device("cuda")
    for stage in chain.stages:
        stage.module.to(dev).train()
    low = torch_dtype(prof.dtype)

    def autocast() -> torch.autocast:
        return torch.autocast("cuda", dtype=low, enabled=prof.dtype != "float32")

    x = model_input(chain, prof.batch, dev)
    stages = list(prof.stages)
    checks: list[str] = []
    for i, stage in enumerate(chain.stages):
        needs = i > 0 and x.is_floating_point()
        t = time_stage(stage, x, input_needs_grad=needs, dtype=prof.dtype, warmup=3, repeats=7)
        kept = selective_saved_bytes(stage.module, x, autocast=autocast)
        held = selective_held_bytes(stage, x, input_needs_grad=needs, dtype=prof.dtype)
        extra = (t.selective_backward_ms or 0.0) - t.backward_ms
        extra_fwd = (t.selective_forward_ms or 0.0) - t.forward_ms
        stages[i] = stages[i].model_copy(
            update={
                "selective_saved_bytes": kept,
                "selective_forward_ms": max(0.0, stages[i].forward_ms + extra_fwd),
                "selective_backward_ms": max(0.0, stages[i].backward_ms + extra),
                "selective_backward_bytes": t.selective_backward_bytes,
            }
        )
        checks.append(
            f"  {stage.name}: saved {stages[i].saved_bytes / 2**20:.1f} MiB, selective keeps {kept / 2**20:.1f} "
            f"(allocated {held / 2**20:.1f}), forward {t.forward_ms:.3f} -> {t.selective_forward_ms or 0:.3f} ms, "
            f"backward {t.backward_ms:.3f} -> {t.selective_backward_ms or 0:.3f} ms, "
            f"transient {(t.selective_backward_bytes or 0) / 2**20:.1f} MiB"
        )
        with torch.no_grad(), autocast():
            x = stage.module(x)
    torch.cuda.empty_cache()
    out = prof.model_copy(update={"stages": tuple(stages)})
    return out, "\n" + "\n".join(checks)


if __name__ == "__main__":
    rewrite_profiles(__doc__ or "", measure)
