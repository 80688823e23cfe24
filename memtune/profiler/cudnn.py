"""cuDNN convolution algorithms through ctypes: list every algorithm of a convolution, time it, run it.

``memtune.profiler._conv_enumerate.enumerate_conv`` asks cuDNN for every forward, backward-data and backward-filter
algorithm of one convolution (``cudnnFindConvolution*AlgorithmEx`` on real buffers), times each working one with
CUDA events (``gpu_median_ms``: median of ``repeats`` after ``warmup``) and returns a ``ConvProfile`` whose table
keeps the failed and unsupported algorithms too, with their status. ``enumerate_stage_convs`` there does it for every
``nn.Conv2d`` of a stage at the input shapes the stage really feeds them. The geometry of one convolution
(``ConvGeometry``) is in ``memtune.profiler._conv_geometry``. ``run_pass`` runs one chosen algorithm;
``memtune.profiler.conv_split.run_split`` runs it in batch chunks, and ``memtune.tuner.runtime.conv`` builds its
autograd Function on that.

# NOTE [ cuDNN binding ]
memtune talks to cuDNN's legacy convolution API, which cuDNN 9 still ships, through ctypes on the
``libcudnn.so.9`` PyTorch loaded (``load_cudnn`` says where it looks). The rules every call follows:

* One handle per (thread, device); before every call the handle is bound to PyTorch's current stream
  (``cudnnSetStream``), so cuDNN's work is ordered with PyTorch's and a workspace from PyTorch's caching
  allocator (``torch.empty(n, dtype=torch.uint8)``, allocated on that stream) is safe to reuse after it.
* Every return code is checked; a failure raises ``CudnnError`` naming the function, the status
  (``cudnnGetErrorString``) and the convolution.
* Tensors are NCHW and contiguous. Data types: fp32, bf16 and fp16 (all computing in fp32, which is what
  PyTorch and autocast run) and fp64.
* The math type is part of the choice: ``Find`` returns one per algorithm (tensor cores, TF32 or plain
  FMA) and it is set on the convolution descriptor (``cudnnSetConvolutionMathType``) before that
  algorithm runs or its workspace is queried. Before ``Find`` the descriptor gets the math type PyTorch
  would use: fp32 ``DEFAULT`` (TF32 allowed) when ``torch.backends.cudnn.allow_tf32``, else ``FMA``;
  bf16/fp16 ``TENSOR_OP``.
* ``Find`` is asked for as many results as ``cudnnGet*AlgorithmMaxCount`` says (at least the enum's
  size) and gets a workspace as large as the largest algorithm asks for (``cudnnGet*WorkspaceSize``),
  capped by the free GPU memory; an algorithm needing more is recorded as ``failed`` with the workspace it
  asked for. Every algorithm of the enum (``ALGO_NAMES``) is listed: those ``Find`` does not return as
  ``unsupported``, none dropped. (cuDNN 9.19's MaxCount is larger than the enums, 10/8/9 against 8/6/7;
  ids past the enum are listed only when ``Find`` returns them.)

# NOTE [ Algorithm timing ]
Each working algorithm runs ``warmup`` times untimed, then ``repeats`` times between two CUDA events on
the current stream; the median is kept. Before each timed run a GPU spin (``torch.cuda._sleep``, about
1 ms) is queued, so the CPU has enqueued the start event, the run and the end event before the GPU
reaches them: the time is the GPU's alone, without the Python/ctypes and cuDNN host cost of the call
(tens of microseconds, which would otherwise dominate small convolutions). ``default_ms`` and
``default_bwd_ms`` (PyTorch's own ``F.conv2d`` and its backward) are timed the same way, so the table
and the default compare like with like. In training the host cost overlaps the GPU's work as long as
the kernels are longer than it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import statistics
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from memtune.profiler._conv_geometry import _DATA_TYPES, ConvGeometry, module_padding, symmetric_padding
from memtune.profiler.profiler_errors import ProfilerError

__all__ = [
    "ALGO_NAMES",
    "BWD_DATA_ALGOS",
    "BWD_FILTER_ALGOS",
    "FWD_ALGOS",
    "LIBRARY_ENV",
    "MATH_DEFAULT",
    "MATH_FMA",
    "MATH_TENSOR_OP",
    "MATH_TENSOR_OP_ALLOW_CONVERSION",
    "PASSES",
    "ConvAlgoPerf",
    "ConvGeometry",
    "Cudnn",
    "CudnnError",
    "Pass",
    "algo_name",
    "cudnn_available",
    "cudnn_version",
    "gpu_median_ms",
    "load_cudnn",
    "module_padding",
    "run_pass",
    "status_kind",
    "symmetric_padding",
    "workspace_bytes",
]

Pass = Literal["fwd", "bwd_data", "bwd_filter"]
PASSES: tuple[Pass, ...] = ("fwd", "bwd_data", "bwd_filter")

#: cudnnConvolutionFwdAlgo_t, by id
FWD_ALGOS = (
    "IMPLICIT_GEMM",
    "IMPLICIT_PRECOMP_GEMM",
    "GEMM",
    "DIRECT",
    "FFT",
    "FFT_TILING",
    "WINOGRAD",
    "WINOGRAD_NONFUSED",
)
#: cudnnConvolutionBwdDataAlgo_t, by id
BWD_DATA_ALGOS = ("ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED")
#: cudnnConvolutionBwdFilterAlgo_t, by id (WINOGRAD is not implemented by cuDNN)
BWD_FILTER_ALGOS = ("ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING")
ALGO_NAMES: dict[Pass, tuple[str, ...]] = {"fwd": FWD_ALGOS, "bwd_data": BWD_DATA_ALGOS, "bwd_filter": BWD_FILTER_ALGOS}

#: cudnnMathType_t
MATH_DEFAULT, MATH_TENSOR_OP, MATH_TENSOR_OP_ALLOW_CONVERSION, MATH_FMA = 0, 1, 2, 3

#: environment variable naming the libcudnn file to load, tried first
LIBRARY_ENV = "MEMTUNE_CUDNN_LIBRARY"

_NCHW = 0  # cudnnTensorFormat_t
_CROSS_CORRELATION = 1  # cudnnConvolutionMode_t (what PyTorch's conv2d computes)
_SPIN_CYCLES = 2_000_000  # GPU clock cycles spun before each timed run: about 1 ms at 2 GHz


def algo_name(pass_: Pass, algo: int) -> str:
    """cuDNN's name of algorithm ``algo`` of ``pass_`` (``IMPLICIT_PRECOMP_GEMM``), ``ALGO_<id>`` if unknown."""
    names = ALGO_NAMES[pass_]
    return names[algo] if 0 <= algo < len(names) else f"ALGO_{algo}"


