"""Small models for the module-stage tests: each one step well under a second on CPU, deterministic.

Each ``Case`` holds a model, its example inputs (in one of the forms ``profile_module`` and
``check_equivalence`` take: a tensor, a dict of keyword arguments or an ``(args, kwargs)`` pair) and the loss
both are given. The models cover what the stage tracer and the planned runtime must handle: skip connections
held across many stages (U-Net), blocks taking the list of all earlier outputs (DenseNet), residual adds with
in-place ReLU6 and depthwise convolutions (MobileNetV2), Hugging Face transformers with their default dropout and
caches (RNG replay and a copy of the cache under recompute), two inputs and a dict output, tied weights between
two stages, and a stage returning a tuple.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "CASES",
    "Case",
    "CondBlock",
    "DictStageNet",
    "MLPBlock",
    "TiedLM",
    "TupleStageNet",
    "TwoInputNet",
    "UNet",
    "build_case",
]

LossFn = Callable[[Any], torch.Tensor]


def mean_square(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


def hf_loss(out: Any) -> torch.Tensor:
    return out.loss  # type: ignore[no-any-return]


def sum_of_means(out: Any) -> torch.Tensor:
    """The loss of a model returning a dict or tuple of tensors: the sum of their means."""
    values = out.values() if isinstance(out, dict) else out
    return torch.stack([t.float().mean() for t in values]).sum()


# ---- U-Net ---------------------------------------------------------------------------------------------


class ConvBlock(nn.Module):
    """Two 3×3 convolutions, each followed by BatchNorm and an in-place ReLU."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(x)))


class UpBlock(nn.Module):
    """Upsample by a transposed convolution, concatenate the encoder's output (the skip), then a ``ConvBlock``."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cout, 2, stride=2)
        self.block = ConvBlock(2 * cout, cout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.block(torch.cat([self.up(x), skip], dim=1))


class UNet(nn.Module):
    """Three encoder blocks (``enc.0`` to ``enc.2``), a bottleneck and three decoder blocks (``dec.0`` to
    ``dec.2``): ``dec.2`` reads ``enc.0``'s output, five stages after it was made."""

    def __init__(self, cin: int = 3, width: int = 8, classes: int = 2) -> None:
        super().__init__()
        chans = [width, 2 * width, 4 * width]
        self.enc = nn.ModuleList(ConvBlock(a, b) for a, b in zip([cin, *chans[:-1]], chans, strict=True))
        self.bottleneck = ConvBlock(chans[-1], 2 * chans[-1])
        ups = [2 * chans[-1], *chans[::-1][:-1]]
        self.dec = nn.ModuleList(UpBlock(a, b) for a, b in zip(ups, chans[::-1], strict=True))
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.enc:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottleneck(x)
        for block, skip in zip(self.dec, reversed(skips), strict=True):
            x = block(x, skip)
        return self.head(x)  # type: ignore[no-any-return]


# ---- DenseNet ------------------------------------------------------------------------------------------


class DenseLayer(nn.Module):
    """BN-ReLU-1×1 conv-BN-ReLU-3×3 conv on the concatenation of every earlier output (a list, as torchvision)."""

    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(4 * growth)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(self.relu1(self.norm1(torch.cat(features, 1))))
        return self.conv2(self.relu2(self.norm2(x)))  # type: ignore[no-any-return]


class DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, cin: int, growth: int) -> None:
        super().__init__()
        for i in range(layers):
            self[f"denselayer{i + 1}"] = DenseLayer(cin + i * growth, growth)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Sequential):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.add_module("norm", nn.BatchNorm2d(cin))
        self.add_module("relu", nn.ReLU(inplace=True))
        self.add_module("conv", nn.Conv2d(cin, cout, 1, bias=False))
        self.add_module("pool", nn.AvgPool2d(2))


class DenseNet(nn.Module):
    """torchvision's DenseNet layout, tiny: a stem, dense blocks with transitions between, a linear classifier."""

    def __init__(self, growth: int = 8, blocks: tuple[int, ...] = (3, 3), init: int = 16, classes: int = 10) -> None:
        super().__init__()
        layers: OrderedDict[str, nn.Module] = OrderedDict(
            conv0=nn.Conv2d(3, init, 3, padding=1, bias=False), norm0=nn.BatchNorm2d(init), relu0=nn.ReLU(inplace=True)
        )
        ch = init
        for i, n in enumerate(blocks):
            layers[f"denseblock{i + 1}"] = DenseBlock(n, ch, growth)
            ch += n * growth
            if i != len(blocks) - 1:
                layers[f"transition{i + 1}"] = Transition(ch, ch // 2)
                ch //= 2
        layers["norm5"] = nn.BatchNorm2d(ch)
        self.features = nn.Sequential(layers)
        self.classifier = nn.Linear(ch, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.features(x))
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))  # type: ignore[no-any-return]


