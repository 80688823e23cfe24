"""Errors raised by the tuner package.

Hierarchy::

    TunerError
    ├── PlanError     a plan does not fit its profile (names the stage and the field)
    ├── BudgetError   a budget string or number is not understood or not positive
    └── SearchError   a search could not run (bad settings, no feasible plan where one is required)
"""

from __future__ import annotations

__all__ = ["BudgetError", "PlanError", "SearchError", "TunerError"]


class TunerError(Exception):
    """Base class of every error the tuner raises."""


class PlanError(TunerError, ValueError):
    """A plan is malformed or does not match the profile it is applied to."""


class BudgetError(TunerError, ValueError):
    """A memory budget could not be parsed or is out of range."""


class SearchError(TunerError):
    """A plan search could not be run."""
