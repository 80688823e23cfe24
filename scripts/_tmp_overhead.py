import sys, torch
sys.path.insert(0, ".")
import memtune
from benchmarks.promises import MODELS
from tuner import Plan, Action, simulate
from tuner.runtime import planned
from tuner.runtime.guard import configure_allocator
from tuner.runtime.module_bench import measure_step
configure_allocator()
for kind in sys.argv[1:]:
    torch.manual_seed(0)
    model, inputs, loss_fn, opt = MODELS[kind](kind)
    model.train()
    prof = memtune.profile(model, inputs, loss_fn=loss_fn, progress=False)
    for a in Action:
        plan = Plan.uniform(prof.n_stages, a).named(prof)
        sim = simulate(prof, plan, optimizer=opt)
        r = measure_step(model, planned(model, plan), inputs, loss_fn, warmup=2, steps=5, output_held=True, optimizer=opt)
        print(kind, a.value, "measured", round(r["step_ms"], 1), "sim", round(sim.step_ms, 1), "recompute", round(sim.recompute_ms, 1), "stall", round(sim.stall_ms, 1),
              "peak", round(r["peak_bytes"] / 2**30, 2), "sim", round(sim.peak_bytes / 2**30, 2), flush=True)
