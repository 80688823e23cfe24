"""The tensors a ``.pt2`` archive declares, read from its JSON without building any: their metadata (``TensorMeta``:
dtype, shape in elements, device), their sizes in bytes (``TensorSize``, checked against a GPU type's memory, NOTE
[ Upload limits ] in ``memtune.profiler._exported_checks``), and the weight and constant configs (``check_payloads``)
that say which record holds which parameter, buffer or constant."""

from __future__ import annotations

import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import torch
from torch._export.serde.schema import ScalarType

from memtune.profiler._exported_members import PROGRAM, _bad, member_json
from memtune.profiler.profiler_errors import TensorTooLargeError

__all__ = ["FLOATS", "Payload", "TensorMeta", "TensorSize", "check_payloads", "largest_tensor", "tensor_meta"]

_MAX_DIM = 1 << 40

_FQN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+){0,63}\Z")

#: schema.ScalarType name -> (torch dtype name, bytes per element); complex, float8 and wide unsigned are refused
_DTYPES = {
    "BYTE": ("uint8", 1), "CHAR": ("int8", 1), "SHORT": ("int16", 2), "INT": ("int32", 4), "LONG": ("int64", 8),
    "HALF": ("float16", 2), "FLOAT": ("float32", 4), "DOUBLE": ("float64", 8), "BOOL": ("bool", 1),
    "BFLOAT16": ("bfloat16", 2),
}  # fmt: skip
FLOATS = frozenset({"float16", "float32", "float64", "bfloat16"})
_STRIDED = 7  # schema.Layout.Strided
_DEVICES = frozenset({"cpu", "cuda"})

_STATIC = "export with static shapes (no dynamic_shapes=…); the first input's first dimension is the batch"
_WHY_NOT = {
    "as_expr": "a symbolic size, which torch parses with sympy.sympify (it evaluates Python); " + _STATIC,
    "as_graph": "a subgraph (torch.cond, a torch.no_grad() region, checkpointing …)",
    "as_custom_obj": "a script object",
    "as_operator": "an operator passed as an argument",
}


@dataclass(frozen=True)
class TensorMeta:
    """A tensor's declared dtype, element size (bytes), sizes, strides and storage offset (elements)."""

    dtype: str
    itemsize: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def extent(self) -> int:
        """Elements of storage the view reaches (0 when it is empty)."""
        if self.numel == 0:
            return 0
        return self.offset + sum((s - 1) * st for s, st in zip(self.sizes, self.strides, strict=True)) + 1


@dataclass(frozen=True)
class TensorSize:
    """A tensor a program holds or makes, by name, with its bytes (NOTE [ Upload limits ]).

    Attributes:
        name: a parameter's, buffer's or constant's qualified name, or the graph node that makes the tensor.
        what: what it is (``parameter``, ``buffer``, ``output of node``, ``size argument of node`` …).
        meta: its dtype and sizes as declared.
        member: the archive member that declares it.
        op: the operator of the node that makes it (``aten.ones.default``), if a node does.
    """

    name: str
    what: str
    meta: TensorMeta
    member: str = PROGRAM
    op: str | None = None

    @property
    def nbytes(self) -> int:
        return self.meta.nbytes

    def describe(self) -> str:
        call = f", a call of {self.op}" if self.op else ""
        return f"{self.what} {self.name!r}{call}: {self.meta.dtype}, sizes {list(self.meta.sizes)}, {self.nbytes} bytes"


def largest_tensor(tensors: list[TensorSize], limit_bytes: int | None = None, where: str = "") -> TensorSize | None:
    """The largest of ``tensors`` (None when there are none).

    Raises:
        TensorTooLargeError: it is over ``limit_bytes`` (``where`` says whose limit, e.g. "the h200's 141 GB").
    """
    if not tensors:
        return None
    top = max(tensors, key=lambda t: t.nbytes)
    if limit_bytes is not None and top.nbytes > limit_bytes:
        raise TensorTooLargeError(
            f"{top.describe()}, over the {limit_bytes} bytes of {where or 'the limit'}: no memory plan can fit a "
            "tensor larger than the GPU (NOTE [ Upload limits ]); export the model smaller, or for a GPU with more "
            "memory",
            tensor=top.name,
            nbytes=top.nbytes,
            limit_bytes=limit_bytes,
            member=top.member,
        )
    return top


def _int(value: Any, where: str, member: str = PROGRAM, *, lo: int = 0, hi: int = _MAX_DIM) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise _bad(f"expected an integer in [{lo}, {hi}], got {str(value)[:40]}", where, member)
    return value


def _static(values: Any, where: str, member: str) -> tuple[int, ...]:
    if not isinstance(values, list) or len(values) > 64:
        raise _bad("expected a list of at most 64 sizes", where, member)
    for v in values:
        if not isinstance(v, dict) or set(v) != {"as_int"}:
            why = _WHY_NOT["as_expr"] if isinstance(v, dict) and "as_expr" in v else f"got {str(v)[:80]}"
            raise _bad(f"only static sizes are accepted ({why})", where, member)
    return tuple(_int(v["as_int"], where, member) for v in values)


