"""Memory held before the step, on one CUDA GPU (NOTE [ Memory held before the step ] in
``memtune.profiler._module_step``): the region tests' small ResNet (width 32, batch 64, 3 x 128 x 128, channels-last,
fp32) tuned with default settings at 60, 70 and 80% of its peak; for each served plan, the profile's held bytes, the
predicted peak, the measured ``max_memory_allocated`` of a step, and three steps under ``memtune.budget_guard``.

    python scripts/held_memory_check.py        # on one GPU, from the repository's top
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memtune
from memtune.tuner.runtime import PlanOutOfMemoryError
from tests.unit.modules.region_models import TinyResNet, square

__all__ = ["main"]

MiB = float(1 << 20)


def _measured_peak(run: torch.nn.Module, model: torch.nn.Module, x: torch.Tensor) -> float:
    """MiB: the second step's ``max_memory_allocated`` (the first warms cuDNN and the host pool up)."""
    for first in (True, False):
        if not first:
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        square(run(x)).backward()
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / MiB


def _fits(run: torch.nn.Module, model: torch.nn.Module, x: torch.Tensor, budget: int) -> bool:
    try:
        with memtune.budget_guard(budget, run):
            for _ in range(3):
                square(run(x)).backward()
                model.zero_grad(set_to_none=True)
    except (torch.OutOfMemoryError, PlanOutOfMemoryError) as exc:
        print(f"  out of memory: {str(exc)[:200]}")
        return False
    return True


def main() -> None:
    torch.manual_seed(0)
    model = TinyResNet(width=32, classes=10).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(64, 3, 128, 128, device="cuda").contiguous(memory_format=torch.channels_last)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for share in ("60% of peak", "70% of peak", "80% of peak"):
        tuned = memtune.tune(model, share, example_inputs=x, loss_fn=square, trials=60, progress=False)
        best, budget = tuned.result.best, tuned.result.budget_bytes
        print(f"{share}: held {tuned.profile.resident_bytes / MiB:.2f} MiB, budget {budget / MiB:.2f} MiB")
        if best is None or tuned.plan is None:
            print("  no plan fits")
            continue
        run = memtune.planned(model, tuned.plan)
        measured = _measured_peak(run, model, x)
        print(f"  {best.name}: predicted {best.peak_bytes / MiB:.2f} MiB, measured {measured:.2f} MiB")
        print(f"  under budget_guard: {'fits' if _fits(run, model, x, budget) else 'out of memory'}")
        run.release()


if __name__ == "__main__":
    main()
