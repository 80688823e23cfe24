"""A module's parameters and buffers as a planned step reads them, without walking the module tree each time.

# NOTE [ Module tensors read from the modules' tables ]
A planned step reads a model's parameters and buffers at every forward (what the offload hooks leave on the device)
and a stage's at every call of an offloaded or recomputed stage (its gathered parameters, the devices whose random
state a re-run replays, the buffers a re-run restores). ``nn.Module.parameters()`` walks the module tree through
generators and builds every name on the way: on a ResNet-like model of 34 stages, with the tensors so small that the
host's time is Python's, those walks were a quarter of what a planned step of mixed actions added to the unplanned
one. ``ModuleTensors`` walks the tree once, when a planned model is made, and each read then takes the tensors that
each module's own tables (``_parameters``, ``_buffers``, which ``nn.Module.named_parameters`` reads) hold at that
moment, each tensor once. So a parameter replaced after planning (a sharded one, or one FSDP2 gathers and registers
for a module's forward, NOTE [ Sharded parameters ]) is read as it is when read; a submodule added to the model after
it was planned is not seen (plan the model again).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ModuleTensors"]


class ModuleTensors:
    """The parameters and buffers of ``module`` and its submodules (NOTE [ Module tensors read from the modules'
    tables ]), the tree walked once."""

    def __init__(self, module: nn.Module) -> None:
        self._modules = tuple(module.modules())

    def parameters(self) -> list[torch.Tensor]:
        """The parameters the modules hold now, each once."""
        return list({id(p): p for m in self._modules for p in m._parameters.values() if p is not None}.values())

    def buffers(self) -> list[torch.Tensor]:
        """The buffers the modules hold now, each once."""
        return list({id(b): b for m in self._modules for b in m._buffers.values() if b is not None}.values())
