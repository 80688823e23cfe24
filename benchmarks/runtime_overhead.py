"""What memtune's planned runtime adds to the host's time of a training step, on the CPU, where tensors so small that
the step is Python's make the runtime's own work the difference.

    python -m benchmarks.runtime_overhead --out benchmarks/results/cpu/runtime-overhead.json

A ResNet-like model of ``--blocks`` residual blocks of 8 channels (three convolutions and batch norms each) in 8
groups, on a 2 × 3 × 4 × 4 input, profiled by ``memtune.profile`` into its module stages (the stem, every block,
the head); then, in one process, the model unplanned and planned with every stage kept, with every stage offloaded,
with every stage recomputed, and with the stages mixed (``okkorrkkok`` repeated), each run for ``--steps`` forward
and backward steps (no update) a round, one variant after another, ``--rounds`` rounds after one untimed one; each
variant's median step over the rounds, and what it adds to the unplanned step. One thread.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["Block", "Net", "main", "measure"]


class Block(nn.Module):
    """A residual block of three convolutions, each with a batch norm."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c3, self.b3 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        return torch.relu(self.b3(self.c3(y)) + x)


class Net(nn.Module):
    """A stem, ``blocks`` residual blocks in 8 groups, a pooled linear head."""

    def __init__(self, blocks: int = 32, c: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        per = max(1, blocks // 8)
        self.layers = nn.ModuleList([nn.Sequential(*[Block(c) for _ in range(per)]) for _ in range(8)])
        self.head = nn.Linear(c, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean((2, 3)))


def measure(blocks: int = 32, steps: int = 10, rounds: int = 7) -> dict[str, Any]:
    """Each variant's median step over ``rounds`` (ms) and what it adds to the unplanned step."""
    import memtune
    from memtune.tuner import Plan

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net(blocks)
    x = torch.randn(2, 3, 4, 4)

    def loss(out: torch.Tensor) -> torch.Tensor:
        return out.sum()

    profile = memtune.profile(model, x, loss_fn=loss, progress=False)
    n = profile.n_stages
    plans = {"kept": "k" * n, "offloaded": "o" * n, "recomputed": "r" * n, "mixed": ("okkorrkkok" * n)[:n]}
    runs: dict[str, nn.Module] = {"unplanned": model}
    runs.update({name: memtune.planned(model, Plan.from_actions(c).named(profile)) for name, c in plans.items()})
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(1 + rounds):
        for name, run in runs.items():
            began = time.perf_counter()
            for _ in range(steps):
                loss(run(x)).backward()
                for p in model.parameters():
                    p.grad = None
            if r > 0:
                times[name].append((time.perf_counter() - began) * 1e3 / steps)
    median = {name: statistics.median(t) for name, t in times.items()}
    return {
        "stages": n,
        "plans": plans,
        "step_ms": median,
        "added_ms": {name: median[name] - median["unplanned"] for name in plans},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path)
    a = parser.parse_args()
    for flag, value in (("--blocks", a.blocks), ("--steps", a.steps), ("--rounds", a.rounds)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, not {value}")
    got = measure(a.blocks, a.steps, a.rounds)
    got.update(torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
               command=f"python -m benchmarks.runtime_overhead --blocks {a.blocks} --steps {a.steps} "
                       f"--rounds {a.rounds}")  # fmt: skip
    for name, ms in got["step_ms"].items():
        added = got["added_ms"].get(name)
        print(f"{name:>10}: {ms:7.2f} ms a step" + (f", {added:+.2f} ms added" if added is not None else ""))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(got, indent=1) + "\n")


if __name__ == "__main__":
    main()
