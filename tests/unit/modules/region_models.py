"""Small models for the region tests (NOTE [ Regions ] in ``memtune.profiler.region_tree``), laid out as the models
regions are for, at a size CPU inductor compiles in seconds:

* ``TinyResNet``: torchvision's ResNet layout: a stem of four root-level stages (conv, BN, in-place ReLU, max-pool),
  ``layer1`` and ``layer2`` of two basic blocks each (residual add and in-place ReLU inside the block), pooling and a
  linear head.
* ``TinyEncoder``: a BERT-like layout: ``embed``, ``encoder.layers`` (a ``ModuleList`` the encoder iterates) of
  pre-norm blocks, ``head``; no dropout, so a recomputed region's re-run has nothing random to replay.
* ``SiLUAfter``: a model whose own code writes the output of a stage in place (``F.silu(..., inplace=True)``) before
  the next stage reads it: the write at a region edge of NOTE [ In-place writes at region edges ].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SiLUAfter", "TinyEncoder", "TinyResNet", "encoder_batch", "resnet_batch", "square", "taken_grads"]


def square(out: torch.Tensor) -> torch.Tensor:
    """The tests' loss: the mean square of the output, in fp32."""
    return out.float().square().mean()


def taken_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the parameters' gradients by name, the gradients then cleared."""
    got = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return got


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)  # type: ignore[no-any-return]


class TinyResNet(nn.Module):
    def __init__(self, width: int = 8, classes: int = 5) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(2)
        self.layer1 = nn.Sequential(BasicBlock(width, width), BasicBlock(width, width))
        self.layer2 = nn.Sequential(BasicBlock(width, 2 * width, 2), BasicBlock(2 * width, 2 * width))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))  # type: ignore[no-any-return]


def resnet_batch() -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))  # type: ignore[no-any-return]


class Encoder(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)  # type: ignore[no-any-return]


class TinyEncoder(nn.Module):
    def __init__(self, vocab: int = 32, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.encoder = Encoder(width, depth)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)))  # type: ignore[no-any-return]


def encoder_batch() -> torch.Tensor:
    return torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))


class SiLUAfter(nn.Module):
    """``a`` (a linear layer and a layer norm), then the model's own in-place SiLU on ``a``'s output, then ``b``."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width))
        self.b = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.a(x), inplace=True)
        return self.head(self.b(h))  # type: ignore[no-any-return]
