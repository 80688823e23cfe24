"""cuDNN algorithms on the CPU side: the ctypes layout, the loader's errors, plan -> algorithm resolution,
and the chosen-algorithm convolution's PyTorch fallback (the GPU side is tests/gpu/test_cudnn_gpu.py)."""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Iterator

import pytest
import torch
from algo_tables import MiB
from algo_tables import algo as _algo
from torch import nn

import memtune.profiler._conv_enumerate as conv_enumerate
import memtune.profiler.cudnn as cudnn
import memtune.tuner.runtime.conv as rconv
from memtune.profiler._profile import ConvAlgo, ConvProfile, DeviceIdentity, Profile, StageProfile
from memtune.profiler.chain import ModelChain, Stage, flatten
from memtune.profiler.profiler_errors import ProfilerError
from memtune.tuner._conv_choice import ConvTriple, choose_algorithms, conv_key, select_algo
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import ConvChoice, Plan
from memtune.tuner.runtime.conv import AlgoChoice, ChosenConv2d, CudnnConv2dFunction, apply_conv_choices, cudnn_conv2d


# ---- the binding's layout and names ----------------------------------------------------------------
def test_perf_struct_matches_cudnn_layout() -> None:
    perf = cudnn.ConvAlgoPerf
    assert ctypes.sizeof(perf) == 48
    offsets = {name: getattr(perf, name).offset for name, *_ in perf._fields_}
    assert offsets == {
        "algo": 0,
        "status": 4,
        "time": 8,
        "memory": 16,
        "determinism": 24,
        "mathType": 28,
        "reserved": 32,
    }
    array = (perf * 3)()
    assert ctypes.sizeof(array) == 144  # Find writes an array of them: no padding between elements


def test_algorithm_names_follow_the_cudnn_enums() -> None:
    assert cudnn.algo_name("fwd", 0) == "IMPLICIT_GEMM"
    assert cudnn.algo_name("fwd", 1) == "IMPLICIT_PRECOMP_GEMM"
    assert cudnn.algo_name("fwd", 5) == "FFT_TILING"
    assert cudnn.algo_name("fwd", 7) == "WINOGRAD_NONFUSED"
    assert cudnn.algo_name("bwd_data", 3) == "FFT_TILING"
    assert cudnn.algo_name("bwd_filter", 3) == "ALGO_3"
    assert cudnn.algo_name("bwd_filter", 6) == "FFT_TILING"
    assert cudnn.algo_name("bwd_filter", 9) == "ALGO_9"
    assert [len(cudnn.ALGO_NAMES[p]) for p in cudnn.PASSES] == [8, 6, 7]


@pytest.mark.parametrize(
    ("status", "major", "kind"),
    [
        (0, 9, "ok"),
        (3000, 9, "unsupported"),
        (3002, 9, "unsupported"),
        (4000, 9, "failed"),
        (2000, 9, "failed"),
        (9, 8, "unsupported"),
        (2, 8, "failed"),
        (0, 8, "ok"),
    ],
)
def test_status_classification(status: int, major: int, kind: str) -> None:
    assert cudnn.status_kind(status, major) == kind


def test_every_signature_returns_a_status_with_declared_arguments() -> None:
    for name, argtypes in cudnn._SIGNATURES.items():
        assert name.startswith("cudnn")
        assert all(isinstance(t, type) for t in argtypes), name
    assert len(cudnn._SIGNATURES["cudnnFindConvolutionForwardAlgorithmEx"]) == 13
    assert len(cudnn._SIGNATURES["cudnnConvolutionBackwardFilter"]) == 13


