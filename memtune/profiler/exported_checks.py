"""What a ``.pt2`` archive may hold, checked without running anything from it (NOTE [ Safe exported programs ] in
``memtune.profiler.exported``): its members, the one pickle ``torch.export.save`` writes (decoded, never loaded), the
weight
and constant configs, and the program JSON, field by field against torch's program schema."""

from __future__ import annotations

import dataclasses
import io
import json
import operator
import pickletools
import re
import zipfile
import zlib
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import torch
from torch._export.serde.schema import SCHEMA_VERSION, ScalarType

from memtune.profiler.errors import ArchiveTooLargeError, ExportedError, TensorTooLargeError

__all__ = [
    "CONSTANTS_CONFIG",
    "CONSTANT_RECORD",
    "FLOATS",
    "PROGRAM",
    "SAMPLE_INPUTS",
    "WEIGHTS_CONFIG",
    "WEIGHT_RECORD",
    "Payload",
    "Program",
    "TensorMeta",
    "TensorSize",
    "check_graph",
    "check_payloads",
    "check_program",
    "largest_tensor",
    "member_json",
    "member_text",
    "read_members",
    "scan_sample_inputs",
    "tensor_meta",
]

PROGRAM = "models/model.json"
WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
SAMPLE_INPUTS = "data/sample_inputs/model.pt"
WEIGHT_RECORD = re.compile(r"data/weights/(weight_[0-9]{1,9})\Z")
CONSTANT_RECORD = re.compile(r"data/constants/(tensor_[0-9]{1,9})\Z")
_SMALL = ("archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id")
_KNOWN = (*_SMALL, PROGRAM, WEIGHTS_CONFIG, CONSTANTS_CONFIG, SAMPLE_INPUTS)
_REFUSED_MEMBERS = (
    (re.compile(r"data/(weights|constants)/[^/]*\.pt\Z"), "an older layout that keeps all tensors in one pickle"),
    (re.compile(r"data/constants/custom_obj_"), "a pickled TorchScript object"),
    (re.compile(r"data/constants/opaque_obj_"), "a pickled Python object"),
    (re.compile(r"data/(aotinductor|mtia|executorch)/|xl_model_weights/"), "compiled code or a runtime's payload"),
    (re.compile(r"extra/"), "an extra file (torch.export.save(extra_files=…))"),
    (re.compile(r"models/"), "a second program (save one program, named 'model')"),
)
# NOTE [ Upload limits ]: what a hostile archive may not do besides what its bytes cost. A 250 KB archive whose one
# deflated member unpacked to 240 MiB was stored inflated (four at once took the API from 764 to 2,280 MB), and
# 100,000 empty members or a program of 300,000 dead nodes were accepted (the nodes held a check for 55.9 s).
# torch.export.save stores every member uncompressed, so only a re-packed archive has deflated members, and a
# program JSON deflates some 10-30x; a model's graph has some thousands of operator calls (ResNet-50's training
# graph ~1,700, a 48-layer transformer's ~10,000). Within these limits a check can still take long (20,000 dead
# nodes: some 5 s; 100,000: some 25 s on two busy cores), so the service checks an upload in a child process it kills
# past MEMTUNE_MAX_EXPORTED_CHECK_S (``memtune.api.exported_upload``). And a small archive can declare a tensor no GPU
# holds: a parameter whose record is empty (torch.export.load makes zeros of its declared shape), or a call such as
# ``torch.ones(2**32)`` (``aten.ones.default`` with ``size`` [4294967296], 16 GiB): every tensor the program holds or
# makes (``TensorSize``: parameters, buffers, constants, every node's declared output, and the size a call that
# allocates (no view) is given, whatever its output's metadata says) is checked against the GPU type's memory, at
# upload (the ``gpu`` asked for, else the largest GPU type known) and again when a job names its GPU type. Shapes are
# taken as declared: a view's sizes and what a later call makes of them are not propagated.
_MAX_MEMBERS = 10_000
_MAX_RATIO = 100  # unpacked / packed bytes of a deflated member above _RATIO_FROM
_RATIO_FROM = 1 << 20
_MAX_NODES = 100_000
_MAX_SMALL_BYTES = 64
_MAX_DIM = 1 << 40
_MAX_INT = 1 << 62

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}\Z")
_FQN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+){0,63}\Z")
_STACK_KEY = re.compile(r"[A-Za-z0-9_.]{1,500}\Z")
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.<>]{0,499}\Z")
_PLAIN = re.compile(r"[A-Za-z0-9_ ,.+\-*>()\[\]]{0,200}\Z")  # einsum equations, reduction and rounding modes …
_VERSION = re.compile(r"[A-Za-z0-9_.+\-]{0,64}\Z")
_TARGET = re.compile(r"torch\.ops\.(aten|prims)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\Z")
_GETITEM = "_operator.getitem"

