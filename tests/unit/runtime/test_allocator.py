"""The account of reserved segments that out-of-memory errors carry (``memtune.tuner.runtime._allocator``)."""

from __future__ import annotations

from memtune.tuner.runtime._allocator import describe_reserved, group_segments, reserved_summary
from memtune.tuner.runtime._run_errors import PlanOutOfMemoryError

GIB = 2**30


def _seg(stream: int, pool: str, expandable: bool, total: int, allocated: int) -> dict[str, object]:
    # the keys torch.cuda.memory_snapshot() gives each segment (the ones this module reads)
    return {
        "device": 0,
        "stream": stream,
        "segment_type": pool,
        "is_expandable": expandable,
        "total_size": total,
        "allocated_size": allocated,
    }


def test_segments_are_grouped_by_stream_pool_and_kind_most_unallocated_first() -> None:
    groups = group_segments(
        [
            _seg(0, "large", True, 4 * GIB, 3 * GIB),
            _seg(0, "large", False, 2 * GIB, GIB // 8),
            _seg(0, "large", False, GIB, 0),
            _seg(0, "small", False, 2 << 20, 1 << 20),
            _seg(7, "large", True, GIB, GIB),
        ]
    )
    first = groups[0]
    assert (first.stream, first.pool, first.expandable, first.segments) == (0, "large", False, 2)
    assert first.reserved_bytes == 3 * GIB and first.allocated_bytes == GIB // 8
    assert first.unallocated_bytes == 3 * GIB - GIB // 8
    assert [g.unallocated_bytes for g in groups] == sorted((g.unallocated_bytes for g in groups), reverse=True)
    assert sum(g.segments for g in groups) == 5
    assert {(g.stream, g.pool, g.expandable) for g in groups} == {
        (0, "large", False),
        (0, "large", True),
        (0, "small", False),
        (7, "large", True),
    }


def test_the_description_names_stream_pool_and_gib() -> None:
    text = describe_reserved(group_segments([_seg(0x5A, "large", True, 3 * GIB, GIB)]))
    assert text == "stream 0x5a large expandable: 1 segment(s), 3.00 GiB reserved, 1.00 GiB allocated"
    assert describe_reserved([]) == "no segments reserved"


def test_without_cuda_there_is_nothing_to_describe() -> None:
    import torch

    if not torch.cuda.is_available():
        assert reserved_summary() == ""


def test_an_out_of_memory_error_says_where_the_reserved_memory_sat() -> None:
    err = PlanOutOfMemoryError(
        label="optuna",
        stage=3,
        stage_name="maxpool",
        phase="forward",
        budget_bytes=2 * GIB,
        detail="CUDA out of memory. Tried to allocate 2.00 MiB.",
        reserved="stream 0x0 large: 2 segment(s), 1.97 GiB reserved, 0.13 GiB allocated",
    )
    assert "plan 'optuna'" in str(err) and "stage 3 (maxpool)" in str(err)
    where = "stream 0x0 large: 2 segment(s), 1.97 GiB reserved, 0.13 GiB allocated"
    assert str(err).endswith(f"Reserved at the failure: {where}.")
    assert err.reserved.startswith("stream 0x0")
    assert "Reserved at the failure" not in str(
        PlanOutOfMemoryError(label=None, stage=None, stage_name=None, phase="backward")
    )