def tensor_meta(meta: Any, where: str, member: str = PROGRAM) -> TensorMeta:
    """A ``schema.TensorMeta`` checked: a supported dtype, dense, static, on the CPU or a CUDA device."""
    _fields(meta, {"dtype", "sizes", "requires_grad", "device", "strides", "storage_offset", "layout"}, where, member)
    code = _int(meta["dtype"], where, member, hi=255)
    try:
        dtype, itemsize = _DTYPES[ScalarType(code).name]
    except (ValueError, KeyError):
        supported = ", ".join(d for d, _ in _DTYPES.values())
        raise _bad(f"dtype code {code} is not supported (supported: {supported})", where, member) from None
    if meta["layout"] != _STRIDED or type(meta["requires_grad"]) is not bool:
        raise _bad("only dense (strided) tensors are supported, with requires_grad true or false", where, member)
    device = meta["device"]
    if not (
        isinstance(device, dict)
        and set(device) == {"type", "index"}
        and device["type"] in _DEVICES
        and (device["index"] is None or (type(device["index"]) is int and 0 <= device["index"] < 64))
    ):
        raise _bad(f"device must be cpu or cuda, got {str(device)[:80]}", where, member)
    sizes, strides = _static(meta["sizes"], where, member), _static(meta["strides"], where, member)
    if len(strides) != len(sizes):
        raise _bad("sizes and strides differ in length", where, member)
    offset = _static([meta["storage_offset"]], where, member)[0]
    return TensorMeta(dtype, itemsize, sizes, strides, offset)


@dataclass(frozen=True)
class Payload:
    """One entry of a weights or constants config: a raw tensor record and the view of it a name gets."""

    fqn: str
    path: str
    is_param: bool
    meta: TensorMeta
    raw_meta: dict[str, Any]


def check_payloads(
    members: Mapping[str, bytes], member: str, record: re.Pattern[str]
) -> tuple[dict[str, Any], list[Payload]]:
    """A weights or constants config checked: every entry raw tensor bytes (no pickle) whose view fits its record.

    Returns the config document and its entries."""
    doc = member_json(members, member)
    if not isinstance(doc, dict) or set(doc) != {"config"} or not isinstance(doc["config"], dict):
        raise _bad('expected {"config": {name: payload, …}}', member=member)
    folder = member.rsplit("/", 1)[0] + "/"
    out: list[Payload] = []
    for fqn, entry in doc["config"].items():
        fqn = _fqn(fqn, "a tensor name", member)
        _fields(entry, {"path_name", "is_param", "use_pickle", "tensor_meta"}, fqn, member)
        if entry["use_pickle"] is not False:
            raise _bad(
                "this tensor is stored as a pickle (use_pickle), which torch.export.load unpickles with "
                "weights_only=False; memtune accepts raw tensor bytes only (plain tensors, not subclasses)",
                fqn,
                member,
            )
        path = entry["path_name"]
        if not isinstance(path, str) or not record.match(folder + path) or folder + path not in members:
            raise _bad(f"payload file {str(path)[:80]!r} is not a raw tensor record of this archive", fqn, member)
        if type(entry["is_param"]) is not bool:
            raise _bad("is_param must be true or false", fqn, member)
        out.append(
            Payload(fqn, path, entry["is_param"], tensor_meta(entry["tensor_meta"], fqn, member), entry["tensor_meta"])
        )
    groups: dict[str, list[Payload]] = {}
    for p in out:
        groups.setdefault(p.path, []).append(p)
    for path, group in groups.items():
        nbytes, first = len(members[folder + path]), group[0].meta
        if nbytes % first.itemsize:
            raise _bad(f"{nbytes} bytes is not a whole number of {first.dtype} elements", member=folder + path)
        # an empty record (a parameter whose values were dropped): torch.export.load makes zeros of the first view
        numel = first.numel if nbytes == 0 else nbytes // first.itemsize
        for p in group:
            if p.meta.dtype != first.dtype or p.meta.extent > numel:
                raise _bad(
                    f"the view ({p.meta.dtype}, sizes {list(p.meta.sizes)}, strides {list(p.meta.strides)}, offset "
                    f"{p.meta.offset}) does not fit the {numel} {first.dtype} elements of {path}",
                    p.fqn,
                    member,
                )
    return doc, out


def _fields(
    obj: Any, allowed: set[str], where: str, member: str = PROGRAM, *, optional: AbstractSet[str] = frozenset()
) -> dict[str, Any]:
    """``obj`` as an object with exactly the fields ``allowed`` (those in ``optional`` may be missing)."""
    if not isinstance(obj, dict):
        raise _bad("expected an object", where, member)
    unknown, missing = set(obj) - allowed, allowed - optional - set(obj)
    if unknown:
        raise _bad(
            f"unknown field(s) {sorted(unknown)[:5]}: this server reads the program schema of torch "
            f"{torch.__version__} (export with it)",
            where,
            member,
        )
    if missing:
        raise _bad(f"missing field(s) {sorted(missing)}", where, member)
    return obj


def _fqn(value: Any, what: str, member: str = PROGRAM, *, root: bool = False) -> str:
    if root and value == "":
        return value
    if not isinstance(value, str) or len(value) > 500 or not _FQN.match(value):
        raise _bad(
            f"{what} {str(value)[:80]!r} is not a dotted path of identifiers (FX pastes names into Python source)",
            member=member,
        )
    return value
