"""Errors raised by the profiler package.

Hierarchy::

    ProfilerError
    ├── SpecError               a JSON model spec or zoo request is invalid (names layer index, field, limit)
    ├── ExportedError           an exported program (.pt2) is refused (names the archive member and field)
    │   └── ArchiveTooLargeError  the archive, or what it unpacks to, is over the size limit
    └── UnknownGPUError         a GPU name is not in the roofline table
"""

from __future__ import annotations

__all__ = ["ArchiveTooLargeError", "ExportedError", "ProfilerError", "SpecError", "UnknownGPUError"]


class ProfilerError(Exception):
    """Base class of every error the profiler raises."""


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
    """An exported program (``.pt2``) is refused (NOTE [ Safe exported programs ] in ``profiler.exported``).

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


class UnknownGPUError(ProfilerError, KeyError):
    """A GPU name was not found among the known roofline device specs."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown GPU"
