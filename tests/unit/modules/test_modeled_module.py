"""Module profiles made on the CPU for a GPU: every time is that GPU's roofline, none the CPU's clock (NOTE
[ Modeled module profiles ] in ``memtune.profiler.module_roofline``), and the printouts name the GPU modeled."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from torch import nn

import memtune
from memtune.profiler._flops import count_stage
from memtune.profiler._fused_attention import gpu_attention
from memtune.profiler._profile import Profile
from memtune.profiler.devices import get_gpu
from memtune.profiler.modeled import SIMT_EFFICIENCY, roofline_ms
from memtune.profiler.module_profile import _capture, as_inputs, profile_module
from memtune.profiler.module_roofline import _OpNames
from memtune.profiler.stagefacts import StageFacts
from memtune.tuner.plan import Action
from memtune.tuner.tuned import device_label
from tests.unit.modules.models import UNet, build_case, mean_square

H100 = get_gpu("h100")
MODELED = "modeled for h100 (roofline; compute counted on the CPU)"


def _profile(name: str) -> Profile:
    case = build_case(name)
    return profile_module(case.model, case.inputs, loss_fn=case.loss_fn, gpu="h100", warmup=0, repeats=1)


@pytest.fixture(scope="module")
def gpt2() -> Profile:
    return _profile("gpt2")


@pytest.fixture(scope="module")
def unet() -> Profile:
    return _profile("unet")


@pytest.mark.parametrize("name", ["unet", "gpt2"])
def test_a_cpu_profile_for_a_gpu_is_modeled_for_that_gpu(name: str, request: pytest.FixtureRequest) -> None:
    p: Profile = request.getfixturevalue(name)
    assert p.source == "modeled" and p.device.key == "h100"
    assert p.compute_source == "modeled:h100 roofline (ops counted on the CPU)"
    assert p.transfer_source == "modeled:h100"
    assert all(s.forward_ms > 0 for s in p.stages) and all(s.backward_ms > 0 for s in p.stages)
    assert p.loss_ms is not None and p.loss_ms > 0  # the ops outside the stages, priced, not a CPU remainder
    assert device_label(p) == MODELED


def test_a_stage_takes_the_roofline_of_its_own_ops(gpt2: Profile) -> None:
    """transformer.h.1 counted alone on the arguments the model gives it, priced by the roofline: the profile's."""
    case = build_case("gpt2")
    block = case.model.get_submodule("transformer.h.1")
    (args, kwargs), _ = _capture(case.model, block, as_inputs(case.inputs), nullcontext(), torch.device("cpu"))
    hidden = args[0].requires_grad_()
    # the ops as the GPU runs them (NOTE [ CPU ops the GPU fuses ], NOTE [ Fused attention on the CPU ])
    with gpu_attention(), count_stage() as count, _OpNames(count):
        block(hidden, *args[1:], **kwargs)
    fwd, bwd = roofline_ms(StageFacts(0, 0, 0, count, True, True, ()), H100)
    stage = next(s for s in gpt2.stages if s.name == "transformer.h.1")
    assert (stage.forward_ms, stage.backward_ms) == pytest.approx((fwd, bwd), rel=1e-12)
    # a selective run re-runs the block's cheap ops in its backward: same forward, a dearer backward
    assert stage.selective_forward_ms == pytest.approx(fwd)
    assert stage.selective_backward_ms is not None and stage.selective_backward_ms > bwd
    # a recomputed one re-runs its whole forward first (NOTE [ Recompute priced as measured ])
    assert stage.recompute_backward_ms == pytest.approx(fwd + bwd, rel=1e-12)


def test_times_do_not_depend_on_the_cpus_clock(unet: Profile) -> None:
    again = _profile("unet")
    assert [(s.forward_ms, s.backward_ms, s.selective_forward_ms, s.selective_backward_ms) for s in again.stages] == [
        (s.forward_ms, s.backward_ms, s.selective_forward_ms, s.selective_backward_ms) for s in unet.stages
    ]
    assert again.loss_ms == unet.loss_ms
    assert [s.d2h_ms for s in unet.stages] == [H100.transfer_ms(s.saved_bytes, "d2h") for s in unet.stages]


def test_a_larger_matrix_product_costs_more() -> None:
    """A 1024x1024 linear layer at batch 1024 (2.1 GFLOP) is compute-bound on an H100 in fp32; a 64x64 one is not."""
    torch.manual_seed(0)
    n = 1024
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, n), nn.Linear(n, n))
    p = profile_module(
        model, torch.randn(n, 64), loss_fn=mean_square, stages=["0", "1", "2"], gpu="h100", warmup=0, repeats=1
    )
    small, big = p.stages[0], p.stages[2]
    compute_ms = 2 * n**3 / (H100.peak_flops["float32"] * SIMT_EFFICIENCY) * 1e3
    assert big.forward_ms - small.forward_ms == pytest.approx(compute_ms, rel=0.05)
    assert big.backward_ms > small.backward_ms + compute_ms  # dX and dW: the product twice


