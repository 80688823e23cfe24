"""Measure the zoo on this CUDA GPU and write the profiles memtune ships (``memtune/profiler/data``).

Usage (on the GPU machine, from the repository root)::

    python scripts/profile_zoo.py --models vgg16,resnet50,gpt --dtypes float32,bfloat16
    python scripts/profile_zoo.py --models vgg16 --batches 64,256 --out /tmp/profiles
    python scripts/profile_zoo.py --models vgg16,resnet50 --conv-algos   # with cuDNN algorithm tables

Each combination is measured with ``memtune.profiler.measure.profile(..., device="cuda")`` and written as
``<model>-b<batch>-<dtype>-<gpu>.json``. A combination that runs out of GPU memory is skipped (the
cache is emptied and the script says so); the others go on.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

try:
    import memtune.profiler  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from memtune.profiler import ZOO_NAMES, ProfilerError, build
from memtune.profiler.library import data_dir, profile_filename
from memtune.profiler.measure import profile

__all__ = ["DEFAULT_BATCHES", "main"]

#: batches per model when --batches is not given (the measured facts of docs/concepts.md use 256 and, for gpt, 16)
DEFAULT_BATCHES: dict[str, tuple[int, ...]] = {"gpt": (8, 16)}
_IMAGE_BATCHES = (64, 128, 256)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", default="vgg16,resnet50,gpt", help=f"comma-separated, from {', '.join(ZOO_NAMES)}")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (default: per model)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16, float16")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: memtune/profiler/data)")
    p.add_argument("--device", default="cuda", help="cuda or cuda:N")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds per stage")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds per stage (median kept)")
    p.add_argument("--skip-existing", action="store_true", help="leave combinations whose file exists")
    p.add_argument(
        "--conv-algos",
        action="store_true",
        help="also enumerate and time every cuDNN algorithm of every convolution (slower)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the measurements; returns the process exit status (1 when nothing could be measured)."""
    args = _parse(argv)
    if not torch.cuda.is_available():
        print("profile_zoo: CUDA is not available; run this on the GPU machine", file=sys.stderr)
        return 2
    models = _csv(args.models)
    unknown = [m for m in models if m not in ZOO_NAMES]
    if unknown:
        print(f"profile_zoo: unknown models {unknown}; known: {', '.join(ZOO_NAMES)}", file=sys.stderr)
        return 2
    out_dir: Path = args.out or data_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu_name = torch.cuda.get_device_name(torch.device(args.device))
    written = skipped = 0
    for model in models:
        batches = [int(b) for b in _csv(args.batches)] if args.batches else DEFAULT_BATCHES.get(model, _IMAGE_BATCHES)
        chain = build(model)
        for dtype in _csv(args.dtypes):
            for batch in batches:
                label = f"{model} batch {batch} {dtype}"
                path = out_dir / profile_filename(model, batch, dtype, gpu_name)
                if args.skip_existing and path.exists():
                    print(f"{label}: {path.name} exists, skipped", flush=True)
                    continue
                t0 = time.perf_counter()

                def tick(name: str, done: int, total: int, label: str = label) -> None:
                    print(f"\r{label}: stage {done}/{total} {name:<24}", end="", flush=True)

                try:
                    prof = profile(
                        chain,
                        batch,
                        dtype,
                        device=args.device,
                        warmup=args.warmup,
                        repeats=args.repeats,
                        progress=tick,
                        conv_algos=args.conv_algos,
                    )
                except torch.OutOfMemoryError:
                    print(f"\r{label}: out of GPU memory, skipped" + " " * 24, flush=True)
                    skipped += 1
                    gc.collect()
                    torch.cuda.empty_cache()
                    continue
                except ProfilerError as exc:
                    print(f"\r{label}: {exc}", file=sys.stderr, flush=True)
                    return 1
                if args.conv_algos:  # NOTE [ Lean transients ]: needs the runtime's convolution, so measured here
                    from memtune.tuner.measure.lean import measure_lean_transients

                    prof = measure_lean_transients(chain, prof)
                path = out_dir / profile_filename(model, batch, dtype, prof.device.key)
                prof.save(path)
                written += 1
                s = prof.summary()
                print(
                    f"\r{label}: fwd {s['forward_ms']} ms, bwd {s['backward_ms']} ms, "
                    f"saved {prof.saved_bytes / 2**30:.2f} GiB -> {path} ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
                gc.collect()
                torch.cuda.empty_cache()
        del chain
        gc.collect()
        torch.cuda.empty_cache()
    print(f"profile_zoo: {written} written, {skipped} skipped for lack of memory", flush=True)
    return 0 if written or not skipped else 1


if __name__ == "__main__":
    raise SystemExit(main())
