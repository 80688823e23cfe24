"""The CPU meter reads the allocator's events and keeps what the metered code writes to standard error, less the
allocator's own note about blocks made before it (NOTE [ Allocator meters ] in ``memtune.profiler.memory_meter``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # a fresh interpreter that imports torch

SCRIPT = textwrap.dedent(
    """
    import sys, warnings, torch
    from memtune.profiler.memory_meter import metered

    before = torch.randn(1000, 1000)  # 4,000,000 bytes made before the meter, freed inside it
    with metered(torch.device("cpu")) as reading:
        del before
        kept = torch.randn(100, 100)  # 40,000 bytes
        print("the model's own line", file=sys.stderr)
        warnings.warn("the model's own warning")
    print(reading.peak_bytes, reading.end_bytes)
    """
)


def test_the_cpu_meter_keeps_the_codes_stderr_and_drops_the_allocators_note() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120)
    # the allocator reports no size for a block made before the meter, so its free is not counted
    assert done.stdout.split() == ["40000", "40000"]
    assert "the model's own line" in done.stderr
    assert "the model's own warning" in done.stderr
    assert "allocated before the profiling started" not in done.stderr
