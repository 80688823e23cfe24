"""The model zoo: every model builds, runs forward and backward, and matches the reference architectures."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch import nn

from memtune.profiler._layers import BasicBlock, Bottleneck, TokenPositionEmbedding, TransformerBlock
from memtune.profiler.chain import ModelChain, conv_modules
from memtune.profiler.profiler_errors import SpecError
from memtune.profiler.spec import SpecLimits, validate_spec
from memtune.profiler.zoo import ZOO, ZOO_NAMES, build, deep_vgg_groups, gpt_param_count, image_spec, zoo_params

TINY_GPT = {"layers": 2, "width": 64, "heads": 4, "seq_len": 16, "vocab": 100}
DEEP_VGGS = ("vgg116", "vgg216", "vgg316", "vgg416", "vgg516")


def _param_count(chain: ModelChain) -> int:
    return sum(p.numel() for p in chain.as_sequential().parameters())


def _kinds(chain: ModelChain) -> Counter[str]:
    return Counter(stage.kind for stage in chain.stages)


def _input(chain: ModelChain, batch: int = 2, device: str = "cpu") -> torch.Tensor:
    if chain.input_kind == "tokens":
        return torch.randint(0, chain.vocab_size, (batch, *chain.input_shape), device=device)
    return torch.randn(batch, *chain.input_shape, device=device)


def _forward_backward(chain: ModelChain) -> torch.Tensor:
    model = chain.as_sequential().train()
    out: torch.Tensor = model(_input(chain))
    out.float().square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"no gradient for {name}"
    return out


def test_zoo_names_are_the_promised_set() -> None:
    expected = (
        "vgg16",
        "vgg19",
        *DEEP_VGGS,
        "alexnet",
        "overfeat",
        "resnet18",
        "resnet50",
        "gpt",
    )
    assert expected == ZOO_NAMES
    assert set(ZOO) == set(ZOO_NAMES)


@pytest.mark.parametrize(
    ("name", "size"), [("vgg16", 32), ("alexnet", 63), ("overfeat", 71), ("resnet18", 32), ("resnet50", 32)]
)
@pytest.mark.slow
def test_image_model_runs_forward_and_backward_on_cpu(name: str, size: int) -> None:
    torch.manual_seed(0)
    chain = build(name, {"image_size": size, "num_classes": 10})
    out = _forward_backward(chain)
    assert out.shape == (2, 10)
    assert torch.isfinite(out).all()
    assert chain.input_shape == (3, size, size)
    assert chain.input_kind == "image"


@pytest.mark.parametrize("name", ("vgg19", *DEEP_VGGS))
def test_vgg_variants_forward_and_backward_shapes(name: str) -> None:
    # VGG-16 runs for real above; its deeper variants (100M+ parameters each, the same module types) are
    # run by torch on the meta device, which checks every shape and the autograd graph without memory.
    with torch.device("meta"):
        chain = build(name, {"image_size": 32, "num_classes": 10})
        model = chain.as_sequential()
        out = model(torch.randn(2, 3, 32, 32))
        out.sum().backward()
    assert out.shape == (2, 10)
    assert all(p.grad is not None for p in model.parameters())


def test_gpt_runs_forward_and_backward_on_cpu() -> None:
    torch.manual_seed(0)
    chain = build("gpt", TINY_GPT)
    out = _forward_backward(chain)
    assert out.shape == (2, 16, 100)
    assert chain.input_shape == (16,)
    assert chain.input_kind == "tokens"
    assert chain.vocab_size == 100


def test_gpt_is_causal() -> None:
    torch.manual_seed(0)
    model = build("gpt", TINY_GPT).as_sequential().eval()
    ids = torch.randint(0, 100, (1, 16))
    changed = ids.clone()
    changed[0, 10] = (ids[0, 10] + 1) % 100
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_gpt_stages() -> None:
    chain = build("gpt", {**TINY_GPT, "layers": 3})
    assert [s.kind for s in chain.stages] == [
        "embedding",
        "transformer",
        "transformer",
        "transformer",
        "layernorm",
        "linear",
    ]
    assert [s.name for s in chain.stages] == ["embed", "blocks.0", "blocks.1", "blocks.2", "ln_f", "head"]
    assert isinstance(chain.stages[0].module, TokenPositionEmbedding)
    block = chain.stages[1].module
    assert isinstance(block, TransformerBlock)
    assert block.causal
    assert block.fc1.out_features == 4 * 64


def test_vgg16_stages_follow_torchvision() -> None:
    with torch.device("meta"):
        chain = build("vgg16")
    assert len(chain) == 40  # 13 conv + 13 relu + 5 pool, avgpool, flatten, 7 classifier modules
    assert _kinds(chain) == Counter(
        conv2d=13, relu=15, maxpool2d=5, adaptiveavgpool2d=1, flatten=1, linear=3, dropout=2
    )
    names = [s.name for s in chain.stages]
    assert names[:3] == ["features.0", "features.1", "features.2"]
    assert names[30:33] == ["features.30", "avgpool", "flatten"]
    assert names[-1] == "classifier.6"
    assert [s.kind for s in chain.stages[-7:]] == ["linear", "relu", "dropout", "linear", "relu", "dropout", "linear"]
    relus = [s.module for s in chain.stages if s.kind == "relu"]
    assert all(isinstance(m, nn.ReLU) and m.inplace for m in relus)
    first = chain.stages[0].module
    assert isinstance(first, nn.Conv2d)
    assert (first.in_channels, first.out_channels, first.kernel_size, first.padding) == (3, 64, (3, 3), (1, 1))
    pool = chain.stages[31].module
    assert isinstance(pool, nn.AdaptiveAvgPool2d)
    assert pool.output_size == (7, 7)


def test_vgg19_stage_count() -> None:
    with torch.device("meta"):
        chain = build("vgg19")
    assert len(chain) == 46
    assert _kinds(chain)["conv2d"] == 16


@pytest.mark.parametrize(("name", "hundreds"), [(n, k) for k, n in enumerate(DEEP_VGGS, start=1)])
def test_deep_vgg_follows_vdnn_section_4_3(name: str, hundreds: int) -> None:
    groups = deep_vgg_groups(hundreds)
    assert groups == tuple(n + 20 * hundreds for n in (2, 2, 3, 3, 3))
    with torch.device("meta"):
        chain = build(name)
    convs = [s.module for s in chain.stages if s.kind == "conv2d"]
    assert len(convs) == 13 + 100 * hundreds
    assert len(convs) + _kinds(chain)["linear"] == int(name[3:])  # weight layers = the name's number
    assert _kinds(chain)["maxpool2d"] == 5
    widths = [m.out_channels for m in convs if isinstance(m, nn.Conv2d)]
    expected = [w for w, n in zip((64, 128, 256, 512, 512), groups, strict=True) for _ in range(n)]
    assert widths == expected
    assert all(isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3) and m.padding == (1, 1) for m in convs)


def test_alexnet_and_overfeat_stages() -> None:
    with torch.device("meta"):
        alexnet = build("alexnet")
        overfeat = build("overfeat")
    assert len(alexnet) == 22
    assert _kinds(alexnet) == Counter(
        conv2d=5, relu=7, maxpool2d=3, adaptiveavgpool2d=1, flatten=1, dropout=2, linear=3
    )
    assert len(overfeat) == 21
    assert _kinds(overfeat) == Counter(conv2d=5, relu=7, maxpool2d=3, flatten=1, dropout=2, linear=3)
    assert overfeat.input_shape == (3, 231, 231)
    convs = [m for s in overfeat.stages for _, m in conv_modules(s)]
    assert [(c.out_channels, c.kernel_size[0], c.stride[0]) for c in convs] == [
        (96, 11, 4),
        (256, 5, 1),
        (512, 3, 1),
        (1024, 3, 1),
        (1024, 3, 1),
    ]
    fc6 = overfeat.stages[14].module
    assert isinstance(fc6, nn.Linear)
    assert (fc6.in_features, fc6.out_features) == (1024 * 6 * 6, 3072)  # 6x6 maps at 231x231


@pytest.mark.parametrize(("name", "blocks", "kind"), [("resnet18", 8, BasicBlock), ("resnet50", 16, Bottleneck)])
def test_resnet_stages(name: str, blocks: int, kind: type[nn.Module]) -> None:
    with torch.device("meta"):
        chain = build(name)
    assert len(chain) == 4 + blocks + 3
    assert [s.name for s in chain.stages[:4]] == ["conv1", "bn1", "relu", "maxpool"]
    assert [s.kind for s in chain.stages[:4]] == ["conv2d", "batchnorm2d", "relu", "maxpool2d"]
    residual = [s for s in chain.stages if s.kind == "residual"]
    assert len(residual) == blocks
    assert all(isinstance(s.module, kind) for s in residual)
    assert [s.name for s in chain.stages[-3:]] == ["avgpool", "flatten", "fc"]
    # Every stride-2 block and the first bottleneck have a projection shortcut; convs inside count too.
    first = residual[0].module
    assert (first.downsample is not None) == (kind is Bottleneck)
    assert len(list(conv_modules(residual[-1]))) == (2 if kind is BasicBlock else 3)


@pytest.mark.parametrize(
    ("name", "count"),
    [("vgg16", 138_357_544), ("resnet18", 11_689_512), ("resnet50", 25_557_032), ("alexnet", 61_100_840)],
)
def test_parameter_counts_match_torchvision(name: str, count: int) -> None:
    with torch.device("meta"):
        chain = build(name)
    assert _param_count(chain) == count


def test_overfeat_parameter_count_matches_the_paper_layout() -> None:
    # conv 96x3x11x11, 256x96x5x5, 512x256x3x3, 1024x512x3x3, 1024x1024x3x3, FC 36864->3072->4096->1000.
    expected = sum(
        o * i * k * k + o for o, i, k in [(96, 3, 11), (256, 96, 5), (512, 256, 3), (1024, 512, 3), (1024, 1024, 3)]
    )
    expected += sum(i * o + o for i, o in [(36864, 3072), (3072, 4096), (4096, 1000)])
    with torch.device("meta"):
        assert _param_count(build("overfeat")) == expected == 145_920_872


@pytest.mark.parametrize("name", [n for n in ZOO_NAMES if n != "gpt"])
def test_analytic_parameter_count_equals_built(name: str) -> None:
    params = {"image_size": 80, "num_classes": 17}
    validated = validate_spec(image_spec(name, params), SpecLimits(max_layers=4096))
    with torch.device("meta"):
        assert _param_count(build(name, params)) == validated.param_count


def test_gpt_analytic_parameter_count_equals_built() -> None:
    params = {**zoo_params("gpt"), **TINY_GPT, "mlp_ratio": 3}
    assert _param_count(build("gpt", params)) == gpt_param_count(params)
    with torch.device("meta"):
        assert _param_count(build("gpt")) == gpt_param_count(zoo_params("gpt"))


def test_chain_carries_name_and_resolved_params() -> None:
    with torch.device("meta"):
        chain = build("VGG-16", {"image_size": "48"})
    assert chain.name == "vgg16"
    assert chain.params == {"num_classes": 1000, "image_size": 48}
    assert build("gpt", TINY_GPT).params == {**TINY_GPT, "mlp_ratio": 4}


@pytest.mark.parametrize(
    ("given", "canonical"),
    [("VGG-16", "vgg16"), ("ResNet50", "resnet50"), ("resnet_18", "resnet18"), ("Vgg_116", "vgg116"), ("GPT", "gpt")],
)
def test_names_are_case_and_separator_insensitive(given: str, canonical: str) -> None:
    assert zoo_params(given) == zoo_params(canonical)
    with torch.device("meta"):
        assert build(given, {"num_classes": 5} if canonical != "gpt" else TINY_GPT).name == canonical


def test_defaults() -> None:
    assert zoo_params("vgg16") == {"num_classes": 1000, "image_size": 224}
    assert zoo_params("overfeat") == {"num_classes": 1000, "image_size": 231}
    assert zoo_params("gpt") == {
        "layers": 24,
        "width": 1024,
        "heads": 16,
        "seq_len": 1024,
        "vocab": 50304,
        "mlp_ratio": 4,
    }


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(SpecError) as info:
        build("vgg17")
    assert info.value.field == "model"
    message = str(info.value)
    assert "'vgg17'" in message
    assert all(name in message for name in ZOO_NAMES)


@pytest.mark.parametrize(
    ("name", "params", "field", "fragment"),
    [
        ("vgg16", {"depth": 3}, "depth", "image_size (32..4096, default 224)"),
        ("vgg16", {"image_size": 31}, "image_size", "32..4096"),
        ("alexnet", {"image_size": 62}, "image_size", "63..4096"),
        ("overfeat", {"image_size": 70}, "image_size", "71..4096"),
        ("resnet50", {"num_classes": 0}, "num_classes", "1..1000000"),
        ("resnet50", {"num_classes": 2.5}, "num_classes", "must be an integer"),
        ("resnet50", {"num_classes": True}, "num_classes", "must be an integer"),
        ("resnet50", {"num_classes": "ten"}, "num_classes", "must be an integer"),
        ("gpt", {"heads": 3}, "heads", "do not divide width 1024"),
        ("gpt", {"image_size": 32}, "image_size", "layers (1..1024, default 24)"),
    ],
)
def test_bad_params_name_the_field_and_range(name: str, params: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        build(name, params)
    assert info.value.field == field
    assert f"field {field!r}" in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize("name", [n for n in ZOO_NAMES if n != "gpt"])
def test_declared_minimum_image_size_is_tight(name: str) -> None:
    minimum = next(p.minimum for p in ZOO[name].params if p.name == "image_size")
    spec = image_spec(name, {"image_size": minimum, "num_classes": 10})
    limits = SpecLimits(max_layers=4096)
    validate_spec(spec, limits)
    if minimum > 1:
        spec["input_shape"] = [3, minimum - 1, minimum - 1]
        with pytest.raises(SpecError, match="is larger than the input"):
            validate_spec(spec, limits)


def test_image_spec_refuses_gpt() -> None:
    with pytest.raises(SpecError) as info:
        image_spec("gpt")
    assert info.value.field == "model"


def test_gpt_too_large_is_refused_before_allocation() -> None:
    with pytest.raises(SpecError) as info:
        build("gpt", {"layers": 1024, "width": 65536, "heads": 64})
    assert info.value.field == "layers"
    assert "parameters" in str(info.value)
