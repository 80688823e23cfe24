"""NOTE [ Region backward measured in the chain ] (memtune.profiler._region_chain): what a kept step reads raises a
compiled region's profiled backward, never lowers it; the CPU reads nothing."""

from __future__ import annotations

import torch
from torch import nn

from memtune.profiler._region_chain import chain_backward_bytes, with_chain_backward
from memtune.profiler._stage_run import _Timing
from memtune.profiler.module_profile import as_inputs

MiB = 1 << 20


def test_the_chain_raises_the_plain_and_recomputed_backward_by_the_same_excess() -> None:
    alone = _Timing(1.0, 2.0, chained_backward_bytes=498 * MiB, recompute_backward_bytes=1382 * MiB)
    raised = with_chain_backward(alone, 890 * MiB)
    assert raised.chained_backward_bytes == 890 * MiB
    assert raised.recompute_backward_bytes == (1382 + 392) * MiB
    assert (raised.forward_ms, raised.backward_ms) == (1.0, 2.0)


def test_a_chain_reading_below_the_isolated_one_or_none_changes_nothing() -> None:
    alone = _Timing(1.0, 2.0, chained_backward_bytes=988 * MiB, recompute_backward_bytes=None)
    assert with_chain_backward(alone, 900 * MiB) is alone
    assert with_chain_backward(alone, None) is alone
    unmeasured = _Timing(1.0, 2.0)
    assert with_chain_backward(unmeasured, 900 * MiB) is unmeasured


def test_the_cpu_reads_nothing() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    got = chain_backward_bytes(
        model,
        list(model),
        [True, True],
        as_inputs(torch.randn(3, 4)),
        lambda o: o.sum(),
        "float32",
        torch.device("cpu"),
    )
    assert got == [None, None]