#: schema.ScalarType name -> (torch dtype name, bytes per element); complex, float8 and wide unsigned are refused
_DTYPES = {
    "BYTE": ("uint8", 1), "CHAR": ("int8", 1), "SHORT": ("int16", 2), "INT": ("int32", 4), "LONG": ("int64", 8),
    "HALF": ("float16", 2), "FLOAT": ("float32", 4), "DOUBLE": ("float64", 8), "BOOL": ("bool", 1),
    "BFLOAT16": ("bfloat16", 2),
}  # fmt: skip
FLOATS = frozenset({"float16", "float32", "float64", "bfloat16"})
_STRIDED = 7  # schema.Layout.Strided
_DEVICES = frozenset({"cpu", "cuda"})

_ARGUMENTS = frozenset({
    "as_none", "as_tensor", "as_tensors", "as_int", "as_ints", "as_float", "as_floats", "as_string", "as_strings",
    "as_scalar_type", "as_memory_format", "as_layout", "as_device", "as_bool", "as_bools", "as_optional_tensors",
    "as_optional_tensor", "as_int_lists", "as_float_lists",
})  # fmt: skip
_STATIC = "export with static shapes (no dynamic_shapes=…); the first input's first dimension is the batch"
_WHY_NOT = {
    "as_expr": "a symbolic size, which torch parses with sympy.sympify (it evaluates Python); " + _STATIC,
    "as_graph": "a subgraph (torch.cond, a torch.no_grad() region, checkpointing …)",
    "as_custom_obj": "a script object",
    "as_operator": "an operator passed as an argument",
}
_EVAL_MODE = {  # target -> the argument that is False when the program was exported in eval mode
    "torch.ops.aten.dropout.default": "train",
    "torch.ops.aten.native_dropout.default": "train",
    "torch.ops.aten.feature_dropout.default": "train",
    "torch.ops.aten.alpha_dropout.default": "train",
    "torch.ops.aten.batch_norm.default": "training",
    "torch.ops.aten.instance_norm.default": "use_input_stats",
}
_EVAL_ONLY = frozenset({"torch.ops.aten._native_batch_norm_legit_no_training.default"})

_STORAGES = ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool")
_SAFE_GLOBALS = frozenset(
    {("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict")}
    | {("torch", f"{t}Storage") for t in _STORAGES}
)
_PICKLE_STRINGS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"})
_PICKLE_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"})
_PICKLE_GET = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PICKLE_REFUSED = frozenset({"EXT1", "EXT2", "EXT4", "OBJ"})


def _bad(message: str, where: str | None = None, member: str = PROGRAM) -> ExportedError:
    return ExportedError(message, member=member, field=where)


# ---- members --------------------------------------------------------------------------------------------------


