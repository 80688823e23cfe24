"""Every cuDNN algorithm of a convolution, timed: ``enumerate_conv`` for one ``nn.Conv2d``, ``enumerate_stage_convs``
for every convolution of a stage at the input shapes the stage really feeds them.

``enumerate_conv`` asks cuDNN for every forward, backward-data and backward-filter algorithm of one
convolution (``cudnnFindConvolution*AlgorithmEx`` on real buffers), times each working one with CUDA
events (median of ``repeats`` after ``warmup``, NOTE [ Algorithm timing ] in ``memtune.profiler.cudnn``) and returns
a ``ConvProfile`` whose table keeps the failed and unsupported algorithms too, with their status; times are in ms,
workspaces in bytes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from memtune.profiler._conv_geometry import ConvGeometry, _dtype_name, _pair, symmetric_padding
from memtune.profiler._profile import ConvAlgo, ConvProfile
from memtune.profiler.chain import Stage, conv_modules
from memtune.profiler.cudnn import (
    ALGO_NAMES,
    MATH_DEFAULT,
    MATH_FMA,
    MATH_TENSOR_OP,
    PASSES,
    ConvAlgoPerf,
    Cudnn,
    CudnnError,
    Pass,
    _Descriptors,
    algo_name,
    gpu_median_ms,
    load_cudnn,
    run_pass,
    status_kind,
)
from memtune.profiler.profiler_errors import ProfilerError

__all__ = ["enumerate_conv", "enumerate_stage_convs"]

_FIND_MEMORY_FRACTION = 0.8  # of the free GPU memory, at most, for the Find workspace


def _find_math(dtype: str, allow_tf32: bool) -> int:
    if dtype in ("float16", "bfloat16"):
        return MATH_TENSOR_OP
    if dtype == "float32" and allow_tf32:
        return MATH_DEFAULT
    return MATH_FMA


def _allocate_up_to(want: int, device: torch.device) -> torch.Tensor | None:
    """A uint8 workspace of ``want`` bytes, or the largest power-of-two fraction of it that fits."""
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    size = min(want, int((free + cached) * _FIND_MEMORY_FRACTION))
    while size > 0:
        try:
            return torch.empty(size, dtype=torch.uint8, device=device)
        except torch.OutOfMemoryError:
            size //= 2
    return None


_MAX_COUNT = {
    "fwd": "cudnnGetConvolutionForwardAlgorithmMaxCount",
    "bwd_data": "cudnnGetConvolutionBackwardDataAlgorithmMaxCount",
    "bwd_filter": "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount",
}
_FIND = {
    "fwd": "cudnnFindConvolutionForwardAlgorithmEx",
    "bwd_data": "cudnnFindConvolutionBackwardDataAlgorithmEx",
    "bwd_filter": "cudnnFindConvolutionBackwardFilterAlgorithmEx",
}


def _enumerate_pass(
    lib: Cudnn,
    handle: ctypes.c_void_p,
    d: _Descriptors,
    pass_: Pass,
    bufs: dict[str, torch.Tensor],
    math_type: int,
    warmup: int,
    repeats: int,
) -> list[ConvAlgo]:
    """Every algorithm of one pass (NOTE [ cuDNN binding ]), sorted by id."""
    geom = d.geom
    ctx = f"{pass_}, {geom.describe()}"
    count = ctypes.c_int(0)
    lib.call(_MAX_COUNT[pass_], handle, ctypes.byref(count), context=ctx)
    known = len(ALGO_NAMES[pass_])
    n = max(count.value, known)  # cuDNN 9 reports more than its enums hold: ask for every result it has
    d.set_math(math_type)
    asked: dict[int, int] = {}
    for algo in range(known):
        st, size = d.workspace_status(handle, pass_, algo)
        if st == 0:
            asked[algo] = size
    device = bufs["x"].device
    workspace = _allocate_up_to(max(asked.values(), default=0), device)
    ws_ptr = ctypes.c_void_p(workspace.data_ptr() if workspace is not None else None)
    ws_size = workspace.numel() if workspace is not None else 0
    perf = (ConvAlgoPerf * n)()
    returned = ctypes.c_int(0)
    ptr = {k: ctypes.c_void_p(t.data_ptr()) for k, t in bufs.items()}
    if pass_ == "fwd":
        operands = (d.x, ptr["x"], d.w, ptr["w"], d.conv, d.y, ptr["y"])
    elif pass_ == "bwd_data":
        operands = (d.w, ptr["w"], d.y, ptr["dy"], d.conv, d.x, ptr["dx"])
    else:
        operands = (d.x, ptr["x"], d.y, ptr["dy"], d.conv, d.w, ptr["dw"])
    lib.call(_FIND[pass_], handle, *operands, n, ctypes.byref(returned), perf, ws_ptr, ws_size, context=ctx)
    d.math_type = None  # Find may leave another math type on the descriptor
    torch.cuda.current_stream(device).synchronize()

    found: dict[int, ConvAlgoPerf] = {}
    for res in perf[: returned.value]:
        prev = found.get(res.algo)
        if prev is None or (prev.status != 0 and res.status == 0):  # results come fastest first
            found[res.algo] = res
    a_in, b_in, out = {
        "fwd": (bufs["x"], bufs["w"], bufs["y"]),
        "bwd_data": (bufs["w"], bufs["dy"], bufs["dx"]),
        "bwd_filter": (bufs["x"], bufs["dy"], bufs["dw"]),
    }[pass_]
    algos: list[ConvAlgo] = []
    for algo in sorted(set(range(known)) | set(found)):
        p = found.get(algo)
        if p is None:
            status: Literal["ok", "failed", "unsupported"] = "unsupported"
        else:
            status = status_kind(p.status, lib.major)
        ms: float | None = None
        if status == "ok" and p is not None:

            def run(algo: int = algo, math: int = p.mathType) -> None:
                run_pass(pass_, geom, a_in, b_in, out, algo, math, workspace)

            try:
                ms = gpu_median_ms(run, warmup, repeats)
            except CudnnError:
                status = "failed"
        if status == "ok" and p is not None:
            ws, math = int(p.memory), int(p.mathType)
        else:
            ws, math = asked.get(algo, 0), math_type if p is None else int(p.mathType)
        algos.append(
            ConvAlgo.model_validate(
                {
                    "pass": pass_,
                    "algo": algo,
                    "name": algo_name(pass_, algo),
                    "ms": ms,
                    "workspace_bytes": ws,
                    "math_type": math,
                    "deterministic": bool(p is not None and p.determinism == 1),
                    "status": status,
                }
            )
        )
    return algos


def enumerate_conv(
    module: nn.Conv2d,
    input_shape: Sequence[int],
    dtype: str | torch.dtype = "float32",
    *,
    name: str = "",
    warmup: int = 2,
    repeats: int = 5,
    allow_tf32: bool | None = None,
    device: torch.device | str | None = None,
) -> ConvProfile:
    """Every cuDNN algorithm of ``module`` at ``input_shape``, timed; plus PyTorch's own conv2d time.

    Runs ``cudnnFindConvolution{Forward,BackwardData,BackwardFilter}AlgorithmEx`` on random buffers of the
    real shapes, then times each working algorithm at the math type Find returned by NOTE [ Algorithm
    timing ]. ``default_ms``/``default_bwd_ms`` time ``F.conv2d`` forward and its input+weight backward
    the same way.

    Args:
        module: the convolution (its weight's shape and settings are used; the module is not modified).
        input_shape: ``(N, C, H, W)`` of its input.
        dtype: ``float32``, ``bfloat16`` (what autocast runs), ``float16`` or ``float64``.
        name: the conv's name inside its stage (``ConvProfile.name``).
        warmup: untimed runs per algorithm.
        repeats: timed runs per algorithm; the median is kept.
        allow_tf32: let fp32 use TF32 tensor cores; default ``torch.backends.cudnn.allow_tf32``.
        device: the CUDA device; default the module's if on CUDA, else the current one.

    Returns:
        A ``ConvProfile`` listing every algorithm id of every pass (failed/unsupported with ``ms=None``).

    Raises:
        ProfilerError: CUDA is not available, or libcudnn cannot be loaded.
        CudnnError: a cuDNN call failed outright (not one algorithm: those are recorded).
    """
    if not torch.cuda.is_available():
        raise ProfilerError("cuDNN algorithms can only be enumerated on a CUDA GPU; CUDA is not available here")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    lib = load_cudnn()
    dtype_name = _dtype_name(dtype)
    if device is not None:
        dev = torch.device(device)
    elif module.weight.is_cuda:
        dev = module.weight.device
    else:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    tf32 = torch.backends.cudnn.allow_tf32 if allow_tf32 is None else allow_tf32
    geom = ConvGeometry.from_module(module, input_shape, dtype_name)
    tdt = geom.torch_dtype
    with torch.cuda.device(dev), torch.no_grad():
        bufs = {
            "x": torch.randn(geom.input_shape, dtype=tdt, device=dev),
            "w": module.weight.detach().to(device=dev, dtype=tdt).contiguous(),
            "y": torch.empty(geom.output_shape, dtype=tdt, device=dev),
            "dy": torch.randn(geom.output_shape, dtype=tdt, device=dev),
            "dx": torch.empty(geom.input_shape, dtype=tdt, device=dev),
            "dw": torch.empty(geom.weight_shape, dtype=tdt, device=dev),
        }
        handle = lib.handle(dev)
        d = lib.descriptors(geom)
        math = _find_math(dtype_name, tf32)
        algos: list[ConvAlgo] = []
        for pass_ in PASSES:
            algos.extend(_enumerate_pass(lib, handle, d, pass_, bufs, math, warmup, repeats))
    default_fwd, default_bwd = _default_ms(geom, bufs, tf32, warmup, repeats, dev)
    del bufs
    kernel = _pair(module.kernel_size)
    return ConvProfile(
        name=name,
        in_channels=module.in_channels,
        out_channels=module.out_channels,
        kernel_size=kernel,
        stride=_pair(module.stride),
        padding=symmetric_padding(module),
        input_hw=(int(input_shape[2]), int(input_shape[3])),
        dilation=_pair(module.dilation),
        groups=module.groups,
        batch=int(input_shape[0]),
        dtype=dtype_name,
        default_ms=default_fwd,
        default_bwd_ms=default_bwd,
        algos=tuple(algos),
    )


def _default_ms(
    geom: ConvGeometry, bufs: dict[str, torch.Tensor], allow_tf32: bool, warmup: int, repeats: int, dev: torch.device
) -> tuple[float, float]:
    """PyTorch's own ``F.conv2d`` forward ms and input+weight backward ms at ``geom``."""
    args = (None, geom.stride, geom.padding, geom.dilation, geom.groups)
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    try:
        with torch.cuda.device(dev):
            x = bufs["x"].detach().requires_grad_(True)
            w = bufs["w"].detach().requires_grad_(True)
            with torch.no_grad():
                fwd = gpu_median_ms(lambda: F.conv2d(x, w, *args), warmup, repeats)
            with torch.enable_grad():
                y = F.conv2d(x, w, *args)
                dy = bufs["dy"]
                bwd = gpu_median_ms(lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True), warmup, repeats)
    finally:
        torch.backends.cudnn.allow_tf32 = before
    return fwd, bwd


