"""``memtune calibrate``'s arithmetic and where its calibration is read from (the GPU runs are in tests/gpu)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtune.tuner._tuner_errors import TunerError
from memtune.tuner.calibration import calibration_for, profile_key
from memtune.tuner.measure.bench import BenchRow
from memtune.tuner.measure.calibrate import _verified_headroom, _write, simulated_share
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import Simulator
from tests.unit.tuner.profiles import conv_profile

GiB = 1 << 30


def _row(
    name: str, kind: str, *, step: float | None = 10.0, peak: int | None = None, err: str | None = None
) -> BenchRow:
    return BenchRow(name, kind, step, peak, None, None, error=err)


def test_the_simulated_share_is_the_largest_allocated_excess_over_the_simulated_peak() -> None:
    rows = [
        _row("unconstrained", "unconstrained", step=90.0, peak=20 * GiB),
        _row("tuned@50%", "tuned", peak=int(5.2 * GiB)),  # 0.2 GiB above a 5 GiB peak of a 10 GiB budget: 2%
        _row("tuned@60%", "tuned", peak=int(6.3 * GiB)),  # 0.3 GiB above 6 GiB of 10 GiB: 3%
        _row("tuned@70%", "tuned", step=None, err="out of memory"),
        _row("tuned@80%", "tuned", peak=7 * GiB),  # below its simulated 8 GiB: no share
    ]
    budgets = {f"tuned@{p}%": (10 * GiB, p * GiB // 10) for p in (50, 60, 70, 80)}
    assert simulated_share(rows, budgets) == pytest.approx(0.03)
    with pytest.raises(TunerError, match=r"no tuned plan ran.*out of memory"):
        simulated_share([_row("tuned@50%", "tuned", step=None, err="out of memory")], {"tuned@50%": (GiB, GiB)})


@pytest.mark.slow
def test_the_headroom_grows_until_every_plan_runs_under_its_own_cap() -> None:
    prof = conv_profile(6)
    peak = Simulator(prof).run(Plan.uniform(prof.n_stages)).peak_bytes
    budgets = {"tuned@60%": int(0.6 * peak), "tuned@80%": int(0.8 * peak)}
    caps: list[tuple[str, int]] = []

    def run_rows(plans: list[tuple[str, str, Plan]], cap: int, **_: object) -> list[BenchRow]:
        ((name, kind, _plan),) = plans
        caps.append((name, cap))
        oom = "headroom 2%" in name  # the first round's plans run out of memory, the second's fit
        return [_row(name, kind, step=None if oom else 10.0, err="out of memory" if oom else None)]

    headroom, checks = _verified_headroom(prof, budgets, 0.004, 30, run_rows, lambda _w: None)
    assert headroom == pytest.approx(0.05)  # 0.4% rounds up to 1%, plus 1%; then one step of 3%
    assert {cap for name, cap in caps if name.startswith("tuned@60%")} == {budgets["tuned@60%"]}
    assert sum(r.error is not None for r in checks) == len(checks) // 2


def test_a_calibration_is_written_where_it_is_read_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMTUNE_CALIBRATION_DIR", str(tmp_path))
    prof = conv_profile(1)
    rows = [_row("unconstrained", "unconstrained", step=90.0), _row("tuned@50%", "tuned", peak=GiB)]
    done = _write("testgpu", "Test GPU", prof, 100.0, rows, 0.012, 0.05, None)
    assert done.path == tmp_path / "calibration-testgpu.json"
    assert done.data["headroom"] == 0.05 and "1.2%" in done.data["source"]
    assert done.data["compute_scale"] == {profile_key(prof): 0.9}
    read = calibration_for("testgpu")  # the user's calibration is read first
    assert read.headroom == 0.05 and json.loads(done.path.read_text())["gpu"] == "testgpu"
    calibration_for.cache_clear()
    with pytest.raises(TunerError, match="unconstrained step did not run"):
        _write("g", "G", prof, 100.0, [_row("unconstrained", "unconstrained", step=None, err="boom")], 0.0, 0.01,
               tmp_path / "c.json")  # fmt: skip


def test_a_measured_profile_of_an_uncalibrated_gpu_type_gets_advice() -> None:
    from memtune.tuner.calibration import missing_calibration

    prof = conv_profile(1)
    measured = prof.model_copy(update={"source": "measured"})
    unknown = measured.model_copy(update={"device": measured.device.model_copy(update={"key": "nocal-gpu"})})
    assert missing_calibration(prof) is None  # modeled: nothing measured to calibrate against
    advice = missing_calibration(unknown)
    assert advice is not None and "memtune calibrate" in advice and "nocal-gpu" in advice
