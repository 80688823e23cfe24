"""What selective stages cost and free on the committed H200 profiles, and whether the search takes them.

    python -m benchmarks.selective gpt:16:bfloat16 gpt:16:float32 resnet50:256:float32 resnet50:256:bfloat16

For each profile (its ``selective_*`` fields measured by ``scripts/selective_fields.py``): the stage that frees the
most under ``selective`` (NOTE [ Selective stages ] in ``memtune.profiler.selective``), what it frees and what it costs
(extra forward and backward ms), the same stage's cost and bytes under ``recompute`` alone, and then, per budget
(fractions of the unconstrained simulated peak), the fastest plan of the trials' Pareto front with and without the
action (the simulator alone; the final pick also prices allocator retries, ``memtune.tuner.placement``), and how many
stages the first one makes selective.
"""

from __future__ import annotations

from benchmarks.common import budget_table_args
from memtune.profiler import Profile
from memtune.tuner import Action, Candidate, Plan, simulate, tune
from memtune.tuner.stage_choices import selective_gain_bytes

__all__ = ["main"]

MiB = 1 << 20


def _fastest(profile: Profile, budget: int, trials: int) -> Candidate | None:
    front = [c for c in tune(profile, budget, trials=trials, seed=0).pareto if c.peak_bytes <= budget]
    return min(front, key=lambda c: c.step_ms, default=None)


def main() -> None:
    args, profiles, fractions = budget_table_args(__doc__, fractions="0.5,0.6,0.8", trials=200)
    for text, prof in profiles:
        k = max(range(prof.n_stages), key=lambda i: selective_gain_bytes(prof, i))
        st = prof.stages[k]
        gain = selective_gain_bytes(prof, k)
        extra = sum(st.selective_extra_ms)
        freed = max(0, st.saved_bytes - prof.stages[k - 1].output_bytes)  # a one-stage segment keeps its input
        recompute = f"{1000 * st.forward_ms / (freed / MiB):.1f} us/MiB" if freed else "frees nothing"
        print(
            f"{text}: {st.name} saves {st.saved_bytes / MiB:.0f} MiB; selective frees {gain / MiB:.0f} MiB for "
            f"{extra:.2f} ms ({1000 * extra / (gain / MiB):.1f} us/MiB); recompute frees up to {freed / MiB:.0f} MiB "
            f"for its forward, {st.forward_ms:.2f} ms ({recompute})"
        )
        peak = simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes
        for frac in fractions:
            budget = int(frac * peak)
            with_s = _fastest(prof, budget, args.trials)
            without = _fastest(prof.without_selective(), budget, args.trials)
            count = sum(a is Action.SELECTIVE for a in with_s.plan.actions) if with_s else 0
            show = [f"{c.step_ms:.2f} ms" if c else "none fits" for c in (with_s, without)]
            print(
                f"  {frac:.0%} ({budget / 2**30:.2f} GiB): with selective {show[0]} ({count} selective stages), "
                f"without {show[1]}"
            )


if __name__ == "__main__":
    main()
