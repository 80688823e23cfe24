"""The library of committed profiles: file names, lookup, mismatches."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

from memtune.profiler.chain import ModelChain, flatten
from memtune.profiler.library import data_dir, find_profile, list_profiles, profile_filename
from memtune.profiler.modeled import modeled_profile
from memtune.profiler.profiler_errors import ProfilerError


def tiny() -> ModelChain:
    return ModelChain("tiny", flatten(nn.Sequential(nn.Linear(4, 4))), (4,), params={"width": 4})


def test_file_names_use_the_gpu_key() -> None:
    assert profile_filename("vgg16", 256, "float32", "NVIDIA H200") == "vgg16-b256-float32-h200.json"
    assert profile_filename("gpt", 16, "bfloat16", "a100") == "gpt-b16-bfloat16-a100-80gb.json"


def test_find_and_list(tmp_path: Path) -> None:
    p = modeled_profile(tiny(), 8, "float32", "a100")
    p.save(tmp_path / profile_filename("tiny", 8, "float32", "a100"))
    (tmp_path / "notes.txt").write_text("not a profile")
    assert find_profile("tiny", 8, "float32", "A100-SXM4-80GB", directory=tmp_path) == p
    assert find_profile("tiny", 8, "float32", "a100", params={"width": 4}, directory=tmp_path) == p
    assert find_profile("tiny", 8, "float32", "a100", params={"width": 8}, directory=tmp_path) is None
    assert find_profile("tiny", 16, "float32", "a100", directory=tmp_path) is None
    (entry,) = list_profiles(tmp_path)
    assert (entry.model, entry.batch, entry.dtype, entry.gpu) == ("tiny", 8, "float32", "a100-80gb")


def test_a_misnamed_file_is_an_error(tmp_path: Path) -> None:
    p = modeled_profile(tiny(), 8, "float32", "h200")
    p.save(tmp_path / "tiny-b16-float32-h200.json")
    with pytest.raises(ProfilerError, match="b8"):
        find_profile("tiny", 16, "float32", "h200", directory=tmp_path)


def test_committed_profiles_load() -> None:
    assert data_dir().name == "data"
    entries = list_profiles()
    for entry in entries:
        prof = find_profile(entry.model, entry.batch, entry.dtype, entry.gpu, compile_budget=entry.compile_budget)
        assert prof is not None and prof.source == "measured"
    assert any(e.compile_budget is not None for e in entries)  # a compiled profile's name parses as one


def test_user_profiles_come_before_shipped_ones_and_shipped_data_can_be_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memtune.profiler.library import find_profile, profile_filename, user_profile_dir

    shipped = find_profile("resnet50", 256, "float32", "h100")
    assert shipped is not None
    mine = shipped.model_copy(update={"loss_ms": 123.0})
    user_profile_dir().mkdir(parents=True)
    mine.save(user_profile_dir() / profile_filename("resnet50", 256, "float32", "h100"))
    found = find_profile("resnet50", 256, "float32", "h100")
    assert found is not None and found.loss_ms == 123.0
    (user_profile_dir() / profile_filename("resnet50", 256, "float32", "h100")).unlink()
    monkeypatch.setenv("MEMTUNE_SHIPPED_DATA", "0")
    assert find_profile("resnet50", 256, "float32", "h100") is None
    monkeypatch.setenv("MEMTUNE_SHIPPED_DATA", "1")
    assert find_profile("resnet50", 256, "float32", "h100") is not None