class ConvAlgoPerf(ctypes.Structure):
    """``cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t`` (all three share this 48-byte layout).

    ``time`` is milliseconds; ``memory`` the workspace bytes.
    """

    _fields_ = [
        ("algo", ctypes.c_int),
        ("status", ctypes.c_int),
        ("time", ctypes.c_float),
        ("memory", ctypes.c_size_t),
        ("determinism", ctypes.c_int),
        ("mathType", ctypes.c_int),
        ("reserved", ctypes.c_int * 3),
    ]


def status_kind(status: int, major: int = 9) -> Literal["ok", "failed", "unsupported"]:
    """Classify a ``cudnnStatus_t``: 0 is ``ok``; the NOT_SUPPORTED family (cuDNN 9: 3000-3999,
    cuDNN 8: 9) is ``unsupported``; anything else ``failed``."""
    if status == 0:
        return "ok"
    if major >= 9:
        return "unsupported" if 3000 <= status < 4000 else "failed"
    return "unsupported" if status == 9 else "failed"


class CudnnError(ProfilerError, RuntimeError):
    """A cuDNN call returned an error status.

    Args:
        function: the cuDNN function that failed.
        status: its ``cudnnStatus_t``.
        message: ``cudnnGetErrorString`` of the status.
        context: what was being done (the convolution, the algorithm).
    """

    def __init__(self, function: str, status: int, message: str, context: str = "") -> None:
        where = f" ({context})" if context else ""
        super().__init__(f"{function} failed with {message} (status {status}){where}")
        self.function = function
        self.status = status
        self.message = message


# ---- the library -------------------------------------------------------------------------------------
_VP = ctypes.c_void_p
_I = ctypes.c_int
_PI = ctypes.POINTER(ctypes.c_int)
_PS = ctypes.POINTER(ctypes.c_size_t)
_PPERF = ctypes.POINTER(ConvAlgoPerf)
_PVP = ctypes.POINTER(ctypes.c_void_p)