def read_members(data: bytes, max_bytes: int) -> dict[str, bytes]:
    """The archive's members by name below its root folder: names, count, sizes and compression checked, every byte
    read (what a member holds is checked by the caller)."""
    if len(data) > max_bytes:
        raise ArchiveTooLargeError(
            f"the archive is {len(data)} bytes, over the limit of {max_bytes}", limit_bytes=max_bytes
        )
    if not data.startswith(b"PK\x03\x04"):
        raise ExportedError("not a .pt2 archive (a zip file, which starts with 'PK'); save it with torch.export.save")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as e:
        raise ExportedError(f"the archive is truncated or corrupt ({e}); send the whole .pt2 file") from e
    if len(infos) > _MAX_MEMBERS:
        raise ExportedError(f"the archive has {len(infos)} members, over the limit of {_MAX_MEMBERS}")
    declared = sum(i.file_size for i in infos)
    if declared > max_bytes:
        biggest = max(infos, key=lambda i: i.file_size)
        raise ArchiveTooLargeError(
            f"the archive unpacks to {declared} bytes ({biggest.file_size} in its largest member), over the limit of "
            f"{max_bytes}",
            limit_bytes=max_bytes,
            member=biggest.filename,
        )
    if any(i.filename in ("serialized_exported_program.json", "version") for i in infos):
        raise ExportedError("the older .pt2 layout (torch < 2.8) keeps weights as pickles; re-save with torch >= 2.8")
    if len({i.filename.split("/", 1)[0] for i in infos}) != 1 or any("/" not in i.filename for i in infos):
        raise ExportedError("the archive's members must lie in one root folder, as torch.export.save writes them")
    members: dict[str, bytes] = {}
    for info in infos:
        name = info.filename.split("/", 1)[1]
        _allowed_member(name)
        if name in members:
            raise _bad("the archive holds this member twice", member=name)
        if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise _bad("the member is encrypted, or compressed other than stored or deflate", member=name)
        if name in _SMALL and info.file_size > _MAX_SMALL_BYTES:
            raise _bad(f"the member declares {info.file_size} bytes, over {_MAX_SMALL_BYTES}", member=name)
        if info.file_size > _RATIO_FROM and info.file_size > _MAX_RATIO * max(1, info.compress_size):
            raise _bad(
                f"the member unpacks {info.file_size} bytes from {info.compress_size}, over {_MAX_RATIO} times "
                "(NOTE [ Upload limits ]); send the archive as torch.export.save wrote it",
                member=name,
            )
        try:
            with zf.open(info) as f:
                blob = f.read(info.file_size + 1)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError) as e:
            raise _bad(f"the member cannot be read ({e}); the archive is truncated or corrupt", member=name) from e
        if len(blob) != info.file_size:
            raise _bad(f"the member holds {len(blob)} bytes, not the {info.file_size} it declares", member=name)
        members[name] = blob
    return members


def _allowed_member(name: str) -> None:
    if name in _KNOWN or WEIGHT_RECORD.match(name) or CONSTANT_RECORD.match(name):
        return
    for pattern, what in _REFUSED_MEMBERS:
        if pattern.match(name):
            raise _bad(
                f"the archive holds {what}, which memtune does not read (NOTE [ Safe exported programs ]); send the "
                "program as torch.export.save writes it, with plain tensors only",
                member=name,
            )
    raise _bad(
        f"unexpected member; a .pt2 archive for memtune holds only {', '.join(_KNOWN)}, data/weights/weight_<n> and "
        "data/constants/tensor_<n>",
        member=name,
    )


def member_text(members: Mapping[str, bytes], name: str, allowed: str) -> str:
    """A small member's text, which must match the regular expression ``allowed``."""
    if name not in members:
        raise _bad("the archive lacks this member; save the program with torch.export.save", member=name)
    text = members[name].decode("ascii", errors="replace")
    if not re.fullmatch(allowed, text):
        raise _bad(f"unexpected content {members[name][:20]!r}", member=name)
    return text


def member_json(members: Mapping[str, bytes], name: str) -> Any:
    if name not in members:
        raise _bad("the archive lacks this member; save the program with torch.export.save", member=name)
    try:
        return json.loads(members[name])
    except (ValueError, RecursionError) as e:
        raise _bad(f"not valid JSON ({e})", member=name) from e


def scan_sample_inputs(blob: bytes) -> None:
    """Refuse sample inputs that are not a ``torch.save`` archive naming only tensor-rebuilding globals.

    Its pickle is decoded with ``pickletools.genops`` (opcodes and their arguments: nothing is imported or called);
    a global named on the stack (``STACK_GLOBAL``) must come from the two strings pushed just before it."""
    if not blob.startswith(b"PK\x03\x04"):
        raise _bad(
            "not a torch.save archive but a bare pickle; save the program with torch.export.save", member=SAMPLE_INPUTS
        )
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as zf:
            names = [n for n in zf.namelist() if n.endswith("/data.pkl")]
            if len(names) != 1 or len(zf.infolist()) > _MAX_MEMBERS:
                raise _bad("not a torch.save archive (it has no single data.pkl)", member=SAMPLE_INPUTS)
            info = zf.getinfo(names[0])
            if info.file_size > 2 * len(blob) + 4096:
                raise _bad("its pickle declares more bytes than the member holds", member=SAMPLE_INPUTS)
            pkl = zf.read(info)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError) as e:
        raise _bad(f"not a readable torch.save archive ({e})", member=SAMPLE_INPUTS) from e
    pushed: list[str | None] = []  # what each opcode pushed when it was a string, else None
    memo: dict[int, str | None] = {}
    try:
        for op, arg, _pos in pickletools.genops(pkl):
            name = op.name
            if name in _PICKLE_REFUSED:
                raise _bad(f"its pickle uses opcode {name}, which plain tensors never need", member=SAMPLE_INPUTS)
            if name in ("GLOBAL", "INST"):
                _safe_global(*str(arg).partition(" ")[::2])
            elif name == "STACK_GLOBAL":
                if len(pushed) < 2 or pushed[-1] is None or pushed[-2] is None:
                    raise _bad("its pickle names a class it assembles at run time", member=SAMPLE_INPUTS)
                _safe_global(str(pushed[-2]), str(pushed[-1]))
            if name in _PICKLE_STRINGS:
                pushed.append(str(arg))
            elif name in _PICKLE_PUT:
                memo[len(memo) if name == "MEMOIZE" else int(str(arg))] = pushed[-1] if pushed else None
            elif name in _PICKLE_GET:
                pushed.append(memo.get(int(str(arg))))
            else:
                pushed.append(None)
    except ExportedError:
        raise
    except Exception as e:  # pickletools raises ValueError and others on malformed opcodes
        raise _bad(f"its pickle is malformed ({e})", member=SAMPLE_INPUTS) from e


