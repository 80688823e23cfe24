"""How much faster algorithm choice could make a tuned plan: an upper bound from the no-choice search.

    python -m benchmarks.choice_bound resnet50:256:float32 resnet50:256:bfloat16 --fractions 0.4,0.5,0.6

A plan with chosen algorithms at budget B runs the same actions as some plan with the framework's algorithms, whose
peak is at most B + F, where F is the most workspace the memory-optimal algorithms free at any one stage (the
simulator's per-stage workspaces with ``conv_rule="default"`` less those with ``"memory_optimal"``). Where the
framework's algorithms are the fastest ones (the simulated unconstrained step with ``fastest`` is no faster), the
joint search at B can therefore be no faster than the no-choice search at B + F: their ratio bounds what choice
can gain. Printed for each budget: F, the no-choice best at B and at B + F, the joint best at B, and the bound.
"""

from __future__ import annotations

from benchmarks.common import budget_table_args
from memtune.tuner import Plan, Simulator, tune

__all__ = ["freeable_bytes", "main"]


def freeable_bytes(sim: Simulator) -> tuple[int, str]:
    """The most workspace (bytes) memory-optimal algorithms free at one stage against the framework's, and where."""
    n = sim.profile.n_stages
    _, _, wf0, wb0 = sim.stage_costs(Plan.uniform(n))
    _, _, wf1, wb1 = sim.stage_costs(Plan.uniform(n, conv_rule="memory_optimal"))
    return max(
        (max(a - b, c - d), s.name) for a, b, c, d, s in zip(wf0, wf1, wb0, wb1, sim.profile.stages, strict=True)
    )


def main() -> None:
    args, profiles, fractions = budget_table_args(__doc__, fractions="0.4,0.5,0.6", trials=300)
    print("| config | budget | F (MiB, stage) | no choice at B | no choice at B + F | joint at B | bound on the gain |")
    print("|---|---|---|---|---|---|---|")
    for cfg, prof in profiles:
        sim = Simulator(prof)
        n = prof.n_stages
        default, fastest = sim.run(Plan.uniform(n)), sim.run(Plan.uniform(n, conv_rule="fastest"))
        free, where = freeable_bytes(sim)
        plain = prof.without_conv_algos()
        for frac in fractions:
            b = int(frac * default.peak_bytes)
            at_b = tune(plain, b, trials=args.trials, seed=0, headroom=0.05).best
            more = tune(plain, b + free, trials=args.trials, seed=0, headroom=0.05).best
            joint = tune(prof, b, trials=args.trials, seed=0, headroom=0.05).best
            if at_b is None or more is None or joint is None:
                print(f"| {cfg} | {frac:.0%} | {free >> 20}, {where} | no plan fits | | | |")
                continue
            bound = at_b.step_ms / more.step_ms - 1
            print(
                f"| {cfg} | {frac:.0%} | {free >> 20}, {where} | {at_b.step_ms:.1f} | {more.step_ms:.1f} | "
                f"{joint.step_ms:.1f} | {bound:+.1%} |",
                flush=True,
            )
        print(f"<!-- {cfg}: unconstrained {default.step_ms:.1f} ms default, {fastest.step_ms:.1f} ms fastest -->")


if __name__ == "__main__":
    main()
