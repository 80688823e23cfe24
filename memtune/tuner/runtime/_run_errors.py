"""Errors raised while a plan runs on a live model.

Hierarchy (under ``memtune.tuner._tuner_errors.TunerError``)::

    TunerError
    └── PlanOutOfMemoryError   the GPU ran out of memory during a planned step (names plan and stage)

Malformed plans, or plans that do not match the model, raise ``memtune.tuner._tuner_errors.PlanError``.
"""

from __future__ import annotations

from typing import Literal

from memtune.tuner._tuner_errors import TunerError

__all__ = ["PlanOutOfMemoryError"]

Phase = Literal["forward", "backward"]


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


class PlanOutOfMemoryError(TunerError):
    """A planned training step ran out of GPU memory.

    The runtime has already dropped its in-flight copies and emptied the CUDA cache when this is
    raised, so the process can run another step (with another plan or a larger budget).

    Args:
        label: the plan's label (which policy or search made it), or None.
        stage: index of the stage that was running, or None when unknown.
        stage_name: that stage's name in the chain.
        phase: ``forward`` or ``backward``.
        budget_bytes: the budget the step ran under, if a ``budget_guard`` was active.
        detail: the allocator's own message.
        reserved: where the allocator's reserved memory sat at the failure, by stream and pool
            (``memtune.tuner.runtime._allocator.reserved_summary``), or "".
        outside: where the step was when no stage was running (the model's own code before its first stage, the
            loss and the model's code after its last stage), named by the runtime.
    """

    def __init__(
        self,
        *,
        label: str | None,
        stage: int | None,
        stage_name: str | None,
        phase: Phase,
        budget_bytes: int | None = None,
        detail: str = "",
        reserved: str = "",
        outside: str | None = None,
    ) -> None:
        plan = f"plan {label!r}" if label else "an unlabeled plan"
        if stage is not None:
            where = f"the {phase} of stage {stage} ({stage_name})"
        else:
            where = outside or f"the {phase} of the model outside its stages"
        budget = f" under a budget of {_gib(budget_bytes)} ({budget_bytes} bytes)" if budget_bytes else ""
        first_line = detail.strip().splitlines()[0] if detail.strip() else ""
        super().__init__(
            f"{plan} ran out of GPU memory in {where}{budget}. "
            "Pick a plan simulated for a smaller budget (more offload/recompute), lower the batch, "
            "or raise the budget."
            + (f" Allocator said: {first_line}" if first_line else "")
            + (f" Reserved at the failure: {reserved}." if reserved else "")
        )
        self.label = label
        self.stage = stage
        self.stage_name = stage_name
        self.phase = phase
        self.budget_bytes = budget_bytes
        self.detail = detail
        self.reserved = reserved
