"""A planned model's state dict is the user's model's (NOTE [ The model's own state dict ] in
``memtune.tuner.runtime._planned_base``): saved from the planned model it loads into the user's own class, and the
user's own checkpoint loads into the planned model, at the top or inside a larger module."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import memtune
from memtune.tuner import Action, Plan


class Net(nn.Module):
    """A user's class; ``model`` is its own attribute, as in Hugging Face models (``model.layers...``)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.model(x))


PLAN = Plan(actions=[Action.RECOMPUTE, Action.KEEP], stages=("model", "head"))


def _trained(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(16, 8)).square().mean().backward()
    optimizer.step()
    return model


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_saved_from_the_planned_model_loads_into_the_users_class(tmp_path: Path) -> None:
    torch.manual_seed(1)
    planned = _trained(memtune.planned(Net(), PLAN))
    torch.save(planned.state_dict(), tmp_path / "planned.pt")
    plain = Net()
    assert str(plain.load_state_dict(torch.load(tmp_path / "planned.pt"))) == "<All keys matched successfully>"
    assert _same(plain.state_dict(), planned.state_dict())
    assert list(planned.state_dict()) == list(Net().state_dict())  # model.0.weight, ..., head.bias: no extra step


def test_the_users_checkpoint_loads_into_the_planned_model(tmp_path: Path) -> None:
    torch.manual_seed(2)
    plain = _trained(Net())
    torch.save(plain.state_dict(), tmp_path / "plain.pt")
    user = Net()
    planned = memtune.planned(user, PLAN)
    planned.load_state_dict(torch.load(tmp_path / "plain.pt"))
    assert _same(user.state_dict(), plain.state_dict())  # the parameters are the user's model's, loaded in place


def test_a_planned_model_inside_a_larger_module_keeps_its_keys() -> None:
    torch.manual_seed(3)
    outer = nn.ModuleDict({"net": memtune.planned(Net(), PLAN)})
    plain = nn.ModuleDict({"net": Net()})
    assert list(outer.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(outer.state_dict())
    assert _same(plain.state_dict(), outer.state_dict())
    outer.load_state_dict(plain.state_dict())