def _safe_global(module: str, attr: str) -> None:
    if (module, attr) not in _SAFE_GLOBALS:
        raise _bad(
            f"its pickle names {module}.{attr}: sample inputs may hold plain tensors only (memtune never unpickles "
            "them, NOTE [ Safe exported programs ])",
            member=SAMPLE_INPUTS,
        )


# ---- tensors --------------------------------------------------------------------------------------------------


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


# ---- the program ----------------------------------------------------------------------------------------------


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


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > 1_000_000:
        raise _bad("expected a list", where)
    return value


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise _bad(f"{str(value)[:80]!r} is not an identifier", where)
    return value


def _fqn(value: Any, what: str, member: str = PROGRAM, *, root: bool = False) -> str:
    if root and value == "":
        return value
    if not isinstance(value, str) or len(value) > 500 or not _FQN.match(value):
        raise _bad(
            f"{what} {str(value)[:80]!r} is not a dotted path of identifiers (FX pastes names into Python source)",
            member=member,
        )
    return value


def _empty(value: Any, where: str, why: str) -> None:
    if value not in ({}, [], None):
        raise _bad(why, where)


@dataclass
class _Graph:
    """What the node checks learn on the way: tensors' metadata, and integer inputs' bounds from embeddings."""

    tensors: dict[str, TensorMeta]
    highs: dict[str, int]
    #: tensor name -> (node, operator) of the node that makes it
    made_by: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    #: tensors of the sizes that factory calls ask for (``aten.ones.default``'s ``size``), whatever the metadata says
    created: list[TensorSize] = dataclasses.field(default_factory=list)


def _tensor(ref: Any, where: str, g: _Graph) -> str:
    name = _name(_fields(ref, {"name"}, where)["name"], where)
    if name not in g.tensors:
        raise _bad(f"tensor {name!r} has no metadata in tensor_values", where)
    return name


def _argument(arg: Any, where: str, g: _Graph) -> None:
    """A ``schema.Argument``: one field, of a kind memtune accepts, its value checked."""
    if not isinstance(arg, dict) or len(arg) != 1:
        raise _bad("an argument must have exactly one field", where)
    ((kind, value),) = arg.items()
    if kind not in _ARGUMENTS:
        why = _WHY_NOT.get(kind) or ("a symbolic value; " + _STATIC if kind.startswith("as_sym") else "not supported")
        raise _bad(f"argument of kind {kind}: {why}", where)
    if kind == "as_tensor":
        _tensor(value, where, g)
    elif kind == "as_tensors":
        for v in _list(value, where):
            _tensor(v, where, g)
    elif kind in ("as_optional_tensors", "as_optional_tensor"):
        for v in _list(value, where) if kind == "as_optional_tensors" else [value]:
            if len(_fields(v, {"as_tensor", "as_none"}, where, optional={"as_tensor", "as_none"})) != 1:
                raise _bad("an optional tensor must have exactly one field", where)
            if "as_tensor" in v:
                _tensor(v["as_tensor"], where, g)
    elif kind in ("as_string", "as_strings"):
        for v in _list(value, where) if kind == "as_strings" else [value]:
            if not isinstance(v, str) or not _PLAIN.match(v):
                raise _bad(f"string argument {str(v)[:80]!r} is not a short plain string", where)
    elif kind == "as_device":
        dev = _fields(value, {"type", "index"}, where)
        if dev["type"] not in _DEVICES or not (dev["index"] is None or type(dev["index"]) is int):
            raise _bad(f"device {str(dev)[:60]} is not cpu or cuda", where)
    elif kind in ("as_int", "as_ints", "as_int_lists", "as_scalar_type", "as_memory_format", "as_layout"):
        for v in value if isinstance(value, list) else [value]:
            for x in v if kind == "as_int_lists" else [v]:
                _int(x, where, lo=-_MAX_INT, hi=_MAX_INT)
    elif kind != "as_none":  # floats and booleans
        for v in value if isinstance(value, list) else [value]:
            for x in v if isinstance(v, list) else [v]:
                if not isinstance(x, (int, float)) and x not in ("Infinity", "-Infinity", "NaN"):
                    raise _bad(f"expected a number, got {str(x)[:40]!r}", where)


