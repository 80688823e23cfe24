"""Errors raised by the profiler package.

Hierarchy::

    ProfilerError
    ├── SpecError               a JSON model spec or zoo request is invalid (names layer index, field, limit)
    ├── ExportedError           an exported program (.pt2) is refused (names the archive member and field)
    │   ├── ArchiveTooLargeError  the archive, or what it unpacks to, is over the size limit
    │   └── TensorTooLargeError   a tensor the program holds or makes is larger than the GPU's memory
    └── UnknownGPUError         a GPU name is not in the roofline table
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArchiveTooLargeError",
    "ExportedError",
    "ProfilerError",
    "SpecError",
    "TensorTooLargeError",
    "UnknownGPUError",
]


def _restore(cls: type[ProfilerError], args: tuple[Any, ...], state: dict[str, Any]) -> ProfilerError:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class ProfilerError(Exception):
    """Base class of every error the profiler raises.

    Errors pickle with their attributes (an exported program is checked in a child process of the API, which sends
    back what it raised); ``Exception``'s own pickling calls ``cls(*args)``, which keyword-only fields defeat.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, dict(self.__dict__)))


class SpecError(ProfilerError, ValueError):
    """A model spec (zoo parameters or JSON layers) is invalid.

    Args:
        message: what is wrong and what to do about it.
        layer: index of the offending layer in the spec, if any.
        field: name of the offending field, if any.
    """

    def __init__(self, message: str, *, layer: int | None = None, field: str | None = None) -> None:
        where = []
        if layer is not None:
            where.append(f"layer {layer}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = f"{', '.join(where)}: " if where else ""
        super().__init__(prefix + message)
        self.layer = layer
        self.field = field
        self.detail = message


class ExportedError(ProfilerError, ValueError):
    """An exported program (``.pt2``) is refused (NOTE [ Safe exported programs ] in ``memtune.profiler.exported``).

    Args:
        message: what is wrong and what to do about it.
        member: the archive member at fault (``models/model.json``), if any.
        field: the field, node or tensor name at fault inside it, if any.
    """

    def __init__(self, message: str, *, member: str | None = None, field: str | None = None) -> None:
        where = ": ".join(x for x in (member, field) if x)
        super().__init__(f"{where}: {message}" if where else message)
        self.member = member
        self.field = field
        self.detail = message


class ArchiveTooLargeError(ExportedError):
    """An exported program's archive, or what it unpacks to, is larger than ``limit_bytes``."""

    def __init__(self, message: str, *, limit_bytes: int, member: str | None = None) -> None:
        super().__init__(message, member=member)
        self.limit_bytes = limit_bytes


class TensorTooLargeError(ExportedError):
    """A tensor an exported program holds (a parameter, buffer or constant) or makes (a node's output, a factory
    call's size) takes more bytes than ``limit_bytes``, the memory of the GPU it is meant for: no plan can fit it.

    Args:
        message: which tensor, its dtype and sizes, and what to do.
        tensor: the tensor's name (a qualified parameter name, or a graph node's).
        nbytes: its bytes.
        limit_bytes: the limit it is over.
        member: the archive member that declares it.
    """

    def __init__(self, message: str, *, tensor: str, nbytes: int, limit_bytes: int, member: str | None = None) -> None:
        super().__init__(message, member=member, field=tensor)
        self.tensor = tensor
        self.nbytes = nbytes
        self.limit_bytes = limit_bytes


class UnknownGPUError(ProfilerError, KeyError):
    """A GPU name was not found among the known roofline device specs."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown GPU"
