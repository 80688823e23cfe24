"""The host link the GPUs of one host share: pinned copy rates while 1, 2, 4 ... GPUs copy at once, and all-reduce.

    python -m benchmarks.shared_link OUT [--devices 0,1,2,3] [--mib 256] [--repeats 7] [--merge-into FILE]

Measures on this host (NOTE [ Measuring the shared link ] in ``memtune.tuner.measure.link_share``) each GPU's
device-to-host and host-to-device rate (GB/s) with 1, 2, 4 ... GPUs copying at once, one way and both ways at once, and
NCCL's all-reduce bus bandwidth among 2, 4 ... GPUs. Writes ``OUT/shared-link-<gpu>-x<N>.json`` (the calibration fields
``shared_link_gbps`` and ``allreduce_gbps``, each GPU's own rates, the environment) and the same as a text table beside
it. ``--merge-into`` also writes the two fields, with ``shared_link_source``, into a calibration file
(``memtune/tuner/data/calibration-<gpu>.json``, or the user's; ``memtune.tuner.calibration``), checked before it is
written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import environment

__all__ = ["main", "render"]


def render(result: dict[str, Any]) -> str:
    """The measurement as a text table: per-GPU GB/s by GPUs copying at once, then the all-reduce."""
    lines = [
        f"{result['device_name']} x{len(result['devices'])} ({result['gpu']}), {result['nbytes'] >> 20} MiB copies",
        f"{'copying at once':>16} {'d2h':>8} {'h2d':>8} {'both: d2h':>10} {'both: h2d':>10}",
    ]
    for count, row in result["shared_link_gbps"].items():
        cells = [f"{row.get(k, float('nan')):8.2f}" for k in ("d2h", "h2d")]
        cells += [f"{row.get(k, float('nan')):10.2f}" for k in ("both_d2h", "both_h2d")]
        lines.append(f"{count:>16} {' '.join(cells)}")
    for count, gbps in result["allreduce_gbps"].items():
        lines.append(f"all-reduce among {count}: {gbps:.1f} GB/s bus bandwidth")
    lines.append(result["environment"])
    return "\n".join(lines) + "\n"


def _merge(path: Path, result: dict[str, Any]) -> None:
    from memtune.tuner.calibration import Calibration

    data = json.loads(path.read_text()) if path.is_file() else {"gpu": result["gpu"]}
    data["shared_link_gbps"] = result["shared_link_gbps"]
    if result["allreduce_gbps"]:
        data["allreduce_gbps"] = result["allreduce_gbps"]
    data["shared_link_source"] = result["source"]
    Calibration.from_data(data, gpu=result["gpu"])  # raises on a broken field before anything is written
    path.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="directory for the JSON and text results")
    ap.add_argument("--devices", default=None, help="CUDA device indices in the order copiers are added (default all)")
    ap.add_argument("--mib", type=int, default=256, help="MiB per copy")
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds per count and mode (median kept)")
    ap.add_argument("--merge-into", type=Path, default=None, help="calibration file to write the fields into")
    args = ap.parse_args(argv)

    import torch

    from memtune.profiler.devices import gpu_key
    from memtune.tuner.measure.link_share import measure_allreduce, measure_shared_link

    if not torch.cuda.is_available():
        sys.exit("benchmarks.shared_link measures GPUs: no CUDA device is visible")
    devices = [int(d) for d in args.devices.split(",")] if args.devices else list(range(torch.cuda.device_count()))
    props = torch.cuda.get_device_properties(devices[0])
    key = gpu_key(props.name, props.total_memory)
    nbytes = args.mib << 20
    run = measure_shared_link(devices, nbytes=nbytes, repeats=args.repeats)
    allreduce = measure_allreduce(devices, nbytes=nbytes)
    env = environment()
    command = f"python -m benchmarks.shared_link {' '.join(sys.argv[1:]) if argv is None else ' '.join(argv)}"
    result = {
        "gpu": key,
        "device_name": props.name,
        "devices": devices,
        "nbytes": nbytes,
        "shared_link_gbps": run.table,
        "allreduce_gbps": allreduce,
        "per_gpu_gbps": run.per_gpu,
        "environment": env,
        "source": f"{command} on {len(devices)}x {props.name} ({env})",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"shared-link-{key}-x{len(devices)}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    text = render(result)
    stem.with_suffix(".txt").write_text(text)
    print(text, end="")
    if args.merge_into is not None:
        _merge(args.merge_into, result)
        print(f"written into {args.merge_into}")


if __name__ == "__main__":
    main()
