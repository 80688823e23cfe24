"""Per-model benchmark processes spread over GPUs (NOTE [ One model per GPU ] in ``benchmarks.gpu_pool``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.gpu_pool import SHARED_HOST_ENV, child_argv, core_shares, run_across_gpus

CHILD = f"""
import json, os, sys, time
SHARED = {SHARED_HOST_ENV!r}
models = sys.argv[sys.argv.index("--models") + 1]
time.sleep(0.2)
with open(os.path.join(sys.argv[1], models + ".json"), "w") as f:
    json.dump({{"argv": sys.argv[1:], "gpu": os.environ["CUDA_VISIBLE_DEVICES"],
               "shared": os.environ[SHARED]}}, f)
print("done", models)
sys.exit(3 if models == "bad" else 0)
"""


def test_a_child_gets_one_model_and_one_gpu_whatever_form_the_options_took() -> None:
    argv = ["--models", "a,b", "--out", "X", "--gpus=4", "--fresh"]
    assert child_argv(argv, "b") == ["--out", "X", "--fresh", "--models", "b", "--gpus", "1"]
    assert child_argv(["--models=a,b", "--gpus", "2"], "a") == ["--models", "a", "--gpus", "1"]


def test_every_model_runs_once_on_one_of_the_visible_gpus_and_failures_are_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "fake_bench.py").write_text(CHILD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,9")
    failed = run_across_gpus("fake_bench", ["m1", "m2", "bad"], [str(tmp_path), "--models", "m1,m2,bad"], 2)
    assert failed == 1
    runs = {m: json.loads((tmp_path / f"{m}.json").read_text()) for m in ("m1", "m2", "bad")}
    assert {r["gpu"] for r in runs.values()} <= {"5", "7"}  # the first two visible GPUs only
    assert all(r["shared"] == "2" and r["argv"][-4:-2] == ["--models", r["argv"][-3]] for r in runs.values())
    out = capsys.readouterr().out
    assert "[m1 on GPU 5] done m1" in out or "[m1 on GPU 7] done m1" in out


def test_more_gpus_than_visible_is_refused_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(SystemExit, match="names only 1"):
        run_across_gpus("benchmarks.module_peers", ["gpt2"], [], 2)


def test_each_gpu_gets_its_own_share_of_the_cores() -> None:
    assert core_shares([3, 0, 1, 2, 4], 2) == [[0, 1, 2], [3, 4]]
    assert core_shares(list(range(8)), 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert core_shares([5], 3) == [[5], [5], [5]]  # fewer cores than GPUs: shared in turn
    with pytest.raises(ValueError, match="among 0"):
        core_shares([0], 0)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_a_child_is_pinned_to_its_share_and_its_compile_workers_limited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    child = """
import json, os, sys, time
time.sleep(0.1)
models = sys.argv[sys.argv.index("--models") + 1]
with open(os.path.join(sys.argv[1], models + ".json"), "w") as f:
    json.dump({"cores": sorted(os.sched_getaffinity(0)), "threads": os.environ["TORCHINDUCTOR_COMPILE_THREADS"]}, f)
"""
    (tmp_path / "pinned_bench.py").write_text(child)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert run_across_gpus("pinned_bench", ["a", "b"], [str(tmp_path)], 2) == 0
    shares = core_shares(sorted(os.sched_getaffinity(0)), 2)
    runs = [json.loads((tmp_path / f"{m}.json").read_text()) for m in ("a", "b")]
    assert sorted(r["cores"] for r in runs) == sorted(shares)
    assert all(r["threads"] == str(len(r["cores"])) for r in runs)