def _operator(target: Any, where: str) -> torch._ops.OpOverload | None:
    """An ATen or prims operator overload that exists here and touches no file, or ``operator.getitem`` (None):
    looked up by attribute under ``torch.ops`` (nothing is called)."""
    if target == _GETITEM:
        return None
    match = _TARGET.match(target) if isinstance(target, str) else None
    if not match:
        raise _bad(
            f"target {str(target)[:100]!r} is not an ATen or prims operator (torch.ops.aten.<op>.<overload>); "
            "higher-order operators (torch.cond, torch.no_grad() regions …), custom operators and Python callables "
            "are not accepted",
            where,
        )
    namespace, op, overload = match.groups()
    try:
        resolved = getattr(getattr(getattr(torch.ops, namespace), op), overload)
    except Exception:  # an unknown name: torch raises AttributeError or RuntimeError
        resolved = None
    if not isinstance(resolved, torch._ops.OpOverload):
        raise _bad(f"operator {target!r} does not exist in this server's torch {torch.__version__}", where)
    if any(a.name == "filename" for a in resolved._schema.arguments):
        raise _bad(f"operator {target!r} reads or writes files", where)
    return resolved


def _module_stack(text: Any, where: str) -> str:
    """``nn_module_stack`` metadata ("key,path,type;…"), each part checked."""
    if not isinstance(text, str) or len(text) > 20_000:
        raise _bad("nn_module_stack must be a string", where)
    for entry in text.split(";") if text else []:
        parts = entry.split(",")
        if len(parts) != 3 or not _STACK_KEY.match(parts[0]) or not _TYPE_NAME.match(parts[2]):
            raise _bad(f"nn_module_stack entry {entry[:80]!r} is not key,module path,type name", where)
        _fqn(parts[1], f"module path (node {where})", root=True)
    return text


def _nodes(nodes: Any, g: _Graph) -> list[dict[str, Any]]:
    """The graph's nodes checked; canonical copies whose metadata is ``nn_module_stack`` alone."""
    out = []
    listed = _list(nodes, "graph.nodes")
    if len(listed) > _MAX_NODES:
        raise _bad(f"the graph has {len(listed)} nodes, over the limit of {_MAX_NODES} (NOTE [ Upload limits ])")
    for k, node in enumerate(listed):
        _fields(
            node,
            {"target", "inputs", "outputs", "metadata", "is_hop_single_tensor_return", "name"},
            f"node {k}",
            optional={"is_hop_single_tensor_return", "name"},
        )
        where = _name(node.get("name") or f"node_{k}", f"node {k}")
        target = node["target"]
        op = _operator(target, where)
        if target in _EVAL_ONLY:
            raise _eval_mode(where, target)
        named: dict[str, Any] = {}
        for arg in _list(node["inputs"], where):
            _fields(arg, {"name", "arg", "kind"}, where)
            named[_name(arg["name"], where)] = arg["arg"]
            _argument(arg["arg"], f"{where}.{arg['name']}", g)
        made = target.removeprefix("torch.ops.")
        outputs = []
        for out_arg in _list(node["outputs"], where):
            _argument(out_arg, f"{where} output", g)
            listed_out = out_arg.get("as_tensors") or [out_arg.get("as_tensor")]
            outputs += [t["name"] for t in listed_out if isinstance(t, dict)]
        for name in outputs:
            g.made_by.setdefault(name, (where, made))
        _size_argument(op, named.get("size"), outputs, where, made, g)
        flag = _EVAL_MODE.get(target)
        if flag is not None and named.get(flag) == {"as_bool": False}:
            raise _eval_mode(where, target, flag)
        if target == "torch.ops.aten.embedding.default" and "as_tensor" in named.get("indices", {}):
            weight = g.tensors.get(named.get("weight", {}).get("as_tensor", {}).get("name", ""))
            index = named["indices"]["as_tensor"]["name"]
            if weight is not None and weight.sizes:
                g.highs[index] = min(g.highs.get(index, _MAX_INT), weight.sizes[0])
        if node.get("is_hop_single_tensor_return") not in (None, True, False):
            raise _bad("expected true, false or null", where)
        metadata = node["metadata"]
        if not isinstance(metadata, dict):
            raise _bad("metadata must be an object", where)
        canonical = (
            {"nn_module_stack": _module_stack(metadata["nn_module_stack"], where)}
            if "nn_module_stack" in metadata
            else {}
        )
        out.append(dict(node, metadata=canonical))
    return out