# Find*Ex: 8 descriptors/pointers, then requested count, returned count*, perf results*, workspace, its bytes
_FIND_ARGS: list[Any] = [_VP] * 8 + [_I, _PI, _PPERF, _VP, ctypes.c_size_t]

# name -> argtypes; every one returns cudnnStatus_t
_SIGNATURES: dict[str, list[Any]] = {
    "cudnnCreate": [_PVP],
    "cudnnSetStream": [_VP, _VP],
    "cudnnCreateTensorDescriptor": [_PVP],
    "cudnnDestroyTensorDescriptor": [_VP],
    "cudnnSetTensor4dDescriptor": [_VP, _I, _I, _I, _I, _I, _I],
    "cudnnCreateFilterDescriptor": [_PVP],
    "cudnnDestroyFilterDescriptor": [_VP],
    "cudnnSetFilter4dDescriptor": [_VP, _I, _I, _I, _I, _I, _I],
    "cudnnCreateConvolutionDescriptor": [_PVP],
    "cudnnDestroyConvolutionDescriptor": [_VP],
    "cudnnSetConvolution2dDescriptor": [_VP, _I, _I, _I, _I, _I, _I, _I, _I],
    "cudnnSetConvolutionGroupCount": [_VP, _I],
    "cudnnSetConvolutionMathType": [_VP, _I],
    "cudnnGetConvolution2dForwardOutputDim": [_VP, _VP, _VP, _PI, _PI, _PI, _PI],
    "cudnnGetConvolutionForwardAlgorithmMaxCount": [_VP, _PI],
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": [_VP, _PI],
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": [_VP, _PI],
    "cudnnFindConvolutionForwardAlgorithmEx": _FIND_ARGS,  # x, w -> y
    "cudnnFindConvolutionBackwardDataAlgorithmEx": _FIND_ARGS,  # w, dy -> dx
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": _FIND_ARGS,  # x, dy -> dw
    "cudnnGetConvolutionForwardWorkspaceSize": [_VP, _VP, _VP, _VP, _VP, _I, _PS],  # h, x, w, conv, y
    "cudnnGetConvolutionBackwardDataWorkspaceSize": [_VP, _VP, _VP, _VP, _VP, _I, _PS],  # h, w, dy, conv, dx
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": [_VP, _VP, _VP, _VP, _VP, _I, _PS],  # h, x, dy, conv, dw
    # handle, alpha, xDesc, x, wDesc, w, convDesc, algo, workspace, bytes, beta, yDesc, y
    "cudnnConvolutionForward": [_VP, _VP, _VP, _VP, _VP, _VP, _VP, _I, _VP, ctypes.c_size_t, _VP, _VP, _VP],
    # handle, alpha, wDesc, w, dyDesc, dy, convDesc, algo, workspace, bytes, beta, dxDesc, dx
    "cudnnConvolutionBackwardData": [_VP, _VP, _VP, _VP, _VP, _VP, _VP, _I, _VP, ctypes.c_size_t, _VP, _VP, _VP],
    # handle, alpha, xDesc, x, dyDesc, dy, convDesc, algo, workspace, bytes, beta, dwDesc, dw
    "cudnnConvolutionBackwardFilter": [_VP, _VP, _VP, _VP, _VP, _VP, _VP, _I, _VP, ctypes.c_size_t, _VP, _VP, _VP],
}


