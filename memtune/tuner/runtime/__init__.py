"""Apply a memory plan to a live model (the only part of ``tuner`` that imports torch).

``planned(model, plan)`` wraps a chain so that each training step offloads, recomputes and keeps
saved activations as the plan says (NOTE [ Plan semantics ] in ``memtune.tuner.plan``); ``load_plan`` reads a
plan file or ``tune --json`` output; ``budget_guard`` caps CUDA memory and reports out-of-memory as
``PlanOutOfMemoryError`` naming the plan and stage; ``check_equivalence`` checks that a plan leaves
loss, gradients and buffers unchanged. ``memtune.tuner.measure.bench`` measures plans side by side and
``memtune.tuner.measure.validate`` measures a job's chosen plans on this process's GPU (imported on their own:
they pull in the simulator and cuDNN bindings). ``memtune.tuner.runtime.ddp`` runs a plan on every rank of a
data-parallel run, its copies staggered over a shared host link (``memtune.tuner.runtime._stagger``; imported on its
own). ``InferenceRunner`` runs an inference plan (``memtune.tuner.inference``).
"""

from __future__ import annotations

from memtune.tuner.runtime._inference_runner import InferenceRunner
from memtune.tuner.runtime._planned import PlannedChain, load_plan, planned
from memtune.tuner.runtime._pool import HostPool
from memtune.tuner.runtime._run_errors import PlanOutOfMemoryError
from memtune.tuner.runtime.float64 import Float64Judgement, fitting_float64_step, float64_step, judge_against_float64
from memtune.tuner.runtime.guard import budget_guard
from memtune.tuner.runtime.offload import OffloadStats
from memtune.tuner.runtime.verify import Equivalence, ReferenceStep, check_equivalence, compare_steps, reference_step

__all__ = [
    "Equivalence",
    "Float64Judgement",
    "HostPool",
    "InferenceRunner",
    "OffloadStats",
    "PlanOutOfMemoryError",
    "PlannedChain",
    "ReferenceStep",
    "budget_guard",
    "check_equivalence",
    "compare_steps",
    "fitting_float64_step",
    "float64_step",
    "judge_against_float64",
    "load_plan",
    "planned",
    "reference_step",
]
