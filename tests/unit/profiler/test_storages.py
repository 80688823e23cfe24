"""The saved-storage table (NOTE [ Saved storages ]) on layers whose saved tensors are known exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memtune.profiler._meta import meta_chain, meta_input
from memtune.profiler._profile import SavedStorage
from memtune.profiler._storages import saved_storage_table, stage_saved_bytes
from memtune.profiler.chain import ModelChain, flatten

F32 = 4


def chain_of(*modules: nn.Module, input_shape: tuple[int, ...]) -> ModelChain:
    return ModelChain("test", flatten(nn.Sequential(*modules)), input_shape)


def table(storages: list[SavedStorage]) -> list[tuple[int, tuple[int, ...], int]]:
    return [(s.bytes, s.saved_by, s.producer) for s in storages]


class Residual(nn.Module):
    """conv -> relu(inplace) -> conv, plus the input, then relu(inplace)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(self.relu(self.conv1(x)))
        return self.relu(out + x)


def test_linear_saves_its_input_not_its_weight() -> None:
    ch = chain_of(nn.Linear(16, 32), nn.Linear(32, 8), input_shape=(16,))
    storages, out, inplace = saved_storage_table(ch, torch.randn(4, 16))
    assert table(storages) == [
        (4 * 16 * F32, (0,), -1),  # the model input, saved by the first linear
        (4 * 32 * F32, (1,), 0),  # stage 0's output, saved by the second linear
        (4 * 8 * F32, (), 1),  # the last output: listed, saved by nobody
    ]
    assert out == [1, 2]
    assert inplace == [False, False]
    assert stage_saved_bytes(storages, 2) == [256, 512]


def test_conv_relu_inplace_conv_shares_one_storage() -> None:
    ch = chain_of(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(4, 5, 3, padding=1), input_shape=(3, 8, 8)
    )
    storages, out, inplace = saved_storage_table(ch, torch.randn(2, 3, 8, 8))
    assert table(storages) == [
        (2 * 3 * 64 * F32, (0,), -1),
        (2 * 4 * 64 * F32, (1, 2), 0),  # conv output = relu output (in place), saved by relu and conv
        (2 * 5 * 64 * F32, (), 2),
    ]
    assert out == [1, 1, 2]
    assert inplace == [False, True, False]
    assert stage_saved_bytes(storages, 3) == [1536, 2048, 0]


def test_maxpool_saves_input_and_int64_indices() -> None:
    ch = chain_of(nn.Conv2d(3, 4, 3, padding=1), nn.MaxPool2d(2), input_shape=(3, 8, 8))
    storages, out, _ = saved_storage_table(ch, torch.randn(2, 3, 8, 8))
    assert table(storages) == [
        (2 * 3 * 64 * F32, (0,), -1),
        (2 * 4 * 64 * F32, (1,), 0),  # pool input
        (2 * 4 * 16 * 8, (1,), 1),  # int64 indices
        (2 * 4 * 16 * F32, (), 1),  # pool output
    ]
    assert out == [1, 3]
    assert stage_saved_bytes(storages, 2) == [1536, 2048 + 1024]


def test_dropout_mask_bool_with_cuda_semantics_float_on_cpu() -> None:
    ch = chain_of(nn.Linear(16, 32), nn.Dropout(0.5), input_shape=(16,))
    cpu, _, _ = saved_storage_table(ch, torch.randn(4, 16))
    # the CPU multiplies by a float noise tensor and saves it
    assert table(cpu)[2] == (4 * 32 * F32, (1,), 1)
    mch = meta_chain(ch)
    meta, _, _ = saved_storage_table(mch, meta_input(mch, 4))
    # CUDA (emulated on meta) uses native_dropout and saves a 1-byte bool mask
    assert table(meta)[2] == (4 * 32, (1,), 1)
    assert stage_saved_bytes(meta, 2) == [4 * 16 * F32, 4 * 32]


def test_views_share_their_producers_storage() -> None:
    ch = chain_of(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), nn.Flatten(), nn.Linear(4 * 64, 10), input_shape=(3, 8, 8)
    )
    storages, out, inplace = saved_storage_table(ch, torch.randn(2, 3, 8, 8))
    assert out == [1, 1, 1, 2]
    assert inplace == [False, True, True, False]
    assert storages[1].saved_by == (1, 3)  # relu saves it, the linear saves its flattened view
    assert storages[1].producer == 0


def test_residual_block_internals() -> None:
    c = 4
    t = 2 * c * 64 * F32
    ch = ModelChain("res", [*flatten(nn.Sequential(nn.Conv2d(3, c, 3, padding=1))), *flatten(Residual(c))], (3, 8, 8))
    storages, out, inplace = saved_storage_table(ch, torch.randn(2, 3, 8, 8))
    assert table(storages) == [
        (2 * 3 * 64 * F32, (0,), -1),
        (t, (1,), 0),  # block input, saved by conv1
        (t, (1,), 1),  # conv1 output = relu output, saved by relu and conv2
        (t, (1,), 1),  # out + x, saved by the in-place relu: the block's output
    ]  # conv2's output is read by the add but saved by nobody: not listed
    assert out == [1, 3]
    assert inplace == [False, False]
    assert stage_saved_bytes(storages, 2) == [1536, 3 * t]


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_meta_table_equals_cpu_table(dtype: torch.dtype | None) -> None:
    ch = chain_of(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 16, 10),
        input_shape=(3, 8, 8),
    )
    cpu = saved_storage_table(ch, torch.randn(2, 3, 8, 8), autocast_dtype=dtype)
    mch = meta_chain(ch)
    meta = saved_storage_table(mch, meta_input(mch, 2), autocast_dtype=dtype)
    assert table(cpu[0]) == table(meta[0])
    assert cpu[1:] == meta[1:]


def test_saved_bytes_sum_to_the_table_total() -> None:
    from memtune.profiler._layers import BasicBlock

    ch = ModelChain(
        "blocks",
        [
            *flatten(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True))),
            *flatten(nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 16, stride=2))),
        ],
        (3, 8, 8),
    )
    storages, out, _ = saved_storage_table(ch, torch.randn(2, 3, 8, 8))
    s = stage_saved_bytes(storages, len(ch))
    assert sum(s) == sum(st.bytes for st in storages if st.saved_by)
    assert all(b > 0 for b in s[:2] + s[3:])
    assert all(o is not None for o in out)
    # every storage's holders are stages at or after its producer
    assert all(min(st.saved_by) >= st.producer for st in storages if st.saved_by)


def test_model_parameters_on_another_device_are_refused() -> None:
    from memtune.profiler.profiler_errors import ProfilerError

    ch = chain_of(nn.Linear(4, 4), input_shape=(4,))
    with pytest.raises(ProfilerError, match="meta_chain"):
        saved_storage_table(ch, torch.empty(2, 4, device="meta"))
