"""memtune profiler: the model zoo, JSON specs and factories, chains and module stages, per-stage measurement, GPU
specs and identity.

Value types (``Profile`` …) and errors import without torch; the names that need torch (``build``,
``modeled_profile`` …) are loaded on first use, so the torch-free tuner can import this package. The measuring
function is ``profiler.measure.profile`` (``memtune.profile`` for users): it is not on this face, where the
name ``profile`` is the submodule of the ``Profile`` type.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from profiler.errors import ArchiveTooLargeError, ExportedError, ProfilerError, SpecError, UnknownGPUError
from profiler.profile import (
    CompilerPoint,
    ConvAlgo,
    ConvProfile,
    DeviceIdentity,
    Profile,
    SavedStorage,
    StageProfile,
    StepPeak,
)
from profiler.rows import RowMap

# The lazy names, for type checkers (``__getattr__`` would make them ``Any``).
if TYPE_CHECKING:
    from profiler.chain import ModelChain
    from profiler.devices import GPUS, GPUSpec, get_gpu
    from profiler.factory import build_factory
    from profiler.library import find_profile
    from profiler.modeled import modeled_profile
    from profiler.module_profile import profile_module
    from profiler.modules import find_stages
    from profiler.spec import from_spec, spec_hash
    from profiler.zoo import ZOO_NAMES, build

__all__ = [
    "GPUS",
    "ZOO_NAMES",
    "ArchiveTooLargeError",
    "CompilerPoint",
    "ConvAlgo",
    "ConvProfile",
    "DeviceIdentity",
    "ExportedError",
    "GPUSpec",
    "ModelChain",
    "Profile",
    "ProfilerError",
    "RowMap",
    "SavedStorage",
    "SpecError",
    "StageProfile",
    "StepPeak",
    "UnknownGPUError",
    "build",
    "build_factory",
    "find_profile",
    "find_stages",
    "from_spec",
    "get_gpu",
    "modeled_profile",
    "profile_module",
    "spec_hash",
]

_LAZY = {
    "GPUS": "profiler.devices",
    "GPUSpec": "profiler.devices",
    "get_gpu": "profiler.devices",
    "ZOO_NAMES": "profiler.zoo",
    "build": "profiler.zoo",
    "ModelChain": "profiler.chain",
    "from_spec": "profiler.spec",
    "spec_hash": "profiler.spec",
    "find_profile": "profiler.library",
    "modeled_profile": "profiler.modeled",
    "profile_module": "profiler.module_profile",
    "find_stages": "profiler.modules",
    "build_factory": "profiler.factory",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'profiler' has no attribute {name!r}")
