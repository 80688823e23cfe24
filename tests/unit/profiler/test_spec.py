"""JSON model specs: analytic shapes and counts equal what torch builds; every error names layer and field."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memtune.profiler.spec as spec_module
from memtune.profiler._layers import BasicBlock, Bottleneck, TransformerBlock
from memtune.profiler.chain import ModelChain
from memtune.profiler.profiler_errors import SpecError
from memtune.profiler.spec import LAYER_TYPES, SpecLimits, from_spec, spec_hash, validate_spec

CNN: dict[str, Any] = {
    "name": "every-image-layer",
    "input_shape": [3, 33, 30],
    "layers": [
        {"type": "conv2d", "out_channels": 8, "kernel_size": [5, 3], "stride": [2, 1], "padding": [1, 2]},
        {"type": "batchnorm2d"},
        {"type": "relu", "inplace": True},
        {"type": "maxpool2d", "kernel_size": 3, "stride": 2, "padding": 1},
        {"type": "residual", "kind": "basic", "channels": 8},
        {"type": "residual", "kind": "basic", "channels": 16, "stride": 2},
        {"type": "residual", "kind": "bottleneck", "channels": 4, "stride": 2},
        {"type": "residual", "kind": "bottleneck", "channels": 4},
        {"type": "avgpool2d", "kernel_size": 2, "stride": 1},
        {"type": "relu"},
        {"type": "adaptive_avgpool2d", "output_size": [2, 3]},
        {"type": "flatten"},
        {"type": "dropout", "p": 0.25},
        {"type": "linear", "out_features": 12, "bias": False},
        {"type": "relu"},
        {"type": "linear", "out_features": 5},
    ],
}

SEQ: dict[str, Any] = {
    "input_shape": [12, 32],
    "layers": [
        {"type": "transformer", "heads": 4, "causal": True},
        {"type": "transformer", "heads": 2, "mlp_ratio": 2},
        {"type": "linear", "out_features": 7},
        {"type": "flatten"},
        {"type": "linear", "out_features": 3},
    ],
}


def _run_stages(chain: ModelChain, x: torch.Tensor) -> list[tuple[int, ...]]:
    shapes = []
    for stage in chain.stages:
        x = stage.module(x)
        shapes.append(tuple(x.shape[1:]))
    return shapes


@pytest.mark.parametrize("spec", [CNN, SEQ], ids=["cnn", "sequence"])
def test_analytic_shapes_and_params_equal_the_built_model(spec: dict[str, Any]) -> None:
    torch.manual_seed(0)
    validated = validate_spec(spec)
    chain = from_spec(spec)
    assert len(chain) == len(spec["layers"])
    x = torch.randn(2, *spec["input_shape"], requires_grad=True)
    assert _run_stages(chain, x) == [info.output_shape for info in validated.layers]
    assert sum(p.numel() for p in chain.as_sequential().parameters()) == validated.param_count
    for stage, info in zip(chain.stages, validated.layers, strict=True):
        assert sum(p.numel() for p in stage.module.parameters()) == info.param_count, stage.name
    out = chain.as_sequential()(x)
    out.square().mean().backward()
    assert x.grad is not None
    assert validated.output_shape == tuple(out.shape[1:])


def test_stage_kinds_and_modules() -> None:
    chain = from_spec(CNN)
    kinds = [s.kind for s in chain.stages]
    assert kinds[:4] == ["conv2d", "batchnorm2d", "relu", "maxpool2d"]
    assert kinds[4:8] == ["residual"] * 4
    assert kinds[8:] == ["avgpool2d", "relu", "adaptiveavgpool2d", "flatten", "dropout", "linear", "relu", "linear"]
    assert isinstance(chain.stages[4].module, BasicBlock)
    assert isinstance(chain.stages[6].module, Bottleneck)
    assert chain.stages[2].module.inplace
    assert chain.stages[13].module.bias is None
    seq = from_spec(SEQ)
    first, second = seq.stages[0].module, seq.stages[1].module
    assert isinstance(first, TransformerBlock)
    assert isinstance(second, TransformerBlock)
    assert first.causal
    assert not second.causal
    assert second.fc1.out_features == 64


def test_causal_flag_is_respected() -> None:
    torch.manual_seed(0)
    layer: dict[str, Any] = {"type": "transformer", "heads": 2, "causal": True}
    spec = {"input_shape": [6, 16], "layers": [layer]}
    block = from_spec(spec).as_sequential().eval()
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[0, 4] = torch.randn(16)  # not a constant shift: LayerNorm would remove that
    with torch.no_grad():
        torch.testing.assert_close(block(x)[:, :4], block(y)[:, :4])
    layer["causal"] = False
    encoder = from_spec(spec).as_sequential().eval()
    with torch.no_grad():
        assert not torch.allclose(encoder(x)[:, :4], encoder(y)[:, :4])


def test_chain_name_and_params() -> None:
    chain = from_spec(CNN)
    digest = spec_hash(CNN)
    assert chain.name == f"spec:{digest}"
    assert chain.params == {"spec_hash": digest, "spec_name": "every-image-layer"}
    assert from_spec({**CNN, "name": "My CNN (v2)"}).params["spec_name"] == "My CNN (v2)"
    assert chain.input_shape == (3, 33, 30)
    assert chain.input_kind == "image"
    assert [s.name for s in chain.stages][:3] == ["0", "1", "2"]
    named = copy.deepcopy(CNN)
    named["layers"][0]["name"] = "stem.conv"
    assert from_spec(named).stages[0].name == "stem.conv"


def test_activation_bytes_are_counted_per_sample() -> None:
    spec = {
        "input_shape": [2, 4, 4],
        "layers": [
            {"type": "conv2d", "out_channels": 3, "kernel_size": 3, "padding": 1},  # 3*4*4 floats
            {"type": "relu", "inplace": True},  # nothing new
            {"type": "relu"},  # 48 floats
            {"type": "maxpool2d", "kernel_size": 2},  # 3*2*2 floats + int64 indices
            {"type": "flatten"},  # a view
            {"type": "dropout"},  # 12 floats + 12 bool mask bytes
        ],
    }
    validated = validate_spec(spec)
    assert [i.activation_bytes for i in validated.layers] == [192, 0, 192, 12 * 12, 0, 12 * 5]
    assert validated.activation_bytes == 192 + 192 + 144 + 60


def test_spec_hash_is_canonical() -> None:
    base = spec_hash(CNN)
    assert len(base) == 64
    assert int(base, 16) >= 0
    # Key order, written-out defaults, n vs [n, n] and labels do not change the architecture.
    reordered = json.loads(json.dumps(CNN, sort_keys=True))
    assert spec_hash(reordered) == base
    explicit = copy.deepcopy(CNN)
    explicit["layers"][4].update(stride=1)
    explicit["layers"][9].update(inplace=False)
    explicit["layers"][3]["kernel_size"] = [3, 3]
    explicit["layers"][15].update(bias=True, name="head")
    explicit["name"] = "another-label"
    assert spec_hash(explicit) == base
    assert spec_hash(validate_spec(CNN)) == base
    # Any architectural change does.
    for path, value in [(("layers", 0, "out_channels"), 9), (("layers", 12, "p"), 0.5), (("input_shape", 1), 32)]:
        changed = copy.deepcopy(CNN)
        target: Any = changed
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        assert spec_hash(changed) != base, path


def test_spec_hash_is_stable_across_versions() -> None:
    # Pinned: stored profiles are keyed by it. Change only with SPEC_VERSION.
    spec = {"input_shape": [3, 8, 8], "layers": [{"type": "conv2d", "out_channels": 4, "kernel_size": 3}]}
    canonical = validate_spec(spec).canonical()
    assert canonical == {
        "spec_version": 1,
        "input_shape": [3, 8, 8],
        "layers": [
            {
                "type": "conv2d",
                "out_channels": 4,
                "kernel_size": [3, 3],
                "stride": [1, 1],
                "padding": [0, 0],
                "bias": True,
            }
        ],
    }
    assert spec_hash(spec) == "8968755cfa73f4deab49cb395fb4c40ce1c0ce22d0dd56bbc2bc6a2217f0eb1e"


def _image(*layers: object, shape: tuple[int, ...] = (3, 7, 7)) -> dict[str, Any]:
    return {"input_shape": list(shape), "layers": list(layers)}


RELU = {"type": "relu"}
CONV = {"type": "conv2d", "out_channels": 4, "kernel_size": 3}


@pytest.mark.parametrize(
    ("spec", "layer", "field", "fragment"),
    [
        (
            _image(RELU, RELU, RELU, {"type": "conv2d", "out_channels": 3, "kernel_size": 9}),
            3,
            "kernel_size",
            "9 is larger than the input 7x7 at this layer",
        ),
        (_image(RELU, {"type": "dense", "units": 3}), 1, "type", "allowed types: conv2d, batchnorm2d"),
        (_image({"type": "torch.nn.Linear"}), 0, "type", "unknown layer type 'torch.nn.Linear'"),
        (_image({"units": 3}), 0, "type", "every layer needs a 'type'"),
        (_image({**CONV, "out_channels": 4.0}), 0, "out_channels", "must be an integer, got 4.0"),
        (_image({**CONV, "out_channels": "4"}), 0, "out_channels", "must be an integer, got '4'"),
        (_image({**CONV, "out_channels": True}), 0, "out_channels", "must be an integer, got True"),
        (_image({**CONV, "out_channels": -4}), 0, "out_channels", "must be at least 1, got -4"),
        (_image({**CONV, "padding": -1}), 0, "padding", "must be at least 0"),
        (_image({**CONV, "kernel_size": [3, 3, 3]}), 0, "kernel_size", "list of two integers"),
        (_image({**CONV, "dilation": 2}), 0, "dilation", "allowed fields: name, out_channels, kernel_size"),
        (_image({"type": "conv2d", "kernel_size": 3}), 0, "out_channels", "is required for conv2d layers"),
        (_image({"type": "relu", "inplace": "yes"}), 0, "inplace", "must be true or false"),
        (_image({"type": "dropout", "p": 1.0}), 0, "p", "must be in [0, 1)"),
        (_image({"type": "residual", "kind": "wide", "channels": 4}), 0, "kind", "'basic' or 'bottleneck'"),
        (
            _image(CONV, {"type": "maxpool2d", "kernel_size": 2}, {"type": "maxpool2d", "kernel_size": 3}),
            2,
            "kernel_size",
            "3 is larger than the input 2x2 at this layer",
        ),
        (_image({"type": "maxpool2d", "kernel_size": 3, "padding": 2}), 0, "padding", "at most kernel_size // 2"),
        (_image(CONV, {"type": "linear", "out_features": 10}), 1, "type", 'add {"type": "flatten"}'),
        (_image({"type": "transformer", "heads": 2}), 0, "type", "needs a (seq_len, width) input"),
        (_image({"type": "flatten"}, CONV), 1, "type", "needs a (C, H, W) image input"),
        (_image(CONV, shape=(10, 64)), 0, "type", "(seq_len, width) = (10, 64)"),
        (_image({"type": "transformer", "heads": 5}, shape=(10, 64)), 0, "heads", "5 heads do not divide the width 64"),
        (_image(RELU, {**RELU, "name": "0"}), 1, "name", "already the name of layer 0"),
        (_image({**RELU, "name": "a b"}), 0, "name", "letters, digits"),
        (_image({"type": "flatten"}, {"type": "linear", "out_features": 2_000_000}), 1, "out_features", "max_dim"),
        (
            _image(
                {"type": "flatten"},
                {"type": "linear", "out_features": 50_000},
                {"type": "linear", "out_features": 50_000},
            ),
            2,
            "out_features",
            "above the limit of 2,000,000,000 (SpecLimits.max_params)",
        ),
        (
            _image({"type": "conv2d", "out_channels": 1024, "kernel_size": 1}, RELU, shape=(3, 4096, 4096)),
            1,
            None,
            "SpecLimits.max_activation_bytes",
        ),
        (_image(3), 0, None, 'each layer must be a JSON object like {"type": "relu"}'),
    ],
)
def test_layer_errors_name_layer_and_field(spec: dict[str, Any], layer: int, field: str | None, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    err = info.value
    assert err.layer == layer
    assert err.field == field
    message = str(err)
    prefix = f"layer {layer}" + (f", field {field!r}" if field else "")
    assert message.startswith(prefix + ":"), message
    assert fragment in message


@pytest.mark.parametrize(
    ("spec", "field", "fragment"),
    [
        ({"layers": [RELU]}, "input_shape", "is required"),
        ({"input_shape": [3, 7, 7, 1], "layers": [RELU]}, "input_shape", "[C, H, W] (images) or [seq_len, width]"),
        ({"input_shape": [3, 0, 7], "layers": [RELU]}, "input_shape", "at least 1"),
        ({"input_shape": [3, 7, 7], "layers": []}, "layers", "at least one layer"),
        ({"name": "bad\nlabel", "input_shape": [3, 7, 7], "layers": [RELU]}, "name", "printable characters"),
        ({"input_shape": [3, 7, 7], "layers": [RELU], "optimizer": "sgd"}, "optimizer", "allowed fields"),
        ({"input_shape": [3, 7, 7], "layers": [RELU] * 513}, "layers", "limit of 512 (SpecLimits.max_layers)"),
        ({"input_shape": [3, 7, 2_000_000], "layers": [RELU]}, "input_shape", "SpecLimits.max_dim"),
    ],
)
def test_spec_level_errors_name_the_field(spec: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    assert info.value.layer is None
    assert info.value.field == field
    assert fragment in str(info.value)


def test_not_a_mapping() -> None:
    with pytest.raises(SpecError, match="must be a JSON object"):
        validate_spec([RELU])  # type: ignore[arg-type]


def test_limits_are_overridable() -> None:
    long = _image(*[RELU] * 600)
    with pytest.raises(SpecError):
        validate_spec(long)
    assert len(validate_spec(long, SpecLimits(max_layers=600)).layers) == 600
    wide = _image({"type": "flatten"}, {"type": "linear", "out_features": 100})
    with pytest.raises(SpecError, match=r"SpecLimits\.max_params"):
        validate_spec(wide, SpecLimits(max_params=1000))


def test_huge_spec_is_refused_before_parsing_or_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_modules(*args: object) -> None:
        raise AssertionError("a module was built for an invalid spec")

    monkeypatch.setattr(spec_module, "_module", no_modules)
    started = time.perf_counter()
    with pytest.raises(SpecError, match="1000000 layers"):
        from_spec(_image(*[RELU] * 1_000_000))
    assert time.perf_counter() - started < 1.0
    with pytest.raises(SpecError, match="max_params"):
        from_spec(_image({"type": "flatten"}, {"type": "linear", "out_features": 1_000_000}, shape=(3, 64, 64)))


def test_many_errors_are_counted() -> None:
    with pytest.raises(SpecError, match=r"and 2 more problems"):
        validate_spec(_image({"type": "conv2d", "out_channels": -1, "kernel_size": 0, "stride": "x"}))


# Random stacks of windows: the analytic check accepts exactly what torch can run, with the same shapes.
_window_layer = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("conv2d"),
            "out_channels": st.integers(1, 3),
            "kernel_size": st.integers(1, 5) | st.lists(st.integers(1, 5), min_size=2, max_size=2),
            "stride": st.integers(1, 3),
            "padding": st.integers(0, 2),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["maxpool2d", "avgpool2d"]),
            "kernel_size": st.integers(1, 4),
            "stride": st.integers(1, 3),
            "padding": st.integers(0, 2),
        }
    ),
    st.fixed_dictionaries({"type": st.just("residual"), "kind": st.just("basic"), "channels": st.integers(1, 3)}),
)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layers=st.lists(_window_layer, min_size=1, max_size=4),
    height=st.integers(1, 12),
    width=st.integers(1, 12),
)
def test_analytic_check_agrees_with_torch(layers: list[dict[str, Any]], height: int, width: int) -> None:
    spec = {"input_shape": [2, height, width], "layers": layers}
    x = torch.randn(1, 2, height, width)
    try:
        validated = validate_spec(spec)
    except SpecError:
        accepted = False
    else:
        accepted = True
    if not accepted:
        with torch.no_grad(), pytest.raises(RuntimeError):
            for layer in layers:
                x = _build_one(layer, x.shape[1]).eval()(x)
        return
    chain = from_spec(spec)
    chain.as_sequential().eval()  # shares the stage modules; batch norm of one 1x1 sample needs eval mode
    with torch.no_grad():
        assert _run_stages(chain, x) == [info.output_shape for info in validated.layers]


def _build_one(layer: dict[str, Any], channels: int) -> torch.nn.Module:
    """Build a layer directly with torch (no analytic check), to see whether torch itself accepts it."""
    kind = layer["type"]
    if kind == "conv2d":
        return torch.nn.Conv2d(channels, layer["out_channels"], layer["kernel_size"], layer["stride"], layer["padding"])
    if kind == "maxpool2d":
        return torch.nn.MaxPool2d(layer["kernel_size"], layer["stride"], layer["padding"])
    if kind == "avgpool2d":
        return torch.nn.AvgPool2d(layer["kernel_size"], layer["stride"], layer["padding"])
    return BasicBlock(channels, layer["channels"])


def test_layer_types_are_the_documented_set() -> None:
    expected = (
        "conv2d",
        "batchnorm2d",
        "relu",
        "maxpool2d",
        "avgpool2d",
        "adaptive_avgpool2d",
        "flatten",
        "linear",
        "dropout",
        "residual",
        "transformer",
    )
    assert expected == LAYER_TYPES