# ---- geometry ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("conv", "shape"),
    [
        (nn.Conv2d(64, 64, 3, padding=1), (2, 64, 20, 20)),
        (nn.Conv2d(3, 16, 7, stride=2, padding=3), (2, 3, 33, 31)),
        (nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4), (1, 8, 9, 9)),
        (nn.Conv2d(4, 6, (3, 5), padding="same"), (1, 4, 7, 8)),
        (nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect"), (1, 4, 7, 8)),
    ],
)
def test_geometry_output_shape_matches_pytorch(conv: nn.Conv2d, shape: tuple[int, ...]) -> None:
    geom = cudnn.ConvGeometry.from_module(conv, shape, "float32")
    out = conv(torch.randn(shape))
    assert geom.output_shape == tuple(out.shape)
    assert geom.weight_shape == tuple(conv.weight.shape)


def test_geometry_rejects_what_cudnn_cannot_describe() -> None:
    with pytest.raises(ProfilerError, match="asymmetrically"):
        cudnn.ConvGeometry.from_module(nn.Conv2d(2, 2, 4, padding="same"), (1, 2, 8, 8), "float32")
    with pytest.raises(ValueError, match="not supported by the cuDNN binding"):
        cudnn.ConvGeometry.from_module(nn.Conv2d(2, 2, 3), (1, 2, 8, 8), "int8")
    with pytest.raises(ValueError, match="groups"):
        cudnn.ConvGeometry.of((1, 6, 8, 8), (4, 3, 3, 3), 1, 1, 1, 4, "float32")


