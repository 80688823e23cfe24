"""vDNN's own memory accounting (NOTE [ vDNN accounting ]), its prefetch search, and the algorithm tables carried over
to a modeled GPU (NOTE [ Transplanted algorithm tables ])."""

from __future__ import annotations

import pytest

from memtune.profiler import Profile, modeled_profile
from memtune.profiler.algo_transplant import CUDNN_V4, transplant_algos
from memtune.tuner import Plan, Simulator
from memtune.tuner.policies.vdnn import vdnn_all
from memtune.tuner.policies.vdnn_accounting import find_prefetch_layer, paper_memory
from tests.unit.profiler.algo_tables import algo
from tests.unit.profiler.small_chains import small_chain


@pytest.fixture(scope="module")
def small() -> Profile:
    """conv, relu (in place), maxpool, conv, relu (in place), flatten (in place), dropout, linear; batch 2."""
    return modeled_profile(small_chain(), 2, "float32", "k40")


def test_find_prefetch_layer_is_figure_8() -> None:
    offloaded = [True, False, True, False, True]
    convs = [True, False, True, False, False]
    prefetched = [False] * 5
    assert find_prefetch_layer(4, offloaded, prefetched, convs) == 2  # the relu at 3 is skipped
    assert prefetched == [False, False, True, False, False]
    assert find_prefetch_layer(3, offloaded, prefetched, convs) == -1  # stops at the convolution, already fetched
    assert find_prefetch_layer(2, offloaded, prefetched, convs) == 0
    assert find_prefetch_layer(1, offloaded, prefetched, convs) == -1
    assert find_prefetch_layer(5, [False] * 5, [False] * 5, [False, False, False, True, False]) == -1


def test_the_baseline_is_network_wide(small: Profile) -> None:
    sizes = [s.output_bytes for s in small.stages]
    assert [s.inplace for s in small.stages] == [False, True, False, False, True, True, False, False]
    weights = 2 * sum(s.param_bytes for s in small.stages)
    maps = small.input_bytes + sum(b for b, s in zip(sizes, small.stages, strict=True) if not s.inplace)
    m = paper_memory(small, Plan.uniform(small.n_stages))
    assert m.max_bytes == m.avg_bytes == weights + maps + 2 * max(sizes)  # one dX and one dY, no workspace
    assert dict(m.peak_parts) == {"W and dW": weights, "feature maps": maps, "gradient maps": 2 * max(sizes),
                                  "workspace": 0}  # fmt: skip
    assert m.offloaded_bytes == 0


def test_vdnn_all_by_hand(small: Profile) -> None:
    # buffers: input 1536 B, conv0 2048, pool 512, conv3 1024, dropout 1024, linear 80 (batch 2, fp32)
    assert small.input_bytes == 1536
    assert [s.output_bytes for s in small.stages] == [2048, 2048, 512, 1024, 1024, 1024, 1024, 80]
    w = 2 * sum(s.param_bytes for s in small.stages)
    m = paper_memory(small, vdnn_all(small, 0))
    # the pool's backward: its X (conv0's map) and Y, the input prefetched for conv0, dY 512 and dX 2048
    assert (m.max_bytes, m.peak_layer) == (w + 6656, "bwd 2")
    # its parts: W and dW; X, Y and the prefetched input (2048 + 512 + 1536); dY 512 and dX 2048; no workspace
    assert m.peak_parts == (("W and dW", w), ("feature maps", 4096), ("gradient maps", 2560), ("workspace", 0))
    assert m.offloaded_bytes == 1536 + 2048 + 512 + 1024 + 1024
    forward = [3584, 2048, 2560, 1536, 1024, 1024, 2048, 1104]
    backward = [3232, 3584, 3584, 2560, 4096, 6656, 5632, 5120]
    assert m.avg_bytes == pytest.approx(w + (sum(forward) + sum(backward)) / 16)


def test_recompute_has_no_vdnn_rule(small: Profile) -> None:
    with pytest.raises(ValueError, match="keep and offload only"):
        paper_memory(small, Plan.from_actions("kkrrkkkk"))


def _measured(profile: Profile, batch: int) -> Profile:
    """``profile`` as if measured at ``batch``: its first convolution with a table of four algorithms."""
    st = profile.stages[0]
    conv = st.convs[0].model_copy(
        update={
            "batch": batch,
            "default_ms": 2.0,
            "default_bwd_ms": 4.0,
            "algos": (
                algo("fwd", 0, 4.0, 0),
                algo("fwd", 1, 2.0, 8),
                algo("fwd", 7, 1.0, 64),  # Winograd: not in cuDNN 4.0
                algo("bwd_data", 0, 3.0, 0),
                algo("bwd_filter", 1, 1.0, 16, split=2),  # a split run: not carried
                algo("bwd_filter", 0, 2.0, 0),
            ),
        }
    )
    stages = (st.model_copy(update={"convs": (conv,)}), *profile.stages[1:])
    return profile.model_copy(update={"stages": stages})


def test_transplanted_tables_keep_ratios_and_scale_workspace(small: Profile) -> None:
    source = _measured(modeled_profile(small_chain(), 8, "float32", "h100"), 8)
    out = transplant_algos(small, source)
    conv = out.stages[0].convs[0]
    assert conv.default_ms == pytest.approx(small.stages[0].forward_ms)  # the stage is the convolution
    rows = {(a.pass_, a.algo): a for a in conv.algos}
    assert set(rows) == {("fwd", 0), ("fwd", 1), ("bwd_data", 0), ("bwd_filter", 0)}
    assert rows["fwd", 0].ms == pytest.approx(2 * conv.default_ms)  # 4.0 / 2.0 measured
    assert rows["bwd_data", 0].ms == pytest.approx(0.75 * small.stages[0].backward_ms)
    assert rows["fwd", 1].workspace_bytes == round(8 * (1 << 20) * 2 / 8)  # batch 2 of 8
    assert out.stages[3].convs[0].algos == ()  # no measured twin
    assert out.compute_source.endswith("+algos:" + source.device.name)
    assert CUDNN_V4["fwd"] == frozenset({0, 1, 2, 4, 5})
    # the tables now separate vDNN's memory-optimal and fastest choices
    sim = Simulator(out)
    fast, lean = (sim.run(Plan.uniform(out.n_stages, conv_rule=r)) for r in ("fastest", "memory_optimal"))
    assert lean.step_ms > fast.step_ms


def test_no_twin_is_an_error(small: Profile) -> None:
    other = modeled_profile(small_chain(), 8, "float32", "h100")
    with pytest.raises(ValueError, match="no measured convolution with the shapes"):
        transplant_algos(small, other)
