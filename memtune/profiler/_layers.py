"""Building blocks that are one stage each: residual blocks and transformer blocks.

The chain view (``memtune.profiler.chain``) flattens ``nn.Sequential`` containers and keeps any other module
whole; the classes here are such whole modules. Each carries a class attribute ``stage_kind`` that
``memtune.profiler.chain.flatten`` reads as the stage's kind (``residual``, ``transformer``, ``embedding``).

The residual blocks follow torchvision's ResNet v1.5 layout exactly (stride on the 3x3 convolution of
the bottleneck, ``ReLU(inplace=True)``, in-place ``out += identity``), so that their parameter counts
and saved tensors match the numbers memtune's measured facts refer to.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "BOTTLENECK_EXPANSION",
    "BasicBlock",
    "Bottleneck",
    "TokenPositionEmbedding",
    "TransformerBlock",
]

BOTTLENECK_EXPANSION = 4
"""A bottleneck block's output has this many times its ``channels`` (torchvision's ``expansion``)."""


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)


def _downsample(in_channels: int, out_channels: int, stride: int) -> nn.Sequential | None:
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
        nn.BatchNorm2d(out_channels),
    )


class BasicBlock(nn.Module):
    """ResNet-18/34 block: two 3x3 convolutions with batch norm, plus the identity (or a 1x1 projection).

    Args:
        in_channels: channels of the input feature map.
        channels: channels of the output feature map.
        stride: stride of the first convolution (and of the projection); 2 halves height and width.
    """

    stage_kind: ClassVar[str] = "residual"

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, channels, stride)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(channels, channels)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = _downsample(in_channels, channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        result: torch.Tensor = self.relu(out)
        return result


class Bottleneck(nn.Module):
    """ResNet-50/101/152 block (v1.5): 1x1 reduce, 3x3 (strided), 1x1 expand by 4, plus the identity.

    Args:
        in_channels: channels of the input feature map.
        channels: bottleneck width; the output has ``BOTTLENECK_EXPANSION * channels`` channels.
        stride: stride of the 3x3 convolution (and of the projection).
    """

    stage_kind: ClassVar[str] = "residual"

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = channels * BOTTLENECK_EXPANSION
        self.conv1 = nn.Conv2d(in_channels, channels, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = _conv3x3(channels, channels, stride)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv3 = nn.Conv2d(channels, out_channels, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        result: torch.Tensor = self.relu(out)
        return result


class TransformerBlock(nn.Module):
    """Pre-norm transformer block on ``(batch, seq, width)`` inputs.

    ``x + attn(LayerNorm(x))`` then ``x + MLP(LayerNorm(x))``; attention is multi-head self-attention
    through ``F.scaled_dot_product_attention`` (so the fused kernels are used where available), the MLP
    is ``Linear(width, mlp_ratio * width) -> GELU -> Linear(mlp_ratio * width, width)``.

    Args:
        width: model width (features per token); must be divisible by ``heads``.
        heads: number of attention heads.
        mlp_ratio: hidden width of the MLP as a multiple of ``width``.
        causal: mask attention to earlier positions (decoder) or not (encoder).
    """

    stage_kind: ClassVar[str] = "transformer"

    def __init__(self, width: int, heads: int, mlp_ratio: int = 4, *, causal: bool = True) -> None:
        super().__init__()
        if width % heads != 0:
            raise ValueError(f"width {width} is not divisible by heads {heads}; pick heads that divide width")
        self.heads = heads
        self.causal = causal
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, mlp_ratio * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(mlp_ratio * width, width)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        head_dim = width // self.heads
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        merged: torch.Tensor = self.proj(out.transpose(1, 2).reshape(batch, seq, width))
        return merged

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self.ln1(x))
        mlp: torch.Tensor = self.fc2(self.act(self.fc1(self.ln2(x))))
        return x + mlp


class TokenPositionEmbedding(nn.Module):
    """Token embedding plus a learned position embedding: ``(batch, seq)`` int64 ids -> ``(batch, seq, width)``.

    Args:
        vocab: number of token ids.
        seq_len: longest sequence (number of learned positions).
        width: embedding width.
    """

    stage_kind: ClassVar[str] = "embedding"

    def __init__(self, vocab: int, seq_len: int, width: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(seq_len, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[-1]
        if seq > self.position.num_embeddings:
            raise ValueError(
                f"sequence of {seq} tokens is longer than the {self.position.num_embeddings} learned positions; "
                "build the model with a larger seq_len"
            )
        positions = torch.arange(seq, device=ids.device)
        embedded: torch.Tensor = self.token(ids) + self.position(positions)
        return embedded
