"""The workspace a GPU's convolution takes, modeled from its shapes, for profiles made on the CPU for a GPU.

# NOTE [ GPU convolution workspaces ]
A CPU cannot see cuDNN's workspaces: its own convolutions (oneDNN) allocate other scratch (a reordered copy of
the input and of the output), and a profile made on the CPU for an H100 kept the CPU's. On the H100 the ResNet-50
promise profile (batch 128, fp32) measured ``layer3.0``'s forward transient at 294 MiB against 204 on the CPU, and
the U-Net's (width 64, batch 16 x 256 x 256) ``dec.2`` at 512 MiB against 256; plans made on the CPU ran over
their budget by those bytes when priced on the H100's profile.

What cuDNN takes, measured: in every stage of the committed zoo profiles (``memtune/profiler/data``) that is one
convolution (AlexNet, OverFeat, VGG-16/19, ResNet's stem; H100 and H200, fp32 and bf16, batch 64 to 256: 276
forward and 166 backward transients, ``python -m benchmarks.conv_workspace_check`` lists them), PyTorch's default
algorithm takes a workspace of about the NHWC copies of the convolution's three tensors, T = X + Y + W (input,
output and filter bytes; a tensor with fewer than 4 (fp32) or 8 (bf16/fp16) channels stored with that many: an RGB
input), plus a little:

* forward: T (to 0.2 MiB) in 221 of 276; at most 16.0 MiB above it (VGG-16 fp32, batch 64, 512 channels at
  14 x 14: 74 against 58 MiB, also the largest ratio, 1.28); below it in 34, where cuDNN picks an algorithm without
  the copies (VGG's first layer: 0; 64 to 128 channels at 112 x 112 in fp32: the input only);
* backward (``chained_backward_bytes`` less the output's gradient; the data and filter gradients are made inside
  it): at most 21.4 MiB above T (OverFeat fp32's first layer: 524 against 503 MiB), at most 1.15 T; below it in 12.

The model takes ``T + min(SLACK_FRACTION x T, SLACK_CAP_BYTES)`` for each pass (``conv_workspace_bytes``): above
every one of the 442 measurements, by at most 32 MiB plus what cuDNN's cheaper choices leave out. It is an upper
bound on purpose: a plan said to fit must fit. No convolution with T below 29 MiB was measured; there the rule is
extrapolated. Where the rule is applied is NOTE [ GPU transients from the CPU's allocator ] in
``memtune.profiler.memory_meter``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "SLACK_CAP_BYTES",
    "SLACK_FRACTION",
    "conv_copies_bytes",
    "conv_workspace_bytes",
    "event_workspace_bytes",
    "output_shape",
    "padded_channels",
]

SLACK_FRACTION = 0.3  # the forward's largest measured ratio to T is 1.28, the backward's 1.15
SLACK_CAP_BYTES = 32 * 2**20  # the largest measured excess over T is 21.4 MiB (backward), 16 MiB (forward)

#: kineto's names for the element types of convolution inputs, and their bytes
_ELEMENT_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2}


def padded_channels(channels: int, element_size: int) -> int:
    """``channels`` as cuDNN's NHWC kernels store them: at least 4 for a 4-byte type, 8 for a 2-byte one (NOTE
    [ GPU convolution workspaces ])."""
    least = {2: 8, 4: 4}.get(element_size, 1)
    return max(channels, least)


def conv_copies_bytes(x_shape: Sequence[int], w_shape: Sequence[int], y_shape: Sequence[int], element_size: int) -> int:
    """T of NOTE [ GPU convolution workspaces ]: the NHWC copies of a convolution's input, output and filter, their
    channels padded (``padded_channels``), bytes.

    Args:
        x_shape: the input, ``(N, C_in, *spatial)``.
        w_shape: the filter as PyTorch stores it: ``(C_out, C_in / groups, *kernel)``, or ``(C_in, C_out / groups,
            *kernel)`` for a transposed convolution.
        y_shape: the output, ``(N, C_out, *spatial)``.
        element_size: bytes per element (4 for fp32, 2 for bf16/fp16).

    A grouped filter's channels are padded as any other's (an upper bound: a depthwise filter is small).
    """

    def nbytes(shape: Sequence[int], channel_dims: Sequence[int]) -> int:
        dims = [padded_channels(d, element_size) if i in channel_dims else d for i, d in enumerate(shape)]
        return math.prod(dims) * element_size

    return nbytes(x_shape, (1,)) + nbytes(y_shape, (1,)) + nbytes(w_shape, (0, 1))


def conv_workspace_bytes(
    x_shape: Sequence[int], w_shape: Sequence[int], y_shape: Sequence[int], element_size: int
) -> int:
    """The workspace one pass (forward, data or filter gradient) of a convolution takes on the GPU, bytes: T
    (``conv_copies_bytes``, same arguments) and its slack, ``min(SLACK_FRACTION x T, SLACK_CAP_BYTES)`` (NOTE [ GPU
    convolution workspaces ])."""
    total = conv_copies_bytes(x_shape, w_shape, y_shape, element_size)
    return total + min(int(SLACK_FRACTION * total), SLACK_CAP_BYTES)


def output_shape(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> tuple[int, ...]:
    """The output shape of ``aten::convolution`` with these arguments (PyTorch's own formula)."""
    spatial = len(x_shape) - 2
    kernel = w_shape[2:]

    def at(v: Sequence[int], i: int) -> int:
        return v[i] if len(v) > 1 else v[0]

    if transposed:
        out_ch = w_shape[1] * groups
        sizes = [
            (x_shape[2 + i] - 1) * at(stride, i)
            - 2 * at(padding, i)
            + at(dilation, i) * (kernel[i] - 1)
            + at(output_padding, i)
            + 1
            for i in range(spatial)
        ]
    else:
        out_ch = w_shape[0]
        sizes = [
            (x_shape[2 + i] + 2 * at(padding, i) - at(dilation, i) * (kernel[i] - 1) - 1) // at(stride, i) + 1
            for i in range(spatial)
        ]
    return (x_shape[0], out_ch, *sizes)


def event_workspace_bytes(
    name: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[str], concrete: Sequence[object]
) -> int | None:
    """The GPU workspace of one convolution op as ``torch.profiler`` records it (``record_shapes=True``), bytes:
    the larger of its passes' (NOTE [ GPU convolution workspaces ]); None for another op or one whose arguments
    were not recorded.

    ``aten::convolution`` takes ``(input, weight, bias, stride, padding, dilation, transposed, output_padding,
    groups)``; ``aten::convolution_backward`` ``(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask)``.
    """
    element = _ELEMENT_BYTES.get(dtypes[0] if dtypes else "", 0)
    y: Sequence[int]
    try:
        if name == "aten::convolution" and len(shapes) >= 9 and element:
            x, w = shapes[0], shapes[1]
            stride, padding, dilation, transposed, out_pad, groups = concrete[3:9]
            y = output_shape(
                x, w, _ints(stride), _ints(padding), _ints(dilation), bool(transposed), _ints(out_pad), _int(groups)
            )
        elif name == "aten::convolution_backward" and len(shapes) >= 10 and element:
            y, x, w = shapes[0], shapes[1], shapes[2]
        else:
            return None
    except (TypeError, IndexError, ValueError, ZeroDivisionError):
        return None
    if len(x) < 3 or len(w) < 3 or len(y) < 3:
        return None
    return conv_workspace_bytes(x, w, y, element)


def _ints(value: object) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"not a list of ints: {value!r}")
    return tuple(_int(v) for v in value)


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise TypeError(f"not an int: {value!r}")
    return value
