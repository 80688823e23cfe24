"""A small conv-relu(in-place)-pool-conv-flatten-dropout-linear chain shared by the profiler tests."""

from __future__ import annotations

from torch import nn

from profiler.chain import ModelChain, flatten

__all__ = ["small_chain"]


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