def _size_argument(
    op: torch._ops.OpOverload | None, size: Any, outputs: list[str], where: str, made: str, g: _Graph
) -> None:
    """A call that allocates a new tensor of the sizes it is given (``aten.ones.default``'s ``size``; not a view such
    as ``expand``) makes that tensor whatever its output's metadata declares: its bytes count too."""
    if op is None or not isinstance(size, dict) or set(size) != {"as_ints"} or not op._schema.returns:
        return
    if op._schema.returns[0].alias_info is not None:  # a view of its input: allocates nothing
        return
    sizes = tuple(_int(s, where, lo=0, hi=_MAX_INT) for s in size["as_ints"])
    out = g.tensors.get(outputs[0]) if outputs else None
    dtype, itemsize = (out.dtype, out.itemsize) if out is not None else ("int64", 8)
    meta = TensorMeta(dtype, itemsize, sizes, (), 0)
    g.created.append(TensorSize(where, "size argument of node", meta, op=made))


def _eval_mode(where: str, target: str, flag: str | None = None) -> ExportedError:
    op = target.removeprefix("torch.ops.")
    how = f"{op} with {flag}=False" if flag else op
    return _bad(
        f"the node runs {how}: the program was exported in eval mode, whose memory is not a training step's; call "
        "model.train() before torch.export.export",
        where,
    )


_STATE = {  # input spec kind -> its fields, the one holding the qualified name first
    "parameter": ("parameter_name", "arg"),
    "buffer": ("buffer_name", "arg", "persistent"),
    "tensor_constant": ("tensor_constant_name", "arg"),
}
_NOT_INPUTS = {
    "custom_obj": "script objects",
    "token": "side effects (effect tokens)",
    "constant_input": "non-tensor inputs (export bakes ints, floats and strings into the program)",
}


def _signature(signature: Any, g: _Graph) -> tuple[list[tuple[str, TensorMeta]], dict[str, str]]:
    """The user inputs (name, metadata) and the state tensors' kinds by qualified name, from the graph signature."""
    _fields(signature, {"input_specs", "output_specs"}, "signature")
    inputs: list[tuple[str, TensorMeta]] = []
    state: dict[str, str] = {}
    for i, spec in enumerate(_list(signature["input_specs"], "input_specs")):
        where = f"input spec {i}"
        if not isinstance(spec, dict) or len(spec) != 1:
            raise _bad("an input spec must have exactly one field", where)
        ((kind, body),) = spec.items()
        if kind == "user_input":
            arg = _fields(body, {"arg"}, where)["arg"]
            if not isinstance(arg, dict) or set(arg) != {"as_tensor"}:
                raise _bad("every input must be a tensor", where)
            name = _tensor(arg["as_tensor"], where, g)
            inputs.append((name, g.tensors[name]))
        elif kind in _STATE:
            _fields(body, set(_STATE[kind]), where)
            _tensor(body["arg"], where, g)
            state[_fqn(body[_STATE[kind][0]], f"{kind} name")] = kind
        else:
            raise _bad(f"{_NOT_INPUTS.get(kind, kind)} are not supported", where)
    for i, spec in enumerate(_list(signature["output_specs"], "output_specs")):
        where = f"output spec {i}"
        if not isinstance(spec, dict) or len(spec) != 1:
            raise _bad("an output spec must have exactly one field", where)
        ((kind, body),) = spec.items()
        if kind in ("user_output", "loss_output"):
            _argument(_fields(body, {"arg"}, where)["arg"], where, g)
        elif kind == "buffer_mutation":
            _tensor(_fields(body, {"arg", "buffer_name"}, where)["arg"], where, g)
            _fqn(body["buffer_name"], "buffer name")
        elif kind == "user_input_mutation":
            _tensor(_fields(body, {"arg", "user_input_name"}, where)["arg"], where, g)
            _name(body["user_input_name"], where)
        else:
            raise _bad(f"output kind {kind} is not supported", where)
    if not inputs or not inputs[0][1].sizes:
        raise _bad("the program must take a tensor input whose first dimension is the batch", "input_specs")
    return inputs, state


