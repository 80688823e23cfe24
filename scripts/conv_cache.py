"""Does a capped row change the convolution algorithms of the rows after it? Measure the same rows before and after.

    python scripts/conv_cache.py OUT.json vgg16:256:bfloat16:0.7 [...]

PyTorch's cuDNN convolution caches, per shape, the execution plan that last ran. When a plan's workspace cannot be
allocated under a cap, it tries the next heuristic plan and caches that one, and it keeps using it after the cap is
lifted (``run_single_conv`` in ATen's ``Conv_v8.cpp``). In one process, then, a capped row can slow every later row
that runs PyTorch's convolution. For each configuration this measures, in order: the unconstrained step and PyTorch's
``save_on_cpu`` (fresh), the ``checkpoint_sqrt`` and ``save_on_cpu`` policies under the budget's cap, then the
unconstrained step and ``save_on_cpu`` again, uncapped. Rows go to OUT.json as they come.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from configs import read_config

from memtune.tuner import POLICIES
from memtune.tuner.measure.bench import BenchRow, bench_plans
from memtune.tuner.runtime.guard import configure_allocator

__all__: list[str] = []


def main() -> None:
    out = Path(sys.argv[1])
    configure_allocator()
    results: list[dict[str, object]] = []
    for cfg in sys.argv[2:]:
        c = read_config(cfg)
        chain, prof, batch, dtype, budget = c.chain, c.profile, c.batch, c.dtype, c.budget_bytes
        capped = [(name, "policy", POLICIES[name](prof, budget)) for name in ("checkpoint_sqrt", "save_on_cpu")]
        for phase, plans, builtins in (("fresh", [], True), ("capped", capped, False), ("after", [], True)):

            def show(r: BenchRow, cfg: str = cfg, phase: str = phase) -> None:
                print(
                    f"{cfg} {phase:7s} {r.name:40s} {r.step_ms and round(r.step_ms, 1)} ms "
                    f"peak {r.peak_bytes and round(r.peak_bytes / 2**30, 2)} GiB retries {r.alloc_retries} "
                    f"{r.error or ''}"[:200],
                    flush=True,
                )
                results.append({"config": cfg, "phase": phase, **r.to_dict()})
                out.write_text(json.dumps(results, indent=1) + "\n")

            bench_plans(
                chain, prof, batch, dtype, budget, plans, pytorch_builtins=builtins, warmup=2, iters=6, on_row=show
            )


if __name__ == "__main__":
    main()
