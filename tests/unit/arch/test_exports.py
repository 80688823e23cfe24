"""The public names of each package: a test, so the public API cannot drift silently (as httpx does)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import memtune
import memtune.api
import memtune.api.cli
import memtune.api.service
import memtune.profiler
import memtune.storage
import memtune.storage.repositories
import memtune.tuner
import memtune.tuner.runtime

EXPECTED = {
    memtune.profiler: {
        "GPUS", "ZOO_NAMES", "ArchiveTooLargeError", "CompilerPoint", "ConvAlgo", "ConvProfile", "DeviceIdentity",
        "ExportedError", "GPUSpec", "HostPrices", "ModelChain", "Profile", "ProfilerError", "RowMap", "SaveRule",
        "SavedStorage", "SpecError", "StageProfile", "StepPeak", "UnknownGPUError", "build", "build_factory",
        "find_profile", "find_stages", "from_spec", "get_gpu", "modeled_profile", "profile_module", "spec_hash",
    },
    memtune.tuner: {
        "POLICIES", "Action", "BoundError", "BudgetError", "CalibrationError", "Candidate", "Plan", "PlanError",
        "PrefetchTrigger", "RanksResult", "SearchError", "SharedLink", "SimResult", "Simulator", "Stagger",
        "TuneResult", "TunerError",
        "exact_front", "exact_optimum", "format_bytes", "parse_budget", "prefetch_trigger", "ranks_prefetch_trigger",
        "run_policy", "shard_units", "sharded_profile", "simulate", "simulate_ranks", "stagger_for", "tune",
        "InferenceFacts", "InferencePlan", "InferenceSim", "LayerFitError", "LayerPlan", "plan_inference",
        "simulate_inference", "PeakCheck", "peak_check", "held_output_note", "planning_headroom",
    },
    memtune.tuner.runtime: {
        "Equivalence", "HostPool", "OffloadStats", "PlanOutOfMemoryError", "PlannedChain", "ReferenceStep",
        "budget_guard", "check_equivalence", "compare_steps", "load_plan", "planned", "reference_step",
        "InferenceRunner", "Float64Judgement", "fitting_float64_step", "float64_step", "judge_against_float64",
    },
    memtune.storage: {
        "ConflictError", "Database", "IdempotencyConflictError", "NotFoundError", "StorageError", "UnavailableError",
        "default_url", "normalize_url", "upgrade",
    },
    memtune.storage.repositories: {
        "BestAnswer", "CalibrationRepository", "GpuRepository", "JobLease", "JobRepository", "KeyRepository",
        "LeaderboardPage", "LeaseStatus", "ModelRepository", "ProfileRepository", "ResultRepository",
        "WorkerRecord", "WorkerRepository", "content_hash", "hash_key", "identity_hash", "pareto_flags",
    },
    memtune.api: {"MemtuneClient", "create_app"},
    memtune.api.cli: {"app", "load_chain", "resolve_profile"},
    memtune.api.service: set(),
    memtune: {"Action", "Plan", "Profile", "Tuned", "budget_guard", "load_plan", "planned", "profile", "tune"},
}  # fmt: skip


@pytest.mark.parametrize("module", list(EXPECTED), ids=lambda m: m.__name__)
def test_exported_names(module: object) -> None:
    assert set(module.__all__) == EXPECTED[module]  # type: ignore[attr-defined]
    for name in module.__all__:  # type: ignore[attr-defined]
        assert getattr(module, name) is not None, name


def test_tuner_and_profiler_value_types_import_without_torch() -> None:
    code = (
        "import sys, memtune, memtune.tuner, memtune.profiler; memtune.profiler.Profile; memtune.Plan; "
        "assert 'torch' not in sys.modules, 'torch loaded'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
