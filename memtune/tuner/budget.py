"""Memory budgets: what users write (``12GiB``, ``60% of peak``, ``0.6 of gpu``) and its bytes."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from memtune.tuner._tuner_errors import BudgetError

if TYPE_CHECKING:
    from memtune.profiler import Profile

__all__ = ["Budget", "bytes_unit", "format_bytes", "parse_budget", "profile_budget", "search_budget"]

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
_SIZE = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_FRACTION = re.compile(
    r"^\s*([-+]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(%?)\s*of\s+(?:the\s+)?([a-z]+)\s*$", re.IGNORECASE
)
_OF = {"peak": "peak", "gpu": "gpu", "memory": "gpu"}
_HOW = "write bytes with a unit ('12GiB', '800MB') or a fraction that says of what ('60% of peak', '0.6 of gpu')"

Kind = Literal["bytes", "peak", "gpu"]


@dataclass(frozen=True)
class Budget:
    """A budget as written (NOTE [ Budget grammar ]): bytes, or a fraction of the model's unconstrained peak or of the
    GPU's memory.

    Attributes:
        kind: ``bytes``, ``peak`` (of the model's unconstrained peak) or ``gpu`` (of the GPU's memory).
        value: bytes for ``bytes``, else the fraction in (0, 1].
        text: what was written.
    """

    kind: Kind
    value: float
    text: str

    @classmethod
    def parse(cls, value: str | int | Budget) -> Budget:
        """Read a budget; a Python ``int`` is bytes.

        # NOTE [ Budget grammar ]
        One grammar on the command line, in Python and over HTTP: bytes with a unit (``12GiB``, ``12 GB``,
        ``800MiB``; binary ``KiB/MiB/GiB/TiB``, decimal ``KB/MB/GB/TB``, ``B``; short ``G`` meaning GiB), or a
        fraction that says of what: ``60% of peak`` / ``0.6 of peak`` (the model's simulated unconstrained peak) and
        ``60% of gpu`` / ``0.6 of gpu`` (the GPU's memory). A bare number is refused: ``0.6`` meant the GPU's memory
        to ``tune`` and the peak to ``bench``, and ``2`` meant two bytes over HTTP.

        Raises:
            BudgetError: not in the grammar (the message shows both ways to write it), not positive, or a fraction
                above 1.
        """
        if isinstance(value, Budget):
            return value
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise BudgetError(f"budget {value!r} is not understood: {_HOW}")
        if isinstance(value, int):
            if value <= 0:
                raise BudgetError(f"budget {value!r} must be positive")
            return cls("bytes", float(value), f"{value}B")
        frac = _FRACTION.match(value)
        if frac:
            return cls._fraction(value, frac)
        m = _SIZE.match(value)
        if not m:
            raise BudgetError(f"budget {value!r} is not understood: {_HOW}")
        number, unit = float(m.group(1)), m.group(2).lower()
        if not unit:
            raise BudgetError(f"budget {value!r} has no unit: {_HOW}")
        if unit not in _UNITS or not unit:
            raise BudgetError(
                f"budget {value!r}: unknown unit {m.group(2)!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
            )
        if not math.isfinite(number):
            raise BudgetError(f"budget {value!r} is not a finite number")
        if number <= 0:
            raise BudgetError(f"budget {value!r} must be positive")
        size = number * _UNITS[unit]
        if size < 1:
            raise BudgetError(f"budget {value!r} is less than one byte")
        return cls("bytes", size, value.strip())

    @classmethod
    def _fraction(cls, text: str, m: re.Match[str]) -> Budget:
        number = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
        of = _OF.get(m.group(3).lower())
        if of is None:
            raise BudgetError(f"budget {text!r}: a fraction is of 'peak' or of 'gpu', not of {m.group(3)!r}")
        if not math.isfinite(number) or not 0 < number <= 1:
            raise BudgetError(f"budget {text!r}: the fraction must be in (0, 1] (0%-100%)")
        return cls(of, number, text.strip())  # type: ignore[arg-type]

    def resolve(self, *, gpu_memory_bytes: int | None = None, peak_bytes: int | None = None) -> int:
        """The budget in bytes; budgets above the GPU's memory are refused where it is known.

        Raises:
            BudgetError: the fraction's reference (the peak or the GPU's memory) is not known here, or the budget
                exceeds the GPU's memory.
        """
        if self.kind == "bytes":
            result = int(self.value)
        else:
            ref = peak_bytes if self.kind == "peak" else gpu_memory_bytes
            if ref is None:
                what = "the model's unconstrained peak" if self.kind == "peak" else "the GPU's memory"
                raise BudgetError(f"budget {self.text!r} is a fraction of {what}, which is not known here; {_HOW}")
            result = int(self.value * ref)
        if result <= 0:
            raise BudgetError(f"budget {self.text!r} is less than one byte")
        if gpu_memory_bytes is not None and result > gpu_memory_bytes:
            raise BudgetError(
                f"budget {self.text!r} ({format_bytes(result)}) exceeds the GPU's memory "
                f"({format_bytes(gpu_memory_bytes)})"
            )
        return result


def parse_budget(
    value: str | int | Budget, gpu_memory_bytes: int | None = None, *, peak_bytes: int | None = None
) -> int:
    """A budget in bytes (NOTE [ Budget grammar ] in ``Budget.parse``).

    Args:
        value: what the user wrote; a Python ``int`` is bytes.
        gpu_memory_bytes: the GPU's memory, bytes: needed for fractions of the GPU, and budgets above it are refused.
        peak_bytes: the model's unconstrained peak, bytes: needed for fractions of the peak.

    Raises:
        BudgetError: the text is not in the grammar, is not positive, needs a reference that is not given, or exceeds
            the GPU's memory.
    """
    return Budget.parse(value).resolve(gpu_memory_bytes=gpu_memory_bytes, peak_bytes=peak_bytes)


def profile_budget(value: str | int | Budget, profile: Profile, optimizer: str = "sgd") -> int:
    """A budget in bytes for ``profile``'s model: a fraction of the peak is of its simulated unconstrained step's."""
    budget = Budget.parse(value)
    peak = None
    if budget.kind == "peak":
        from memtune.tuner.plan import Plan
        from memtune.tuner.simulator import Simulator

        peak = Simulator(profile, optimizer).run(Plan.uniform(profile.n_stages).named(profile)).peak_bytes
    return budget.resolve(gpu_memory_bytes=profile.device.memory_bytes, peak_bytes=peak)


def format_bytes(n: float) -> str:
    """``12.00 GiB`` style, binary units."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def bytes_unit(*sizes: float) -> tuple[str, int]:
    """One binary unit for a table of ``sizes``: GiB where the largest is a GiB or more, else MiB (KiB below one
    MiB), so that a small model's peaks do not all print as ``0.03 GiB``."""
    largest = max((abs(n) for n in sizes), default=0.0)
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if largest >= size:
            return unit, size
    return "KiB", 2**10


def search_budget(budget_bytes: int, headroom: float) -> int:
    """The bytes plans are searched against: ``budget_bytes`` less the ``headroom`` fraction kept free for the
    caching allocator (NOTE [ Headroom ] in ``memtune.tuner.search``)."""
    return int(budget_bytes * (1.0 - headroom))
