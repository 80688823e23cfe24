"""Which modules can run on strips of rows and keep the same math, and which input rows each output row reads.

A module qualifies when every output row is a function of a window of input rows and of nothing else: a 2-D
convolution with zero padding, a max- or average-pool without ``ceil_mode``, and pointwise modules (activations,
BatchNorm in eval mode, dropout in eval mode or with p=0). Anything that mixes rows globally or draws random
numbers does not: BatchNorm in training mode (batch statistics over every row), dropout in training mode (a
strip draws its mask in another order), adaptive pooling, flatten, linear layers, containers with their own
``forward``. ``memtune.tuner.runtime._spatial_strips`` runs the split; ``leaf_rows`` says why a module is refused, and
``stage_row_map`` gives the profile's fact (``StageProfile.rows``, NOTE [ Spatial splitting ] in
``memtune.tuner._spatial``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from memtune.profiler._spatial_rows import RowMap, compose_rows

__all__ = ["POINTWISE", "LeafRows", "chain_row_maps", "leaf_rows", "stage_leaves", "stage_row_map"]

#: modules applied to every element alone (their ``forward`` not overridden): a strip of rows gives the same rows
POINTWISE: tuple[type[nn.Module], ...] = (
    nn.Identity, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU, nn.Mish,
    nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Hardsigmoid, nn.Hardswish, nn.Hardshrink, nn.Softshrink, nn.Softplus,
    nn.Softsign, nn.Tanhshrink, nn.LogSigmoid, nn.Threshold,
)  # fmt: skip
#: pointwise only outside training (or with p=0): in training they draw random numbers
_RANDOM: tuple[type[nn.Module], ...] = (
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout, nn.RReLU,
)  # fmt: skip
_BATCH_NORMS: tuple[type[nn.Module], ...] = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
_WINDOWED: tuple[type[nn.Module], ...] = (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)


@dataclass(frozen=True)
class LeafRows:
    """The input rows one module's output rows read (H only; W runs whole).

    Attributes:
        kernel: rows one output row reads, dilation included.
        stride: rows between consecutive output rows.
        pad_top / pad_bottom: rows of padding the module adds above and below its input.
    """

    kernel: int = 1
    stride: int = 1
    pad_top: int = 0
    pad_bottom: int = 0

    def out_rows(self, in_rows: int) -> int:
        """H of the output for an input of ``in_rows`` rows (floor division, as without ``ceil_mode``)."""
        return (in_rows + self.pad_top + self.pad_bottom - self.kernel) // self.stride + 1

    def row_map(self, in_rows: int) -> RowMap:
        """This window as a ``RowMap`` on an input of ``in_rows`` rows."""
        return RowMap(
            kernel=self.kernel,
            stride=self.stride,
            padding=self.pad_top,
            in_rows=in_rows,
            out_rows=self.out_rows(in_rows),
        )


def _first(v: int | Sequence[int] | None, default: int) -> int:
    """The H entry of a 2-D module argument (an int means both)."""
    if v is None:
        return default
    return int(v) if isinstance(v, int) else int(v[0])


def _is(m: nn.Module, bases: tuple[type[nn.Module], ...]) -> bool:
    """``m`` is one of ``bases`` and runs one of their ``forward`` methods (a subclass may do anything in its own)."""
    return isinstance(m, bases) and any(type(m).forward is b.forward for b in bases)


def _conv_rows(m: nn.Conv2d) -> LeafRows:
    if m.padding_mode != "zeros":
        raise ValueError(f"pads with {m.padding_mode!r}, which reads rows a strip does not hold; use zero padding")
    k, d, s = _first(m.kernel_size, 1), _first(m.dilation, 1), _first(m.stride, 1)
    kernel = d * (k - 1) + 1
    if isinstance(m.padding, str):  # "valid" or "same" (stride 1): the extra odd row goes below, as in PyTorch
        total = 0 if m.padding == "valid" else kernel - 1
        return LeafRows(kernel, s, total // 2, total - total // 2)
    p = _first(m.padding, 0)
    return LeafRows(kernel, s, p, p)


def _pool_rows(m: nn.MaxPool2d | nn.AvgPool2d) -> LeafRows:
    if m.ceil_mode:
        raise ValueError("has ceil_mode=True, whose last window depends on the whole height; use ceil_mode=False")
    k = _first(m.kernel_size, 1)
    s = _first(m.stride, k) if m.stride else k  # an empty stride means the kernel size
    p = _first(m.padding, 0)
    if isinstance(m, nn.MaxPool2d):
        if m.return_indices:
            raise ValueError("returns indices into the whole image, which a strip cannot give")
        return LeafRows(_first(m.dilation, 1) * (k - 1) + 1, s, p, p)
    if p and not m.count_include_pad:
        raise ValueError("pads H with count_include_pad=False: a strip cannot tell its padding from its rows")
    return LeafRows(k, s, p, p)


def leaf_rows(module: nn.Module) -> LeafRows:
    """The row window of one leaf module, for running it on strips of rows with the same math.

    Raises:
        ValueError: the module cannot run on strips with the same math; the message says why and what to change
            (the caller adds which stage and module type).
    """
    m = module
    if m._forward_hooks or m._forward_pre_hooks:
        raise ValueError("has forward hooks, which a split run would call once per strip on part of the image")
    if _is(m, _BATCH_NORMS):
        if m.training or getattr(m, "running_mean", None) is None:
            raise ValueError(
                "normalises with statistics of the whole batch and image in training mode; leave it out of the "
                "split segment or put it in eval mode"
            )
        return LeafRows()
    if _is(m, _RANDOM):
        if m.training and float(getattr(m, "p", 1.0)) > 0:
            raise ValueError("draws random numbers in training mode, which strips would draw in another order")
        return LeafRows()
    if _is(m, POINTWISE):
        return LeafRows()
    if isinstance(m, _WINDOWED):
        if not _is(m, _WINDOWED):
            raise ValueError("overrides the forward of its base class, so the rows it reads cannot be known")
        if isinstance(m, nn.Conv2d):
            return _conv_rows(m)
        return _pool_rows(m)  # type: ignore[arg-type]
    raise ValueError(
        "is not a module that maps rows to rows with the same math on strips (splittable: Conv2d, MaxPool2d, "
        "AvgPool2d and pointwise modules)"
    )


def stage_leaves(module: nn.Module) -> list[nn.Module]:
    """The leaf modules a stage runs, in order: the module itself, or the leaves of a plain ``nn.Sequential``
    (NOTE [ Which containers are flattened ] in ``memtune.profiler.chain``).

    Raises:
        ValueError: a container that runs its own ``forward`` (its rows cannot be known).
    """
    if isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward:
        return [leaf for child in module.children() for leaf in stage_leaves(child)]
    if next(module.children(), None) is not None:
        raise ValueError("is a container with its own forward, whose rows cannot be known")
    return [module]


def stage_row_map(module: nn.Module, in_shape: Sequence[int], out_shape: Sequence[int]) -> RowMap | None:
    """``StageProfile.rows`` of a stage module with input and output shapes (batch included); None where the stage
    cannot run on strips of rows with the same math, its tensors are not images (N, C, H, W), or its modules do not
    explain its output height."""
    if len(in_shape) != 4 or len(out_shape) != 4:
        return None
    try:
        windows = [leaf_rows(m) for m in stage_leaves(module)]
    except ValueError:
        return None
    if not windows:
        return None
    maps: list[RowMap] = []
    rows = int(in_shape[2])
    for w in windows:
        if w.out_rows(rows) < 1:
            return None
        maps.append(w.row_map(rows))
        rows = w.out_rows(rows)
    if rows != int(out_shape[2]):
        return None
    return compose_rows(maps)


def chain_row_maps(
    modules: Sequence[nn.Module], input_shape: Sequence[int], output_shapes: Sequence[Sequence[int]]
) -> tuple[RowMap | None, ...]:
    """``stage_row_map`` of every stage of a chain from its traced shapes (``ChainFacts``); all None when the trace
    recorded no shapes."""
    if len(output_shapes) != len(modules):
        return (None,) * len(modules)
    ins = [input_shape, *output_shapes[:-1]]
    return tuple(stage_row_map(m, i, o) for m, i, o in zip(modules, ins, output_shapes, strict=True))
