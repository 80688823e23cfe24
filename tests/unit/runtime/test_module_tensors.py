"""NOTE [ Module tensors read from the modules' tables ] (``memtune.tuner.runtime._module_tensors``): the tensors a
planned step reads are what ``nn.Module.parameters()`` and ``buffers()`` give, each once, read when asked."""

from __future__ import annotations

import torch
from torch import nn

from memtune.tuner.runtime._module_tensors import ModuleTensors


def _ids(tensors: list[torch.Tensor]) -> list[int]:
    return [id(t) for t in tensors]


def test_the_tensors_are_the_modules_own_each_once() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 4, bias=False))
    model[2].weight = model[0].weight  # tied: one parameter in two modules
    model[1].register_buffer("scratch", torch.zeros(2), persistent=False)
    got = ModuleTensors(model)
    assert sorted(_ids(got.parameters())) == sorted(_ids(list(model.parameters())))
    assert sorted(_ids(got.buffers())) == sorted(_ids(list(model.buffers())))
    assert len(got.parameters()) == 4  # the tied weight once, the first linear's bias, the norm's weight and bias
    assert len(_ids(got.buffers())) == len(set(_ids(got.buffers())))


def test_a_parameter_replaced_after_the_walk_is_read_as_it_is_now() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    got = ModuleTensors(model)
    fresh = nn.Parameter(torch.ones(4, 4))
    model[0].weight = fresh  # as FSDP2 registers a gathered parameter for a module's forward
    assert any(p is fresh for p in got.parameters())
    model[0].bias = None
    assert sorted(_ids(got.parameters())) == sorted(_ids(list(model.parameters())))