class Cudnn:
    """The loaded ``libcudnn`` with typed entry points, one handle per (thread, device).

    Use ``load_cudnn()`` rather than constructing it. ``call(name, *args, context=...)`` runs one
    function and raises ``CudnnError`` on a non-zero status.
    """

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib = lib
        self.path = path
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        lib.cudnnGetVersion.argtypes = []
        lib.cudnnGetErrorString.restype = ctypes.c_char_p
        lib.cudnnGetErrorString.argtypes = [ctypes.c_int]
        self.functions: dict[str, Callable[..., int]] = {}
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)  # AttributeError when missing: load_cudnn reports it
            fn.restype = ctypes.c_int
            fn.argtypes = argtypes
            self.functions[name] = fn
        self.version = int(lib.cudnnGetVersion())
        self.major = self.version // 10000 if self.version >= 90000 else self.version // 1000
        self._local = threading.local()

    def error_string(self, status: int) -> str:
        """``cudnnGetErrorString(status)``."""
        raw = self.lib.cudnnGetErrorString(status)
        return raw.decode() if raw else f"cuDNN status {status}"

    def call(self, name: str, *args: Any, context: str = "") -> None:
        """Run ``name(*args)``; raise ``CudnnError`` unless it returns ``CUDNN_STATUS_SUCCESS``."""
        status = int(self.functions[name](*args))
        if status != 0:
            raise CudnnError(name, status, self.error_string(status), context)

    def try_call(self, name: str, *args: Any) -> int:
        """Run ``name(*args)`` and return its status (for queries whose failure is an answer)."""
        return int(self.functions[name](*args))

    def handle(self, device: torch.device) -> ctypes.c_void_p:
        """This thread's handle for ``device``, bound to PyTorch's current stream on it."""
        handles: dict[int, ctypes.c_void_p] = getattr(self._local, "handles", None) or {}
        self._local.handles = handles
        index = device.index if device.index is not None else torch.cuda.current_device()
        handle = handles.get(index)
        if handle is None:
            handle = ctypes.c_void_p()
            with torch.cuda.device(index):
                self.call("cudnnCreate", ctypes.byref(handle), context=f"cuda:{index}")
            handles[index] = handle
        stream = torch.cuda.current_stream(index).cuda_stream
        self.call("cudnnSetStream", handle, ctypes.c_void_p(stream), context="binding PyTorch's current stream")
        return handle

    def descriptors(self, geom: ConvGeometry) -> _Descriptors:
        """This thread's descriptors for ``geom`` (cached, at most 256 geometries)."""
        cache: OrderedDict[ConvGeometry, _Descriptors] | None = getattr(self._local, "descs", None)
        if cache is None:
            cache = OrderedDict()
            self._local.descs = cache
        d = cache.get(geom)
        if d is not None:
            cache.move_to_end(geom)
            return d
        d = _Descriptors(self, geom)
        cache[geom] = d
        while len(cache) > 256:
            _, old = cache.popitem(last=False)
            old.close()
        return d


_LOCK = threading.Lock()
_LOADED: Cudnn | None = None
_LOAD_ERROR: str | None = None


def _candidates() -> list[str]:
    """Where ``load_cudnn`` looks, in order."""
    out: list[str] = []
    env = os.environ.get(LIBRARY_ENV)
    if env:
        out.append(env)
    out.append("libcudnn.so.9")  # the copy PyTorch already loaded, found by its soname
    out.append(str(Path(torch.__file__).parent / "lib" / "libcudnn.so.9"))
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for base in (spec.submodule_search_locations or []) if spec else []:
        out.append(str(Path(base) / "cudnn" / "lib" / "libcudnn.so.9"))
    found = ctypes.util.find_library("cudnn")
    if found:
        out.append(found)
    return list(dict.fromkeys(out))


def load_cudnn() -> Cudnn:
    """Load libcudnn once per process (NOTE [ cuDNN binding ]).

    Looks at ``$MEMTUNE_CUDNN_LIBRARY``, then ``libcudnn.so.9`` by soname (the copy PyTorch loaded),
    then ``torch/lib``, then ``nvidia/cudnn/lib`` of site-packages, then the system's ``libcudnn``.

    Raises:
        ProfilerError: no usable libcudnn was found; the message lists every path tried and why.
    """
    global _LOADED, _LOAD_ERROR
    with _LOCK:
        if _LOADED is not None:
            return _LOADED
        if _LOAD_ERROR is not None:
            raise ProfilerError(_LOAD_ERROR)
        tried: list[str] = []
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path)
            except OSError as exc:
                tried.append(f"{path}: {exc}")
                continue
            try:
                _LOADED = Cudnn(lib, path)
            except AttributeError as exc:
                tried.append(f"{path}: lacks the legacy convolution API ({exc})")
                continue
            return _LOADED
        _LOAD_ERROR = (
            "cannot load libcudnn (needed to enumerate and run cuDNN convolution algorithms). Tried:\n  "
            + "\n  ".join(tried)
            + f"\nInstall a CUDA build of PyTorch (it brings nvidia-cudnn-cu*), or set {LIBRARY_ENV} to the "
            "path of libcudnn.so.9."
        )
        raise ProfilerError(_LOAD_ERROR)


def cudnn_available() -> bool:
    """True when CUDA is available and libcudnn loads (never raises)."""
    if not torch.cuda.is_available():
        return False
    try:
        load_cudnn()
    except ProfilerError:
        return False
    return True


