"""Small chains shared by the tests: conv-relu(in-place)-pool-conv-flatten-dropout-linear, and a VGG-shaped one."""

from __future__ import annotations

import torch
from torch import nn

from memtune.profiler.chain import ModelChain, flatten

__all__ = ["small_chain", "small_vgg"]


def small_chain() -> ModelChain:
    """The chain on 3×8×8 inputs: every kind of saved storage the profiler tracks, in eight stages."""
    return ModelChain(
        "small",
        flatten(
            nn.Sequential(
                nn.Conv2d(3, 4, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
                nn.Conv2d(4, 8, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Flatten(),
                nn.Dropout(),
                nn.Linear(8 * 16, 10),
            )
        ),
        (3, 8, 8),
    )


def small_vgg() -> ModelChain:
    """14 stages on 3×8×8 inputs: convolutions with in-place ReLUs, BatchNorm, pools, dropout and a classifier; cheap
    enough for many plans (parameters seeded with 0)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [
        nn.Conv2d(3, 6, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(6, 6, 3, padding=1),
        nn.BatchNorm2d(6),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 2 * 2, 16),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.Linear(16, 4),
    ]
    return ModelChain(name="small-vgg", stages=flatten(nn.Sequential(*layers)), input_shape=(3, 8, 8))
