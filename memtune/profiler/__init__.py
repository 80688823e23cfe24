"""memtune profiler: the model zoo, JSON specs and factories, chains and module stages, per-stage measurement, GPU
specs and identity.

Value types (``Profile`` …) and errors import without torch; the names that need torch (``build``,
``modeled_profile`` …) are loaded on first use, so the torch-free tuner can import this package. The measuring
function is ``memtune.profiler.measure.profile`` (``memtune.profile`` for users): it is not on this face, where the
name ``profile`` is the submodule of the ``Profile`` type.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from memtune.profiler._profile import (
    CompilerPoint,
    ConvAlgo,
    ConvProfile,
    DeviceIdentity,
    HostPrices,
    Profile,
    SavedStorage,
    SaveRule,
    StageProfile,
    StepPeak,
)
from memtune.profiler._spatial_rows import RowMap
from memtune.profiler.profiler_errors import (
    ArchiveTooLargeError,
    ExportedError,
    ProfilerError,
    SpecError,
    UnknownGPUError,
)

# The lazy names, for type checkers (``__getattr__`` would make them ``Any``).
if TYPE_CHECKING:
    from memtune.profiler.chain import ModelChain
    from memtune.profiler.devices import GPUS, GPUSpec, get_gpu
    from memtune.profiler.factory import build_factory
    from memtune.profiler.library import find_profile
    from memtune.profiler.modeled import modeled_profile
    from memtune.profiler.module_profile import profile_module
    from memtune.profiler.module_stages import find_stages
    from memtune.profiler.spec import from_spec, spec_hash
    from memtune.profiler.zoo import ZOO_NAMES, build

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
    "HostPrices",
    "ModelChain",
    "Profile",
    "ProfilerError",
    "RowMap",
    "SaveRule",
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
    "GPUS": "memtune.profiler.devices",
    "GPUSpec": "memtune.profiler.devices",
    "get_gpu": "memtune.profiler.devices",
    "ZOO_NAMES": "memtune.profiler.zoo",
    "build": "memtune.profiler.zoo",
    "ModelChain": "memtune.profiler.chain",
    "from_spec": "memtune.profiler.spec",
    "spec_hash": "memtune.profiler.spec",
    "find_profile": "memtune.profiler.library",
    "modeled_profile": "memtune.profiler.modeled",
    "profile_module": "memtune.profiler.module_profile",
    "find_stages": "memtune.profiler.module_stages",
    "build_factory": "memtune.profiler.factory",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memtune.profiler' has no attribute {name!r}")