def _treespec(text: Any, where: str) -> None:
    """A pytree spec of the module call graph: tuples, lists, dicts and leaves only."""
    if not isinstance(text, str) or len(text) > 100_000:
        raise _bad("expected a pytree spec string", where)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise _bad(f"pytree spec is not JSON ({e})", where) from e
    if not (isinstance(doc, list) and len(doc) == 2 and doc[0] == 1):
        raise _bad("unexpected pytree spec protocol", where)
    types = {None, "builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict"}

    def walk(spec: Any, depth: int) -> None:
        _fields(spec, {"type", "context", "children_spec"}, where)
        if spec["type"] not in types or depth > 32:
            raise _bad(
                f"inputs and outputs must be tensors in tuples, lists and dicts (got {str(spec['type'])[:60]})", where
            )
        if spec["context"] is not None and (not isinstance(spec["context"], str) or len(spec["context"]) > 10_000):
            raise _bad("unexpected pytree context", where)
        for child in _list(spec["children_spec"], where):
            walk(child, depth + 1)

    walk(doc[1], 0)


def _call_graph(entries: Any, g: _Graph) -> None:
    for k, entry in enumerate(_list(entries, "module_call_graph")):
        _fields(entry, {"fqn", "signature"}, f"module_call_graph {k}")
        fqn = _fqn(entry["fqn"], "module path", root=True)
        sig = entry["signature"]
        if sig is None:
            continue
        where = f"module {fqn!r} signature"
        _fields(sig, {"inputs", "outputs", "in_spec", "out_spec", "forward_arg_names"}, where)
        for arg in _list(sig["inputs"], where) + _list(sig["outputs"], where):
            _argument(arg, where, g)
        _treespec(sig["in_spec"], where)
        _treespec(sig["out_spec"], where)
        for name in _list(sig["forward_arg_names"] or [], where):
            _name(name, where)


@dataclass(frozen=True)
class Program:
    """A program JSON that passed the checks.

    Attributes:
        canonical: the program as it is stored (node metadata reduced to ``nn_module_stack``).
        inputs: the user inputs, ``(name, metadata)`` in order.
        highs: integer inputs' exclusive bounds, from the embeddings they index.
        state: parameters', buffers' and tensor constants' kinds by qualified name.
        n_nodes: operator calls.
        tensors: every tensor the graph declares (inputs, parameters, buffers, constants, the nodes' outputs) and
            every one its factory calls ask for, by name.
    """

    canonical: dict[str, Any]
    inputs: list[tuple[str, TensorMeta]]
    highs: dict[str, int]
    state: dict[str, str]
    n_nodes: int
    tensors: list[TensorSize]

    @property
    def max_tensor_bytes(self) -> int:
        """The largest tensor's bytes (0 when there is none)."""
        top = largest_tensor(self.tensors)
        return top.nbytes if top is not None else 0

    @property
    def torch_version(self) -> str:
        return str(self.canonical["torch_version"])


_TOP = {
    "graph_module", "opset_version", "range_constraints", "schema_version", "verifiers", "torch_version", "guards_code",
}  # fmt: skip
_GRAPH = {
    "inputs", "outputs", "nodes", "tensor_values", "sym_int_values", "sym_bool_values", "is_single_tensor_return",
    "custom_obj_values", "sym_float_values",
}  # fmt: skip


