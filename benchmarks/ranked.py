"""The largest batch that trains on every rank of a data-parallel run, batch by batch, one row each.

# NOTE [ A rank out of memory ]
When one rank runs out of memory in the middle of a step and the other does not, the other waits in a collective
(DDP's all-reduce, FSDP2's all-gather) that the first will never join, and the group can only end by its timeout:
NCCL's watchdog then takes the processes down. So rank 0 writes each batch's row to a file as soon as the ranks
agree on it, and when the group dies the rows written stand and the next batch is the one that did not train,
with the reason. A short collective timeout (``--timeout``) bounds what such a batch costs; the ranks run the same
work side by side, so a collective waits only for the other rank's share of one batch.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["measure_steps", "rank_rows", "spawn_rows", "start_ranks"]


def rank_rows(
    rank: int, world: int, batches: Sequence[int], measure: Callable[[int], dict[str, Any]], rows_file: str | None
) -> list[dict[str, Any]]:
    """This rank's rows: ``measure(batch)`` for the batches in order up to the first that any rank could not train.

    ``measure`` returns ``ok``, ``ms`` (median step), ``peak`` and ``reserved`` (bytes allocated and reserved at
    most; None on CPU) and ``error``. The row holds the slowest rank's step and the largest peaks; rank 0 appends it
    to ``rows_file`` (JSON lines) at once.
    """
    import torch.distributed as dist

    rows = []
    for batch in batches:
        mine = measure(batch)
        if rows_file is not None:  # what this rank saw, should the group die before the ranks agree
            Path(f"{rows_file}.rank{rank}").write_text(json.dumps({"batch": batch, **mine}))
        every: list[Any] = [None] * world
        dist.all_gather_object(every, mine)
        ok = all(r["ok"] for r in every)
        peaks = [r["peak"] for r in every if r["peak"] is not None]
        reserved = [r.get("reserved") for r in every if r.get("reserved") is not None]
        row = {
            "batch": batch,
            "fits": ok,
            "step_ms": max(r["ms"] for r in every) if ok else None,
            "peak_bytes": max(peaks) if ok and peaks else None,
            "reserved_bytes": max(reserved) if ok and reserved else None,
            "error": next((r["error"] for r in every if r["error"]), None),
        }
        rows.append(row)
        if rank == 0 and rows_file is not None:
            with open(rows_file, "a") as f:
                f.write(json.dumps(row) + "\n")
        if not ok:
            break
    return rows


def spawn_rows(
    fn: Callable[..., list[dict[str, Any]]],
    world: int,
    cfg: Any,
    *,
    batches: Sequence[int],
    backend: str,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """Rank 0's rows of ``fn(rank, world, cfg)`` in ``world`` fresh processes
    (``memtune.tuner.runtime.ddp.spawn_ranks``); ``cfg`` is a dataclass with a ``rows_file`` field, which this fills. If
    the group dies, the rows written so far
    and one for the batch that did not train (NOTE [ A rank out of memory ])."""
    from memtune.tuner.runtime.ddp import spawn_ranks

    with tempfile.TemporaryDirectory(prefix="memtune-rows-") as tmp:
        rows_file = Path(tmp, "rows.jsonl")
        try:
            ranked = dataclasses.replace(cfg, rows_file=str(rows_file))
            return list(spawn_ranks(fn, world, ranked, backend=backend, timeout_s=timeout_s)[0])
        except Exception as exc:  # a rank raised, died or timed out in a collective
            text = rows_file.read_text() if rows_file.is_file() else ""
            rows = [json.loads(line) for line in text.splitlines()]
            done = {r["batch"] for r in rows}
            failed = next((b for b in batches if b not in done), None)
            lines = str(exc).strip().splitlines() or [""]
            seen = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rows.jsonl.rank*"))]
            own = [s["error"] for s in seen if s["batch"] == failed and s.get("error")]
            cause = own[0] if own else lines[-1].strip()
            error = (
                f"the ranks stopped ({type(exc).__name__}; {cause[:200]}): one rank out of memory mid-step leaves the "
                "others waiting in a collective (NOTE [ A rank out of memory ])"
            )
            rows.append({"batch": failed, "fits": False, "step_ms": None, "peak_bytes": None, "error": error})
            return rows


def start_ranks(nproc: int, cpu: bool) -> str:
    """Before CUDA starts in a benchmark's parent: memtune's allocator settings, which the spawned ranks inherit
    (``memtune.tuner.runtime.guard.configure_allocator``); exits when the host has fewer GPUs than ranks. Returns the
    settings in force."""
    import torch

    from memtune.tuner.runtime.guard import configure_allocator

    allocator = configure_allocator()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not cpu and gpus < nproc:
        sys.exit(f"--nproc {nproc} needs {nproc} GPUs, this host has {gpus}; --cpu runs a CPU smoke test")
    return allocator


def measure_steps(
    step: Callable[[], None], *, warmup: int, steps: int, cuda: bool, guard: Any = None
) -> dict[str, Any]:
    """``warmup`` then ``steps`` timed calls of ``step`` inside ``guard`` (a ``budget_guard``, or none): the
    ``measure`` result of ``rank_rows`` (median ms by CUDA events, else the host clock; peaks of the timed steps),
    or, when a step runs out of memory, ``ok`` False with the error's first line."""
    import torch

    from memtune.tuner.measure.step_timing import timed_ms
    from memtune.tuner.runtime import PlanOutOfMemoryError

    try:
        with guard if guard is not None else contextlib.nullcontext():
            for _ in range(warmup):
                step()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            times = timed_ms(step, steps, cuda=cuda)
    except (torch.OutOfMemoryError, PlanOutOfMemoryError) as exc:
        return {"ok": False, "ms": None, "peak": None, "error": f"out of memory: {str(exc).splitlines()[0][:200]}"}
    return {
        "ok": True,
        "ms": statistics.median(times),
        "peak": torch.cuda.max_memory_allocated() if cuda else None,
        "reserved": torch.cuda.max_memory_reserved() if cuda else None,
        "error": None,
    }


