"""A row of a convolution's algorithm table, for the tests of choosing and splitting algorithms."""

from __future__ import annotations

from memtune.profiler._profile import ConvAlgo
from memtune.profiler.cudnn import algo_name

__all__ = ["MiB", "algo"]

MiB = 1 << 20


def algo(
    pass_: str, algo: int, ms: float | None, ws_mib: float, status: str = "ok", math: int = 0, split: int = 1
) -> ConvAlgo:
    """One table row: ``pass_``'s algorithm ``algo`` taking ``ms`` with ``ws_mib`` MiB of workspace."""
    return ConvAlgo.model_validate(
        {
            "pass": pass_,
            "algo": algo,
            "name": algo_name(pass_, algo),  # type: ignore[arg-type]
            "ms": ms,
            "workspace_bytes": int(ws_mib * MiB),
            "math_type": math,
            "status": status,
            "split": split,
        }
    )
