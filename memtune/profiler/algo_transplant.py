"""Algorithm tables for a modeled GPU, carried over from a measured profile of the same convolutions.

# NOTE [ Transplanted algorithm tables ]
A modeled profile (``memtune.profiler.modeled``) prices each stage by a roofline and carries no cuDNN algorithm tables,
so a plan's convolution rule changes nothing on it: vDNN's memory-optimal (``_m``) and performance-optimal (``_p``)
policies come out equal. The GPUs of the seed papers (a K40, a P100, a Titan X) cannot be measured here, so their
tables are carried over from a measured profile holding the same convolutions (same channels, kernel, stride,
padding, dilation, groups and input size), by these rules:

* Only the algorithms cuDNN had at the time are kept (``CUDNN_V4``: cuDNN 4.0, the library vDNN ran on, had no
  Winograd; forward implicit GEMM, precomputed implicit GEMM, GEMM, FFT and FFT tiling; backward data and filter
  algorithms 0-3). Only unsplit runs of the default math type are kept.
* Time: each algorithm takes the modeled convolution's time times its measured ratio to the measured
  framework's own time at the same shapes (``ConvProfile.default_ms`` / ``default_bwd_ms``): the modeled GPU keeps
  the roofline's time for the framework's choice and the measured GPU's spread between algorithms. The backward
  ratio is taken against the measured data and filter passes together. The modeled convolution's time is the
  stage's modeled time times the convolution's share of the stage's FLOPs.
* Workspace: the measured bytes times the batch ratio (modeled batch / measured batch): the workspaces of
  implicit GEMM with precomputed indices, GEMM and FFT hold per-sample buffers. The bytes are those of the cuDNN
  that was measured, not of cuDNN 4.0, whose sizes the papers do not list; the docs say so beside every result.

A convolution with no measured twin keeps an empty table (the framework's choice, as before). The transplant is a
model: the profile's ``compute_source`` names its source.
"""

from __future__ import annotations

from collections.abc import Mapping

from memtune.profiler._profile import ConvAlgo, ConvProfile, Profile, StageProfile

__all__ = ["CUDNN_V4", "transplant_algos"]

#: the algorithms of cuDNN 4.0 per pass (ids of ``cudnnConvolution*Algo_t``), NOTE [ Transplanted algorithm tables ]
CUDNN_V4: Mapping[str, frozenset[int]] = {
    "fwd": frozenset({0, 1, 2, 4, 5}),
    "bwd_data": frozenset({0, 1, 2, 3}),
    "bwd_filter": frozenset({0, 1, 2, 3}),
}

_Shape = tuple[int, int, tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int], int, tuple[int, int]]


def _shape(c: ConvProfile) -> _Shape:
    return (c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding, c.dilation, c.groups, c.input_hw)


def _conv_flops(c: ConvProfile, batch: int) -> float:
    """Multiply-adds x 2 of the convolution's forward (any padding), for its share of a stage's time."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = c.kernel_size, c.stride, c.padding, c.dilation
    h, w = c.input_hw
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return 2.0 * batch * c.out_channels * ho * wo * (c.in_channels // c.groups) * kh * kw


def _source_tables(source: Profile) -> dict[_Shape, ConvProfile]:
    out: dict[_Shape, ConvProfile] = {}
    for st in source.stages:
        for c in st.convs:
            if c.algos and c.default_ms and c.default_bwd_ms and c.batch:
                out.setdefault(_shape(c), c)
    return out


def _carried(
    twin: ConvProfile, fwd_ms: float, bwd_ms: float, batch: int, keep: Mapping[str, frozenset[int]]
) -> tuple[ConvAlgo, ...]:
    assert twin.default_ms and twin.default_bwd_ms and twin.batch  # _source_tables kept only these
    scale_ws = batch / twin.batch
    rows = []
    for a in twin.algos:
        if a.split != 1 or a.math_type != 0 or a.algo not in keep[a.pass_]:
            continue
        base, measured = (fwd_ms, twin.default_ms) if a.pass_ == "fwd" else (bwd_ms, twin.default_bwd_ms)
        ms = None if a.ms is None else base * a.ms / measured
        rows.append(a.model_copy(update={"ms": ms, "workspace_bytes": round(a.workspace_bytes * scale_ws)}))
    return tuple(rows)


def _stage_with_tables(
    st: StageProfile, twins: Mapping[_Shape, ConvProfile], batch: int, dtype: str, keep: Mapping[str, frozenset[int]]
) -> tuple[StageProfile, int]:
    if not st.convs:
        return st, 0
    total = st.flops or sum(_conv_flops(c, batch) for c in st.convs)
    convs, carried = [], 0
    for c in st.convs:
        twin = twins.get(_shape(c))
        if twin is None or total <= 0:
            convs.append(c)
            continue
        share = min(1.0, _conv_flops(c, batch) / total)
        fwd_ms, bwd_ms = st.forward_ms * share, st.backward_ms * share
        algos = _carried(twin, fwd_ms, bwd_ms, batch, keep)
        update = {"algos": algos, "default_ms": fwd_ms, "default_bwd_ms": bwd_ms, "batch": batch, "dtype": dtype}
        convs.append(c.model_copy(update=update))
        carried += 1
    return st.model_copy(update={"convs": tuple(convs)}), carried


def transplant_algos(
    profile: Profile, source: Profile, *, algorithms: Mapping[str, frozenset[int]] = CUDNN_V4
) -> Profile:
    """``profile`` with algorithm tables carried over from ``source`` (NOTE [ Transplanted algorithm tables ]).

    Args:
        profile: a modeled profile (any profile whose convolutions have no tables).
        source: a measured profile with algorithm tables (``memtune/profiler/data/vgg16-b256-float32-h100.json``).
        algorithms: the algorithm ids kept per pass; default cuDNN 4.0's.

    Returns:
        The profile with tables on every convolution that has a twin in ``source``, and ``compute_source``
        naming the source (``"<compute source>+algos:<source device>"``).

    Raises:
        ValueError: the two profiles differ in dtype, or ``source`` has no convolution twin of any of
            ``profile``'s convolutions.
    """
    if profile.dtype != source.dtype:
        raise ValueError(f"algorithm tables of a {source.dtype} profile cannot price a {profile.dtype} one")
    twins = _source_tables(source)
    stages, carried = [], 0
    for st in profile.stages:
        new, n = _stage_with_tables(st, twins, profile.batch, profile.dtype, algorithms)
        stages.append(new)
        carried += n
    if carried == 0 and any(st.convs for st in profile.stages):
        raise ValueError(
            f"{source.model!r} on {source.device.name} has no measured convolution with the shapes of "
            f"{profile.model!r}'s; carry tables over from a profile of the same convolutions"
        )
    device = source.device.name
    return profile.model_copy(
        update={"stages": tuple(stages), "compute_source": f"{profile.compute_source}+algos:{device}"}
    )
