"""Errors raised by the tuner package.

Hierarchy::

    TunerError
    ├── PlanError     a plan does not fit its profile (names the stage and the field)
    ├── BudgetError   a budget string or number is not understood or not positive
    ├── CalibrationError  a GPU type's calibration data is malformed (names the field)
    ├── BoundError    the budget bound's linear program gave no answer (the plan stands without its bound)
    └── SearchError   a search could not run (bad settings, no feasible plan where one is required)
"""

from __future__ import annotations

__all__ = ["BoundError", "BudgetError", "CalibrationError", "PlanError", "SearchError", "TunerError"]


class TunerError(Exception):
    """Base class of every error the tuner raises."""


class PlanError(TunerError, ValueError):
    """A plan is malformed or does not match the profile it is applied to."""


class BudgetError(TunerError, ValueError):
    """A memory budget could not be parsed or is out of range."""


class CalibrationError(TunerError, ValueError):
    """A calibration (``memtune.tuner.calibration.Calibration.from_data``) is malformed.

    Args:
        message: what is wrong, naming the field and the rule it breaks.
        field: the field at fault (``headroom``, ``compute_scale.resnet50-b64-float32``), or None for the whole.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SearchError(TunerError):
    """A plan search could not be run."""


class BoundError(TunerError):
    """The lower bound on a budget's step (``memtune.tuner.bound.step_lower_bound``, NOTE [ Budget bound ]) has no
    answer: its linear program's solver stopped without one (the message gives the solver's). A plan found by the
    search stands without its bound; callers catch this error alone, so that any other failure shows."""
