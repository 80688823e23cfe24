"""NOTE [ Run record ]: what a GPU results file says made it, and old files without one."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.ranked import result_fields
from benchmarks.render_bench import render
from memtune.profiler import provenance
from memtune.profiler.provenance import command_line, run_of, run_record, source_commit

ROOT = Path(__file__).resolve().parents[3]


def test_a_record_names_the_date_commit_command_and_versions_of_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMTUNE_COMMIT", raising=False)
    run = run_record(["--batch", "2", "a b"], module="benchmarks.promises")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert run["commit"] == head.stdout.strip()
    assert run["dirty"] in (True, False)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", run["date"])
    assert run["command"] == "python -m benchmarks.promises --batch 2 'a b'"
    assert {"python", "torch", "optuna", "numpy"} <= set(run["versions"])
    assert json.loads(json.dumps(run)) == run


def test_an_exported_tree_names_its_commit_in_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMTUNE_COMMIT", raising=False)
    assert source_commit(tmp_path) == (None, None)
    monkeypatch.setenv("MEMTUNE_COMMIT", "0123abc")
    assert source_commit(tmp_path) == ("0123abc", None)


def test_a_named_commit_wins_over_a_git_tree_beside_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree copied to a GPU host may sit beside an older ``.git``: the commit the copy names is the one recorded."""
    monkeypatch.setenv("MEMTUNE_COMMIT", "0123abc")
    assert source_commit(ROOT) == ("0123abc", None)


def test_the_console_script_is_named_by_its_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/venv/bin/memtune", "bench", "vgg16", "--budget", "60% of peak"])
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)
    assert command_line() == "memtune bench vgg16 --budget '60% of peak'"


def test_the_data_parallel_files_carry_the_same_record() -> None:
    fields = result_fields("ddp_plans", ["out", "--nproc", "2"], "expandable_segments:True")
    assert fields["run"]["command"] == fields["command"] == "python -m benchmarks.ddp_plans out --nproc 2"
    assert fields["run"]["commit"] == run_record()["commit"]


def test_a_bench_file_without_a_record_renders_as_before_and_one_with_it_names_its_commit(tmp_path: Path) -> None:
    old = ROOT / "benchmarks/results/h100/sweep/bench-vgg16-b256-float32.json"
    data = json.loads(old.read_text())
    assert run_of(data) is None
    before = render(old)
    assert "commit" not in before.splitlines()[0]
    new = tmp_path / old.name
    new.write_text(json.dumps({**data, "run": {**run_record(), "commit": "f" * 40, "dirty": True}}))
    heading, *table = render(new).splitlines()
    assert heading.endswith(f"; commit {'f' * 10}+, {provenance.run_record()['date'][:10]})")
    assert table == before.splitlines()[1:]