def cudnn_version() -> int:
    """``cudnnGetVersion()`` of the loaded library (e.g. 91900); raises ``ProfilerError`` if none loads."""
    return load_cudnn().version


# ---- descriptors ---------------------------------------------------------------------------------------
class _Descriptors:
    """cuDNN descriptors of one geometry: x, w, y (dy/dx/dw share them) and the convolution."""

    def __init__(self, lib: Cudnn, geom: ConvGeometry) -> None:
        self.lib = lib
        self.geom = geom
        ctx = geom.describe()
        data = _DATA_TYPES[geom.dtype]
        compute = _DATA_TYPES["float64"] if geom.dtype == "float64" else _DATA_TYPES["float32"]
        self.x, self.y, self.w, self.conv = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        self._made: list[tuple[str, ctypes.c_void_p]] = []
        try:
            for name, d in (("Tensor", self.x), ("Tensor", self.y), ("Filter", self.w), ("Convolution", self.conv)):
                lib.call(f"cudnnCreate{name}Descriptor", ctypes.byref(d), context=ctx)
                self._made.append((name, d))
            lib.call("cudnnSetTensor4dDescriptor", self.x, _NCHW, data, *geom.input_shape, context=ctx)
            lib.call("cudnnSetFilter4dDescriptor", self.w, data, _NCHW, *geom.weight_shape, context=ctx)
            lib.call(
                "cudnnSetConvolution2dDescriptor",
                self.conv,
                *geom.padding,
                *geom.stride,
                *geom.dilation,
                _CROSS_CORRELATION,
                compute,
                context=ctx,
            )
            lib.call("cudnnSetConvolutionGroupCount", self.conv, geom.groups, context=ctx)
            dims = [ctypes.c_int() for _ in range(4)]
            lib.call(
                "cudnnGetConvolution2dForwardOutputDim",
                self.conv,
                self.x,
                self.w,
                *(ctypes.byref(v) for v in dims),
                context=ctx,
            )
            out = tuple(v.value for v in dims)
            if out != geom.output_shape:
                raise ProfilerError(f"cuDNN computes output {out} but PyTorch {geom.output_shape} for {ctx}")
            lib.call("cudnnSetTensor4dDescriptor", self.y, _NCHW, data, *out, context=ctx)
        except BaseException:
            self.close()
            raise
        self.math_type: int | None = None
        self._workspace: dict[tuple[Pass, int, int], int] = {}

    def set_math(self, math_type: int) -> None:
        """Set the math type on the convolution descriptor (skipped when it is already set)."""
        if self.math_type != math_type:
            self.lib.call("cudnnSetConvolutionMathType", self.conv, math_type, context=self.geom.describe())
            self.math_type = math_type

    def workspace_status(self, handle: ctypes.c_void_p, pass_: Pass, algo: int) -> tuple[int, int]:
        """``(status, bytes)`` of ``cudnnGet*WorkspaceSize`` for ``algo`` at the descriptor's math type."""
        size = ctypes.c_size_t(0)
        ref = ctypes.byref(size)
        if pass_ == "fwd":
            st = self.lib.try_call(
                "cudnnGetConvolutionForwardWorkspaceSize", handle, self.x, self.w, self.conv, self.y, algo, ref
            )
        elif pass_ == "bwd_data":
            st = self.lib.try_call(
                "cudnnGetConvolutionBackwardDataWorkspaceSize", handle, self.w, self.y, self.conv, self.x, algo, ref
            )
        else:
            st = self.lib.try_call(
                "cudnnGetConvolutionBackwardFilterWorkspaceSize", handle, self.x, self.y, self.conv, self.w, algo, ref
            )
        return st, int(size.value)

    def workspace(self, handle: ctypes.c_void_p, pass_: Pass, algo: int, math_type: int) -> int:
        """Workspace bytes of ``algo`` at ``math_type`` (cached); raises ``CudnnError`` if cuDNN refuses it."""
        key = (pass_, algo, math_type)
        got = self._workspace.get(key)
        if got is None:
            self.set_math(math_type)
            st, got = self.workspace_status(handle, pass_, algo)
            if st != 0:
                fn = {"fwd": "Forward", "bwd_data": "BackwardData", "bwd_filter": "BackwardFilter"}[pass_]
                raise CudnnError(
                    f"cudnnGetConvolution{fn}WorkspaceSize",
                    st,
                    self.lib.error_string(st),
                    f"{pass_} algorithm {algo} ({algo_name(pass_, algo)}), math type {math_type}, "
                    + self.geom.describe(),
                )
            self._workspace[key] = got
        return got

    def close(self) -> None:
        for name, d in reversed(self._made):
            if d.value:
                self.lib.try_call(f"cudnnDestroy{name}Descriptor", d)
        self._made = []