def test_tune_names_the_modeled_gpu(gpt2: Profile) -> None:
    case = build_case("gpt2")
    tuned = memtune.tune(case.model, "60% of peak", example_inputs=case.inputs, gpu="h100", trials=20, progress=False)
    head = str(tuned).splitlines()[0]
    assert MODELED in head and "on NVIDIA H100" not in head
    # the same model profiled again by tune: the same times (nothing measured on the CPU)
    assert [s.forward_ms for s in tuned.profile.stages] == [s.forward_ms for s in gpt2.stages]


def test_the_label_says_what_the_times_are_of(unet: Profile) -> None:
    measured = unet.model_copy(update={"source": "measured", "compute_source": "measured:h100"})
    assert device_label(measured) == f"on {unet.device.name}"
    assert device_label(unet.model_copy(update={"compute_source": "modeled:h100"})) == "modeled for h100 (roofline)"
    cpu_clock = unet.model_copy(update={"compute_source": "measured:cpu Some CPU"})
    assert device_label(cpu_clock).startswith(f"for {unet.device.name} (copies modeled, compute measured:cpu")


def _as_slow(p: Profile, factor: float) -> Profile:
    """``p`` with every compute time ``factor`` times longer: what the CPU's clock gave before."""

    def slow(ms: float | None) -> float | None:
        return None if ms is None else ms * factor

    stages = tuple(
        s.model_copy(
            update={
                "forward_ms": s.forward_ms * factor,
                "backward_ms": s.backward_ms * factor,
                "selective_forward_ms": slow(s.selective_forward_ms),
                "selective_backward_ms": slow(s.selective_backward_ms),
                "recompute_backward_ms": slow(s.recompute_backward_ms),
            }
        )
        for s in p.stages
    )
    return p.model_copy(update={"stages": stages})


def test_offload_is_not_free_beside_the_gpus_compute() -> None:
    """The test U-Net at batch 16 of 128x128 saves 4.5-48 MiB per stage. On an H100 its last decoder block re-runs
    faster than its 48 MiB cross the host link, so at 55% of the peak the search does not offload it (at half the peak
    only the all-offload baseline, save_on_cpu, fits: there is no choice to check). With compute 50x slower (what the
    CPU's clock gave these profiles before), every copy hides behind compute and it offloads more."""
    torch.manual_seed(0)
    p = profile_module(UNet(), torch.randn(16, 3, 128, 128), loss_fn=mean_square, gpu="h100", warmup=0, repeats=1)
    biggest = max(p.stages, key=lambda s: s.saved_bytes)
    assert biggest.saved_bytes >= 32 << 20
    assert biggest.d2h_ms > biggest.forward_ms  # the copy costs more than re-running the stage's forward
    assert min(s.d2h_ms / s.forward_ms for s in p.stages if s.saved_bytes) > 0.1  # copies and compute: one scale

    def best(prof: Profile) -> tuple[Action, ...]:
        tuned = memtune.tune(prof, "55% of peak", trials=40, progress=False, headroom=0.0)
        assert tuned.result.best is not None
        return tuple(tuned.result.best.plan.actions)

    modeled = best(p)
    assert modeled[biggest.index] in (Action.RECOMPUTE, Action.SELECTIVE)
    cpu_clock = best(_as_slow(p, 50.0))
    assert cpu_clock[biggest.index] == Action.OFFLOAD and cpu_clock.count(Action.OFFLOAD) > modeled.count(
        Action.OFFLOAD
    )


def test_cpu_dropout_is_priced_as_the_gpus_one_fused_kernel() -> None:
    """NOTE [ CPU ops the GPU fuses ]: the CPU's bernoulli_, div_ and mul count as one kernel that reads the input and
    writes the output and a one-byte mask; a view (``_unsafe_view``) counts as nothing."""
    x, w = torch.randn(64, 256), torch.randn(256, 8)
    with count_stage() as plain:
        nn.functional.dropout(x, 0.1, training=True)
    with count_stage() as fused, _OpNames(fused):
        nn.functional.dropout(x, 0.1, training=True)
        torch.ops.aten._unsafe_view(x @ w, (64, 8))
    assert len(plain.kernels) == 3  # what the CPU runs
    dropout, matmul = fused.kernels
    assert dropout.kind == "memory" and dropout.bytes_moved == 2 * x.numel() * 4 + x.numel()
    assert matmul.kind == "matmul"


def test_a_profile_for_a_gpu_models_the_cublas_workspaces_a_step_holds(gpt2: Profile, unet: Profile) -> None:
    """NOTE [ Memory held before the step ]: two handles' workspaces where the model runs matrix products (GPT-2),
    none where it runs none (the convolutional U-Net); 32.5 MiB a handle on compute capability 9.0, PyTorch's default
    workspace below it."""
    from memtune.profiler._module_step import CUBLAS_HELD_BYTES_DEFAULT, modeled_resident_bytes

    assert gpt2.resident_bytes == 65 * 2**20
    assert unet.resident_bytes == 0
    assert modeled_resident_bytes("8.0", True) == 2 * CUBLAS_HELD_BYTES_DEFAULT
    assert modeled_resident_bytes("9.0", False) == 0
