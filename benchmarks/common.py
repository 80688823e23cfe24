"""Shared pieces of the benchmarks: which profile to use, and the environment line of every table."""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Mapping

from profiler.profile import Profile

__all__ = ["environment", "zoo_profile"]


def zoo_profile(
    model: str, batch: int, dtype: str = "float32", gpu: str = "h200", params: Mapping[str, object] | None = None
) -> Profile:
    """The committed measured profile when there is one, else a modeled one."""
    from profiler.library import find_profile
    from profiler.modeled import modeled_profile
    from profiler.zoo import build

    chain = build(model, params or {})
    found = find_profile(chain.name, batch, dtype, gpu, params=chain.params)
    return found if found is not None else modeled_profile(chain, batch, dtype, gpu)


def environment() -> str:
    """One line: date, machine, Python, library versions."""
    import optuna
    import torch

    return (
        f"{datetime.date.today().isoformat()}, {platform.processor() or platform.machine()} "
        f"({os.cpu_count()} cores), Python {platform.python_version()}, torch {torch.__version__}, "
        f"optuna {optuna.__version__}"
    )