# ---- loading and the CPU --------------------------------------------------------------------------
@pytest.fixture
def no_library(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make every libcudnn candidate fail to load (and forget any library loaded earlier)."""
    monkeypatch.setattr(cudnn, "_LOADED", None)
    monkeypatch.setattr(cudnn, "_LOAD_ERROR", None)
    monkeypatch.setattr(cudnn, "_candidates", lambda: ["/nonexistent/libcudnn.so.9", "libcudnn_not_here.so.9"])
    yield


def test_load_failure_is_a_profiler_error_naming_what_was_tried(no_library: None) -> None:
    with pytest.raises(ProfilerError) as info:
        cudnn.load_cudnn()
    text = str(info.value)
    assert "/nonexistent/libcudnn.so.9" in text and "libcudnn_not_here.so.9" in text
    assert cudnn.LIBRARY_ENV in text  # says what to do next
    with pytest.raises(ProfilerError):  # remembered, not retried
        cudnn.load_cudnn()


def test_environment_override_is_tried_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cudnn.LIBRARY_ENV, "/opt/custom/libcudnn.so.9")
    assert cudnn._candidates()[0] == "/opt/custom/libcudnn.so.9"
    assert "libcudnn.so.9" in cudnn._candidates()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_without_cuda_nothing_is_enumerated() -> None:
    assert cudnn.cudnn_available() is False
    with pytest.raises(ProfilerError, match="CUDA"):
        conv_enumerate.enumerate_conv(nn.Conv2d(3, 4, 3), (1, 3, 8, 8))
    stage = Stage("conv", "conv2d", nn.Conv2d(3, 4, 3))
    with pytest.raises(ProfilerError, match="CUDA"):
        conv_enumerate.enumerate_stage_convs(stage, torch.randn(1, 3, 8, 8))


def test_cpu_profile_refuses_conv_algos() -> None:
    from memtune.profiler.measure import profile

    chain = ModelChain("tiny", flatten(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())), (3, 8, 8))
    with pytest.raises(ProfilerError, match="conv_algos needs a CUDA device"):
        profile(chain, 1, device="cpu", conv_algos=True)


# ---- plan -> algorithms -----------------------------------------------------------------------------
#: a 64->64 3x3 conv like the measured facts' (docs/concepts.md): PRECOMP fastest with a big workspace, FFT_TILING
#: between, GEMM lean
TABLE = (
    _algo("fwd", 0, 10.5, 0),
    _algo("fwd", 1, 2.2, 1568),
    _algo("fwd", 2, None, 0, "failed"),
    _algo("fwd", 5, 3.9, 85),
    _algo("fwd", 6, 3.0, 200, math=1),
    _algo("fwd", 7, None, 0, "unsupported"),
    _algo("bwd_data", 0, 9.0, 0),
    _algo("bwd_data", 1, 4.0, 0.5),
    _algo("bwd_data", 3, 3.5, 120),
    _algo("bwd_filter", 0, 12.0, 0),
    _algo("bwd_filter", 1, 5.0, 30),
    _algo("bwd_filter", 3, 5.0, 10),
)


def _conv(name: str, algos: tuple[ConvAlgo, ...] = TABLE, cin: int = 2, cout: int = 3) -> ConvProfile:
    return ConvProfile(
        name=name,
        in_channels=cin,
        out_channels=cout,
        kernel_size=(3, 3),
        stride=(1, 1),
        padding=(1, 1),
        input_hw=(8, 8),
        algos=algos,
    )


def _stage(i: int, kind: str, convs: tuple[ConvProfile, ...] = ()) -> StageProfile:
    return StageProfile(
        index=i,
        name=str(i),
        kind=kind,
        forward_ms=1.0,
        backward_ms=2.0,
        output_bytes=1024,
        saved_bytes=0,
        param_bytes=0,
        d2h_ms=0.0,
        h2d_ms=0.0,
        convs=convs,
    )


DEVICE = DeviceIdentity(name="Test GPU", key="test", memory_bytes=16 << 30, d2h_gbps=50.0, h2d_gbps=50.0)


def _profile(stages: tuple[StageProfile, ...]) -> Profile:
    return Profile(
        model="t",
        batch=2,
        dtype="float32",
        input_shape=(2, 8, 8),
        input_bytes=1024,
        device=DEVICE,
        source="measured",
        compute_source="measured:test",
        transfer_source="measured:test",
        stages=stages,
    )


#: stage 0 is a conv (key "0."), stage 2 a block with "a" and "down.0" (no table for "down.0")
PROFILE = _profile(
    (
        _stage(0, "conv2d", (_conv(""),)),
        _stage(1, "relu"),
        _stage(2, "block", (_conv("a", cin=3, cout=3), _conv("down.0", (), cin=3, cout=3))),
    )
)


def _ids(t: ConvTriple) -> tuple[int, int, int]:
    return (t.fwd.algo, t.bwd_data.algo, t.bwd_filter.algo)


def test_default_rule_chooses_nothing() -> None:
    assert choose_algorithms(PROFILE, Plan.uniform(3)) == {}


def test_fastest_picks_least_ms_per_pass_skipping_failed() -> None:
    got = choose_algorithms(PROFILE, Plan.uniform(3, conv_rule="fastest"))
    assert list(got) == ["0.", "2.a"]  # "2.down.0" has no table: left to the framework
    assert _ids(got["0."]) == (1, 3, 3)  # bwd_filter: 1 and 3 tie at 5 ms; 3 needs less workspace
    assert got["0."].workspace_bytes == 1568 * MiB
    assert got["0."].backward_ms == pytest.approx(3.5 + 5.0)


def test_memory_optimal_picks_least_workspace_then_fastest() -> None:
    got = choose_algorithms(PROFILE, Plan.uniform(3, conv_rule="memory_optimal"))
    assert _ids(got["0."]) == (0, 0, 0)
    assert got["0."].workspace_bytes == 0


def test_fastest_within_respects_the_cap() -> None:
    got = choose_algorithms(PROFILE, Plan.uniform(3, conv_rule="fastest_within", conv_workspace_limit_bytes=100 * MiB))
    assert _ids(got["0."]) == (5, 1, 3)  # FFT_TILING (85 MiB) is the fastest within 100 MiB
    got = choose_algorithms(PROFILE, Plan.uniform(3, conv_rule="fastest_within", conv_workspace_limit_bytes=MiB))
    assert _ids(got["0."]) == (0, 1, 0)
    tight = (_algo("fwd", 1, 1.0, 50), _algo("fwd", 5, 2.0, 20))  # nothing fits 1 MiB: the leanest
    assert select_algo(tight, "fwd", "fastest_within", MiB) == tight[1]


def test_overrides_win_over_the_rule_and_are_checked() -> None:
    plan = Plan.uniform(3, conv_rule="memory_optimal", conv_algos={"2.a": ConvChoice(fwd=6, bwd_data=3, bwd_filter=1)})
    got = choose_algorithms(PROFILE, plan)
    assert _ids(got["2.a"]) == (6, 3, 1)
    assert got["2.a"].fwd.math_type == 1
    assert _ids(got["0."]) == (0, 0, 0)
    only = choose_algorithms(PROFILE, Plan.uniform(3, conv_algos={"0.": ConvChoice(fwd=5, bwd_data=0, bwd_filter=1)}))
    assert list(only) == ["0."]
    with pytest.raises(PlanError, match=r"fwd is 2.*working: \[0, 1, 5, 6\]"):
        choose_algorithms(PROFILE, Plan.uniform(3, conv_algos={"0.": ConvChoice(fwd=2, bwd_data=0, bwd_filter=0)}))
    with pytest.raises(PlanError, match="no algorithm table"):
        choose_algorithms(
            PROFILE, Plan.uniform(3, conv_algos={"2.down.0": ConvChoice(fwd=0, bwd_data=0, bwd_filter=0)})
        )
    with pytest.raises(PlanError, match="no convolution named 'b'"):
        choose_algorithms(PROFILE, Plan.uniform(3, conv_algos={"2.b": ConvChoice(fwd=0, bwd_data=0, bwd_filter=0)}))


def test_a_pass_without_working_algorithms_leaves_the_conv_to_the_framework() -> None:
    broken = (_algo("fwd", 0, 1.0, 0), _algo("bwd_data", 0, None, 0, "failed"), _algo("bwd_filter", 0, 1.0, 0))
    prof = _profile((_stage(0, "conv2d", (_conv("", broken),)),))
    assert choose_algorithms(prof, Plan.uniform(1, conv_rule="fastest")) == {}
    assert conv_key(4, "layer.conv1") == "4.layer.conv1"


# ---- the Function's fallback and the swap --------------------------------------------------------
@pytest.fixture
def fresh_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rconv, "_fallback_warned", False)


CHOICE = AlgoChoice(fwd=1, bwd_data=1, bwd_filter=1)


@pytest.mark.parametrize(
    ("stride", "padding", "dilation", "groups"), [(1, 1, 1, 1), (2, 0, 1, 1), (1, 2, 2, 2), (2, 1, 1, 4)]
)
def test_fallback_matches_pytorch_conv(
    fresh_warning: None, stride: int, padding: int, dilation: int, groups: int
) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    w = torch.randn(8, 4 // groups, 3, 3, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="not applied because the tensors are on cpu"):
        y = cudnn_conv2d(x, w, b, CHOICE, stride, padding, dilation, groups)
    ref = nn.functional.conv2d(x, w, b, stride, padding, dilation, groups)
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, w, b), g)
    want = torch.autograd.grad(ref, (x, w, b), g)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_fallback_gradients_pass_gradcheck(fresh_warning: None) -> None:
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.autograd.gradcheck(
            lambda a, b: CudnnConv2dFunction.apply(a, b, (2, 1), (1, 1), (1, 1), 2, CHOICE), (x, w)
        )


def test_fallback_warns_once_per_process(fresh_warning: None) -> None:
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            cudnn_conv2d(x, w, None, CHOICE)
    assert len([s for s in seen if issubclass(s.category, RuntimeWarning)]) == 1


def test_function_rejects_mixed_dtypes() -> None:
    with pytest.raises(ValueError, match="one dtype"):
        CudnnConv2dFunction.apply(
            torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3, dtype=torch.float64), (1, 1), (0, 0), (1, 1), 1, CHOICE
        )


def test_chosen_conv_shares_parameters_and_runs_autocast_like_pytorch(fresh_warning: None) -> None:
    conv = nn.Conv2d(3, 5, 3, padding=1, padding_mode="reflect")
    wrapped = ChosenConv2d(conv, CHOICE, key="0.")
    assert wrapped.weight is conv.weight and wrapped.bias is conv.bias
    assert list(wrapped.state_dict()) == list(conv.state_dict())
    assert "IMPLICIT_PRECOMP_GEMM" in repr(wrapped)
    x = torch.randn(2, 3, 6, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        torch.testing.assert_close(wrapped(x), conv(x))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = wrapped(x), conv(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)  # bias added after rounding to bf16: 1 ulp


class Block(nn.Module):
    """A residual block with a nested conv ("down.0"), like ResNet's."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 3, 3, padding=1)
        self.down = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.a(x)) + self.down(x)


