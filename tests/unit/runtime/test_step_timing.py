"""NOTE [ Step timing ] in memtune.tuner.measure.step_timing, on the CPU: CUDA's events and allocator statistics stood
in for by a fake that logs each call, and the metered path on the real CPU allocator."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from memtune.tuner.measure.step_timing import StepTiming, time_steps, training_step


class _FakeCuda:
    """Stand-ins for the ``torch.cuda`` calls ``time_steps`` makes: each event pair times the next of ``durations``,
    the peaks are fixed, and every step adds ``retries_per_step`` to ``num_alloc_retries``."""

    def __init__(self, durations: list[float], *, peak: int, reserved: int, retries_per_step: int) -> None:
        self.durations = list(durations)
        self.peak, self.reserved, self.retries_per_step = peak, reserved, retries_per_step
        self.retries = 7  # retries from before the measurement: not counted
        self.log: list[str] = []
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing

            def record(self) -> None:
                fake.log.append("record")

            def synchronize(self) -> None:
                fake.log.append("event sync")

            def elapsed_time(self, end: Any) -> float:
                return fake.durations.pop(0)

        self.Event = Event

    def step(self) -> None:
        self.log.append("step")
        self.retries += self.retries_per_step

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        log = self.log
        monkeypatch.setattr(torch.cuda, "Event", self.Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("empty"))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: log.append("reset"))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: self.reserved)
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {"num_alloc_retries": self.retries})


def test_the_median_of_the_timed_steps_after_the_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeCuda([5.0, 1.0, 3.0, 9.0, 2.0], peak=3 << 20, reserved=4 << 20, retries_per_step=2)
    fake.install(monkeypatch)
    timing = time_steps(fake.step, warmup=3, steps=5)
    assert timing == StepTiming(
        step_ms=3.0, peak_bytes=3 << 20, reserved_bytes=4 << 20, steps_run=8, alloc_retries=16, first_step_s=None
    )
    assert timing.alloc_retries_per_step == 2.0
    # three untimed steps, one synchronisation and the peaks reset, then each timed step between its events
    timed = ["record", "step", "record", "event sync"]
    assert fake.log == ["step"] * 3 + ["sync", "reset"] + timed * 5


def test_release_first_and_a_timed_first_step_that_counts_as_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeCuda([4.0, 6.0], peak=1, reserved=2, retries_per_step=1)
    fake.install(monkeypatch)
    timing = time_steps(
        fake.step, warmup=3, steps=2, device=torch.device("cuda", 0), time_first=True, release_first=True
    )
    assert timing.step_ms == 5.0 and timing.steps_run == 5 and timing.alloc_retries == 5
    assert timing.first_step_s is not None and timing.first_step_s >= 0.0
    timed = ["record", "step", "record", "event sync"]
    assert fake.log == ["empty", "step", "sync", "step", "step", "sync", "reset"] + timed * 2
    # no warm-up asked: the timed first step still runs, and counts
    fake = _FakeCuda([4.0], peak=1, reserved=2, retries_per_step=1)
    fake.install(monkeypatch)
    timing = time_steps(fake.step, warmup=0, steps=1, device=torch.device("cuda", 0), time_first=True)
    assert timing.steps_run == 2 and timing.alloc_retries_per_step == 1.0
    assert fake.log == ["step", "sync", "sync", "reset", *timed]


def test_an_error_in_a_step_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeCuda([], peak=0, reserved=0, retries_per_step=0)
    fake.install(monkeypatch)

    def step() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(torch.OutOfMemoryError):
        time_steps(step, warmup=1, steps=1)


def test_metered_steps_on_the_cpu() -> None:
    calls = []
    held: list[torch.Tensor] = []

    def step() -> None:
        calls.append(1)
        held.append(torch.ones(1 << 18))  # 1 MiB left allocated by each step
        torch.ones(1 << 20).sum()  # 4 MiB freed within the step

    timing = time_steps(step, warmup=2, steps=3, device=torch.device("cpu"), peak="metered")
    assert len(calls) == 5 and timing.steps_run == 5
    assert timing.step_ms >= 0.0 and timing.alloc_retries is None and timing.alloc_retries_per_step is None
    # above what was live before the timed steps: the warm-up's tensors are the zero
    assert 3 * (1 << 20) + (4 << 20) <= timing.peak_bytes < 12 << 20
    assert timing.reserved_bytes == timing.peak_bytes


def test_the_process_peak_needs_cuda_and_the_meter_a_device() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        time_steps(lambda: None, warmup=0, steps=1, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="device"):
        time_steps(lambda: None, warmup=0, steps=1, peak="metered")


@pytest.mark.parametrize("output_held", [False, True])
def test_the_training_step_updates_and_clears_the_gradients(output_held: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    before = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = training_step(
        model, ((torch.randn(3, 4),), {}), lambda out: out.square().mean(), opt, output_held=output_held
    )
    step()
    assert model.weight.grad is not None
    assert not torch.equal(model.weight, before)
