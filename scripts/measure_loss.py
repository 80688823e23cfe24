"""Measure the step loss's time on this GPU and write it into committed measured profiles (``loss_ms``).

    python scripts/measure_loss.py memtune/profiler/data/*-h200.json

Profiles measured before ``Profile.loss_ms`` existed lack it, and the simulator then falls back to the
roofline estimate (``memtune.profiler.loss_model.profile_loss_ms``). For each file whose device is this GPU, this runs
``memtune.profiler.loss.measure_loss_ms`` at the profile's output shape and dtype and adds ``loss_ms`` to the JSON,
changing nothing else in the file. Prints the measurement beside the roofline estimate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from memtune.profiler import Profile, build
from memtune.profiler.identity import cuda_identity
from memtune.profiler.loss import loss_classes, measure_loss_ms, output_shape
from memtune.profiler.loss_model import profile_loss_ms
from memtune.profiler.stagefacts import torch_dtype

__all__: list[str] = []


def main() -> None:
    ident = cuda_identity()
    device = torch.device("cuda")
    for name in sys.argv[1:]:
        path = Path(name)
        prof = Profile.load(path)
        if prof.device.key != ident.key or prof.source != "measured":
            print(f"{path}: {prof.source} on {prof.device.key}, not measured on this {ident.key}; skipped")
            continue
        chain = build(prof.model, dict(prof.model_params))
        dtype = torch.float32 if prof.dtype == "float32" else torch_dtype(prof.dtype)
        ms = measure_loss_ms(output_shape(chain, prof.batch), loss_classes(chain), dtype, device, repeats=7)
        estimate = profile_loss_ms(prof.model_copy(update={"loss_ms": None}))
        data = json.loads(path.read_text())
        data["loss_ms"] = ms
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"{path}: loss {ms:.3f} ms measured, {estimate:.3f} ms roofline", flush=True)


if __name__ == "__main__":
    main()
