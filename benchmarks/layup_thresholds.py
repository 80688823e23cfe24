"""The Layup report's Fig. 4 from our profiles: Threshold and Cumulative Threshold per layer of VGG-16.

The Layup cumulative-threshold report ("Compute vs Data Transfer: Memory Optimizations for Neural Networks", Figs.
4.1–4.4) plots, for VGG-16 on a Tesla P100 and a GeForce Titan X at batch 10 and 20, each layer's
``Threshold = T_transfer / T_compute`` and ``Cumulative_Threshold = T_transfer / T_cumulative_compute`` (Algorithm 1;
``memtune.tuner.policies.layup_cumulative``). Its figures are images that the text copy of the report does not hold, so
only their shape can be compared: a
layer becomes a checkpoint where the cumulative curve drops below 1.

This draws the same four panels from roofline profiles of the zoo's VGG-16 (``memtune.profiler.modeled``: the GPU's
spec, no GPU needed), writes ``docs/images/layup-fig4.png`` and prints one markdown row per panel (with how many stages,
and how many of the 13 convolutions, have a Threshold below 1). T_transfer is what a
checkpoint at the stage copies to the host (its saved storages and output); T_compute its forward time.

    python -m benchmarks.layup_thresholds --out docs/images
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from memtune.profiler import Profile, build, modeled_profile
from memtune.tuner.policies.layup_cumulative import checkpoint_transfer_ms, cumulative_steps
from memtune.tuner.policies.storage_map import StorageMap

PANELS = (("p100", 10), ("p100", 20), ("titanx", 10), ("titanx", 20))


def thresholds(profile: Profile) -> tuple[list[float], list[float], list[bool]]:
    """Per stage: Threshold (T_transfer / T_compute), Cumulative Threshold, and whether it is a checkpoint."""
    smap = StorageMap.of(profile)
    plain = [
        checkpoint_transfer_ms(smap, s.index) / s.forward_ms if s.forward_ms > 0 else float("nan")
        for s in profile.stages
    ]
    steps = cumulative_steps(profile)
    return plain, [s.ratio for s in steps], [s.checkpoint for s in steps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/images"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chain = build("vgg16")
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharey=True)
    print(
        "| GPU | batch | stages | checkpoints | median Threshold | median Cumulative Threshold | Threshold < 1: "
        "stages | Threshold < 1: convolutions |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for ax, (gpu, batch) in zip(axes.ravel(), PANELS, strict=True):
        prof = modeled_profile(chain, batch, "float32", gpu)
        plain, cumulative, ckpt = thresholds(prof)
        xs = list(range(len(plain)))
        ax.plot(xs, plain, "o-", ms=3, label="Threshold = T_transfer / T_compute")
        ax.plot(xs, cumulative, "s-", ms=3, label="Cumulative Threshold")
        ax.scatter([x for x in xs if ckpt[x]], [cumulative[x] for x in xs if ckpt[x]], s=60, facecolors="none",
                   edgecolors="red", label="checkpoint (cumulative < 1)", zorder=3)  # fmt: skip
        ax.axhline(1.0, color="grey", ls="--", lw=1)
        ax.set_yscale("log")
        ax.set_title(f"VGG-16 on {prof.device.name}, batch {batch}")
        ax.set_xlabel("layer (stage)")
        ax.grid(True, alpha=0.3)
        finite = [v for v in cumulative if v == v and v != float("inf")]
        convs = [v for v, st in zip(plain, prof.stages, strict=True) if st.kind == "conv2d"]
        print(
            f"| {prof.device.name} | {batch} | {len(plain)} | {sum(ckpt)} | {statistics.median(plain):.2f} | "
            f"{statistics.median(finite):.2f} | {sum(v < 1 for v in plain)} of {len(plain)} | "
            f"{sum(v < 1 for v in convs)} of {len(convs)} |"
        )
    axes[0][0].set_ylabel("ratio (log scale)")
    axes[1][0].set_ylabel("ratio (log scale)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "layup-fig4.png"
    fig.savefig(path, dpi=90)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