def enumerate_stage_convs(
    stage: Stage,
    stage_input: torch.Tensor,
    *,
    dtype: str = "float32",
    warmup: int = 2,
    repeats: int = 5,
    allow_tf32: bool | None = None,
) -> tuple[ConvProfile, ...]:
    """``enumerate_conv`` for every ``nn.Conv2d`` of ``stage`` at the input shape it really sees.

    One forward of the stage (no grad, autocast for bf16/fp16, on a clone of ``stage_input`` so in-place
    layers cannot touch it) records each convolution's input shape with forward pre-hooks; names are
    those of ``memtune.profiler.chain.conv_modules``. Convolutions the forward does not run are left out.

    Raises:
        ProfilerError: CUDA is not available or libcudnn cannot be loaded.
    """
    convs = list(conv_modules(stage))
    if not convs:
        return ()
    if not stage_input.is_cuda:
        raise ProfilerError(
            f"stage {stage.name}: cuDNN algorithms are enumerated on CUDA; its input is on {stage_input.device}"
        )
    shapes: dict[str, tuple[int, ...]] = {}
    handles = []
    for name, conv in convs:

        def hook(_m: nn.Module, args: tuple[Any, ...], name: str = name) -> None:
            if name not in shapes and args and isinstance(args[0], torch.Tensor):
                shapes[name] = tuple(args[0].shape)

        handles.append(conv.register_forward_pre_hook(hook))
    try:
        low = dtype in ("bfloat16", "float16")
        with torch.no_grad(), torch.autocast("cuda", dtype=_low_dtype(dtype), enabled=low):
            stage.module(stage_input.clone())
    finally:
        for h in handles:
            h.remove()
    return tuple(
        enumerate_conv(conv, shapes[name], dtype, name=name, warmup=warmup, repeats=repeats, allow_tf32=allow_tf32)
        for name, conv in convs
        if name in shapes
    )


def _low_dtype(dtype: str) -> torch.dtype:
    return torch.float16 if dtype == "float16" else torch.bfloat16
