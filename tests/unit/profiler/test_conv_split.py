"""Batch-split convolutions on the CPU side (NOTE [ Batch split ]): chunking, which rows a split may be chosen
by, the simulator's reading, and the chosen-algorithm Function's chunked fallback (the GPU side is in
tests/gpu/test_cudnn_gpu.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from algo_tables import MiB
from algo_tables import algo as _algo
from torch import nn

import memtune.profiler.conv_split as conv_split
import memtune.tuner.runtime.conv as rconv
from memtune.profiler._profile import ConvAlgo, ConvProfile, DeviceIdentity, Profile, StageProfile
from memtune.profiler.conv_split import batch_chunks, conv_geometry, split_candidates
from memtune.profiler.cudnn import ConvGeometry
from memtune.profiler.profiler_errors import ProfilerError
from memtune.tuner._conv_choice import choose_algorithms, select_algo
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import ConvChoice, Plan
from memtune.tuner.runtime.conv import AlgoChoice, CudnnConv2dFunction
from memtune.tuner.simulator import Simulator

#: like VGG-16's second conv: PRECOMP fast with a workspace that shrinks with the chunk, GEMM lean and slow
TABLE = (
    _algo("fwd", 0, 40.0, 0),
    _algo("fwd", 1, 7.0, 6000),
    _algo("fwd", 1, 7.2, 1500, split=4),
    _algo("fwd", 1, 7.9, 190, split=32),
    _algo("fwd", 5, 14.0, 300),
    _algo("bwd_data", 0, 55.0, 0),
    _algo("bwd_data", 1, 7.5, 6000),
    _algo("bwd_data", 1, 8.0, 190, split=32),
    _algo("bwd_filter", 0, 56.0, 0),
    _algo("bwd_filter", 1, 12.0, 6000),
    _algo("bwd_filter", 1, 12.5, 190, split=32),
)


def _conv(algos: tuple[ConvAlgo, ...] = TABLE) -> ConvProfile:
    return ConvProfile(
        name="",
        in_channels=64,
        out_channels=64,
        kernel_size=(3, 3),
        stride=(1, 1),
        padding=(1, 1),
        input_hw=(224, 224),
        batch=256,
        dtype="float32",
        default_ms=7.0,
        default_bwd_ms=19.5,
        algos=algos,
    )


def _profile(conv: ConvProfile) -> Profile:
    stage = StageProfile(
        index=0,
        name="conv",
        kind="conv2d",
        forward_ms=7.0,
        backward_ms=19.5,
        output_bytes=1 << 20,  # small: the workspace, not the loss, makes the peak
        saved_bytes=0,
        param_bytes=147456,
        d2h_ms=0.0,
        h2d_ms=0.0,
        forward_workspace_bytes=6000 * MiB,
        backward_workspace_bytes=6000 * MiB,
        convs=(conv,),
    )
    return Profile(
        model="t",
        batch=256,
        dtype="float32",
        input_shape=(64, 224, 224),
        input_bytes=3 << 30,
        device=DeviceIdentity(name="Test GPU", key="test", memory_bytes=80 << 30, d2h_gbps=50.0, h2d_gbps=50.0),
        source="measured",
        compute_source="measured:test",
        transfer_source="measured:test",
        stages=(stage,),
    )


# ---- chunks and geometry ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "split", "want"),
    [
        (256, 1, [(0, 256)]),
        (256, 4, [(0, 64), (64, 128), (128, 192), (192, 256)]),
        (5, 2, [(0, 3), (3, 5)]),
        (5, 4, [(0, 2), (2, 4), (4, 5)]),  # ceil(5 / 4) = 2 rows: three chunks cover the batch
        (3, 8, [(0, 1), (1, 2), (2, 3)]),
    ],
)
def test_chunks_cover_the_batch_in_order(n: int, split: int, want: list[tuple[int, int]]) -> None:
    assert batch_chunks(n, split) == want


def test_chunks_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="split >= 1"):
        batch_chunks(4, 0)


def test_geometry_of_a_profiled_conv_is_the_modules() -> None:
    conv = nn.Conv2d(64, 64, 3, padding=1)
    assert conv_geometry(_conv()) == ConvGeometry.from_module(conv, (256, 64, 224, 224), "float32")
    with pytest.raises(ProfilerError, match="batch and dtype"):
        conv_geometry(_conv().model_copy(update={"batch": None}))


def test_only_algorithms_faster_than_the_lean_one_and_hungrier_are_split() -> None:
    got = split_candidates(_conv(), "fwd")
    assert [(a.algo, a.split) for a in got] == [(1, 1), (5, 1)]  # PRECOMP and FFT_TILING; GEMM is the lean one
    assert split_candidates(_conv((_algo("fwd", 0, 1.0, 0),)), "fwd") == []


# ---- choice ---------------------------------------------------------------------------------------------
def _picked(limit_mib: int) -> tuple[int, int] | None:
    a = select_algo(TABLE, "fwd", "fastest_within", limit_mib * MiB)
    return None if a is None else (a.algo, a.split)


def test_fastest_within_takes_the_fastest_split_that_fits() -> None:
    assert _picked(2000) == (1, 4)
    assert _picked(256) == (1, 32)
    assert _picked(100) == (0, 1)


def test_vdnn_rules_stay_unsplit() -> None:
    fastest = select_algo(TABLE, "fwd", "fastest")
    lean = select_algo(TABLE, "fwd", "memory_optimal")
    assert fastest is not None and (fastest.algo, fastest.split) == (1, 1)
    assert lean is not None and (lean.algo, lean.split) == (0, 1)


def test_overrides_name_their_split() -> None:
    prof = _profile(_conv())
    plan = Plan.uniform(1, conv_algos={"0.": ConvChoice(fwd=1, bwd_data=1, bwd_filter=0, fwd_split=32)})
    got = choose_algorithms(prof, plan)["0."]
    assert (got.fwd.split, got.fwd.workspace_bytes, got.bwd_data.split) == (32, 190 * MiB, 1)
    with pytest.raises(PlanError, match=r"fwd is 5 in 8 batch chunks.*working: none"):
        choose_algorithms(
            prof, Plan.uniform(1, conv_algos={"0.": ConvChoice(fwd=5, bwd_data=1, bwd_filter=1, fwd_split=8)})
        )
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        ConvChoice(fwd=1, bwd_data=1, bwd_filter=1, bwd_data_split=0)


def test_simulator_counts_the_chunks_time_and_one_chunks_workspace() -> None:
    prof = _profile(_conv())
    sim = Simulator(prof)
    whole = Plan.uniform(1, conv_rule="fastest")
    split = Plan.uniform(1, conv_rule="fastest_within", conv_workspace_limit_bytes=256 * MiB)
    fwd_w, bwd_w, wsf_w, wsb_w = sim.stage_costs(whole)
    fwd_s, bwd_s, wsf_s, wsb_s = sim.stage_costs(split)
    assert fwd_s[0] - fwd_w[0] == pytest.approx(7.9 - 7.0)
    assert bwd_s[0] - bwd_w[0] == pytest.approx(12.5 - 12.0)  # the first stage: only the weight pass runs
    assert (wsf_w[0], wsb_w[0]) == (6000 * MiB, 6000 * MiB)
    assert (wsf_s[0], wsb_s[0]) == (190 * MiB, 190 * MiB)
    assert sim.run(split).peak_bytes < sim.run(whole).peak_bytes - 5000 * MiB


# ---- the Function's chunked fallback --------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("splits", [(2, 2, 2), (4, 1, 3), (8, 5, 1), (3, 4, 5)])
def test_chunked_fallback_gives_the_unsplit_values(
    monkeypatch: pytest.MonkeyPatch, splits: tuple[int, int, int]
) -> None:
    monkeypatch.setattr(rconv, "_fallback_warned", True)
    torch.manual_seed(0)
    x = torch.randn(5, 4, 9, 9, dtype=torch.float64, requires_grad=True)  # 5 rows: uneven chunks
    w = torch.randn(6, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    choice = AlgoChoice(1, 1, 1, fwd_split=splits[0], bwd_data_split=splits[1], bwd_filter_split=splits[2])
    y = CudnnConv2dFunction.apply(x, w, (2, 1), (1, 1), (1, 1), 2, choice)
    ref = nn.functional.conv2d(x, w, None, (2, 1), (1, 1), (1, 1), 2)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(y, (x, w), g)
    want = torch.autograd.grad(ref, (x, w), g)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.autograd.gradcheck(lambda a, b: CudnnConv2dFunction.apply(a, b, 1, 1, 1, 2, choice), (x, w))


def test_choice_says_its_chunks() -> None:
    text = AlgoChoice(1, 1, 0, fwd_split=32).describe()
    assert text == "fwd IMPLICIT_PRECOMP_GEMM in 32 chunks, bwd_data ALGO_1, bwd_filter ALGO_0"


# ---- what gets measured (the GPU parts replaced) ---------------------------------------------------------
def test_splits_are_measured_while_they_beat_the_memory_optimal_algorithm(monkeypatch: pytest.MonkeyPatch) -> None:
    conv = _conv()
    lean = conv_split.memory_optimal(conv, "fwd")
    assert lean is not None and (lean.algo, lean.ms) == (0, 40.0)  # IMPLICIT_GEMM: no workspace, 40 ms
    precomp = next(a for a in TABLE if (a.pass_, a.algo, a.split) == ("fwd", 1, 1))
    geom = conv_geometry(conv)
    monkeypatch.setattr(conv_split, "split_workspace_bytes", lambda g, p, a, m, split, dev: 6000 // split)
    operands = (torch.empty(0), torch.empty(0), torch.empty(0))

    def measure(cost: float) -> list[tuple[int, float | None, int]]:
        monkeypatch.setattr(conv_split, "gpu_median_ms", lambda fn, w, r: cost * fn.args[-2])  # ms grows with split
        splits = (2, 4, 8, 16, 32, 64)
        rows = conv_split._measure_algo(geom, "fwd", precomp, operands, splits, lean, 1, 1, torch.device("cpu"))
        return [(r.split, r.ms, r.workspace_bytes) for r in rows]

    # every split is faster than the memory-optimal 40 ms, even when slower than the unsplit 7 ms
    assert [s for s, _, _ in measure(0.5)] == [2, 4, 8, 16, 32, 64]
    assert measure(0.5)[-1] == (64, 32.0, 93)
    # a split as slow as the memory-optimal algorithm is recorded, and larger ones are not measured
    assert measure(10.0) == [(2, 20.0, 3000), (4, 40.0, 1500)]


def test_a_profile_without_its_split_rows_resolves_as_before_they_existed() -> None:
    prof = _profile(_conv())
    plain = prof.without_splits()
    assert prof.has_split_rows and not plain.has_split_rows
    plan = Plan.uniform(1, conv_rule="fastest_within", conv_workspace_limit_bytes=256 * MiB)
    assert choose_algorithms(prof, plan)["0."].fwd.split == 32
    assert (lambda t: (t.fwd.algo, t.fwd.split))(choose_algorithms(plan=plan, profile=plain)["0."]) == (0, 1)
