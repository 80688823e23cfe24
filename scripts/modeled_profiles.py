"""Profiles made on a CPU for an H100 (``source="modeled"``) of ``benchmarks.promises`` models, to compare with the
profiles measured on an H100 that the promises benchmark keeps in its JSON rows.

    CUDA_VISIBLE_DEVICES= python scripts/modeled_profiles.py OUT_DIR MODEL [MODEL ...] [--batch N]

Each model is built on the CPU as ``benchmarks.promises`` builds it on CUDA (same configuration, batch and loss),
profiled by ``memtune.profile(..., gpu="h100")`` and written to ``OUT_DIR/modeled-MODEL.json`` with the seconds it
took; ``--batch N`` builds every model at batch N (``benchmarks.promises --batch N`` measures the H100 side). Full
sizes can need tens of GiB of host memory (GPT-2 at 8 x 1,024 in fp32 needed 28-36 GB with attention unfused).
``python -m benchmarks.modeled_check`` compares the two profiles' tuned plans.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, ".")
import memtune
from benchmarks.promises import SIZES, VISION_BATCH, language_model


def build(kind: str, size: int | None = None) -> tuple[torch.nn.Module, object, object]:
    """The model, its batch (of ``size`` samples, else the promises' own) and its loss, on the CPU."""
    if kind in SIZES:
        model, batch, loss, _ = language_model(kind, device="cpu", batch=size)
        return model, batch, loss
    if kind == "unet":
        from tests.unit.modules.models import UNet, mean_square

        return UNet(width=64), torch.randn(size or 16, 3, 256, 256), mean_square
    import torchvision

    batch = size or VISION_BATCH[kind]
    y = torch.randint(0, 1000, (batch,))
    return (
        getattr(torchvision.models, kind)(),
        torch.randn(batch, 3, 224, 224),
        lambda out: torch.nn.functional.cross_entropy(out, y),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--batch", type=int, help="every model at this batch size instead of its own")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    for kind in args.models:
        torch.manual_seed(0)
        model, inputs, loss = build(kind, args.batch)
        model.train()
        start = time.perf_counter()
        prof = memtune.profile(model, inputs, loss_fn=loss, gpu="h100", progress=False)  # type: ignore[arg-type]
        seconds = time.perf_counter() - start
        row: dict[str, object] = {"model": kind, "seconds": round(seconds, 1), "threads": torch.get_num_threads()}
        if args.batch is not None:
            row["batch"] = args.batch
        row["profile"] = json.loads(prof.to_json())
        (args.out / f"modeled-{kind}.json").write_text(json.dumps(row) + "\n")
        print(f"{kind}: {prof.n_stages} stages, {seconds:.1f} s, {prof.compute_source}", flush=True)


if __name__ == "__main__":
    main()
