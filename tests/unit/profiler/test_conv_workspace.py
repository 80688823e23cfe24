"""The GPU's convolution workspace modeled on the CPU (NOTE [ GPU convolution workspaces ] in
``memtune.profiler.conv_workspace``) and read into the CPU allocator's events (NOTE [ GPU transients from the CPU's
allocator ] in ``memtune.profiler.memory_meter``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks.conv_workspace_check import measured
from memtune.profiler.conv_workspace import (
    SLACK_CAP_BYTES,
    conv_copies_bytes,
    conv_workspace_bytes,
    event_workspace_bytes,
    output_shape,
)
from memtune.profiler.memory_meter import gpu_peak, metered
from memtune.profiler.module_profile import profile_module
from tests.unit.modules.models import mean_square

MiB = 2**20
CPU = torch.device("cpu")


def test_the_model_is_at_or_above_every_workspace_the_zoo_profiles_measured() -> None:
    rows = measured()
    assert {r.pass_ for r in rows} == {"forward", "backward"}
    assert len(rows) >= 400  # 276 forward, 166 backward when written
    above = [r for r in rows if r.measured > r.modeled]
    assert not above, above[:3]
    # and not far above where cuDNN takes the copies: within the slack's cap of T
    at = [r for r in rows if r.pass_ == "forward" and abs(r.measured - r.copies) <= 0.2 * MiB]
    assert len(at) > len(rows) // 3
    assert all(r.modeled - r.measured <= SLACK_CAP_BYTES + 0.2 * MiB for r in at)


def test_copies_are_the_three_tensors_with_an_rgb_input_padded() -> None:
    # VGG-16's 64 -> 64 convolution at 224 x 224, batch 128, fp32: 3,136.14 MiB measured on the H100
    x, w = (128, 64, 224, 224), (64, 64, 3, 3)
    y = output_shape(x, w, (1, 1), (1, 1), (1, 1), False, (0, 0), 1)
    assert y == (128, 64, 224, 224)
    assert conv_copies_bytes(x, w, y, 4) == 2 * 128 * 64 * 224 * 224 * 4 + 64 * 64 * 9 * 4
    # ResNet-50's stem in bf16, batch 128: three input channels stored as eight (294.05 MiB measured)
    x, w = (128, 3, 224, 224), (64, 3, 7, 7)
    y = output_shape(x, w, (2, 2), (3, 3), (1, 1), False, (0, 0), 1)
    assert conv_copies_bytes(x, w, y, 2) == (128 * 8 * 224 * 224 + 128 * 64 * 112 * 112 + 64 * 8 * 49) * 2
    assert conv_workspace_bytes(x, w, y, 2) == conv_copies_bytes(x, w, y, 2) + SLACK_CAP_BYTES


@pytest.mark.parametrize("transposed", [False, True])
def test_output_shape_is_pytorchs(transposed: bool) -> None:
    x = torch.randn(2, 6, 9, 11)
    stride, padding, dilation, out_pad = (2, 3), (1, 0), (1, 2), ((1, 2) if transposed else (0, 0))
    conv: nn.Conv2d | nn.ConvTranspose2d
    if transposed:
        conv = nn.ConvTranspose2d(6, 4, (3, 2), stride, padding, out_pad, groups=2, dilation=dilation)
    else:
        conv = nn.Conv2d(6, 4, (3, 2), stride, padding, dilation, groups=2)
    got = output_shape(tuple(x.shape), tuple(conv.weight.shape), stride, padding, dilation, transposed, out_pad, 2)
    assert got == tuple(conv(x).shape)


def test_an_event_that_is_no_convolution_has_no_workspace() -> None:
    assert event_workspace_bytes("aten::addmm", [[2, 3], [3, 4]], ["float", "float"], [None, None]) is None
    assert event_workspace_bytes("aten::convolution", [], [], []) is None


def test_gpu_peak_drops_a_convolutions_own_scratch_and_adds_its_workspace() -> None:
    memory = [
        (0, 100),  # an input made before the convolution
        (10, 40),  # the CPU's copy of the input, inside the call
        (11, 60),  # the output
        (12, -40),  # the copy freed
        (30, 20),  # after it
        (31, -20),
    ]
    # the CPU's own peak is 200 inside the call; as on the GPU: 160 live at its end, plus a workspace of 25
    assert gpu_peak(memory, [(5, 20, 25)]) == 185
    assert gpu_peak(memory, []) == 200
    # a call inside another's span is the outer call's work
    assert gpu_peak(memory, [(5, 20, 25), (11, 12, 1000)]) == 185
    # a workspace smaller than the CPU's scratch lowers the peak to what the GPU holds
    assert gpu_peak(memory, [(5, 20, 0)]) == 180


def test_the_meter_reads_a_convolution_as_the_gpu_allocates_it() -> None:
    conv = nn.Conv2d(16, 32, 3, padding=1)
    x = torch.randn(8, 16, 64, 64)
    workspace = conv_workspace_bytes((8, 16, 64, 64), (32, 16, 3, 3), (8, 32, 64, 64), 4)
    with metered(CPU, gpu_workspaces=True) as gpu:
        y = conv(x)
    del y
    with metered(CPU) as cpu:
        y = conv(x)
    del y
    out = 8 * 32 * 64 * 64 * 4
    assert gpu.end_bytes == cpu.end_bytes == out
    assert gpu.peak_bytes == out + workspace
    # code without convolutions reads the same either way
    with metered(CPU, gpu_workspaces=True) as a:
        z = (x * 2).relu()
    del z
    with metered(CPU) as b:
        z = (x * 2).relu()
    del z
    assert a.peak_bytes == b.peak_bytes and a.end_bytes == b.end_bytes


def test_a_cpu_made_profile_for_a_gpu_holds_the_gpus_convolution_workspace() -> None:
    """A stage that is one convolution: its forward transient is the modeled workspace, its backward's holds it too;
    ``transients="cpu"`` keeps the CPU's own."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1))
    x = torch.randn(4, 3, 32, 32)
    gpu = profile_module(model, x, loss_fn=mean_square, stages=["0", "1", "2"], gpu="h100", warmup=0, repeats=1)
    cpu = profile_module(
        model, x, loss_fn=mean_square, stages=["0", "1", "2"], gpu="h100", warmup=0, repeats=1, transients="cpu"
    )
    act = (4, 16, 32, 32)
    last = conv_workspace_bytes(act, (16, 16, 3, 3), act, 4)
    assert gpu.stages[2].forward_workspace_bytes == last
    # the backward: the data and filter gradients are made, then the larger pass's workspace on top of them and the
    # output's gradient
    assert gpu.stages[2].chained_backward_bytes is not None
    assert gpu.stages[2].chained_backward_bytes >= last
    assert gpu.stages[2].forward_workspace_bytes != cpu.stages[2].forward_workspace_bytes
    assert gpu.stages[1].forward_workspace_bytes == cpu.stages[1].forward_workspace_bytes  # no convolution
    assert gpu.step_peak is not None and cpu.step_peak is not None
    assert gpu.step_peak.allocated_bytes >= cpu.step_peak.allocated_bytes - 4 * MiB


def test_transients_of_the_cpu_are_refused_on_cuda_and_unknown_words_everywhere() -> None:
    from memtune.profiler.profiler_errors import ProfilerError

    with pytest.raises(ProfilerError, match="transients"):
        profile_module(nn.Linear(4, 4), torch.randn(2, 4), transients="host", warmup=0, repeats=1)  # type: ignore[arg-type]
