"""``memtune calibrate``'s arithmetic and where its calibration is read from (the GPU runs are in tests/gpu)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.tuner.profiles import conv_profile
from tuner.calibration import calibration_for, profile_key
from tuner.errors import TunerError
from tuner.runtime.bench import BenchRow
from tuner.runtime.calibrate import _write

GiB = 1 << 30


def _row(
    name: str, kind: str, *, step: float | None = 10.0, reserved: int | None = None, err: str | None = None
) -> BenchRow:
    return BenchRow(name, kind, step, None, None, None, reserved_bytes=reserved, error=err)


def test_headroom_is_the_largest_reserved_excess_over_the_simulated_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMTUNE_CALIBRATION_DIR", str(tmp_path))
    prof = conv_profile(1)
    rows = [
        _row("unconstrained", "unconstrained", step=90.0),
        _row("tuned@50%", "tuned", reserved=int(5.2 * GiB)),  # 0.2 GiB above a 5 GiB peak of a 10 GiB budget: 2%
        _row("tuned@60%", "tuned", reserved=int(6.3 * GiB)),  # 0.3 GiB above 6 GiB of 10 GiB: 3%
        _row("tuned@70%", "tuned", step=None, err="out of memory"),
    ]
    budgets = {"tuned@50%": (10 * GiB, 5 * GiB), "tuned@60%": (10 * GiB, 6 * GiB), "tuned@70%": (10 * GiB, 7 * GiB)}
    done = _write("testgpu", "Test GPU", prof, 100.0, rows, budgets, None)
    assert done.path == tmp_path / "calibration-testgpu.json"
    assert done.data["headroom"] == 0.03
    assert done.data["compute_scale"] == {profile_key(prof): 0.9}
    read = calibration_for("testgpu")  # the user's calibration is read first
    assert read.headroom == 0.03 and json.loads(done.path.read_text())["gpu"] == "testgpu"
    calibration_for.cache_clear()


def test_a_calibration_needs_the_unconstrained_step_and_one_plan_that_ran(tmp_path: Path) -> None:
    prof = conv_profile(1)
    with pytest.raises(TunerError, match="unconstrained step did not run"):
        _write(
            "g",
            "G",
            prof,
            100.0,
            [_row("unconstrained", "unconstrained", step=None, err="boom")],
            {},
            tmp_path / "c.json",
        )
    with pytest.raises(TunerError, match=r"no tuned plan ran.*out of memory"):
        _write(
            "g", "G", prof, 100.0,
            [_row("unconstrained", "unconstrained"), _row("tuned@50%", "tuned", step=None, err="out of memory")],
            {"tuned@50%": (GiB, GiB)}, tmp_path / "c.json",
        )  # fmt: skip


def test_a_measured_profile_of_an_uncalibrated_gpu_type_gets_advice() -> None:
    from tuner.calibration import missing_calibration

    prof = conv_profile(1)
    measured = prof.model_copy(update={"source": "measured"})
    unknown = measured.model_copy(update={"device": measured.device.model_copy(update={"key": "nocal-gpu"})})
    assert missing_calibration(prof) is None  # modeled: nothing measured to calibrate against
    advice = missing_calibration(unknown)
    assert advice is not None and "memtune calibrate" in advice and "nocal-gpu" in advice
