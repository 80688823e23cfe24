"""``benchmarks.regenerate``: every committed results file is made by one entry or kept with a reason."""

from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path

from benchmarks.regenerate import GENERATED, KEPT, Generated, Kept, classify, missing_rows

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _committed() -> list[str]:
    """The files under benchmarks/results/ that git tracks (every file there when git is not at hand)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return sorted(str(p.relative_to(ROOT)) for p in RESULTS.rglob("*") if p.is_file())
    return sorted(line for line in out.splitlines() if line)


def test_every_committed_results_file_is_generated_or_kept_with_a_reason() -> None:
    files = _committed()
    assert files, "no committed results files found"
    unclassified = [f for f in files if classify(f) is None]
    assert not unclassified, (
        "add these to benchmarks.regenerate's GENERATED (with their command) or KEPT (with why they are not "
        f"regenerated): {unclassified}"
    )
    assert all(k.reason.strip() for k in KEPT)


def test_a_generated_file_is_not_also_kept() -> None:
    both = [(g.output, k.pattern) for g in GENERATED for k in KEPT if fnmatch.fnmatch(g.output, k.pattern)]
    assert not both


def test_every_kept_pattern_still_matches_a_file() -> None:
    files = _committed()
    stale = [k.pattern for k in KEPT if not any(fnmatch.fnmatch(f, k.pattern) for f in files)]
    assert not stale, f"KEPT patterns that match no committed file: {stale}"


def test_entries_have_distinct_names_and_outputs_under_results_and_their_commands_exist() -> None:
    assert len({g.name for g in GENERATED}) == len(GENERATED)
    assert len({g.output for g in GENERATED}) == len(GENERATED)
    for g in GENERATED:
        assert g.output.startswith("benchmarks/results/"), g
        module = ROOT / (g.argv[0].replace(".", "/") + ".py")
        assert module.is_file(), f"{g.name}: no module {g.argv[0]}"
        for page in g.quoted_in:
            assert (ROOT / page).is_file(), f"{g.name}: no page {page}"


def test_classify_names_the_entry_or_the_pattern() -> None:
    g = GENERATED[0]
    assert isinstance(classify(g.output), Generated)
    assert isinstance(classify("benchmarks/results/bench-vgg16-b256-float32.json"), Kept)
    assert classify("benchmarks/results/nothing-like-it.csv") is None


def test_missing_rows_lists_table_rows_the_page_lacks() -> None:
    text = "environment: x\n| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n"
    page = "# page\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert missing_rows(text, page) == ["| 3 | 4 |"]
    assert missing_rows(text, page + "| 3 | 4 |\n") == []