def check_program(doc: Any) -> Program:
    """The program JSON (``models/model.json``) checked against the schema, in canonical form."""
    _fields(doc, _TOP, "program", optional=_TOP - {"graph_module", "schema_version"})
    version = _fields(doc["schema_version"], {"major", "minor"}, "schema_version")
    if version["major"] != SCHEMA_VERSION[0] or _int(version["minor"], "schema_version") > SCHEMA_VERSION[1]:
        raise _bad(
            f"program schema {version['major']}.{version['minor']} is not readable by this server's torch "
            f"{torch.__version__} (schema {SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}); export with that torch",
            "schema_version",
        )
    _empty(
        doc.get("guards_code"),
        "guards_code",
        "guards are Python source, which torch compiles and runs; memtune "
        "accepts programs with no guards (" + _STATIC + ", no torch._check)",
    )
    _empty(doc.get("range_constraints"), "range_constraints", "dynamic shapes are not supported: " + _STATIC)
    verifiers = doc.get("verifiers") or []
    if not isinstance(verifiers, list) or not set(verifiers) <= {"TRAINING", "ATEN"}:
        raise _bad(f"dialect {str(verifiers)[:60]} is not ATen's training or inference IR", "verifiers")
    opsets = doc.get("opset_version") or {}
    if not isinstance(opsets, dict) or not all(_NAME.match(str(k)) and type(v) is int for k, v in opsets.items()):
        raise _bad("opset_version must map names to integers", "opset_version")
    torch_version = doc.get("torch_version") or ""
    if not isinstance(torch_version, str) or not _VERSION.match(torch_version):
        raise _bad("unexpected torch_version", "torch_version")

    gm = _fields(
        doc["graph_module"],
        {"graph", "signature", "module_call_graph", "metadata", "treespec_namedtuple_fields"},
        "graph_module",
    )
    _empty(gm["metadata"], "graph_module.metadata", "graph-module metadata is not supported")
    _empty(
        gm["treespec_namedtuple_fields"],
        "treespec_namedtuple_fields",
        "named tuples are not supported as inputs or outputs; use tensors, tuples, lists or dicts",
    )
    graph = _fields(gm["graph"], _GRAPH, "graph")
    for field in ("sym_int_values", "sym_bool_values", "sym_float_values"):
        _empty(graph[field], field, "symbolic values are not supported: " + _STATIC)
    _empty(graph["custom_obj_values"], "custom_obj_values", "script objects are not supported")
    if type(graph["is_single_tensor_return"]) is not bool:
        raise _bad("expected true or false", "is_single_tensor_return")
    if not isinstance(graph["tensor_values"], dict):
        raise _bad("expected an object", "tensor_values")
    g = _Graph({_name(n, "tensor_values"): tensor_meta(m, n) for n, m in graph["tensor_values"].items()}, {})
    for i, arg in enumerate(_list(graph["inputs"], "graph.inputs") + _list(graph["outputs"], "graph.outputs")):
        _argument(arg, f"graph input or output {i}", g)
    nodes = _nodes(graph["nodes"], g)
    inputs, state = _signature(gm["signature"], g)
    _call_graph(gm["module_call_graph"], g)
    canonical = {
        "graph_module": {
            "graph": dict(graph, nodes=nodes),
            "signature": gm["signature"],
            "module_call_graph": gm["module_call_graph"],
            "metadata": {},
            "treespec_namedtuple_fields": {},
        },
        "opset_version": opsets,
        "range_constraints": {},
        "schema_version": version,
        "verifiers": verifiers,
        "torch_version": torch_version,
        "guards_code": [],
    }
    return Program(canonical, inputs, g.highs, state, len(nodes), _tensor_sizes(g, gm["signature"]))


def _tensor_sizes(g: _Graph, signature: dict[str, Any]) -> list[TensorSize]:
    """Every tensor of the graph by its most telling name: a state tensor by its qualified name, a node's output by
    its node, the rest (inputs) by their own; and the tensors factory calls ask for."""
    named: dict[str, tuple[str, str]] = {}
    for spec in signature["input_specs"]:
        ((kind, body),) = spec.items()
        if kind in _STATE:
            named[body["arg"]["name"]] = (body[_STATE[kind][0]], kind.replace("_", " "))
        else:
            named[body["arg"]["as_tensor"]["name"]] = (body["arg"]["as_tensor"]["name"], "input")
    out = []
    for name, meta in g.tensors.items():
        if name in g.made_by:
            node, op = g.made_by[name]
            out.append(TensorSize(node, "output of node", meta, op=op))
        else:
            who, what = named.get(name, (name, "tensor"))
            out.append(TensorSize(who, what, meta))
    return out + g.created


def check_graph(graph: torch.fx.Graph) -> None:
    """The graph ``torch.export.load`` returned calls ATen and prims operators and ``operator.getitem`` only (the
    JSON was checked for that; this checks what torch made of it)."""
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        t = node.target
        if not (
            node.op == "call_function"
            and (t is operator.getitem or (isinstance(t, torch._ops.OpOverload) and t.namespace in ("aten", "prims")))
        ):
            raise _bad(f"the loaded graph calls {node.op} {t!r}", node.name)
