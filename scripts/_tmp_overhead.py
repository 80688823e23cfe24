import sys, torch
sys.path.insert(0, ".")
import memtune
from benchmarks.promises import MODELS
from tuner import Plan, Action
from tuner.runtime import planned
from tuner.runtime.guard import configure_allocator
from tuner.runtime.module_bench import measure_step
configure_allocator()
for kind in sys.argv[1:]:
    torch.manual_seed(0)
    model, inputs, loss_fn, opt = MODELS[kind](kind)
    model.train()
    prof = memtune.profile(model, inputs, loss_fn=loss_fn, progress=False)
    rows = {}
    for label, run in [("unplanned", model), ("keep-all", planned(model, Plan.uniform(prof.n_stages, Action.KEEP).named(prof))),
                       ("unplanned again", model)]:
        r = measure_step(model, run, inputs, loss_fn, warmup=2, steps=6, output_held=True, optimizer=opt)
        rows[label] = r["step_ms"]
    import time
    # CPU time of one unplanned and one keep-all step, synchronised
    print(kind, {k: round(v, 1) for k, v in rows.items()}, flush=True)
