"""Running a chain on the ``meta`` device as if it ran on a CUDA GPU: shapes and storages, no compute.

A meta tensor has a shape, a dtype and a storage identity but no data, so a forward pass on meta costs
microseconds per op and no memory at any batch size. That is how ``memtune.profiler.modeled`` prices VGG-16 at
batch 256 on a laptop, and how a CPU-measured profile learns what a GPU would keep.

# NOTE [ CUDA semantics on meta ]
Three things differ between a meta (or CPU) forward and a CUDA forward, and change saved bytes:

* Autocast does not apply to meta tensors. ``CudaSemantics`` re-applies CUDA autocast's dtype policy at
  the function level (above autograd, as autocast itself sits): matmul-like ops cast floating inputs to
  the low dtype, the numerically sensitive ops (norms, softmax, exp/log, losses) to float32, the rest
  run in their inputs' type. Casts of leaf tensors that require grad (weights) are cached for the
  forward, as autocast does; the cast copies are what autograd saves, exactly as on the GPU.
* ``F.dropout`` (not in place) uses the fused ``native_dropout`` on CUDA, which saves a 1-byte bool
  mask; elsewhere it multiplies by a float noise tensor and saves that.
* ``F.scaled_dot_product_attention`` picks flash attention on CUDA for fp16/bf16 without a mask and
  memory-efficient attention otherwise; both save q, k, v, the output and a log-sum-exp, not the
  attention matrix of the math fallback.

A function mode sees the functions a module calls, not the ones called from inside another Python-level
function that dispatched to the mode itself (e.g. the projections inside
``F.multi_head_attention_forward``): those run unmodified. memtune's zoo calls ``F.linear``,
``F.layer_norm`` and ``F.scaled_dot_product_attention`` directly; a GPU profile stays the reference.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from memtune.profiler.chain import ModelChain, Stage

__all__ = ["CudaSemantics", "meta_chain", "meta_input"]

_T = torch.Tensor

# CUDA autocast's "lower precision" list, at the Python function level.
_LOW_FUNCS: set[Callable[..., Any]] = {
    torch.conv1d,
    torch.conv2d,
    torch.conv3d,
    torch.conv_transpose1d,
    torch.conv_transpose2d,
    torch.conv_transpose3d,
    F.linear,
    torch.matmul,
    _T.matmul,
    _T.__matmul__,
    _T.__rmatmul__,
    torch.mm,
    _T.mm,
    torch.bmm,
    _T.bmm,
    torch.addmm,
    _T.addmm,
    torch.baddbmm,
    _T.baddbmm,
    torch.addbmm,
    torch.einsum,
    torch.prelu,
    F.prelu,
}
# CUDA autocast's "float32" list, at the Python function level.
_FP32_FUNCS: set[Callable[..., Any]] = {
    F.layer_norm,
    F.group_norm,
    F.softmax,
    F.log_softmax,
    torch.softmax,
    _T.softmax,
    torch.log_softmax,
    _T.log_softmax,
    F.cross_entropy,
    F.nll_loss,
    F.mse_loss,
    F.softplus,
    torch.exp,
    _T.exp,
    torch.log,
    _T.log,
    torch.rsqrt,
    _T.rsqrt,
    torch.pow,
    _T.pow,
    torch.cumsum,
    _T.cumsum,
    torch.logsumexp,
    torch.norm,
    _T.norm,
}
if hasattr(F, "rms_norm"):
    _FP32_FUNCS.add(F.rms_norm)

_DROPOUT_FUNCS: set[Callable[..., Any]] = {F.dropout, torch.dropout}
_SDPA = F.scaled_dot_product_attention


class CudaSemantics(TorchFunctionMode):
    """A function mode that makes a meta (or CPU) forward keep what a CUDA forward keeps.

    See NOTE [ CUDA semantics on meta ]. ``autocast_dtype`` None means no autocast (fp32 training).

    Example::

        with CudaSemantics(torch.bfloat16):
            y = meta_model(x)
    """

    def __init__(self, autocast_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.autocast_dtype = autocast_dtype
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point() or value.dtype == dtype:
                return value
            if value.is_leaf and value.requires_grad:
                hit = self._cache.get(id(value))
                if hit is None or hit[1].dtype != dtype:
                    hit = (value, value.to(dtype))
                    self._cache[id(value)] = hit
                return hit[1]
            return value.to(dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast(v, dtype) for v in value)
        return value

    def _cast_all(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], dtype: torch.dtype) -> tuple[Any, Any]:
        return (
            tuple(self._cast(a, dtype) for a in args),
            {k: self._cast(v, dtype) for k, v in kwargs.items()},
        )

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        low = self.autocast_dtype
        if func in _DROPOUT_FUNCS:
            return _cuda_dropout(func, args, kwargs)
        if func is _SDPA:
            if low is not None:
                args, kwargs = self._cast_all(args, kwargs, low)
            return _cuda_sdpa(args, kwargs)
        if low is not None:
            if func in _LOW_FUNCS:
                args, kwargs = self._cast_all(args, kwargs, low)
            elif func in _FP32_FUNCS:
                args, kwargs = self._cast_all(args, kwargs, torch.float32)
        return func(*args, **kwargs)


def _bind(
    names: tuple[str, ...], defaults: tuple[Any, ...], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[Any]:
    values = list(defaults)
    for k, a in enumerate(args):
        values[k] = a
    for k, name in enumerate(names):
        if name in kwargs:
            values[k] = kwargs[name]
    return values


def _cuda_dropout(func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """``F.dropout`` as CUDA runs it: fused ``native_dropout`` (bool mask) unless in place."""
    if func is F.dropout:
        x, p, training, inplace = _bind(("input", "p", "training", "inplace"), (None, 0.5, True, False), args, kwargs)
    else:  # torch.dropout(input, p, train)
        x, p, training = _bind(("input", "p", "train"), (None, 0.5, True), args, kwargs)
        inplace = False
    if training and not inplace and 0.0 < p < 1.0 and x.numel() > 0:
        return torch.native_dropout(x, p, True)[0]
    return func(*args, **kwargs)


def _cuda_sdpa(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """``F.scaled_dot_product_attention`` with CUDA's fused kernels (flash or memory-efficient)."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    q, k, v, mask, dropout_p, is_causal, scale, gqa = _bind(
        names, (None, None, None, None, 0.0, False, None, False), args, kwargs
    )
    same = q.dim() == 4 and k.shape == q.shape == v.shape and not gqa
    if not same:
        return _SDPA(*args, **kwargs)
    if mask is None and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)
        return out[0]
    bias = None
    if mask is not None:
        bias = mask if mask.dtype == q.dtype else torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
    need_lse = q.requires_grad or k.requires_grad or v.requires_grad
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, need_lse, dropout_p, is_causal, scale=scale
    )
    return out[0]


def meta_chain(chain: ModelChain) -> ModelChain:
    """A copy of ``chain`` whose parameters and buffers live on the meta device (no data copied).

    Parameters keep ``requires_grad``; the copy is in training mode. Tensors a module holds as plain
    attributes (not registered) are deep-copied as they are.
    """
    memo: dict[int, Any] = {}
    for stage in chain.stages:
        for p in stage.module.parameters():
            if id(p) not in memo:
                memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
        for b in stage.module.buffers():
            if id(b) not in memo:
                memo[id(b)] = torch.empty_like(b, device="meta")
    stages = [Stage(s.name, s.kind, copy.deepcopy(s.module, memo).train()) for s in chain.stages]
    return ModelChain(
        name=chain.name,
        stages=stages,
        input_shape=chain.input_shape,
        input_kind=chain.input_kind,
        vocab_size=chain.vocab_size,
        params=dict(chain.params),
    )


def meta_input(chain: ModelChain, batch: int) -> torch.Tensor:
    """The batch's input on meta: float32 images, or int64 token ids for ``input_kind == "tokens"``."""
    dtype = torch.int64 if chain.input_kind == "tokens" else torch.float32
    return torch.empty((batch, *chain.input_shape), dtype=dtype, device="meta")
