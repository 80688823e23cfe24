"""Recompute segments: a maximal run of ``recompute`` stages run under non-reentrant checkpointing.

# NOTE [ In-place at segment boundaries ]
``torch.utils.checkpoint`` saves a segment's input x_{i-1} for the re-run. When the segment's first
stage modifies its input in place (VGG's ``ReLU(inplace=True)`` right after a conv), the saved input is
overwritten during the forward: ``checkpoint_sequential`` then fails in backward ("modified by an
inplace operation"), and with an offloaded input the asynchronous copy could even read half-written
data. We *clone the segment input inside the checkpointed function* when the first stage may write its
input: the clone is what the stage mutates, x_{i-1} stays intact, and the re-run clones again. The cost
is one device copy and one activation: x_{i-1} (kept or offloaded for the re-run) and the stage's result
are now two storages. Any correct runtime needs both, since the re-run reads the values from before the
in-place write. The profile's storage table (NOTE [ Saved storages ]) counts them as one; where the
profile marks the stage ``inplace`` and the segment input is kept, the simulator adds the clone
(``memtune.tuner.simulator``: to the next stage's forward inside a longer segment, and again in the re-run; to
the stage's backward for a one-stage segment whose next stage keeps it). On the H200 a VGG-16 bf16 plan
whose segment starts at ``features.15`` peaked at 7.97 GiB, simulated 7.53 without the clone and 7.91
with it. Where the input or the clone is offloaded, the clone is not counted. We prefer this to running
the module out of place because it works for any stage (a block that calls ``x.relu_()``), not only for
modules with an ``inplace`` flag. "May write its input" is decided before the forward: the stage module
(or, for a container stage, its first leaf module) has ``inplace=True``, or the caller forces
``clone_inputs=True``. A stage that mutates its input without saying so is caught by the input's version
counter after the segment's forward, with a ``PlanError`` that says to pass
``clone_segment_inputs=True``.

# NOTE [ Buffers during recompute ]
Re-running a segment would update BatchNorm running statistics (and any other buffer a module writes
in forward) a second time, so a checkpointed model would drift from the unplanned one. The re-run
snapshots the segment's floating-point and integer buffers and restores them afterwards (also when
checkpoint stops the re-run early), so buffers see exactly one update per step, as without a plan.

# NOTE [ Chain stages return one tensor ]
A chain plan runs ``x_i = s_i(x_{i-1})``: checkpointing, the version check above and the offload hooks
all handle one tensor between stages. A stage that returns a dict or a tuple (a Hugging Face block, a
model's head) would otherwise fail deep inside the next stage or with a bare assertion, so a segment
checks its input and every stage output and raises a ``PlanError`` that names the stage, the type it
returned and the way out: plans with stage names (``memtune.profile``/``memtune.tune`` of any
``nn.Module``, applied by ``memtune.planned``) run module stages, which carry structured outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from memtune.profiler.chain import may_write_input
from memtune.profiler.selective import selective_context
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.runtime._buffers import buffers_kept

__all__ = ["Segment"]

StageHook = Callable[[int, torch.Tensor], None]


def _one_tensor(value: object, k: int, names: Sequence[str]) -> torch.Tensor:
    """``value`` (stage ``k``'s output) when it is a tensor, else the ``PlanError`` of NOTE [ Chain stages return
    one tensor ]."""
    if isinstance(value, torch.Tensor):
        return value
    raise PlanError(
        f"stage {k} ({names[k]}) returned a {type(value).__name__}, not one tensor; a chain plan needs stages "
        "that each return one tensor (x_i = s_i(x_{i-1})). For a model with structured outputs, make the plan "
        "with memtune.profile/memtune.tune of the nn.Module and apply it with memtune.planned: plans with stage "
        "names run module stages, which handle dicts and tuples"
    )


class Segment:
    """Stages ``first..last`` (inclusive) of a chain, run as one checkpointed segment.

    The stage modules are passed to each call, not held, so a module swapped into the chain between
    steps (``memtune.tuner.runtime.conv.apply_conv_choices``) is the one that runs.

    Args:
        first, last: stage indices (inclusive).
        modules: the chain's stage modules now (all of them; decides ``clone_input``).
        names: the chain's stage names (all of them), for error messages.
        clone_input: clone the input inside the segment (None: decide by ``may_write_input``).
        selective: run it under selective checkpointing (NOTE [ Selective stages ] in ``memtune.profiler.selective``):
        keep
            the outputs of its costly operations and re-run only the rest in backward, for a ``selective`` stage.
    """

    def __init__(
        self,
        first: int,
        last: int,
        modules: Sequence[nn.Module],
        names: Sequence[str],
        clone_input: bool | None = None,
        *,
        selective: bool = False,
    ) -> None:
        self.first = first
        self.last = last
        self.name = names[first]
        self.names = tuple(names)
        self.clone_input = may_write_input(modules[first]) if clone_input is None else clone_input
        self.selective = selective

    def __call__(
        self,
        x: torch.Tensor,
        modules: Sequence[nn.Module],
        on_stage_output: StageHook | None = None,
        on_stage_start: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """Run stages ``first..last`` of ``modules`` (the whole chain's stage modules) on ``x`` under checkpointing.

        During the original forward only (not the re-run in backward), ``on_stage_start(k)`` is called
        before stage k and ``on_stage_output(k, y)`` with its output (the runtime tracks where a step is
        and hangs its backward pre-hooks there).
        """
        if self.first > 0:  # NOTE [ Chain stages return one tensor ]
            x = _one_tensor(x, self.first - 1, self.names)
        calls = 0
        mine = list(modules[self.first : self.last + 1])

        def run(inp: torch.Tensor) -> torch.Tensor:
            nonlocal calls
            calls += 1
            if calls == 1:
                return self._run(inp, mine, on_stage_output, on_stage_start)
            with buffers_kept(b for m in mine for b in m.buffers()):  # NOTE [ Buffers during recompute ]
                return self._run(inp, mine, None, None)

        version = x._version
        if self.selective:
            out = checkpoint(run, x, use_reentrant=False, preserve_rng_state=True, context_fn=selective_context)
        else:
            out = checkpoint(run, x, use_reentrant=False, preserve_rng_state=True)
        if x._version != version:
            kind = "is a selective stage" if self.selective else "starts a recompute segment"
            raise PlanError(
                f"stage {self.first} ({self.name}) {kind} and modified its input in "
                "place, which corrupts the input saved for the re-run (NOTE [ In-place at segment "
                "boundaries ]); pass clone_segment_inputs=True to planned(), or set inplace=False on it"
            )
        return _one_tensor(out, self.last, self.names)

    def _run(
        self,
        x: torch.Tensor,
        modules: list[nn.Module],
        on_stage_output: StageHook | None,
        on_stage_start: Callable[[int], None] | None,
    ) -> torch.Tensor:
        if self.clone_input:
            x = x.clone()  # NOTE [ In-place at segment boundaries ]
        for k, m in enumerate(modules, start=self.first):
            if on_stage_start is not None:
                on_stage_start(k)
            x = _one_tensor(m(x), k, self.names)  # NOTE [ Chain stages return one tensor ]
            if on_stage_output is not None:
                on_stage_output(k, x)
        return x
