"""Recording when the offload runtime issues each prefetch, for the tests of prefetch lookaheads."""

from __future__ import annotations

import pytest

from memtune.tuner.runtime.offload import StepState

__all__ = ["record_prefetches"]


def record_prefetches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Patch ``StepState._fetch`` for the test and return the list it fills, in issue order, with (backward stage
    when issued, stage that needs it); a fetch that is not a prefetch fails the test."""
    issued: list[tuple[int, int]] = []
    original = StepState._fetch

    def spy(self: StepState, entry: object, *, prefetch: bool) -> None:
        assert prefetch, "every storage should have been prefetched"
        assert self.backward_stage is not None
        issued.append((self.backward_stage, entry.need))  # type: ignore[attr-defined]
        original(self, entry, prefetch=prefetch)  # type: ignore[arg-type]

    monkeypatch.setattr(StepState, "_fetch", spy)
    return issued
