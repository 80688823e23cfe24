"""Profiles made on a CPU for an H100 (``source="modeled"``) of ``benchmarks.promises`` models, to compare with the
profiles measured on an H100 that the promises benchmark keeps in its JSON rows.

    CUDA_VISIBLE_DEVICES= python scripts/modeled_profiles.py OUT_DIR MODEL [MODEL ...]

Each model is built on the CPU as ``benchmarks.promises`` builds it on CUDA (same configuration, batch and loss),
profiled by ``memtune.profile(..., gpu="h100")`` and written to ``OUT_DIR/modeled-MODEL.json`` with the seconds it
took. Full sizes need tens of GiB of host memory (GPT-2 at 8 x 1,024 in fp32 about 30). ``python -m
benchmarks.modeled_check`` compares the two profiles' tuned plans.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, ".")
import memtune
from benchmarks.promises import SIZES, language_model


def build(kind: str) -> tuple[torch.nn.Module, object, object]:
    """The model, its batch and its loss, on the CPU."""
    if kind in SIZES:
        model, batch, loss, _ = language_model(kind, device="cpu")
        return model, batch, loss
    if kind == "unet":
        from tests.unit.modules.models import UNet, mean_square

        return UNet(width=64), torch.randn(16, 3, 256, 256), mean_square
    import torchvision

    batch = {"resnet50": 128, "mobilenet_v2": 128, "densenet121": 64, "vit_b_16": 64}[kind]
    y = torch.randint(0, 1000, (batch,))
    return (
        getattr(torchvision.models, kind)(),
        torch.randn(batch, 3, 224, 224),
        lambda out: torch.nn.functional.cross_entropy(out, y),
    )


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    for kind in sys.argv[2:]:
        torch.manual_seed(0)
        model, inputs, loss = build(kind)
        model.train()
        start = time.perf_counter()
        prof = memtune.profile(model, inputs, loss_fn=loss, gpu="h100", progress=False)  # type: ignore[arg-type]
        seconds = time.perf_counter() - start
        row = {"model": kind, "seconds": round(seconds, 1), "threads": torch.get_num_threads()}
        row["profile"] = json.loads(prof.to_json())
        (out / f"modeled-{kind}.json").write_text(json.dumps(row) + "\n")
        print(f"{kind}: {prof.n_stages} stages, {seconds:.1f} s, {prof.compute_source}", flush=True)


if __name__ == "__main__":
    main()
