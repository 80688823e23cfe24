"""Budget parsing: sizes, fractions and clear refusals."""

from __future__ import annotations

import pytest

from tuner.budget import format_bytes, parse_budget
from tuner.errors import BudgetError

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
        ("0.6", int(0.6 * GPU)),
        ("1", GPU),
        ("12884901888", 12884901888),
        (0.5, int(0.5 * GPU)),
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
        ("0", "must be positive"),
        ("0GiB", "must be positive"),
        ("12XB", "unknown unit 'XB'"),
        ("1.5", "must be whole"),
        ("500GiB", "exceeds the GPU's memory"),
        ("nan", "not understood"),
        (True, "not True"),
    ],
)
def test_rejects_clearly(text: str, message: str) -> None:
    with pytest.raises(BudgetError, match=message):
        parse_budget(text, GPU)


def test_fraction_needs_gpu_memory() -> None:
    with pytest.raises(BudgetError, match="no GPU memory is known"):
        parse_budget("0.5")
    assert parse_budget("2GiB") == 2 * 2**30


def test_format_bytes() -> None:
    assert format_bytes(12 * 2**30) == "12.00 GiB"
    assert format_bytes(512) == "512 B"
