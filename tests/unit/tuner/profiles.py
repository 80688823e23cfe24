"""A hand-made conv profile for the policy tests: every number chosen so the rules can be checked by hand.

The chain is conv1 - relu1 - conv2 - relu2 - pool - fc1 - relu3 - fc2 (8 stages). ReLUs are in place, so
a conv's output storage is saved by the ReLU after it (as its output) and by the next layer (as its
input), as NOTE [ Saved storages ] describes:

====  =======================  ========  ===========  ==========  =====================
sid   storage                  MiB       producer     saved_by    first saver (S_i)
====  =======================  ========  ===========  ==========  =====================
0     model input              12        -1           (0,)        conv1
1     conv1 out (relu1 in/out) 64        0 conv1      (1, 2)      relu1
2     conv2 out (relu2 in/out) 64        2 conv2      (3, 4)      relu2
3     pool indices             16        4 pool       (4,)        pool
4     pool out                 16        4 pool       (5,)        fc1
5     fc1 out (relu3 in/out)   4         5 fc1        (6, 7)      relu3
6     logits                   1         7 fc2        ()          nobody
====  =======================  ========  ===========  ==========  =====================

Copies: D2H 0.125 ms per MiB (the device's 8.388608 GB/s = 8 MiB per ms), H2D four times faster.
Forward ms per stage: ``FORWARD_MS``; backward is twice forward.
"""

from __future__ import annotations

from profiler.profile import ConvAlgo, ConvProfile, DeviceIdentity, Profile, SavedStorage, StageProfile

__all__ = ["FORWARD_MS", "MiB", "conv_profile"]

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
        {"pass": pass_, "algo": algo, "name": f"ALGO_{algo}", "ms": ms, "workspace_bytes": ws_mib * MiB, "status": status}
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


def conv_profile() -> Profile:
    """The 8-stage conv chain of the module docstring."""
    storages = (
        SavedStorage(bytes=12 * MiB, saved_by=(0,), producer=-1),
        SavedStorage(bytes=64 * MiB, saved_by=(1, 2), producer=0),
        SavedStorage(bytes=64 * MiB, saved_by=(3, 4), producer=2),
        SavedStorage(bytes=16 * MiB, saved_by=(4,), producer=4),
        SavedStorage(bytes=16 * MiB, saved_by=(5,), producer=4),
        SavedStorage(bytes=4 * MiB, saved_by=(6, 7), producer=5),
        SavedStorage(bytes=1 * MiB, saved_by=(), producer=7),
    )
    # (name, kind, output MiB, output storage, S_i MiB, param MiB, inplace, convs)
    rows = (
        ("conv1", "conv2d", 64, 1, 12, 1, False, (_conv(3, 64, CONV1_ALGOS),)),
        ("relu1", "relu", 64, 1, 64, 0, True, ()),
        ("conv2", "conv2d", 64, 2, 0, 2, False, (_conv(64, 64, CONV2_ALGOS),)),
        ("relu2", "relu", 64, 2, 64, 0, True, ()),
        ("pool", "maxpool2d", 16, 4, 16, 0, False, ()),
        ("fc1", "linear", 4, 5, 16, 8, False, ()),
        ("relu3", "relu", 4, 5, 4, 0, True, ()),
        ("fc2", "linear", 1, 6, 0, 1, False, ()),
    )
    stages = []
    for k, (name, kind, out_mib, out_sid, s_mib, p_mib, inplace, convs) in enumerate(rows):
        stages.append(
            StageProfile(
                index=k,
                name=name,
                kind=kind,
                forward_ms=FORWARD_MS[k],
                backward_ms=2 * FORWARD_MS[k],
                output_bytes=out_mib * MiB,
                inplace=inplace,
                output_storage=out_sid,
                saved_bytes=s_mib * MiB,
                param_bytes=p_mib * MiB,
                d2h_ms=s_mib * D2H_MS_PER_MIB,
                h2d_ms=s_mib * H2D_MS_PER_MIB,
                convs=convs,
            )
        )
    return Profile(
        model="conv-chain",
        batch=8,
        dtype="float32",
        input_shape=(3, 32, 32),
        input_bytes=12 * MiB,
        device=DEVICE,
        source="modeled",
        compute_source="hand-made",
        transfer_source="hand-made",
        stages=tuple(stages),
        storages=storages,
    )
