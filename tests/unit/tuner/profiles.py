"""A hand-made conv profile for the policy tests: every number chosen so the rules can be checked by hand.

``conv_profile()`` is conv1 - relu1 - conv2 - relu2 - pool - fc1 - relu3 - fc2 (8 stages). ReLUs are in place, so
a conv's output storage is saved by the ReLU after it (as its output) and by the next layer (as its
input), as NOTE [ Saved storages ] describes:

====  =======================  ========  ===========  ==========  =====================
sid   storage                  MiB       producer     saved_by    first saver (S_i)
====  =======================  ========  ===========  ==========  =====================
0     model input              12        -1           (0,)        conv1
1     conv1 out (relu1 in/out) 64        0 conv1      (1, 2)      relu1
2     conv2 out (relu2 in/out) 64        2 conv2      (3, 4)      relu2
3     pool out                 16        4 pool       (5,)        fc1
4     pool indices             16        4 pool       (4,)        pool
5     fc1 out (relu3 in/out)   4         5 fc1        (6, 7)      relu3
6     logits                   1         7 fc2        ()          nobody
====  =======================  ========  ===========  ==========  =====================

Copies: D2H 0.125 ms per MiB (the device's 8.388608 GB/s = 8 MiB per ms), H2D four times faster.
Forward ms per stage: ``FORWARD_MS``; backward is twice forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from memtune.profiler._profile import (
    ConvAlgo,
    ConvProfile,
    DeviceIdentity,
    Profile,
    SavedStorage,
    StageProfile,
)

__all__ = ["FORWARD_MS", "Layer", "MiB", "chain_profile", "conv_profile"]

MiB = 1 << 20
D2H_MS_PER_MIB = 0.125
H2D_MS_PER_MIB = D2H_MS_PER_MIB / 4
FORWARD_MS = (4.0, 0.5, 10.0, 0.5, 1.0, 1.25, 0.1, 0.25)
DEVICE = DeviceIdentity(
    name="Test GPU",
    key="test",
    memory_bytes=16 << 30,
    d2h_gbps=MiB / D2H_MS_PER_MIB / 1e6,
    h2d_gbps=MiB / H2D_MS_PER_MIB / 1e6,
)


def _algo(pass_: str, algo: int, ms: float | None, ws_mib: int, status: str = "ok") -> ConvAlgo:
    return ConvAlgo.model_validate(
        {
            "pass": pass_,
            "algo": algo,
            "name": f"ALGO_{algo}",
            "ms": ms,
            "workspace_bytes": ws_mib * MiB,
            "status": status,
        }
    )


#: conv1: fwd ladder 1 (100 MiB) -> 2 (10) -> 0 (0); bwd_data 1 (50) -> 0; bwd_filter 1 (20) -> 0
#: (algo 3 is slower than 1 and needs more workspace: never on the ladder)
CONV1_ALGOS = (
    _algo("fwd", 0, 5.0, 0),
    _algo("fwd", 1, 1.0, 100),
    _algo("fwd", 2, 2.0, 10),
    _algo("bwd_data", 0, 4.0, 0),
    _algo("bwd_data", 1, 2.0, 50),
    _algo("bwd_filter", 0, 6.0, 0),
    _algo("bwd_filter", 1, 2.0, 20),
    _algo("bwd_filter", 3, 2.5, 30),
)
#: conv2: fwd 1 (40 MiB) -> 0 (0); algo 5 failed; one algorithm for each backward pass
CONV2_ALGOS = (
    _algo("fwd", 0, 8.0, 0),
    _algo("fwd", 1, 3.0, 40),
    _algo("fwd", 5, None, 0, status="failed"),
    _algo("bwd_data", 0, 6.0, 0),
    _algo("bwd_filter", 0, 6.0, 0),
)


def _conv(cin: int, cout: int, algos: tuple[ConvAlgo, ...]) -> ConvProfile:
    return ConvProfile(
        name="",
        in_channels=cin,
        out_channels=cout,
        kernel_size=(3, 3),
        stride=(1, 1),
        padding=(1, 1),
        input_hw=(32, 32),
        algos=algos,
    )


@dataclass(frozen=True)
class Layer:
    """One stage of a hand-made chain: what it costs and which tensors autograd saves for it (MiB, ms)."""

    name: str
    kind: str
    forward_ms: float
    out_mib: int
    param_mib: int = 0
    inplace: bool = False  # output shares the input's storage; saves it (as its output)
    saves_input: bool = False
    extra_mib: int = 0  # a storage of its own it saves, e.g. max-pool indices
    convs: tuple[ConvProfile, ...] = ()


def chain_profile(layers: list[Layer], *, input_mib: int = 12, model: str = "conv-chain") -> Profile:
    """Build a profile from layers: storages, saved_by, S_i and copy times follow from the flags."""
    sizes = [input_mib]
    producers = [-1]
    savers: list[list[int]] = [[]]
    cur = 0  # storage holding x_{k-1}
    stages_out: list[int] = []
    for k, layer in enumerate(layers):
        if layer.saves_input:
            savers[cur].append(k)
        if layer.inplace:
            out = cur
            savers[cur].append(k)
        else:
            out = len(sizes)
            sizes.append(layer.out_mib)
            producers.append(k)
            savers.append([])
        if layer.extra_mib:
            sizes.append(layer.extra_mib)
            producers.append(k)
            savers.append([k])
        stages_out.append(out)
        cur = out
    storages = tuple(
        SavedStorage(bytes=b * MiB, saved_by=tuple(sorted(set(by))), producer=p)
        for b, by, p in zip(sizes, savers, producers, strict=True)
    )
    first_mib = [0] * len(layers)
    for b, by in zip(sizes, savers, strict=True):
        if by:
            first_mib[min(by)] += b
    stages = tuple(
        StageProfile(
            index=k,
            name=layer.name,
            kind=layer.kind,
            forward_ms=layer.forward_ms,
            backward_ms=2 * layer.forward_ms,
            output_bytes=sizes[stages_out[k]] * MiB,
            inplace=layer.inplace,
            output_storage=stages_out[k],
            saved_bytes=first_mib[k] * MiB,
            param_bytes=layer.param_mib * MiB,
            d2h_ms=first_mib[k] * D2H_MS_PER_MIB,
            h2d_ms=first_mib[k] * H2D_MS_PER_MIB,
            convs=layer.convs,
        )
        for k, layer in enumerate(layers)
    )
    return Profile(
        model=model,
        batch=8,
        dtype="float32",
        input_shape=(3, 32, 32),
        input_bytes=input_mib * MiB,
        device=DEVICE,
        source="modeled",
        compute_source="hand-made",
        transfer_source="hand-made",
        stages=stages,
        storages=storages,
    )


def conv_profile(blocks: int = 1) -> Profile:
    """``blocks`` x (conv1 - relu1 - conv2 - relu2 - pool), then fc1 - relu3 - fc2.

    With one block this is the 8-stage chain of the module docstring (``FORWARD_MS``); only the first
    block's convolutions carry algorithm tables. More blocks give a deeper chain whose peak is set by
    saved activations, so offloading policies differ in the simulator.
    """
    f = FORWARD_MS
    layers: list[Layer] = []
    for b in range(blocks):
        tables = b == 0
        layers += [
            Layer(
                f"conv1.{b}",
                "conv2d",
                f[0],
                64,
                1,
                saves_input=True,
                convs=(_conv(3, 64, CONV1_ALGOS),) if tables else (),
            ),
            Layer(f"relu1.{b}", "relu", f[1], 64, inplace=True),
            Layer(
                f"conv2.{b}",
                "conv2d",
                f[2],
                64,
                2,
                saves_input=True,
                convs=(_conv(64, 64, CONV2_ALGOS),) if tables else (),
            ),
            Layer(f"relu2.{b}", "relu", f[3], 64, inplace=True),
            Layer(f"pool.{b}", "maxpool2d", f[4], 16, saves_input=True, extra_mib=16),
        ]
    layers += [
        Layer("fc1", "linear", f[5], 4, 8, saves_input=True),
        Layer("relu3", "relu", f[6], 4, inplace=True),
        Layer("fc2", "linear", f[7], 1, 1, saves_input=True),
    ]
    return chain_profile(layers)
