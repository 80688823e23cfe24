"""HMMS as published (NOTE [ HMMS offload cap ] in ``memtune/tuner/policies/hmms.py``): VGG-19 and ResNet-50 at batch 64
on a modeled P100 whose host link runs at 12, 20 and 34.1 GB/s, the plan with the paper's offload cap and without it.

Prints one markdown row per model and link rate: the theoretical limit, and for each plan the simulated slowdown over
the unplanned step, the stall, the peak against the unplanned peak and the number of sync points. The paper reports
ResNet-50 able to offload 40% of its data and a 5.1% overhead, VGG-19 all of it. CPU only, seconds.

    python -m benchmarks.hmms_repro
"""

from __future__ import annotations

from memtune.profiler import Profile, build, modeled_profile
from memtune.tuner import Plan, simulate
from memtune.tuner.policies.hmms import hmms, offload_limit

GiB = 1 << 30
RATES_GBPS = (12.0, 20.0, 34.1)


def at_link(profile: Profile, gbps: float) -> Profile:
    """``profile`` with its host link at ``gbps`` both ways (copy times of every stage rescaled)."""
    scale = profile.device.d2h_gbps / gbps
    stages = tuple(
        s.model_copy(update={"d2h_ms": s.d2h_ms * scale, "h2d_ms": s.h2d_ms * scale}) for s in profile.stages
    )
    device = profile.device.model_copy(update={"d2h_gbps": gbps, "h2d_gbps": gbps})
    return profile.model_copy(update={"device": device, "stages": stages})


def main() -> None:
    print("| model | link GB/s | limit | capped: slowdown, stall ms, peak GiB, syncs | all offloaded: the same |")
    print("|---|---|---|---|---|")
    for name in ("vgg19", "resnet50"):
        base_profile = modeled_profile(build(name), 64, "float32", "p100")
        for gbps in RATES_GBPS:
            p = at_link(base_profile, gbps)
            base = simulate(p, Plan.uniform(p.n_stages))
            cells = []
            for cap in (True, False):
                plan = hmms(p, 0, cap=cap)
                r = simulate(p, plan)
                cells.append(
                    f"{(r.step_ms / base.step_ms - 1) * 100:+.1f}%, {r.stall_ms:.1f}, "
                    f"{r.peak_bytes / GiB:.2f} of {base.peak_bytes / GiB:.2f}, {len(plan.sync_points)}"
                )
            print(f"| {name} b64 | {gbps:g} | {offload_limit(p):.2f} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
