"""Shared data of the service unit tests (a module with a unique name, importable from every test file)."""

from __future__ import annotations

from typing import Any

__all__ = ["SMALL_SPEC"]

SMALL_SPEC: dict[str, Any] = {
    "name": "tiny-cnn",
    "input_shape": [3, 16, 16],
    "layers": [
        {"type": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1},
        {"type": "relu", "inplace": True},
        {"type": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1},
        {"type": "relu"},
        {"type": "maxpool2d", "kernel_size": 2},
        {"type": "conv2d", "out_channels": 16, "kernel_size": 3, "padding": 1},
        {"type": "relu"},
        {"type": "flatten"},
        {"type": "linear", "out_features": 10},
    ],
}
