"""memtune profiler: the model zoo, JSON specs and factories, chains and module stages, per-stage measurement, GPU
specs and identity.

Value types (``Profile`` …) and errors import without torch; the names that need torch (``build``,
``profile``, ``modeled_profile`` …) are loaded on first use, so the torch-free tuner can import this package.
"""

from __future__ import annotations

import importlib
from typing import Any

from profiler.errors import ProfilerError, SpecError, UnknownGPUError
from profiler.profile import CompilerPoint, ConvAlgo, ConvProfile, DeviceIdentity, Profile, SavedStorage, StageProfile

__all__ = [
    "GPUS",
    "ZOO_NAMES",
    "CompilerPoint",
    "ConvAlgo",
    "ConvProfile",
    "DeviceIdentity",
    "ModelChain",
    "Profile",
    "ProfilerError",
    "SavedStorage",
    "SpecError",
    "StageProfile",
    "UnknownGPUError",
    "build",
    "build_factory",
    "find_profile",
    "find_stages",
    "from_spec",
    "get_gpu",
    "modeled_profile",
    "profile",
    "profile_module",
    "spec_hash",
]

_LAZY = {
    "GPUS": "profiler.devices",
    "get_gpu": "profiler.devices",
    "ZOO_NAMES": "profiler.zoo",
    "build": "profiler.zoo",
    "ModelChain": "profiler.chain",
    "from_spec": "profiler.spec",
    "spec_hash": "profiler.spec",
    "find_profile": "profiler.library",
    "modeled_profile": "profiler.modeled",
    "profile": "profiler.measure",
    "profile_module": "profiler.module_profile",
    "find_stages": "profiler.modules",
    "build_factory": "profiler.factory",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'profiler' has no attribute {name!r}")
