"""The budget grammar (NOTE [ Budget grammar ]): sizes, fractions that say of what, and clear refusals."""

from __future__ import annotations

import pytest

from memtune.tuner._tuner_errors import BudgetError
from memtune.tuner.budget import format_bytes, parse_budget

GPU = 141 * 10**9


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12GiB", 12 * 2**30),
        ("12 GiB", 12 * 2**30),
        ("12gib", 12 * 2**30),
        ("12GB", 12 * 10**9),
        ("12G", 12 * 2**30),
        ("800MiB", 800 * 2**20),
        ("1.5GiB", int(1.5 * 2**30)),
        ("12884901888B", 12884901888),
        ("60% of gpu", int(0.6 * GPU)),
        ("0.6 of gpu", int(0.6 * GPU)),
        ("100% of the gpu", GPU),
        ("1 of gpu", GPU),
        (2**30, 2**30),
    ],
)
def test_accepts(text: str | float, expected: int) -> None:
    assert parse_budget(text, GPU) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not understood"),
        ("twelve", "not understood"),
        ("12 GiB please", "not understood"),
        ("-1GiB", "must be positive"),
        ("0GiB", "must be positive"),
        ("12XB", "unknown unit 'XB'"),
        ("0.6", "has no unit.*'12GiB'.*'60% of peak'"),
        ("2", "has no unit"),
        ("12884901888", "has no unit"),
        ("0", "has no unit"),
        ("150% of peak", r"must be in \(0, 1\]"),
        ("0% of gpu", r"must be in \(0, 1\]"),
        ("60% of ram", "of 'peak' or of 'gpu'"),
        ("500GiB", "exceeds the GPU's memory"),
        ("nan", "not understood"),
        (True, "not understood"),
        (0.5, "not understood"),
        (-3, "must be positive"),
    ],
)
def test_rejects_clearly(text: str, message: str) -> None:
    with pytest.raises(BudgetError, match=message):
        parse_budget(text, GPU)


def test_a_fraction_needs_what_it_is_a_fraction_of() -> None:
    with pytest.raises(BudgetError, match="fraction of the GPU's memory, which is not known here"):
        parse_budget("50% of gpu")
    with pytest.raises(BudgetError, match="fraction of the model's unconstrained peak, which is not known here"):
        parse_budget("50% of peak", GPU)
    assert parse_budget("50% of peak", GPU, peak_bytes=10**9) == 5 * 10**8
    assert parse_budget("2GiB") == 2 * 2**30


def test_a_fraction_of_the_peak_is_of_the_profiles_simulated_unconstrained_peak() -> None:
    from memtune.tuner.budget import profile_budget
    from memtune.tuner.plan import Plan
    from memtune.tuner.simulator import simulate
    from tests.unit.tuner.profiles import conv_profile

    prof = conv_profile(2)
    peak = simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes
    assert profile_budget("60% of peak", prof) == int(0.6 * peak)
    assert profile_budget("1GiB", prof) == 2**30


def test_format_bytes() -> None:
    assert format_bytes(12 * 2**30) == "12.00 GiB"
    assert format_bytes(512) == "512 B"
