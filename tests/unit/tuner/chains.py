"""Hand-made profiles for tuner tests: chains whose numbers are chosen, so rules can be checked by hand."""

from __future__ import annotations

from memtune.profiler._profile import DeviceIdentity, Profile, SavedStorage, StageProfile

MiB = 1 << 20
DEVICE = DeviceIdentity(name="Test GPU", key="test", memory_bytes=16 << 30, d2h_gbps=10.0, h2d_gbps=10.0)


def linear_chain(
    n: int = 6,
    *,
    forward_ms: float = 1.0,
    saved_mib: int = 100,
    copy_ms: float | None = None,
    param_mib: int = 10,
) -> Profile:
    """A chain of ``n`` stages; stage k produces x_k (``saved_mib`` MiB) which stage k+1 saves as its input.

    Each storage is x_k, saved by stage k+1 (the last stage's output is saved by nobody). Copy times are
    ``copy_ms`` per storage when given, else bytes / 10 GB/s.
    """
    b = saved_mib * MiB
    copy = b / 10e6 if copy_ms is None else copy_ms
    storages = [SavedStorage(bytes=b, saved_by=(k + 1,), producer=k) for k in range(n - 1)]
    storages.append(SavedStorage(bytes=b, saved_by=(), producer=n - 1))
    stages = []
    for k in range(n):
        owned = b if k >= 1 else 0  # stage k is first to save x_{k-1}
        stages.append(
            StageProfile(
                index=k,
                name=f"s{k}",
                kind="linear",
                forward_ms=forward_ms,
                backward_ms=2 * forward_ms,
                output_bytes=b,
                output_storage=k,
                saved_bytes=owned,
                param_bytes=param_mib * MiB,
                d2h_ms=copy if owned else 0.0,
                h2d_ms=copy if owned else 0.0,
            )
        )
    return Profile(
        model="linear-chain",
        batch=1,
        dtype="float32",
        input_shape=(1,),
        input_bytes=b,
        device=DEVICE,
        source="modeled",
        compute_source="hand-made",
        transfer_source="hand-made",
        stages=tuple(stages),
        storages=tuple(storages),
    )
