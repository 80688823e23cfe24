"""Shared pieces of the benchmarks: which profile to use, the command line of the per-budget tables, the
environment line of every table, and the per-model loop of the benchmarks on users' models."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from memtune.profiler import Profile

__all__ = [
    "budget_table_args",
    "config_profile",
    "environment",
    "model_rows",
    "peer_rows",
    "print_row_lines",
    "same_gpu",
    "zoo_profile",
]


def zoo_profile(
    model: str, batch: int, dtype: str = "float32", gpu: str = "h200", params: Mapping[str, object] | None = None
) -> Profile:
    """The committed measured profile when there is one, else a modeled one."""
    from memtune.profiler import build, find_profile, modeled_profile

    chain = build(model, params or {})
    found = find_profile(chain.name, batch, dtype, gpu, params=chain.params)
    return found if found is not None else modeled_profile(chain, batch, dtype, gpu)


def config_profile(text: str) -> Profile:
    """The profile of ``model:batch:dtype`` (``zoo_profile`` on the H200).

    Raises:
        ValueError: ``text`` is not three fields with an integer batch.
    """
    parts = text.split(":")
    if len(parts) != 3 or not parts[1].isdigit():
        raise ValueError(f"a config is model:batch:dtype, e.g. resnet50:256:float32, not {text!r}")
    model, batch, dtype = parts
    return zoo_profile(model, int(batch), dtype)


def budget_table_args(
    doc: str | None, *, fractions: str, trials: int, extra: Callable[[argparse.ArgumentParser], None] | None = None
) -> tuple[argparse.Namespace, list[tuple[str, Profile]], list[float]]:
    """The command line of a table per config and budget: ``model:batch:dtype`` configs, ``--fractions`` of the
    unconstrained peak and ``--trials`` per search (``extra`` adds more options). Returns the parsed arguments,
    each config with its profile, and the fractions; a bad config or fraction exits with argparse's error.
    Quiets Optuna's per-trial log."""
    import optuna

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+", help="model:batch:dtype, a committed H200 profile where there is one")
    ap.add_argument("--fractions", default=fractions, help="budgets as fractions of the unconstrained peak")
    ap.add_argument("--trials", type=int, default=trials, help="Optuna trials per search")
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    try:
        fracs = [float(f) for f in args.fractions.split(",")]
    except ValueError:
        ap.error(f"--fractions takes comma-separated fractions like 0.5,0.6, not {args.fractions!r}")
    if not all(f > 0.0 for f in fracs):
        ap.error(f"--fractions must be positive, not {args.fractions!r}")
    try:
        profiles = [(c, config_profile(c)) for c in args.configs]
    except ValueError as exc:
        ap.error(str(exc))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return args, profiles, fracs


def environment() -> str:
    """One line: date, machine, Python, library versions.

    Under ``MEMTUNE_RESULTS_REPRODUCIBLE=1`` (set by ``benchmarks.regenerate``) only the versions of the libraries
    that make the numbers (torch, Optuna, NumPy, SciPy): no date or machine, so the file is the same on any day."""
    import optuna
    import torch

    if os.environ.get("MEMTUNE_RESULTS_REPRODUCIBLE") == "1":
        import numpy
        import scipy

        return (
            f"torch {torch.__version__}, optuna {optuna.__version__}, numpy {numpy.__version__}, "
            f"scipy {scipy.__version__} (`python -m benchmarks.regenerate`)"
        )
    return (
        f"{datetime.date.today().isoformat()}, {platform.processor() or platform.machine()} "
        f"({os.cpu_count()} cores), Python {platform.python_version()}, torch {torch.__version__}, "
        f"optuna {optuna.__version__}"
    )


def model_rows(names: str, known: Collection[str], run: Callable[[str], dict[str, Any]], out: Path) -> None:
    """For each comma-separated model of ``names`` (each one of ``known``), in one CUDA process: the JSON row
    ``run(name)`` makes (an exception is the row's ``error``) with the process's NOTE [ Run record ] as ``run``,
    written to ``<out>/<name>.json`` and printed on a line without its profile; the CUDA cache emptied between
    models (``benchmarks.your_models``, ``benchmarks.promises``).
    """
    import gc
    import json

    import optuna
    import torch

    from memtune.profiler.provenance import run_record
    from memtune.tuner.runtime.guard import configure_allocator

    configure_allocator()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out.mkdir(parents=True, exist_ok=True)
    for name in names.split(","):
        if name not in known:
            raise SystemExit(f"--models: {name!r} is not one of {', '.join(known)}")
        try:
            row = run(name)
        except Exception as exc:
            row = {"model": name, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        row["run"] = run_record()
        (out / f"{name}.json").write_text(json.dumps(row, indent=1) + "\n")
        shown = {k: v for k, v in row.items() if k not in ("stage_names", "profile", "run")}
        print(json.dumps(shown)[:3000], flush=True)
        gc.collect()
        torch.cuda.empty_cache()


def same_gpu(path: Path, recorded: str | Mapping[str, Any] | None, current: str) -> None:
    """Refuse to continue a row measured on another kind of GPU: ``recorded`` is the row's ``device`` (a name, or a
    device identity with its ``name``), ``current`` this process's GPU name. A row holds one GPU's measurements only,
    so that its ratios compare like with like.

    Raises:
        SystemExit: the row was measured on a GPU of another name; it says how to start over.
    """
    name = recorded.get("name") if isinstance(recorded, Mapping) else recorded
    if name is not None and name != current:
        raise SystemExit(
            f"{path}: measured on {name}, and this GPU is {current}; continue it on a {name}, or start it over in "
            "another --out folder"
        )


def print_row_lines(description: str | None, lines: Callable[[dict[str, Any]], list[str]]) -> None:
    """A row-reading script's ``main``: ``lines`` of each row named on the command line (``peer_rows``), printed."""
    for row in peer_rows(description):
        print("\n".join(lines(row)))


def peer_rows(description: str | None) -> list[dict[str, Any]]:
    """The ``benchmarks.module_peers`` rows (JSON files) named on the command line, read; a script's ``main`` with
    ``description`` as its help. Exits with a usage error naming any file that is not there."""
    import json

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="benchmarks.module_peers rows (JSON)")
    files = parser.parse_args().files
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        parser.error(f"no such row: {', '.join(missing)}")
    return [json.loads(f.read_text()) for f in files]