# ---- MobileNetV2 ---------------------------------------------------------------------------------------


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """1×1 expansion, 3×3 depthwise, 1×1 linear projection; the input is added back when the shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers: list[nn.Module] = [] if expand == 1 else [ConvBNReLU(cin, hidden, kernel=1)]
        layers += [
            ConvBNReLU(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)  # type: ignore[no-any-return]


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 layout, narrow and short; the classifier has dropout 0.2."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        setting = [(1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 2, 2)]  # expand, channels, repeats, first stride
        layers: list[nn.Module] = [ConvBNReLU(3, 8, stride=2)]
        cin = 8
        for t, c, n, s in setting:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(ConvBNReLU(cin, 32, kernel=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(32, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))  # type: ignore[no-any-return]


# ---- two inputs, a dict output ---------------------------------------------------------------------------


class MLPBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.norm(x)))


class CondBlock(nn.Module):
    """``forward(x, *, cond)``: a residual block gated by a keyword tensor that needs a gradient."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, *, cond: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.norm(x))) * cond


class TwoInputNet(nn.Module):
    """``forward(x, *, y)``: ``x`` positional, ``y`` keyword; returns ``{"main": ..., "aux": ...}``. Its blocks take
    ``y``'s embedding as a keyword argument."""

    def __init__(self, dx: int = 12, dy: int = 6, width: int = 16) -> None:
        super().__init__()
        self.embed_x = nn.Linear(dx, width)
        self.embed_y = nn.Linear(dy, width)
        self.blocks = nn.ModuleList(CondBlock(width) for _ in range(3))
        self.head_main = nn.Linear(width, 4)
        self.head_aux = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor, *, y: torch.Tensor) -> dict[str, torch.Tensor]:
        ey = self.embed_y(y)
        gate = torch.sigmoid(ey)
        h = self.embed_x(x) * gate
        for block in self.blocks:
            h = block(h, cond=gate)
        return {"main": self.head_main(h), "aux": self.head_aux(h + ey)}


# ---- tied weights --------------------------------------------------------------------------------------


class TiedLM(nn.Module):
    """A tiny language model whose output projection is the embedding's weight (two stages share it)."""

    def __init__(self, vocab: int = 64, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(MLPBlock(width) for _ in range(2))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(h).flatten(0, 1), ids.flatten())


# ---- a stage returning a tuple, a stage returning a dict -------------------------------------------------


class GatedBlock(nn.Module):
    """Returns ``(h, gate)``: the next block takes both."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.gate = nn.Linear(width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + self.drop(torch.relu(self.fc(x))) * gate
        return h, torch.sigmoid(self.gate(h))


class TupleStageNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.blocks = nn.ModuleList(GatedBlock(width) for _ in range(3))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        gate = torch.ones_like(h)
        for block in self.blocks:
            h, gate = block(h, gate)
        return self.head(h * gate)  # type: ignore[no-any-return]


class DictBlock(nn.Module):
    """Returns ``{"h": ..., "skip": ...}`` with BatchNorm inside."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.relu(self.norm(self.fc(x)))
        return {"h": h, "skip": x * 0.5}


class DictStageNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.blocks = nn.ModuleList(DictBlock(width) for _ in range(3))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            out = block(h)
            h = out["h"] + out["skip"]
        return self.head(h)  # type: ignore[no-any-return]


# ---- Hugging Face ----------------------------------------------------------------------------------------


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=3,
        n_embd=64,
        n_head=4,
        vocab_size=256,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
    )
    return GPT2LMHeadModel(config)


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=256,
        max_position_embeddings=64,
        attention_dropout=0.1,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)


# ---- cases -----------------------------------------------------------------------------------------------


def _moved(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _moved(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(_moved(v, device) for v in obj)
    return obj


@dataclass(frozen=True)
class Case:
    """A model with one batch and its loss: what a test profiles, plans and checks."""

    model: nn.Module
    inputs: Any
    loss_fn: LossFn

    def to(self, device: torch.device | str) -> Case:
        """The case on ``device`` (the model moved in place, the inputs copied)."""
        device = torch.device(device)
        return Case(self.model.to(device), _moved(self.inputs, device), self.loss_fn)


def _ids(batch: int, seq: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq))


def _hf(make: Callable[[], nn.Module]) -> Case:
    model = make()
    ids = _ids(2, 16, 256)
    return Case(model, {"input_ids": ids, "labels": ids}, hf_loss)


BUILDERS: dict[str, Callable[[], Case]] = {
    "unet": lambda: Case(UNet(), torch.randn(2, 3, 32, 32), mean_square),
    "densenet": lambda: Case(DenseNet(), torch.randn(2, 3, 16, 16), mean_square),
    "mobilenet_v2": lambda: Case(MobileNetV2(), torch.randn(2, 3, 32, 32), mean_square),
    "gpt2": lambda: _hf(gpt2),
    "llama": lambda: _hf(llama),
    "two_inputs": lambda: Case(TwoInputNet(), ((torch.randn(64, 12),), {"y": torch.randn(64, 6)}), sum_of_means),
    "tied": lambda: Case(TiedLM(), _ids(8, 16, 64), lambda loss: loss),
    "tuple_stage": lambda: Case(TupleStageNet(), torch.randn(64, 8), mean_square),
}

#: every case's name
CASES = tuple(BUILDERS)


def build_case(name: str) -> Case:
    """The case ``name`` in training mode, its parameters and inputs drawn from seed 0."""
    torch.manual_seed(0)
    case = BUILDERS[name]()
    case.model.train()
    return case
