"""Models named by a factory: ``package.module:callable`` or ``path/to/file.py:callable``, for the command line.

A factory is the user's own code run on the user's own machine (``memtune profile torchvision.models:resnet50``);
the service never takes one from a request (it takes exported programs, ``memtune.profiler.exported``). torch is
imported where a factory is built or its inputs made, so ``is_factory`` costs the command line nothing (NOTE [ Zoo names
without torch ] in ``memtune.profiler.zoo``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memtune.profiler.profiler_errors import ProfilerError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["build_factory", "factory_inputs", "is_factory"]


def is_factory(ref: str) -> bool:
    """Whether a model argument names a factory (``module:callable``) rather than a zoo model."""
    return ":" in ref


def _load(ref: str) -> Callable[..., Any]:
    where, _, attr = ref.rpartition(":")
    if not where or not attr:
        raise ProfilerError(f"factory {ref!r}: write 'package.module:function' or 'path/to/file.py:function'")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ProfilerError(f"factory {ref!r}: no file {where!r}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ProfilerError(f"factory {ref!r}: cannot load {where!r} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise ProfilerError(f"factory {ref!r}: cannot import {where!r} ({exc})") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ProfilerError(f"factory {ref!r}: {where!r} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


def build_factory(ref: str, params: dict[str, Any] | None = None) -> nn.Module:
    """Call the factory ``ref`` with ``params`` as keyword arguments; it must return an ``nn.Module``."""
    from torch import nn

    model = _load(ref)(**(params or {}))
    if not isinstance(model, nn.Module):
        raise ProfilerError(f"factory {ref!r} returned {type(model).__name__}, not an nn.Module")
    return model


def factory_inputs(
    batch: int, input_shape: tuple[int, ...], *, vocab: int | None = None, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """One batch for a factory model: random floats of ``(batch, *input_shape)``, or token ids in ``[0, vocab)``."""
    import torch

    if batch < 1 or not input_shape or any(d < 1 for d in input_shape):
        raise ProfilerError(f"need batch >= 1 and a positive input shape; got {batch} and {input_shape}")
    shape = (batch, *input_shape)
    if vocab is not None:
        if vocab < 1:
            raise ProfilerError(f"--vocab must be positive, not {vocab}")
        return torch.randint(0, vocab, shape, device=device)
    return torch.randn(shape, device=device)
