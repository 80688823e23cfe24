"""memtune: fit a model's training step into a GPU memory budget, as fast as possible.

The face for Python users; the packages behind it (``profiler``, ``tuner``, ``storage``, ``api``) keep their own::

    import memtune
    tuned = memtune.tune(model, "12GiB", example_inputs=batch)   # profile, search, bound
    print(tuned)
    model = memtune.planned(model, tuned)                          # every step follows the plan

``profile`` measures any ``nn.Module`` stage by stage (its repeated blocks and the pieces between them, or stages
you name), ``tune`` searches plans of offload, recompute and selective stages, ``planned`` applies one, and
``budget_guard`` caps CUDA memory at a budget while a planned step runs.
"""

from __future__ import annotations

from api.python import Tuned, planned, profile, tune
from profiler import Profile
from tuner import Action, Plan
from tuner.runtime import budget_guard, load_plan

__all__ = ["Action", "Plan", "Profile", "Tuned", "budget_guard", "load_plan", "planned", "profile", "tune"]
