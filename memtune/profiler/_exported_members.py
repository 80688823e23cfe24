"""The members of a ``.pt2`` archive and the one pickle ``torch.export.save`` writes, checked without running anything
from it (NOTE [ Safe exported programs ] in ``memtune.profiler.exported``): which member names may appear, how many and
how far a deflated one may unpack (NOTE [ Upload limits ] in ``memtune.profiler._exported_checks``), and the sample
inputs' pickle, decoded opcode by opcode and never loaded. Sizes are in bytes."""

from __future__ import annotations

import io
import json
import pickletools
import re
import zipfile
import zlib
from collections.abc import Mapping
from typing import Any

from memtune.profiler.profiler_errors import ArchiveTooLargeError, ExportedError

__all__ = [
    "CONSTANTS_CONFIG",
    "CONSTANT_RECORD",
    "PROGRAM",
    "SAMPLE_INPUTS",
    "WEIGHTS_CONFIG",
    "WEIGHT_RECORD",
    "member_json",
    "member_text",
    "read_members",
    "scan_sample_inputs",
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
# limits on the members (NOTE [ Upload limits ] in memtune.profiler._exported_checks)
_MAX_MEMBERS = 10_000
_MAX_RATIO = 100  # unpacked / packed bytes of a deflated member above _RATIO_FROM
_RATIO_FROM = 1 << 20
_MAX_SMALL_BYTES = 64

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
