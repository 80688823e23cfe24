"""Shared test setup: make the hand-made chains and service fixtures importable; register no-GPU skips."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))  # the repository root: `from tests.unit… import …` works
sys.path.insert(0, str(Path(__file__).parent / "unit" / "tuner"))
sys.path.insert(0, str(Path(__file__).parent / "unit" / "profiler"))
sys.path.insert(0, str(Path(__file__).parent / "unit" / "service"))  # service_fixtures, for integration tests too


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200 with `pytest -m gpu`)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _own_user_data(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets an empty user data folder (NOTE [ Measured data per GPU type ]): what the person running the
    tests measured on their machine never changes a test's result, and no test writes into their folder."""
    root = tmp_path_factory.mktemp("memtune-data")
    monkeypatch.setenv("MEMTUNE_DATA_DIR", str(root))
    monkeypatch.setenv("MEMTUNE_CALIBRATION_DIR", str(root / "calibrations"))
    monkeypatch.delenv("MEMTUNE_SHIPPED_DATA", raising=False)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op torch thread for the test: its models are tiny, and on a busy CPU a second thread only waits."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
