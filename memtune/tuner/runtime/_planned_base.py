"""``PlannedBase``: what every planned model shares (``memtune.tuner.runtime._planned.PlannedChain`` runs a chain,
``memtune.tuner.runtime._planned_module.PlannedModule`` any module).

Its own module so that ``memtune.tuner.runtime._planned_module`` subclasses it without importing
``memtune.tuner.runtime._planned``, whose ``planned`` builds a ``PlannedModule``: the two would import each other.
``memtune.tuner.runtime._planned`` re-exports
it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Plan
from memtune.tuner.runtime._allocator import reserved_summary
from memtune.tuner.runtime._pool import HostPool
from memtune.tuner.runtime._run_errors import Phase, PlanOutOfMemoryError
from memtune.tuner.runtime.offload import OffloadRuntime, OffloadStats, StepState

__all__ = ["PlannedBase"]


# NOTE [ The model's own state dict ]
# A planned model holds the user's model as its submodule ``model``, so torch would save its weights under
# ``model.`` and a checkpoint of the planned model would not load into the user's own class (nor the user's own
# checkpoint into the planned model). The wrapper has no state of its own, so its state dict is the model's: the
# ``model.`` step is dropped when saving and added back when loading, at whatever depth the planned model sits
# (a planned model inside a larger module too). A Hugging Face model whose own keys start with ``model.`` keeps
# them: only the wrapper's one step is removed.
_WRAPPED = "model."


def _state_dict_without_wrapper(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any]
) -> None:
    """Rename ``{prefix}model.{key}`` to ``{prefix}{key}`` in place, the version metadata too (NOTE [ The model's
    own state dict ]); the wrapped model's own metadata takes the wrapper's place."""
    inner = prefix + _WRAPPED
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner) :]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is None:
        return
    if inner[:-1] in metadata:
        metadata[prefix[:-1]] = metadata.pop(inner[:-1])
    for key in [k for k in metadata if k.startswith(inner)]:
        metadata[prefix + key[len(inner) :]] = metadata.pop(key)


def _load_into_wrapped(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any], *_: object
) -> None:
    """Rename ``{prefix}{key}`` to ``{prefix}model.{key}`` in place before the wrapped model loads (NOTE [ The
    model's own state dict ]). ``state_dict`` is torch's copy; its metadata is the caller's, so entries are added
    for the wrapped model, none removed."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[prefix + _WRAPPED + key[len(prefix) :]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is None:
        return
    if prefix[:-1] in metadata:
        metadata.setdefault(prefix + _WRAPPED[:-1], metadata[prefix[:-1]])
    for key in [k for k in metadata if k.startswith(prefix)]:
        metadata.setdefault(prefix + _WRAPPED + key[len(prefix) :], metadata[key])


# NOTE [ Seen as the model ]
# Code that trains a model reads more of it than its forward, and a planned model stands where the model stood, so it
# answers as the model. Hugging Face's ``Trainer`` (transformers 5) reads: ``inspect.signature(model.forward)``, to
# keep the batch columns the forward takes (without datasets' ``Dataset``, a collator drops the rest: a bare
# ``(*args, **kwargs)`` dropped every column) and to decide whether it passes ``num_items_in_batch``; ``config``, on
# which it sets ``use_cache`` (off by default, else a GPT-2 threads a cache through its stages); ``loss_type``, which
# says a causal model's loss shifts its labels, so the tokens that divide a summed loss are counted over
# ``labels[..., 1:]`` (a Llama's is ``ForCausalLM``; without it a row counts one token more, and a Llama's loss came
# out 15/16 of its own at 16 tokens a row; a GPT-2's is None); and ``main_input_name``, ``num_parameters``,
# ``hf_device_map``, ``accepts_loss_kwargs`` and ``_keys_to_ignore_on_save`` where a run uses them. So the planned
# model's ``forward`` carries the wrapped model's signature (an instance attribute set once, calling the class's
# ``forward``), and an attribute the planned model lacks is the wrapped model's (as ``torch.compile``'s
# ``OptimizedModule`` forwards to the module it compiled). It moves, trains and saves as an ``nn.Module`` holding the
# model (``.to``, ``.train()``, NOTE [ The model's own state dict ]). Two things are the caller's: ``Trainer`` takes
# label names from the class's forward (``find_labels``), so an evaluation that should report a loss passes
# ``TrainingArguments(label_names=["labels"])``; and the model's own activation checkpointing (``Trainer``'s
# ``activation_checkpointing``, ``gradient_checkpointing`` before) would recompute inside the plan's stages, so the
# planned model refuses it and the plan alone decides what recomputes. ``tests/unit/modules/test_trainer_compiled.py``
# trains planned models under ``Trainer``: a GPT-2 of compiled regions, and a Llama whose loss needs ``loss_type``.


def _signed_forward(planned: nn.Module, model: nn.Module) -> functools.partial[Any]:
    """``type(planned).forward`` bound to ``planned``, with the signature of ``model.forward`` (NOTE [ Seen as the
    model ]); a forward whose signature cannot be read keeps the planned model's."""
    call = functools.partial(type(planned).forward, planned)
    with contextlib.suppress(TypeError, ValueError):
        call.__signature__ = inspect.signature(model.forward)  # type: ignore[attr-defined]
    return call


class PlannedBase(nn.Module):
    """What every planned model shares: the offload runtime, where a step is, and out-of-memory errors that name
    the plan and the stage. ``PlannedChain`` runs a chain; ``memtune.tuner.runtime._planned_module.PlannedModule`` any
    module.

    Args:
        model: the wrapped model (parameters shared, no copy).
        plan: the plan.
        names: the stage names, for error messages.
        pool_bytes: host bytes to reserve up front for offloaded storages (0: grow in the first step).
    """

    def __init__(self, model: nn.Module, plan: Plan, names: Sequence[str], *, pool_bytes: int = 0) -> None:
        super().__init__()
        self.model = model
        self.plan = plan
        self.stage_names: tuple[str, ...] = tuple(names)
        self._runtime = OffloadRuntime(reserve_bytes=pool_bytes)
        self._step: StepState | None = None
        self._budget_bytes: int | None = None  # set by oom_guard, for error messages
        self.register_state_dict_post_hook(_state_dict_without_wrapper)  # NOTE [ The model's own state dict ]
        self.register_load_state_dict_pre_hook(_load_into_wrapped)
        self.forward = _signed_forward(self, model)  # type: ignore[method-assign]  # NOTE [ Seen as the model ]

    def __getattr__(self, name: str) -> Any:
        """The planned model's own attribute, parameter or submodule, else the wrapped model's (NOTE [ Seen as the
        model ]); dunder names are never forwarded."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules")
            model = modules.get("model") if modules is not None else None
            if model is None or name.startswith("__"):
                raise
            return getattr(model, name)

    def gradient_checkpointing_enable(self, *_: Any, **__: Any) -> None:
        """Refused: the plan decides what recomputes (NOTE [ Seen as the model ]).

        Raises:
            PlanError: always.
        """
        raise PlanError(
            "a planned model recomputes what its plan says; the model's own activation checkpointing would re-run "
            "inside the plan's stages: leave it off (Trainer's activation_checkpointing or gradient_checkpointing, off "
            "by default)"
        )

    activation_checkpointing_enable = gradient_checkpointing_enable

    # ---- inspection ------------------------------------------------------------------------------
    @property
    def stats(self) -> OffloadStats:
        """Offload counters since construction (copies, bytes, prefetches, dedupes)."""
        return self._runtime.stats

    @property
    def pool(self) -> HostPool | None:
        """The host pool offloaded storages go to (None before the first offload)."""
        return self._runtime.pool

    @property
    def running(self) -> tuple[Phase, int | None]:
        """Where the current or last step is: (phase, stage index)."""
        step = self._step
        if step is None:
            return "forward", None
        if step.forward_stage is not None:
            return "forward", step.forward_stage
        if not step.forward_ended:
            return "forward", None
        return "backward", step.backward_stage

    def _begin_step(self, device: torch.device, exclude_ptrs: set[int]) -> StepState:
        """A new step of the offload runtime with the plan's knobs; ``exclude_ptrs`` stay on the device."""
        plan = self.plan
        self._step = self._runtime.begin_step(
            device,
            sync=plan.sync,
            sync_delay=plan.sync_delay,
            sync_points=plan.sync_points,
            lookahead=plan.prefetch_lookahead,
            exclude_ptrs=exclude_ptrs,
            lookaheads=plan.stage_lookaheads(),  # NOTE [ Prefetch lookahead ] in memtune.tuner.plan
        )
        return self._step

    def release(self) -> None:
        """Give back what the planned model changed on the wrapped model beyond one step: nothing here; a
        ``PlannedModule`` wraps its stage modules once (NOTE [ Stage modules are wrapped once ] in
        ``memtune.tuner.runtime._planned_module``) and its ``release`` restores them."""

    # ---- out of memory ---------------------------------------------------------------------------
    def _oom(self, exc: BaseException, phase: Phase, stage: int | None) -> PlanOutOfMemoryError:
        """Free what the failed step holds and build the error that names plan and stage."""
        reserved = reserved_summary()  # before anything is freed: where the memory sat when the step failed
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)  # frames keep activations alive
        self._runtime.abandon(self._step)
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        return PlanOutOfMemoryError(
            label=self.plan.label,
            stage=stage,
            stage_name=self.stage_names[stage] if stage is not None else None,
            phase=phase,
            budget_bytes=self._budget_bytes,
            detail=str(exc),
            reserved=reserved,
            outside=None if stage is not None else self._outside(phase),
        )

    def _outside(self, phase: Phase) -> str:
        """Where a step is when no stage runs: before the first stage, or after the model returned and before the
        backward reached the last stage (the loss's forward or backward, or the model's own code after its last
        stage, such as a Hugging Face model's cross-entropy over its logits)."""
        n = len(self.stage_names)
        if phase == "forward":
            return f"the forward of the model's own code before its first stage, stage 0 ({self.stage_names[0]})"
        return (
            f"the loss (its forward or backward) or the backward of the model's own code after its last stage, stage "
            f"{n - 1} ({self.stage_names[n - 1]}), before the backward reached that stage"
        )

    @contextlib.contextmanager
    def oom_guard(self, budget_bytes: int | None = None) -> Iterator[None]:
        """Turn an out-of-memory error inside the block (forward or backward) into ``PlanOutOfMemoryError``.

        The error names the plan label and the stage that was running; the runtime's in-flight state
        is dropped and the CUDA cache emptied first, so the next step can run. ``budget_guard`` uses it.
        """
        previous = self._budget_bytes
        self._budget_bytes = budget_bytes
        try:
            yield
        except torch.OutOfMemoryError as exc:
            phase, stage = self.running
            raise self._oom(exc, phase, stage) from exc
        finally:
            self._budget_bytes = previous
