"""The geometry of one 2-D convolution as cuDNN's descriptors see it (``ConvGeometry``) and a module's padding.

``ConvGeometry`` holds shapes in elements (NCHW input, ``(K, C / groups, kh, kw)`` weight), stride, padding and
dilation in elements, the group count and the data type's name; ``module_padding`` and ``symmetric_padding`` say the
zero padding cuDNN runs for an ``nn.Conv2d`` (NOTE [ cuDNN binding ] in ``memtune.profiler.cudnn``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from memtune.profiler.profiler_errors import ProfilerError

__all__ = ["ConvGeometry", "module_padding", "symmetric_padding"]

_DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 9}  # cudnnDataType_t
_TORCH_NAMES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    return (int(v[0]), int(v[-1]))


def _dtype_name(dtype: str | torch.dtype) -> str:
    name = _TORCH_NAMES.get(dtype) if isinstance(dtype, torch.dtype) else dtype
    if name not in _DATA_TYPES:
        raise ValueError(f"dtype {dtype!r} is not supported by the cuDNN binding; use one of {', '.join(_DATA_TYPES)}")
    return name


def symmetric_padding(conv: nn.Conv2d) -> tuple[int, int]:
    """``conv``'s padding ``(ph, pw)``, with ``'valid'``/``'same'`` resolved.

    Raises:
        ProfilerError: ``padding='same'`` needs asymmetric padding (an even effective kernel).
    """
    if not isinstance(conv.padding, str):
        return _pair(conv.padding)
    if conv.padding == "valid":
        return (0, 0)
    kernel, dilation = _pair(conv.kernel_size), _pair(conv.dilation)
    total = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
    if any(t % 2 for t in total):
        raise ProfilerError(
            f"conv with padding='same', kernel {kernel} and dilation {dilation} pads asymmetrically; "
            "cuDNN's descriptor takes symmetric padding: give the conv explicit integer padding"
        )
    return (total[0] // 2, total[1] // 2)


def module_padding(conv: nn.Conv2d) -> tuple[tuple[int, int], bool]:
    """The zero padding cuDNN runs for ``conv`` and whether the input is padded in PyTorch first.

    A ``padding_mode`` other than ``zeros`` pads the input with ``F.pad`` and convolves with no padding,
    as ``nn.Conv2d`` does; then ``((0, 0), True)``.
    """
    pad = symmetric_padding(conv)
    if conv.padding_mode != "zeros":
        return (0, 0), True
    return pad, False


@dataclass(frozen=True)
class ConvGeometry:
    """Everything cuDNN's descriptors need for one 2-D cross-correlation (NCHW, sizes in elements).

    ``input_shape`` is ``(N, C, H, W)`` as cuDNN sees it (after any ``F.pad`` of a non-zero padding mode);
    ``weight_shape`` ``(K, C / groups, kh, kw)``.
    """

    input_shape: tuple[int, int, int, int]
    weight_shape: tuple[int, int, int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    dtype: str

    def __post_init__(self) -> None:
        _dtype_name(self.dtype)
        c = self.input_shape[1]
        k, cg, _, _ = self.weight_shape
        if c != cg * self.groups or k % self.groups:
            raise ValueError(
                f"conv geometry: input channels {c} and output channels {k} must be divisible by groups "
                f"{self.groups} with weight {self.weight_shape}"
            )
        if min(self.output_shape) < 1:
            raise ValueError(f"conv geometry {self} gives an empty output {self.output_shape}")

    @classmethod
    def of(
        cls,
        x_shape: Sequence[int],
        w_shape: Sequence[int],
        stride: int | Sequence[int],
        padding: int | Sequence[int],
        dilation: int | Sequence[int],
        groups: int,
        dtype: str | torch.dtype,
    ) -> ConvGeometry:
        """Build from tensor shapes and ``F.conv2d``'s arguments."""
        if len(x_shape) != 4 or len(w_shape) != 4:
            raise ValueError(f"conv2d needs 4-D input and weight (NCHW), got {tuple(x_shape)} and {tuple(w_shape)}")
        return cls(
            tuple(int(v) for v in x_shape),  # type: ignore[arg-type]
            tuple(int(v) for v in w_shape),  # type: ignore[arg-type]
            _pair(stride),
            _pair(padding),
            _pair(dilation),
            int(groups),
            _dtype_name(dtype),
        )

    @classmethod
    def from_module(cls, conv: nn.Conv2d, input_shape: Sequence[int], dtype: str | torch.dtype) -> ConvGeometry:
        """The geometry ``conv`` runs at on an input of ``input_shape`` (NCHW) in ``dtype``."""
        pad, pre_padded = module_padding(conv)
        shape = list(input_shape)
        if pre_padded:
            ph, pw = symmetric_padding(conv)
            shape[2] += 2 * ph
            shape[3] += 2 * pw
        return cls.of(shape, conv.weight.shape, conv.stride, pad, conv.dilation, conv.groups, dtype)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        """``(N, K, P, Q)`` by PyTorch's formula."""
        n, _, h, w = self.input_shape
        k, _, kh, kw = self.weight_shape
        p = (h + 2 * self.padding[0] - self.dilation[0] * (kh - 1) - 1) // self.stride[0] + 1
        q = (w + 2 * self.padding[1] - self.dilation[1] * (kw - 1) - 1) // self.stride[1] + 1
        return (n, k, p, q)

    @property
    def torch_dtype(self) -> torch.dtype:
        return {v: k for k, v in _TORCH_NAMES.items()}[self.dtype]

    def describe(self) -> str:
        """A one-line description for error messages."""
        n, c, h, w = self.input_shape
        k, _, kh, kw = self.weight_shape
        return (
            f"conv {c}->{k} {kh}x{kw} on {n}x{c}x{h}x{w} {self.dtype}, stride {self.stride}, padding "
            f"{self.padding}, dilation {self.dilation}, groups {self.groups}"
        )
