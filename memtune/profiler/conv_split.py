"""Convolution passes run as batch chunks: the runner and its measurement (NOTE [ Batch split ]).

# NOTE [ Batch split ]
cuDNN's fastest convolution algorithms need workspaces that grow with the batch. On the H200, VGG-16's second
convolution (64->64 3x3 at 224x224, batch 256, fp32) runs IMPLICIT_PRECOMP_GEMM forward in 7.4 ms with a 6.1 GiB
workspace; the forward that needs none (IMPLICIT_GEMM) takes 41.8 ms. Under a tight budget a plan had to take the
slow one for the whole batch.

A convolution's forward and input gradient are per sample, so a pass can run as ``split`` cuDNN calls on
consecutive batch chunks: chunk ``[s, e)`` reads rows ``s:e`` of ``x`` (or ``dy``) and writes the same rows of
``y`` (or ``dx``), each a contiguous slice of an NCHW tensor, with one chunk's workspace. The weight gradient is
a sum over the batch: each chunk's ``dw`` goes to a scratch tensor and is added up, in fp32 for bf16/fp16 (one
rounding per chunk, as the unsplit pass rounds once) and into ``dw`` itself for fp32/fp64. The values are the
unsplit pass's up to summation order; no tensor but the workspace changes size.

Chunks are ``ceil(N / split)`` rows, the last smaller (``batch_chunks``). ``enumerate_splits`` measures a split
run of every algorithm that could gain from one (workspace above the pass's memory-optimal algorithm's, and
faster than it), for each split of ``DEFAULT_SPLITS`` up to the batch, timing the whole pass (every chunk and
the additions) as NOTE [ Algorithm timing ] times one call. The table's row keeps ``split``; its ``ms`` is the
whole pass, its ``workspace_bytes`` one chunk's (``cudnnGet*WorkspaceSize`` at the chunk's shape). A split whose
workspace is no less than a smaller split's is skipped; larger splits of an algorithm are not measured once one
needs no workspace or is no faster than the pass's memory-optimal algorithm. Only the ``fastest_within`` rule
and explicit overrides pick split runs (NOTE [ Convolution choice ]); the runtime (``memtune.tuner.runtime.conv``) runs
them with ``run_split``.

On the H200 (cuDNN 9.19, fp32; the committed ``vgg16-b256-float32-h200.json``, ``features.2`` forward)
IMPLICIT_PRECOMP_GEMM's workspace is proportional to the chunk, at almost the same time: 6272 MiB and 7.43 ms
unsplit, 784 MiB and 7.49 ms in 8 chunks, 98 MiB and 8.74 ms in 64. FFT_TILING's is not, and its time grows:
289 MiB and 14.16 ms unsplit, 85 MiB and 14.91 ms in 4 chunks, 25 MiB and 48.41 ms in 32.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import torch

from memtune.profiler._profile import ConvAlgo, ConvProfile, Profile
from memtune.profiler.cudnn import (
    PASSES,
    ConvGeometry,
    CudnnError,
    Pass,
    gpu_median_ms,
    run_pass,
    workspace_bytes,
)
from memtune.profiler.profiler_errors import ProfilerError

__all__ = [
    "DEFAULT_SPLITS",
    "batch_chunks",
    "chunk_geometry",
    "conv_geometry",
    "enumerate_splits",
    "memory_optimal",
    "profile_with_splits",
    "run_split",
    "split_candidates",
    "split_workspace_bytes",
]

#: batch chunk counts measured per algorithm, at most the batch
DEFAULT_SPLITS = (2, 4, 8, 16, 32, 64)


def batch_chunks(n: int, split: int) -> list[tuple[int, int]]:
    """``[start, stop)`` rows of ``split`` consecutive chunks of a batch of ``n``: ``ceil(n / split)`` each, the
    last smaller (fewer chunks when that many already cover ``n``)."""
    if split < 1 or n < 1:
        raise ValueError(f"need a batch >= 1 and split >= 1, got batch {n} and split {split}")
    size = -(-n // split)
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def chunk_geometry(geom: ConvGeometry, rows: int) -> ConvGeometry:
    """``geom`` at a batch of ``rows``."""
    return dataclasses.replace(geom, input_shape=(rows, *geom.input_shape[1:]))


def split_workspace_bytes(
    geom: ConvGeometry, pass_: Pass, algo: int, math_type: int, split: int, device: torch.device | None = None
) -> int:
    """Workspace bytes of ``algo`` run as ``split`` chunks: its largest (first) chunk's.

    Raises:
        CudnnError: cuDNN does not support the algorithm at the chunk's shape.
    """
    start, stop = batch_chunks(geom.input_shape[0], split)[0]
    return workspace_bytes(chunk_geometry(geom, stop - start), pass_, algo, math_type, device)


def run_split(
    pass_: Pass,
    geom: ConvGeometry,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    algo: int,
    math_type: int,
    split: int = 1,
    workspace: torch.Tensor | None = None,
) -> None:
    """Run one pass into ``out`` as ``split`` calls on batch chunks (NOTE [ Batch split ]).

    Operands as ``memtune.profiler.cudnn.run_pass``: fwd ``(x, w) -> y``, bwd_data ``(w, dy) -> dx``, bwd_filter
    ``(x, dy) -> dw``, contiguous CUDA tensors of ``geom``'s shapes. ``workspace``: a uint8 tensor of at least
    ``split_workspace_bytes`` bytes, else one is allocated once for every chunk.
    """
    if split == 1:
        run_pass(pass_, geom, a, b, out, algo, math_type, workspace)
        return
    chunks = batch_chunks(geom.input_shape[0], split)
    need = split_workspace_bytes(geom, pass_, algo, math_type, split, out.device)
    if need and (workspace is None or workspace.numel() < need):
        workspace = torch.empty(need, dtype=torch.uint8, device=out.device)
    if pass_ == "fwd":
        for s, e in chunks:
            run_pass(pass_, chunk_geometry(geom, e - s), a[s:e], b, out[s:e], algo, math_type, workspace)
        return
    if pass_ == "bwd_data":
        for s, e in chunks:
            run_pass(pass_, chunk_geometry(geom, e - s), a, b[s:e], out[s:e], algo, math_type, workspace)
        return
    wide = out.dtype in (torch.float32, torch.float64)
    total = out if wide else torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    part = torch.empty_like(out)
    for i, (s, e) in enumerate(chunks):
        into = out if wide and i == 0 else part
        run_pass(pass_, chunk_geometry(geom, e - s), a[s:e], b[s:e], into, algo, math_type, workspace)
        if into is part:
            total.add_(part)
    if total is not out:
        out.copy_(total)


def conv_geometry(conv: ConvProfile) -> ConvGeometry:
    """The geometry a profiled convolution was measured at (its batch, shapes, settings and dtype).

    Raises:
        ProfilerError: the table does not say its batch or dtype (it was not enumerated on a GPU).
    """
    if conv.batch is None or conv.dtype is None:
        raise ProfilerError(
            f"conv {conv.name!r}: its algorithm table does not record the batch and dtype it was measured at"
        )
    return ConvGeometry.of(
        (conv.batch, conv.in_channels, *conv.input_hw),
        (conv.out_channels, conv.in_channels // conv.groups, *conv.kernel_size),
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
        conv.dtype,
    )


def _working(conv: ConvProfile, pass_: Pass) -> list[ConvAlgo]:
    return [a for a in conv.algos if a.pass_ == pass_ and a.status == "ok" and a.ms is not None and a.split == 1]


def memory_optimal(conv: ConvProfile, pass_: Pass) -> ConvAlgo | None:
    """The unsplit algorithm of ``pass_`` with the least workspace, the fastest among equals; None if none works."""
    return min(_working(conv, pass_), key=lambda a: (a.workspace_bytes, a.ms or 0.0), default=None)


def split_candidates(conv: ConvProfile, pass_: Pass) -> list[ConvAlgo]:
    """The unsplit algorithms of ``pass_`` a split could make worth having: more workspace than the pass's
    memory-optimal algorithm and faster than it."""
    lean = memory_optimal(conv, pass_)
    if lean is None:
        return []
    return [
        a
        for a in _working(conv, pass_)
        if a.workspace_bytes > lean.workspace_bytes and (a.ms or 0.0) < (lean.ms or 0.0)
    ]


def enumerate_splits(
    conv: ConvProfile,
    *,
    splits: Sequence[int] = DEFAULT_SPLITS,
    warmup: int = 1,
    repeats: int = 3,
    device: torch.device | str | None = None,
) -> ConvProfile:
    """``conv`` with the batch-split runs of its table measured (NOTE [ Batch split ]); earlier ones are replaced.

    Random operands of the measured shapes; each run at the math type its unsplit row recorded.

    Raises:
        ProfilerError: CUDA is not available, or the table lacks its batch or dtype.
    """
    if not torch.cuda.is_available():
        raise ProfilerError("batch-split convolutions can only be measured on a CUDA GPU; CUDA is not available here")
    geom = conv_geometry(conv)
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    dt = geom.torch_dtype
    rows: list[ConvAlgo] = []
    with torch.cuda.device(dev), torch.no_grad():
        bufs = {
            "x": torch.randn(geom.input_shape, dtype=dt, device=dev),
            "w": torch.randn(geom.weight_shape, dtype=dt, device=dev),
            "y": torch.empty(geom.output_shape, dtype=dt, device=dev),
            "dy": torch.randn(geom.output_shape, dtype=dt, device=dev),
            "dx": torch.empty(geom.input_shape, dtype=dt, device=dev),
            "dw": torch.empty(geom.weight_shape, dtype=dt, device=dev),
        }
        operands = {
            "fwd": (bufs["x"], bufs["w"], bufs["y"]),
            "bwd_data": (bufs["w"], bufs["dy"], bufs["dx"]),
            "bwd_filter": (bufs["x"], bufs["dy"], bufs["dw"]),
        }
        for pass_ in PASSES:
            lean = memory_optimal(conv, pass_)
            for algo in split_candidates(conv, pass_):
                rows.extend(_measure_algo(geom, pass_, algo, operands[pass_], splits, lean, warmup, repeats, dev))
        del bufs, operands
    return conv.model_copy(update={"algos": tuple(a for a in conv.algos if a.split == 1) + tuple(rows)})


def _measure_algo(
    geom: ConvGeometry,
    pass_: Pass,
    algo: ConvAlgo,
    operands: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    splits: Sequence[int],
    lean: ConvAlgo | None,
    warmup: int,
    repeats: int,
    dev: torch.device,
) -> list[ConvAlgo]:
    """The split rows of one algorithm, smallest split first, until a split stops paying: it needs no workspace
    or is no faster than ``lean``, the pass's memory-optimal algorithm."""
    lean_ms = lean.ms or 0.0 if lean is not None else 0.0
    a, b, out = operands
    rows: list[ConvAlgo] = []
    least_ws = algo.workspace_bytes
    for split in sorted(set(splits)):
        if split < 2 or split > geom.input_shape[0]:
            continue
        row = {"pass": pass_, "algo": algo.algo, "name": algo.name, "math_type": algo.math_type, "split": split}
        try:
            ws = split_workspace_bytes(geom, pass_, algo.algo, algo.math_type, split, dev)
        except CudnnError:
            rows.append(ConvAlgo.model_validate({**row, "status": "unsupported"}))
            break
        if ws >= least_ws:
            continue  # saves nothing over a smaller split
        try:
            workspace = torch.empty(ws, dtype=torch.uint8, device=dev) if ws else None
            ms: float | None = gpu_median_ms(
                functools.partial(run_split, pass_, geom, a, b, out, algo.algo, algo.math_type, split, workspace),
                warmup,
                repeats,
            )
        except (CudnnError, torch.OutOfMemoryError):
            ms = None
        rows.append(
            ConvAlgo.model_validate(
                {
                    **row,
                    "ms": ms,
                    "workspace_bytes": ws,
                    "deterministic": algo.deterministic,
                    "status": "ok" if ms is not None else "failed",
                }
            )
        )
        least_ws = ws
        if ms is None or ms >= lean_ms or ws == 0:
            break
    return rows


def profile_with_splits(
    profile: Profile,
    *,
    splits: Sequence[int] = DEFAULT_SPLITS,
    warmup: int = 1,
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
) -> Profile:
    """``profile`` with ``enumerate_splits`` run on every convolution that has an algorithm table."""
    stages = []
    for stage in profile.stages:
        convs = []
        for conv in stage.convs:
            if conv.algos:
                conv = enumerate_splits(conv, splits=splits, warmup=warmup, repeats=repeats)
                if progress is not None:
                    n = sum(a.split > 1 and a.status == "ok" for a in conv.algos)
                    progress(f"{stage.name}.{conv.name}: {n} split runs")
            convs.append(conv)
        stages.append(stage.model_copy(update={"convs": tuple(convs)}))
        torch.cuda.empty_cache()
    return profile.model_copy(update={"stages": tuple(stages)})