def _model() -> tuple[nn.Sequential, Block]:
    torch.manual_seed(1)
    block = Block()
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), block), block


OVERRIDE = {"2.down.0": ConvChoice(fwd=0, bwd_data=0, bwd_filter=0)}
WITH_TABLE = _profile(
    (
        _stage(0, "conv2d", (_conv(""),)),
        _stage(1, "relu"),
        _stage(2, "block", (_conv("a", cin=3, cout=3), _conv("down.0", cin=3, cout=3))),
    )
)


@pytest.mark.parametrize("as_chain", [False, True])
def test_apply_swaps_in_and_restores(fresh_warning: None, as_chain: bool) -> None:
    seq, block = _model()
    model: ModelChain | nn.Sequential = ModelChain("t", flatten(seq), (2, 8, 8)) if as_chain else seq
    originals = [seq[0], block.a, block.down[0]]
    x = torch.randn(2, 2, 8, 8)
    want = seq(x)
    plan = Plan.uniform(3, conv_rule="fastest", conv_algos=OVERRIDE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with apply_conv_choices(model, plan, WITH_TABLE) as swapped:
            assert sorted(swapped) == ["0.", "2.a", "2.down.0"]
            assert swapped["0."].choice == AlgoChoice(1, 3, 3)
            assert swapped["2.down.0"].choice == AlgoChoice(0, 0, 0)
            assert isinstance(block.a, ChosenConv2d) and isinstance(block.down[0], ChosenConv2d)
            if as_chain:
                assert isinstance(model, ModelChain)
                assert model.stages[0].module is swapped["0."]
                got = model.as_sequential()(x)
            else:
                assert isinstance(seq[0], ChosenConv2d)
                got = seq(x)
    torch.testing.assert_close(got, want)
    stages = model.stages if isinstance(model, ModelChain) else flatten(seq)
    assert [stages[0].module, block.a, block.down[0]] == originals


def test_apply_restores_on_error_and_checks_the_model(fresh_warning: None) -> None:
    seq, _ = _model()
    first = seq[0]
    plan = Plan.uniform(3, conv_rule="fastest")
    with pytest.raises(RuntimeError, match="boom"), apply_conv_choices(seq, plan, WITH_TABLE):
        raise RuntimeError("boom")
    assert seq[0] is first
    with (
        pytest.raises(PlanError, match="stages"),
        apply_conv_choices(nn.Sequential(nn.Conv2d(2, 3, 3)), plan, WITH_TABLE),
    ):
        pass
    block = Block()
    other = nn.Sequential(nn.Conv2d(2, 7, 3, padding=1), nn.ReLU(), block)
    with pytest.raises(PlanError, match="differs from the profile"), apply_conv_choices(other, plan, WITH_TABLE):
        pass
    assert not isinstance(block.a, ChosenConv2d)


def test_planned_warns_only_when_the_plan_s_algorithms_are_not_swapped_in(fresh_warning: None) -> None:
    """planned() alone cannot run a plan's algorithms and says so; built inside apply_conv_choices it is silent."""
    from memtune.tuner.runtime import planned

    seq, _ = _model()
    plan = Plan.uniform(3, conv_rule="fastest", conv_algos=OVERRIDE)
    with pytest.warns(UserWarning, match="not applied by planned"):
        planned(seq, plan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the CPU fallback's notice
        with apply_conv_choices(seq, plan, WITH_TABLE):
            warnings.simplefilter("error", UserWarning)
            planned(seq, plan)
