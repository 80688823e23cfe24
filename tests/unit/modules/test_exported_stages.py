"""An exported program is staged as ``memtune.profile`` stages the module it was exported from (NOTE [ Module stages ],
exported programs): the same stages, in the same order, of the same kinds.

``torch.export.unflatten`` gives every module back as an ``InterpreterModule``; grouped by that class, a GPT-2 layer
was split into its norms, attention and MLP (21 stages for the README's four-layer model, against 9) and an
``nn.Sequential`` stem stayed one stage.
"""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import memtune
from memtune.profiler.exported import load_exported
from memtune.profiler.module_profile import profile_module
from memtune.profiler.module_stages import find_stages

pytestmark = pytest.mark.slow  # an export and a load each: 5 and 14 s on a 2-core machine


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Sequential(nn.Linear(16, 16), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(self.a(x))


class _Net(nn.Module):
    """A plain ``nn.Sequential`` stem, an iterated ``nn.ModuleList`` of blocks with a ``Sequential`` inside, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1))
        self.blocks = nn.ModuleList([_Block(), _Block(), _Block()])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _exported(model: nn.Module, *args: torch.Tensor, int_high: int | None = None) -> tuple[nn.Module, tuple]:
    model.train()
    buf = io.BytesIO()
    torch.export.save(torch.export.export(model, args), buf)
    return load_exported(buf.getvalue(), max_bytes=1 << 30, int_high=int_high)


def test_an_exported_program_has_the_stages_and_kinds_memtune_profile_finds() -> None:
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(4, 8)
    loaded, inputs = _exported(model, x)
    mine = memtune.profile(model, x, gpu="h100", warmup=0, repeats=1, progress=False)
    theirs = profile_module(loaded, inputs, gpu="h100", warmup=0, repeats=1)
    staged = [(s.name, s.kind) for s in mine.stages]
    assert staged == [
        ("stem.0", "linear"), ("stem.1", "relu"), ("stem.2", "dropout"),
        ("blocks.0", "_block"), ("blocks.1", "_block"), ("blocks.2", "_block"), ("head", "linear"),
    ]  # fmt: skip
    assert [(s.name, s.kind) for s in theirs.stages] == staged
    assert [s.saved_bytes for s in theirs.stages] == [s.saved_bytes for s in mine.stages]


def test_the_readmes_gpt2_exported_has_its_nine_stages() -> None:
    transformers = pytest.importorskip("transformers")

    class Logits(nn.Module):  # an exported program returns tensors: the logits, not a ModelOutput
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.net(input_ids=ids).logits  # type: ignore[no-any-return]

    config = transformers.GPT2Config(
        n_layer=4, n_embd=64, n_head=4, n_positions=64, vocab_size=512, bos_token_id=0, eos_token_id=0, use_cache=False
    )
    model = Logits(transformers.GPT2LMHeadModel(config)).train()
    ids = torch.randint(0, 512, (2, 32))
    mine, _ = find_stages(model, ((ids,), {}))
    loaded, inputs = _exported(model, ids, int_high=512)
    theirs, coarse = find_stages(loaded, (inputs, {}))
    assert len(mine) == 9 and mine[3:7] == [f"net.transformer.h.{i}" for i in range(4)]
    assert (theirs, coarse) == (mine, [])
