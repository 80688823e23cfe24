"""Inference plans (mmCNN): run a chain's forward pass within a working-set budget per layer.

Weights live in host memory and arrive one output-channel partition ahead of the compute that needs them; a layer
too big for the budget runs in partitions of its output channels (NOTE [ Inference plans ] in
``memtune.tuner.inference._inference_plan``). ``plan_inference`` makes a plan from ``InferenceFacts``
(``facts_from_profile``, or ``memtune.tuner.measure.inference_measure.measure_facts`` on a live model),
``simulate_inference`` prices it, and
``memtune.tuner.runtime``'s ``InferenceRunner`` runs it.
"""

from __future__ import annotations

from memtune.tuner.inference._facts import (
    COPY_LATENCY_MS,
    ConvWorkspace,
    InferenceFacts,
    LayerFacts,
    LayerShape,
    facts_from_profile,
)
from memtune.tuner.inference._inference_plan import (
    INFERENCE_PLAN_SCHEMA_VERSION,
    InferencePlan,
    LayerFitError,
    LayerPlan,
)
from memtune.tuner.inference._inference_simulator import InferenceSim, LayerTiming, simulate_inference
from memtune.tuner.inference._memory import WorkingSet, working_sets
from memtune.tuner.inference._planner import plain_plan, plan_inference

__all__ = [
    "COPY_LATENCY_MS",
    "INFERENCE_PLAN_SCHEMA_VERSION",
    "ConvWorkspace",
    "InferenceFacts",
    "InferencePlan",
    "InferenceSim",
    "LayerFacts",
    "LayerFitError",
    "LayerPlan",
    "LayerShape",
    "LayerTiming",
    "WorkingSet",
    "facts_from_profile",
    "plain_plan",
    "plan_inference",
    "simulate_inference",
    "working_sets",
]
