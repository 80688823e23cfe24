"""Regions (NOTE [ Regions ] in ``profiler.regions``): candidate partitions from the module tree, in-place writes at
their edges."""

from __future__ import annotations

import torch
from torch import nn

from profiler.modules import find_stages
from profiler.regions import edge_writes, region_partitions
from tests.unit.modules.region_models import SiLUAfter, TinyEncoder, TinyResNet, encoder_batch, resnet_batch

torch.set_num_threads(1)


def _square(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


# ---- discovery -----------------------------------------------------------------------------------------


def test_a_resnet_is_cut_into_its_layers_or_its_blocks() -> None:
    model = TinyResNet()
    parts = region_partitions(model, ((resnet_batch(),), {}))
    assert [p.names for p in parts] == [
        ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "avgpool", "fc"),
        ("conv1", "bn1", "relu", "maxpool", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "avgpool", "fc"),
    ]
    assert parts[0].covers[4] == ("layer1.0", "layer1.1")
    assert parts[-1].names == tuple(find_stages(model, ((resnet_batch(),), {}))[0])  # the finest: the default stages


def test_a_transformer_is_cut_into_its_encoder_or_its_layers_and_an_iterated_list_is_never_a_region() -> None:
    parts = region_partitions(TinyEncoder(), ((encoder_batch(),), {}))
    assert [p.names for p in parts] == [
        ("embed", "encoder", "head"),
        ("embed", "encoder.layers.0", "encoder.layers.1", "encoder.norm", "head"),  # encoder.layers is iterated
    ]


def test_a_module_whose_call_does_not_cover_its_stages_is_not_a_region() -> None:
    class Pair(nn.Module):  # its forward runs its first child only; the model calls the second itself
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
            self.second = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.first(x)  # type: ignore[no-any-return]

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pair = Pair()
            self.head = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.pair.second(self.pair(x)))  # type: ignore[no-any-return]

    parts = region_partitions(Model(), ((torch.randn(2, 4),), {}), stages=["pair.*", "head"])
    assert [p.names for p in parts] == [("pair.first", "pair.second", "head")]


def test_writes_in_place_at_region_edges_are_found_with_who_wrote() -> None:
    x = torch.randn(4, 16)
    reasons = edge_writes(SiLUAfter(), ["a", "b", "head"], ((x,), {}), loss_fn=_square)
    assert list(reasons) == [0]
    assert "output is written in place after it returned, by the model's own code before stage 'b'" in reasons[0]
    stem = edge_writes(TinyResNet(), ["conv1", "bn1", "relu", "maxpool"], ((resnet_batch(),), {}), loss_fn=_square)
    assert sorted(stem) == [1, 2]  # the in-place ReLU writes the BN's output
    assert "by stage 'relu'" in stem[1] and "inplace=True" in stem[2]
    assert edge_writes(TinyEncoder(), ["embed", "encoder", "head"], ((encoder_batch(),), {}), loss_fn=_square) == {}