# ---- running one algorithm ---------------------------------------------------------------------------
def _scalars(geom: ConvGeometry) -> tuple[ctypes.c_double | ctypes.c_float, ctypes.c_double | ctypes.c_float]:
    if geom.dtype == "float64":
        return ctypes.c_double(1.0), ctypes.c_double(0.0)
    return ctypes.c_float(1.0), ctypes.c_float(0.0)


def run_pass(
    pass_: Pass,
    geom: ConvGeometry,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    algo: int,
    math_type: int,
    workspace: torch.Tensor | None = None,
) -> None:
    """Run one pass into ``out`` on PyTorch's current stream (NOTE [ cuDNN binding ]); no shape checks.

    Operands: fwd ``(x, w) -> y``, bwd_data ``(w, dy) -> dx``, bwd_filter ``(x, dy) -> dw``, all contiguous
    CUDA tensors of ``geom``'s shapes and dtype. ``workspace``: a uint8 tensor used when large enough.
    """
    with torch.cuda.device(out.device):
        _run_on_device(pass_, geom, a, b, out, algo, math_type, workspace)


def _run_on_device(
    pass_: Pass,
    geom: ConvGeometry,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    algo: int,
    math_type: int,
    workspace: torch.Tensor | None,
) -> None:
    lib = load_cudnn()
    handle = lib.handle(out.device)
    d = lib.descriptors(geom)
    size = d.workspace(handle, pass_, algo, math_type)
    d.set_math(math_type)
    if workspace is None or workspace.numel() < size:
        workspace = torch.empty(size, dtype=torch.uint8, device=out.device) if size else None
    ws = ctypes.c_void_p(workspace.data_ptr() if workspace is not None else None)
    alpha, beta = _scalars(geom)
    ctx = f"{pass_} algorithm {algo} ({algo_name(pass_, algo)}), math type {math_type}, {geom.describe()}"
    pa, pb, po = ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()), ctypes.c_void_p(out.data_ptr())
    ra, rb = ctypes.c_void_p(ctypes.addressof(alpha)), ctypes.c_void_p(ctypes.addressof(beta))
    if pass_ == "fwd":  # a = x, b = w, out = y
        lib.call(
            "cudnnConvolutionForward", handle, ra, d.x, pa, d.w, pb, d.conv, algo, ws, size, rb, d.y, po, context=ctx
        )
    elif pass_ == "bwd_data":  # a = w, b = dy, out = dx
        lib.call(
            "cudnnConvolutionBackwardData",
            handle,
            ra,
            d.w,
            pa,
            d.y,
            pb,
            d.conv,
            algo,
            ws,
            size,
            rb,
            d.x,
            po,
            context=ctx,
        )
    else:  # a = x, b = dy, out = dw
        lib.call(
            "cudnnConvolutionBackwardFilter",
            handle,
            ra,
            d.x,
            pa,
            d.y,
            pb,
            d.conv,
            algo,
            ws,
            size,
            rb,
            d.w,
            po,
            context=ctx,
        )


def workspace_bytes(
    geom: ConvGeometry, pass_: Pass, algo: int, math_type: int, device: torch.device | None = None
) -> int:
    """``cudnnGet*WorkspaceSize`` of ``algo`` of ``pass_`` at ``math_type``: the bytes a run allocates.

    Raises:
        CudnnError: cuDNN does not support that algorithm for this geometry.
    """
    lib = load_cudnn()
    dev = device or torch.device("cuda", torch.cuda.current_device())
    return lib.descriptors(geom).workspace(lib.handle(dev), pass_, algo, math_type)


# ---- timing --------------------------------------------------------------------------------------------
def gpu_median_ms(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median GPU ms of ``fn`` over ``repeats`` runs after ``warmup`` (NOTE [ Algorithm timing ])."""
    stream = torch.cuda.current_stream()
    for _ in range(warmup):
        fn()
    times: list[float] = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(_SPIN_CYCLES)  # keeps the GPU busy while the CPU enqueues start, fn, end
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return statistics.median(times)