def rows_table(
    result: dict[str, Any],
    *,
    rate: str,
    rate_label: str,
    predicted: Callable[[str, dict[str, Any]], dict[str, Any] | None],
    label: str,
) -> str:
    """A data-parallel benchmark's rows as a text table: per method and batch the step, the ``rate`` of all GPUs
    (``samples_per_s`` or ``tokens_per_s``), the peak, and ``predicted(method, row)``'s step and peak."""
    width = max(10, *(len(m) + 1 for m in result["methods"]))
    head = f"{'method':<{width}} {'batch/GPU':>9} {'step ms':>9} {rate_label:>10} {'peak GiB':>9}   {label} (ms, GiB)"
    lines = [head]
    for method, rows in result["methods"].items():
        for row in rows:
            pred = predicted(method, row)
            shown = f"{pred['step_ms']:.1f}, {pred['peak_bytes'] / 2**30:.2f}" if pred else "-"
            if not row["fits"]:
                lines.append(
                    f"{method:<{width}} {row['batch']!s:>9} {'-':>9} {'-':>10} {'-':>9}   {shown}  {row['error']}"
                )
                continue
            peak = f"{row['peak_bytes'] / 2**30:9.2f}" if row["peak_bytes"] is not None else f"{'-':>9}"
            lines.append(
                f"{method:<{width}} {row['batch']:>9} {row['step_ms']:9.1f} {row[rate]:10.1f} {peak}   {shown}"
            )
        best = result["largest"].get(method)
        lines.append(f"{'':<{width}} largest batch per GPU that trains: {best['batch'] if best else 'none'}")
    return "\n".join(lines) + "\n"


def result_fields(benchmark: str, argv: Sequence[str] | None, allocator: str) -> dict[str, Any]:
    """The fields every data-parallel result file ends with: environment, allocator settings, the command that made
    it (``python -m benchmarks.<benchmark> ...``), its NOTE [ Run record ] (``run``) and the empty ``methods`` and
    ``largest`` that ``record_method`` fills."""
    from benchmarks.common import environment
    from memtune.profiler.provenance import run_record

    run = run_record(argv, module=f"benchmarks.{benchmark}")
    return {
        "environment": environment(),
        "allocator": allocator,
        "command": run["command"],
        "run": run,
        "methods": {},
        "largest": {},
    }


def record_method(result: dict[str, Any], method: str, rows: list[dict[str, Any]], path: Path) -> None:
    """``rows`` as ``method``'s in ``result``, with its largest batch that trains, and ``result`` written to
    ``path`` at once: a run cut short keeps the methods that finished."""
    result["methods"][method] = rows
    fitting = [r for r in rows if r["fits"]]
    result["largest"][method] = max(fitting, key=lambda r: r["batch"]) if fitting else None
    path.write_text(json.dumps(result, indent=1) + "\n")


def add_rank_options(
    ap: argparse.ArgumentParser, methods: Sequence[str], *, budget: str, batches: str, steps: int
) -> None:
    """The options every data-parallel benchmark takes: where to write, ranks, the per-GPU budget and batches, the
    steps, the methods, the search's trials, the CPU smoke test and the collectives' timeout."""
    ap.add_argument("out", type=Path, help="directory for the JSON result")
    ap.add_argument("--nproc", type=int, required=True, help="ranks: GPUs of this host (or CPU processes with --cpu)")
    ap.add_argument("--budget", default=budget, help="GPU memory each rank may use (bytes with a unit)")
    ap.add_argument("--batches", default=batches, help="per-GPU batches, tried in order")
    ap.add_argument("--steps", type=int, default=steps, help="timed steps per batch")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per batch")
    ap.add_argument("--methods", default=",".join(methods), help=f"any of {', '.join(methods)}")
    ap.add_argument("--trials", type=int, default=150, help="Optuna trials per tuned plan")
    ap.add_argument("--cpu", action="store_true", help="gloo processes on CPU, no budget: a smoke test of the run")
    ap.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a collective waits for a rank (NOTE [ A rank out of memory ])",
    )


def checked_rank_options(ap: argparse.ArgumentParser, args: argparse.Namespace, methods: Sequence[str]) -> None:
    """``args.batch_list`` (sorted, unique) and ``args.method_list`` from the options; an unknown method is
    argparse's error naming the known ones."""
    args.batch_list = sorted({int(b) for b in args.batches.split(",")})
    args.method_list = [m for m in args.methods.split(",") if m]
    bad = [m for m in args.method_list if m not in methods]
    if bad:
        ap.error(f"--methods: unknown {bad}; choose from {', '.join(methods)}")
