"""The public names of each package: a test, so the public API cannot drift silently (as httpx does)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import api
import memtune
import profiler
import tuner

EXPECTED = {
    profiler: {
        "GPUS", "ZOO_NAMES", "CompilerPoint", "ConvAlgo", "ConvProfile", "DeviceIdentity", "ModelChain", "Profile",
        "ProfilerError", "SavedStorage", "SpecError", "StageProfile", "UnknownGPUError", "build", "build_factory",
        "find_profile", "find_stages", "from_spec", "get_gpu", "modeled_profile", "profile", "profile_module",
        "spec_hash",
    },
    tuner: {
        "POLICIES", "Action", "BudgetError", "Candidate", "Plan", "PlanError", "SearchError", "SimResult",
        "Simulator", "TuneResult", "TunerError", "exact_front", "exact_optimum", "format_bytes", "parse_budget",
        "run_policy", "simulate", "tune",
    },
    api: {"MemtuneClient", "create_app"},
    memtune: {"Action", "Plan", "Profile", "Tuned", "budget_guard", "load_plan", "planned", "profile", "tune"},
}  # fmt: skip


@pytest.mark.parametrize("module", list(EXPECTED), ids=lambda m: m.__name__)
def test_exported_names(module: object) -> None:
    assert set(module.__all__) == EXPECTED[module]  # type: ignore[attr-defined]
    for name in module.__all__:  # type: ignore[attr-defined]
        assert getattr(module, name) is not None, name


def test_tuner_and_profiler_value_types_import_without_torch() -> None:
    code = "import sys, tuner, profiler; profiler.Profile; assert 'torch' not in sys.modules, 'torch loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)
