"""Memory budgets: parse what users type (``12GiB``, ``12GB``, ``0.6``) into bytes."""

from __future__ import annotations

import re

from tuner.errors import BudgetError

__all__ = ["format_bytes", "parse_budget", "search_budget"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_PATTERN = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_budget(value: str | int | float, gpu_memory_bytes: int | None = None) -> int:
    """Turn a budget into bytes.

    Accepts a byte count (``12884901888``), a size with a unit (``12GiB``, ``12 GB``, ``800MiB``; binary
    ``KiB/MiB/GiB/TiB`` or decimal ``KB/MB/GB/TB``, short ``G`` meaning GiB) or a fraction of the GPU's
    memory in (0, 1] (``0.6``).

    Args:
        value: what the user typed, or a number.
        gpu_memory_bytes: the GPU's memory, bytes; needed for fractions, and budgets above it are refused.

    Returns:
        The budget in bytes.

    Raises:
        BudgetError: the text is not a size, is not positive, or exceeds the GPU's memory.
    """
    if isinstance(value, bool):
        raise BudgetError(f"budget must be a size like '12GiB' or a fraction like 0.6, not {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        m = _PATTERN.match(str(value))
        if not m:
            raise BudgetError(
                f"budget {value!r} is not understood: write a size like '12GiB', '12GB', '800MiB', "
                "a byte count, or a fraction of the GPU's memory like '0.6'"
            )
        number, unit = float(m.group(1)), m.group(2).lower()
        if unit not in _UNITS:
            raise BudgetError(
                f"budget {value!r}: unknown unit {m.group(2)!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
            )
    if number != number or number in (float("inf"), float("-inf")):
        raise BudgetError(f"budget {value!r} is not a finite number")
    if number <= 0:
        raise BudgetError(f"budget {value!r} must be positive")
    if unit == "" and number <= 1.0:
        if gpu_memory_bytes is None:
            raise BudgetError(f"budget {value!r} is a fraction of the GPU's memory, but no GPU memory is known")
        result = int(number * gpu_memory_bytes)
    elif unit == "" and number != int(number):
        raise BudgetError(
            f"budget {value!r}: a number above 1 is a byte count and must be whole; "
            "a fraction of the GPU's memory must be in (0, 1]"
        )
    else:
        result = int(number * _UNITS[unit])
    if result <= 0:
        raise BudgetError(f"budget {value!r} is less than one byte")
    if gpu_memory_bytes is not None and result > gpu_memory_bytes:
        raise BudgetError(
            f"budget {value!r} ({format_bytes(result)}) exceeds the GPU's memory ({format_bytes(gpu_memory_bytes)})"
        )
    return result


def format_bytes(n: float) -> str:
    """``12.00 GiB`` style, binary units."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def search_budget(budget_bytes: int, headroom: float) -> int:
    """The bytes plans are searched against: ``budget_bytes`` less the ``headroom`` fraction kept free for the
    caching allocator (NOTE [ Headroom ] in ``tuner.search``)."""
    return int(budget_bytes * (1.0 - headroom))
