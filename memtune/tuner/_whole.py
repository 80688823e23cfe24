"""Plans that compile the whole model: the compiler's own partition, chosen by memtune for a byte budget.

# NOTE [ Whole-model compile ]
``torch.compile`` lowers a whole model into few fused kernels, and AOTAutograd's min-cut partitioner decides
what the backward recomputes under ``activation_memory_budget`` (0 to 1). Measured on an H100 (ResNet-50,
batch 128, fp32; docs/results/torch-compile.md), that recomputation costs 1.0–1.7 ms per GiB of peak saved,
while moving a GiB over the host link takes 19.5 ms each way (55 GB/s): there, where the compiler's partition
reaches a peak, no plan of offload and eager recompute ran faster, and a plan over stages compiled one by one
loses what the compiler fuses across stage boundaries (on the GPT model in fp32 eager plans were faster). So a
plan may run the whole model compiled (``Plan.whole_compile``), every stage kept, priced by a measured
*compiler point* of the profile (``Profile.compiler_points``: step and peak of the whole model compiled at one
budget, measured by ``memtune.tuner.measure.compiler_points.measure_compiler_points``), not by the simulator.

What memtune adds to the compiler's one knob: the knob is not a memory bound (at budget 0 ResNet-50's peak was
10.48 GiB, as at budget 1), so ``tune`` takes the fastest measured point that runs under the cap (its measured
reserved peak, what the cap sees, within the budget; where that was not measured, its allocated peak within the
budget less its headroom: ``CompilerPoint.fits``, ``memtune.tuner.search.compiler_candidates``) and serves it where it
beats the best searched plan; below the lowest compiled peak the searched plans (offload, recompute) still
train. A point records the optimizer of its measured steps (``CompilerPoint.optimizer``); served to a plan for
another optimizer, its peaks move by the difference in optimizer state per parameter byte, as the simulator counts
it (``memtune.tuner.search.compiler_candidates``): a point measured with SGD and momentum holds one copy of the
parameters less than an AdamW step. The math is the compiler's: the same as ``torch.compile`` of the model at that
budget, equal to eager up to floating-point reassociation.

# NOTE [ The optimizer's update ]
The simulator's step is the forward and the backward (``SimResult.step_ms``); a compiler point is a measured training
step, the optimizer's update included. The update costs the same under every plan of one model and optimizer, so
plans of stages compare among themselves without it, but a point compared with them as measured would lose by the
update's time: on an H200, AdamW's update over the Llama decoder's 1.01 GiB of parameters took 6.4 ms a step, 3.3 over
GPT-2's 0.46 GiB (the unplanned eager step measured less the simulated one, ``benchmarks.update_time``). So a point's
update is timed inside its steps (``CompilerPoint.update_ms``) and a plan that compiles the whole model is priced at
``CompilerPoint.forward_backward_ms``, as the simulator prices the others; a point measured before that is priced at
its whole step.
"""

from __future__ import annotations

from memtune.profiler import CompilerPoint, Profile
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Plan, PlanKind

__all__ = ["compiler_point"]


def compiler_point(profile: Profile, plan: Plan) -> CompilerPoint:
    """The measured point that prices ``plan`` (a plan with ``whole_compile``).

    Raises:
        PlanError: the plan does not compile the whole model, or the profile has no point at its budget.
    """
    if plan.kind is not PlanKind.WHOLE_COMPILE:
        raise PlanError("the plan runs stage by stage (whole_compile is None): the simulator prices it")
    plan.check(profile)  # raises PlanError naming the budgets measured when none is at the plan's budget
    return next(p for p in profile.compiler_points if p.activation_budget == plan.whole_compile)
