"""Calibrations as data (``Calibration.from_data``: the rules, the fields kept unread) and where ``calibration_for``
finds one: installed in the process, then the user's file, then the committed one."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from memtune.tuner._tuner_errors import CalibrationError
from memtune.tuner.calibration import (
    Calibration,
    calibration_for,
    install_calibration,
    installed_calibrations,
    uninstall_calibrations,
)

DATA: dict[str, Any] = {
    "gpu": "h100",
    "headroom": 0.12,
    "source": "memtune calibrate on a test GPU",
    "compute_scale": {"resnet50-b64-float32": 0.8},
    "copy_gbps": {"d2h": 50.0, "h2d": 51.5},
    "conv_algos": {"resnet50": [{"layer": 3, "algo": 1, "workspace": 1024}]},  # read by nobody yet: kept
}


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "calibrations"
    monkeypatch.setenv("MEMTUNE_CALIBRATION_DIR", str(folder))
    uninstall_calibrations()
    calibration_for.cache_clear()
    yield folder
    uninstall_calibrations()
    calibration_for.cache_clear()


def _user_file(folder: Path, gpu: str, headroom: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"gpu": gpu, "headroom": headroom, "source": "this user's memtune calibrate"}
    (folder / f"calibration-{gpu}.json").write_text(json.dumps(data))


def test_from_data_reads_the_fields_and_keeps_the_rest() -> None:
    cal = Calibration.from_data(DATA)
    assert (cal.gpu, cal.headroom, cal.origin) == ("h100", 0.12, "installed")
    assert cal.compute_scale == {"resnet50-b64-float32": 0.8} and cal.remap_ms_per_gib is None
    assert cal.source == "memtune calibrate on a test GPU"
    assert cal.data == DATA and cal.to_data() == DATA
    copy = cal.to_data()
    copy["conv_algos"]["resnet50"][0]["algo"] = 7
    assert cal.data["conv_algos"]["resnet50"][0]["algo"] == 1  # a copy: the calibration does not change
    assert Calibration.from_data({"headroom": 0.1}, gpu="l4").to_data() == {"headroom": 0.1, "gpu": "l4"}
    assert Calibration("k40").to_data() == {"gpu": "k40", "headroom": 0.0, "source": "none", "compute_scale": {}}


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"headroom": 1.0}, "headroom", "in [0, 1)"),
        ({"headroom": -0.01}, "headroom", "in [0, 1)"),
        ({"headroom": math.nan}, "headroom", "finite number"),
        ({"headroom": "0.1"}, "headroom", "finite number"),
        ({"headroom": True}, "headroom", "finite number"),
        ({"remap_ms_per_gib": -1.0}, "remap_ms_per_gib", ">= 0"),
        ({"remap_ms_per_gib": math.inf}, "remap_ms_per_gib", "finite number"),
        ({"compute_scale": {"gpt-b16-bfloat16": 0}}, "compute_scale.gpt-b16-bfloat16", "> 0"),
        ({"compute_scale": [0.9]}, "compute_scale", "object"),
        ({"copy_gbps": {"d2h": -3.0}}, "copy_gbps.d2h", "> 0"),
        ({"copy_gbps": 50.0}, "copy_gbps", "object"),
        ({"source": 3}, "source", "text"),
        ({"gpu": ""}, "gpu", "GPU type's key"),
        ({"conv_algos": {"x": math.nan}}, None, "not JSON"),
    ],
)
def test_from_data_names_the_field_it_refuses(change: dict[str, Any], field: str | None, words: str) -> None:
    with pytest.raises(CalibrationError, match=r"field|JSON") as caught:
        Calibration.from_data({**DATA, **change})
    assert caught.value.field == field and words in str(caught.value)
    assert field is None or field.split(".")[0] in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_from_data_needs_a_gpu_that_agrees() -> None:
    with pytest.raises(CalibrationError, match="needs field 'gpu'"):
        Calibration.from_data({"headroom": 0.1})
    with pytest.raises(CalibrationError, match="'h100', but this calibration is for 'h200'") as caught:
        Calibration.from_data(DATA, gpu="h200")
    assert caught.value.field == "gpu"
    with pytest.raises(CalibrationError, match="JSON object"):
        Calibration.from_data([1, 2])  # type: ignore[arg-type]


def test_installed_before_user_file_before_committed(_clean: Path) -> None:
    committed = calibration_for("h100")
    shipped = json.loads(Path(str(files("memtune.tuner").joinpath("data", "calibration-h100.json"))).read_text())
    assert committed.origin == "committed" and committed.headroom == shipped["headroom"]

    _user_file(_clean, "h100", 0.2)
    assert calibration_for("h100").origin == "committed"  # files are read once per process …
    calibration_for.cache_clear()  # … until the cache is cleared, as after `memtune calibrate` wrote one
    user = calibration_for("h100")
    assert (user.origin, user.headroom, user.source) == ("user file", 0.2, "this user's memtune calibrate")

    installed = install_calibration(DATA)
    assert calibration_for("h100") is installed and installed.origin == "installed"
    calibration_for.cache_clear()
    assert calibration_for("h100").headroom == 0.12  # clearing the file cache leaves installed ones installed
    assert calibration_for("h200").origin == "committed"  # other GPU types are untouched
    assert set(installed_calibrations()) == {"h100"}

    install_calibration({**DATA, "headroom": 0.3})  # installing again replaces it
    assert calibration_for("h100").headroom == 0.3

    uninstall_calibrations("h100")
    assert calibration_for("h100").origin == "user file" and installed_calibrations() == {}


def test_a_gpu_type_with_nothing_gets_the_empty_calibration() -> None:
    install_calibration({"gpu": "l4", "headroom": 0.07})
    assert calibration_for("l4").headroom == 0.07
    uninstall_calibrations()
    empty = calibration_for("l4")
    assert (empty.origin, empty.headroom, empty.source) == ("none", 0.0, "none")


def test_a_refused_calibration_is_not_installed() -> None:
    with pytest.raises(CalibrationError):
        install_calibration({**DATA, "headroom": 2.0})
    assert installed_calibrations() == {} and calibration_for("h100").origin == "committed"


def test_a_malformed_user_file_is_named(_clean: Path) -> None:
    _user_file(_clean, "l4", 1.5)
    with pytest.raises(CalibrationError, match=r"calibration-l4\.json.*'headroom'") as caught:
        calibration_for("l4")
    assert caught.value.field == "headroom"
