"""Each uniform plan (every stage kept, offloaded, recomputed or selective) of a model: measured step and peak
beside the simulator's, to tell which action's pricing a tuned plan's step error comes from.

    python scripts/uniform_steps.py MODEL [MODEL ...]

MODEL is a model of ``benchmarks.promises``, built and profiled as there; each plan runs 2 warm-up and 5 timed steps
(``memtune.tuner.measure.module_bench.measure_step``, the output held). One line per plan on standard output.
"""

import datetime
import sys

import torch

sys.path.insert(0, ".")
import memtune
from benchmarks.promises import MODELS
from memtune.tuner import Action, Plan, simulate
from memtune.tuner.measure.module_bench import measure_step
from memtune.tuner.runtime import planned
from memtune.tuner.runtime.guard import configure_allocator

configure_allocator()
print(
    f"# python scripts/uniform_steps.py {' '.join(sys.argv[1:])} — {torch.cuda.get_device_name()}, "
    f"torch {torch.__version__}, {datetime.date.today().isoformat()}",
    flush=True,
)
for kind in sys.argv[1:]:
    torch.manual_seed(0)
    model, inputs, loss_fn, opt = MODELS[kind](kind)
    model.train()
    before = torch.cuda.memory_allocated()
    prof = memtune.profile(model, inputs, loss_fn=loss_fn, progress=False)
    left = torch.cuda.memory_allocated() - before
    print(f"# {kind}: {left / 2**20:.1f} MiB more allocated after profiling than before", flush=True)
    print(
        f"# {kind}: the stages' measured re-runs scaled x{prof.recompute_rerun_scale:.2f} to the whole step", flush=True
    )
    for a in Action:
        plan = Plan.uniform(prof.n_stages, a).named(prof)
        sim = simulate(prof, plan, optimizer=opt)
        r = measure_step(
            model, planned(model, plan), inputs, loss_fn, warmup=2, steps=5, output_held=True, optimizer=opt
        )
        print(
            f"{kind} {a.value} measured {r['step_ms']:.1f} sim {sim.step_ms:.1f} recompute {sim.recompute_ms:.1f} "
            f"stall {sim.stall_ms:.1f} peak {r['peak_bytes'] / 2**30:.2f} sim {sim.peak_bytes / 2**30:.2f}",
            flush=True,
        )
