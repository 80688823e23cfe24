"""Joint search (cuDNN algorithms + offload + recompute) against the search without algorithm choice.

    python -m benchmarks.conv_joint [--trials 300]

For VGG-16 and ResNet-50 at batch 256 (fp32, committed H200 profiles with cuDNN algorithm tables) over a
budget sweep (fractions of the unconstrained simulated peak), ``tune`` runs twice: on the profile as it is
(the search picks a convolution rule and workspace cap too), and on the same profile without algorithm
tables (convolutions keep the framework's algorithms and workspaces). Also vDNN's static policies with
memory-optimal (``_m``) and performance-optimal (``_p``) algorithms. All numbers are simulated. As in ``memtune
bench``, the joint search is seeded with the best plan without algorithm choice (``tune(seeds=...)``).
"""

from __future__ import annotations

import argparse

import optuna

from benchmarks.common import environment, zoo_profile
from memtune.tuner import POLICIES, Plan, simulate, tune

__all__ = ["main"]

FRACTIONS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=300)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"environment: {environment()}")
    print("| model | budget (of peak) | GiB | joint ms | no algorithm choice ms | joint faster by | conv rule |")
    print("|---|---|---|---|---|---|---|")
    for model in ("vgg16", "resnet50"):
        prof = zoo_profile(model, 256)
        assert prof.has_conv_algos, f"{model}: profile has no algorithm tables"
        plain = prof.without_conv_algos()
        peak = simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes
        for frac in FRACTIONS:
            budget = int(frac * peak)
            base = tune(plain, budget, trials=args.trials).best
            # as `memtune bench` does: the joint search starts from the plan without choice too (``seeds``)
            joint = tune(prof, budget, trials=args.trials, seeds=[base.plan] if base else []).best
            j = f"{joint.step_ms:.1f}" if joint else "no plan fits"
            b = f"{base.step_ms:.1f}" if base else "no plan fits"
            gain = f"{(base.step_ms - joint.step_ms) / base.step_ms:+.1%}" if joint and base else "-"
            rule = joint.plan.conv_rule if joint else "-"
            print(f"| {model} b256 | {frac:.0%} | {budget / 2**30:.2f} | {j} | {b} | {gain} | {rule} |")
    print()
    print("| model | policy | step ms | peak GiB |")
    print("|---|---|---|---|")
    for model in ("vgg16", "resnet50"):
        prof = zoo_profile(model, 256)
        for name in ("vdnn_all_m", "vdnn_all_p", "vdnn_conv_m", "vdnn_conv_p"):
            plan = POLICIES[name](prof, 1 << 40)
            r = simulate(prof, plan)
            print(f"| {model} b256 | {name} | {r.step_ms:.1f} | {r.peak_bytes / 2**30:.2f} |")


if __name__ == "__main__":
    main()
