"""The plan schema: one action per stage plus global knobs, and what it means for every saved storage.

# NOTE [ Plan semantics ]
This is the plan of docs/concepts.md made exact; the simulator (``memtune.tuner.simulator``) and the runtime
(``memtune.tuner.runtime``) both follow it.

* ``keep``: the stage's saved tensors stay on the GPU until its backward.
* ``offload``: the stage's saved tensors are copied to pinned host memory on a copy stream as soon as
  they exist; the GPU copy is freed once the copy completes and the forward no longer reads it. With
  ``sync="layer"`` (vDNN) compute waits for the copy at the end of the last forward use. With
  ``sync="deferred"`` the wait is put off by ``sync_delay`` stages: a storage packed during stage P's
  forward is waited for, and freed, at the end of forward stage max(last forward use, P + sync_delay), so
  the copy overlaps ``sync_delay`` stages of compute; when that stage is past the forward's end the
  storage stays on the GPU and its backward uses it in place (the copy was wasted). ``sync_delay`` 0 is
  ``layer``. Compute never waits on the host: the wait is a stream wait, so the runtime frees exactly
  where the simulator does, however far the host runs ahead of the GPU (NOTE [ Deferred frees ] in
  ``memtune.tuner.simulator``). The copy comes back ``prefetch_lookahead`` stages before the backward that first
  needs it (per stage: NOTE [ Prefetch lookahead ] below). With
  ``sync="points"`` (HMMS Algorithm 1) compute waits for every outstanding copy at the end of each stage
  in ``sync_points`` and the copies finished by then are freed there. With ``sync="inline"`` (PyTorch's
  ``save_on_cpu``) copies run on the compute stream, blocking it, and come back only when needed.
* ``recompute``: a maximal run of recompute stages i..j is one checkpointed segment: the stages save
  nothing; only the segment input x_{i-1} is saved, offloaded when stage i-1 is ``offload``, else kept.
  In backward, when stage j's backward is due, the segment's forward is re-run from x_{i-1}. In a profile of
  module stages (NOTE [ Module stages ] in ``memtune.profiler.module_stages``) every recompute stage is a segment of its
  own, which keeps every tensor its forward takes (``Profile.stage_inputs``): the model's own forward runs between
  stages, so a checkpoint can only wrap one stage's call.
* ``selective``: the stage runs under PyTorch's selective activation checkpointing (NOTE [ Selective stages ] in
  ``memtune.profiler.selective``): it keeps its input x_{i-1} and the outputs of its costly operations (matrix products,
  convolutions, attention: ``StageProfile.selective_saved_bytes``) on the GPU until its backward, which re-runs
  its cheap operations first. In the storage table it saves nothing itself and holds its input as ``keep`` does;
  the outputs it keeps are held apart from the table, from the end of its forward to the end of its backward.
  Only stages the profile measured so (``selective_*`` fields) may take it; a recompute segment next to it
  treats it as ``keep``.
* ``spatial_splits``: a recompute segment i..j of a chain plan, keyed ``"i-j"``, may run in s strips of rows
  (2..64) with exact halos (NOTE [ Spatial splitting ] in ``memtune.tuner._spatial``): it saves and re-runs what an
  unsplit segment does (only x_{i-1} is saved), but its forward and its re-run go strip by strip, so one strip's
  intermediates live at a time. Only stages whose profile records ``StageProfile.rows`` may be split.

A storage (NOTE [ Saved storages ] in ``memtune.profiler._profile``) is referenced by every non-recompute stage
that saves it and by every segment whose input it is (with stage i-1's action; ``keep`` for module stages).
A storage the model's own code saves outside every stage (``SavedStorage.outside``) is kept whatever the plan.
Then:

* no reference: it is not kept (transient in forward, re-made by recompute in backward);
* any ``keep`` reference: it stays on the GPU;
* otherwise (only ``offload`` references): it is offloaded.

A storage that has both an ``offload`` and a ``keep`` reference is still copied (the offloading stage
cannot know the future) but stays on the GPU: a wasted copy, which the search learns to avoid.

# NOTE [ Prefetch lookahead ]
An offloaded storage whose first backward need is stage k (``StorageFate.need``) is prefetched when the backward
reaches stage min(n-1, k + L_k), where L_k (stages) is ``prefetch_lookaheads[k]`` when the plan has per-stage
lookaheads, else the global ``prefetch_lookahead`` for every k; under ``sync="inline"`` L_k is 0 (fetched on
demand). ``Plan.stage_lookaheads`` computes L_k once for the simulator's ``prefetch_at`` and the runtime's
``StepState.on_backward``. Per-stage values are what the per-layer trigger chooses (NOTE [ Per-layer prefetch
trigger ] in ``memtune.tuner._prefetch_trigger``); an entry for a stage that no offloaded storage first needs changes
nothing. The prefetches one backward stage issues share one copy engine: they are queued by need, the storage needed
first (the highest need stage) first, storage order among equals. The runtime always issued them so (its entries sorted
by need); the simulator queued them in storage order, the one needed last first, so a lookahead that brought back many
storages at the backward's start was simulated stalling on copies that the runtime had already made: on a hand-made
chain (``tests/unit/tuner/test_prefetch_trigger.py``) lookahead 4 was simulated 5.5 ms slower than lookahead 3.

Both fields are stored and neither is derived from the other. The per-stage values are chosen stage by stage (the
trigger moves each from a start it searched), not a function of one number; and under them the global one is still
the plan's own knob: the search's ``lookahead`` parameter a plan is seeded with (``memtune.tuner._search_space``, where
a move that changes it replaces the per-stage values), the trigger's plan keeps it, and ``memtune bench`` prints it.
Deriving either from the other would lose a stored value and drop a field from the JSON of stored plans and from the
service's schema. What is derived is the lookahead each stage runs with, ``Plan.stage_lookaheads`` (which also reads
``sync``); code that prefetches reads that, not the fields.

Convolution algorithms: ``conv_rule`` applies to every convolution (``default`` = the framework's
choice, ``fastest``, ``memory_optimal``, ``fastest_within`` a workspace cap), ``conv_algos`` overrides
single convolutions by key ``"<stage index>.<conv name>"`` (``"3."`` for a stage that is a conv). A pass may
run as several cuDNN calls on batch chunks, each with one chunk's workspace (NOTE [ Batch split ] in
``memtune.profiler.conv_split``): ``fastest_within`` weighs the split runs the profile measured, an override names them
with ``*_split``. The values are the unsplit convolution's (the weight gradient up to summation order).

# NOTE [ Plan kinds ]
A plan is one of five kinds (``PlanKind``), which ``Plan.kind`` reads off its fields: ``whole_compile`` set makes a
whole-model compile whatever else is set; otherwise named ``stages`` make a plan of module stages and
``compile_budget`` makes it compiled. ``Plan``'s validator enforces each kind's rules (its messages name the field and
why); every kind takes ``actions`` (one per stage), the sync and prefetch knobs and ``label``:

* ``chain``: the stages of a chain ``x_i = s_i(x_{i-1})``, run eager. Uses every action, the convolution choices
  (``conv_rule``, ``conv_workspace_limit_bytes``, ``conv_algos``) and ``spatial_splits`` of its recompute segments
  (maximal runs of ``recompute``). Forbids ``compile_saves`` (it needs ``compile_budget``) and ``eager_stages`` (they
  need ``compile_budget`` and ``stages``).
* ``compiled_chain``: a chain whose every stage runs compiled under ``compile_budget`` (NOTE [ Compiled stages ] in
  ``memtune.profiler.compiled``), saving by ``compile_saves`` when set. Forbids ``selective`` actions and convolution
  choices (``conv_rule`` other than ``default``, ``conv_algos``): both work on eager operations; forbids
  ``eager_stages`` (they need ``stages``) and ``spatial_splits`` (eager chains only).
* ``module_stages``: ``stages`` names the module stages the actions apply to, one per action (NOTE [ Module stages ] in
  ``memtune.profiler.module_stages``); every recompute stage is a segment of its own. Uses every action and the
  convolution choices. Forbids ``compile_saves``, ``eager_stages`` and ``spatial_splits`` (the model's own forward
  runs between stages, so none can be split).
* ``compiled_regions``: module stages run as compiled regions (``stages`` and ``compile_budget`` set; NOTE [ Regions ]
  in ``memtune.profiler.region_tree``), saving by ``compile_saves`` when set, with ``eager_stages`` the regions that run
  eager (NOTE [ In-place writes at region edges ]). Forbids what ``compiled_chain`` forbids but ``eager_stages``.
* ``whole_compile``: the whole model compiled under ``whole_compile`` (NOTE [ Whole-model compile ] in
  ``memtune.tuner._whole``), priced by a measured compiler point, not the simulator; ``stages`` may name the module
  stages of its profile. Every action is ``keep``. Forbids ``compile_budget`` (and so ``compile_saves`` and
  ``eager_stages``), convolution choices, and ``spatial_splits`` (no recompute segment to split). Its sync and prefetch
  knobs are stored but nothing is copied.

The stored form stays one versioned model, the kind derived, not a pydantic discriminated union of five models:

* The stored JSON has no tag. Plans in the database, in plan files (``load_plan``), in benchmark results and over the
  service's API are one object of optional fields at ``schema_version`` 1; a tagged union needs a tag field (a new
  stored field, so a new schema version and a migration of stored plans) or a callable discriminator that reads the
  flags, which is this property again, inside pydantic.
* The service's OpenAPI would describe a plan as a ``oneOf`` of five schemas instead of one ``Plan``: a change of the
  API its clients and the schema's snapshot see, for no change on the wire.
* ``Plan`` is one class that code builds and changes: ``Plan(...)``, ``Plan.uniform``, ``Plan.with_``,
  ``model_copy`` and ``Plan.named``, which turns a chain plan into a plan of module stages or compiled stages when it
  meets its profile; over a union each would pick a class, and a change of kind would be a change of class.
* A field a kind forbids is refused by the validator with a message that says which field and what to do; kind
  models with ``extra="forbid"`` would refuse it as pydantic's bare "Extra inputs are not permitted".

The price: a type checker does not narrow the fields by ``kind`` (``stages`` stays ``tuple | None`` after
``plan.kind is PlanKind.COMPILED_REGIONS``), so code that reads a kind's own field tests that field.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memtune.profiler import SaveRule
from memtune.tuner._spatial import check_split_keys, parse_segment_key, spatial_refusal
from memtune.tuner._tuner_errors import PlanError

if TYPE_CHECKING:
    from memtune.profiler import Profile

__all__ = [
    "PLAN_SCHEMA_VERSION",
    "Action",
    "ConvChoice",
    "Plan",
    "PlanKind",
    "StorageFate",
    "resolve_storages",
    "segments",
]

PLAN_SCHEMA_VERSION = 1


class Action(str, Enum):
    """What happens to a stage's saved tensors. See NOTE [ Plan semantics ]."""

    KEEP = "keep"
    OFFLOAD = "offload"
    RECOMPUTE = "recompute"
    SELECTIVE = "selective"


class PlanKind(str, Enum):
    """What a plan runs: a chain or module stages, eager or compiled, or the whole model compiled. Read off a plan's
    fields (``Plan.kind``); each kind's fields and rules are NOTE [ Plan kinds ]."""

    CHAIN = "chain"
    COMPILED_CHAIN = "compiled_chain"
    MODULE_STAGES = "module_stages"
    COMPILED_REGIONS = "compiled_regions"
    WHOLE_COMPILE = "whole_compile"


class ConvChoice(BaseModel):
    """An explicit cuDNN algorithm triple for one convolution (ids as in cudnnConvolution*Algo_t).

    ``*_split``: the batch chunks that pass runs as (NOTE [ Batch split ] in ``memtune.profiler.conv_split``); 1 = one
    call.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    fwd: int = Field(ge=0)
    bwd_data: int = Field(ge=0)
    bwd_filter: int = Field(ge=0)
    fwd_split: int = Field(default=1, ge=1, le=1024)
    bwd_data_split: int = Field(default=1, ge=1, le=1024)
    bwd_filter_split: int = Field(default=1, ge=1, le=1024)


ConvRule = Literal["default", "fastest", "memory_optimal", "fastest_within"]
SyncMode = Literal["layer", "deferred", "points", "inline"]


class Plan(BaseModel):
    """A memory plan for one chain: an action per stage plus global knobs. Versioned JSON."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = PLAN_SCHEMA_VERSION
    actions: tuple[Action, ...] = Field(min_length=1)
    prefetch_lookahead: int = Field(default=2, ge=0, le=1024, description="stages")
    prefetch_lookaheads: tuple[int, ...] | None = Field(
        default=None,
        description="stages, one per stage: the lookahead of the offloaded storages first needed by that stage's "
        "backward (NOTE [ Prefetch lookahead ]); None: prefetch_lookahead for every stage",
    )
    sync: SyncMode = "deferred"
    sync_delay: int = Field(
        default=2,
        ge=0,
        le=1024,
        description="stages; under sync='deferred', how many stages after its pack stage an offloaded storage "
        "is waited for and freed",
    )
    sync_points: tuple[int, ...] = Field(default=(), description="stage indices, for sync='points'")
    conv_rule: ConvRule = "default"
    conv_workspace_limit_bytes: int | None = Field(default=None, ge=0)
    conv_algos: dict[str, ConvChoice] = Field(default_factory=dict)
    label: str | None = Field(default=None, description="which policy or search made it")
    stages: tuple[str, ...] | None = Field(
        default=None,
        description="the qualified names of the module stages the actions apply to, in run order (NOTE [ Module "
        "stages ] in memtune.profiler.module_stages); None for a chain",
    )
    compile_budget: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="every stage runs compiled by torch.compile, partitioned under this activation-memory budget "
        "(NOTE [ Compiled stages ] in memtune.profiler.compiled; module stages are then regions, each wrapped once, "
        "NOTE [ Regions ] in memtune.profiler.region_tree, except eager_stages); the plan is priced on the compiled "
        "profile of that budget. None: eager stages",
    )
    compile_saves: SaveRule | None = Field(
        default=None,
        description="with compile_budget: memtune's save rule inside every compiled stage ('compute': keep the outputs "
        "of matrix products, convolutions and attention, recompute the rest; NOTE [ Saved tensors chosen inside a "
        "compiled region ] in memtune.profiler.saved_tags), as the compiled profile it is priced on was measured; "
        "None: the compiler's own choice under compile_budget",
    )
    eager_stages: tuple[int, ...] = Field(
        default=(),
        description="stage indices that run eager in a plan whose module stages run compiled (compile_budget set): "
        "regions written in place at their edges (NOTE [ In-place writes at region edges ] in "
        "memtune.profiler.region_tree), "
        "as the profile measured them; empty: every stage compiled",
    )
    whole_compile: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="the whole model runs compiled by torch.compile under this activation-memory budget, every "
        "stage 'keep' (NOTE [ Whole-model compile ] in memtune.tuner._whole); priced by the profile's measured "
        "compiler point of that budget. None: the stages run as the actions say",
    )
    spatial_splits: dict[str, int] = Field(
        default_factory=dict,
        description="recompute segment 'i-j' -> strips of rows (2..64) it runs in, halos included (NOTE [ Spatial "
        "splitting ] in memtune.tuner._spatial); empty: every segment runs whole",
    )

    @model_validator(mode="after")
    def _check(self) -> Plan:
        if self.schema_version != PLAN_SCHEMA_VERSION:
            raise ValueError(f"plan schema_version {self.schema_version} is not supported (expected 1)")
        if self.sync == "points" and not self.sync_points:
            raise ValueError("sync 'points' needs sync_points (stage indices where compute waits for copies)")
        if any(b <= a for a, b in zip(self.sync_points, self.sync_points[1:], strict=False)):
            raise ValueError("sync_points must be strictly increasing stage indices")
        if self.conv_rule == "fastest_within" and self.conv_workspace_limit_bytes is None:
            raise ValueError("conv_rule 'fastest_within' needs conv_workspace_limit_bytes")
        if self.stages is not None and len(self.stages) != len(self.actions):
            raise ValueError(f"plan names {len(self.stages)} stages but has {len(self.actions)} actions")
        if self.prefetch_lookaheads is not None:  # NOTE [ Prefetch lookahead ]
            _check_lookaheads(self.prefetch_lookaheads, len(self.actions))
        if self.compile_budget is not None:  # NOTE [ Compiled stages ]: the compiler's operations, not eager ones
            if Action.SELECTIVE in self.actions:
                k = self.actions.index(Action.SELECTIVE)
                raise ValueError(f"stage {k} is 'selective', which a compiled plan cannot take (compile_budget is set)")
            if self.conv_rule != "default" or self.conv_algos:
                raise ValueError("a compiled plan leaves convolutions to the compiler: conv_rule must be 'default' "
                                 "and conv_algos empty when compile_budget is set")  # fmt: skip
        if self.compile_saves is not None and self.compile_budget is None:
            raise ValueError("compile_saves is a save rule of compiled stages: it needs compile_budget")
        if self.eager_stages:  # NOTE [ In-place writes at region edges ]
            if self.compile_budget is None or self.stages is None:
                raise ValueError("eager_stages names stages of a plan whose module stages run compiled: it needs "
                                 "compile_budget and stages")  # fmt: skip
            if any(b <= a for a, b in zip(self.eager_stages, self.eager_stages[1:], strict=False)):
                raise ValueError("eager_stages must be strictly increasing stage indices")
            bad = [k for k in self.eager_stages if not 0 <= k < len(self.actions)]
            if bad:
                raise ValueError(f"eager_stages {bad} are outside the stage range 0..{len(self.actions) - 1}")
        if self.whole_compile is not None:  # NOTE [ Whole-model compile ]: the compiler chooses what to save
            if any(a is not Action.KEEP for a in self.actions):
                k = next(k for k, a in enumerate(self.actions) if a is not Action.KEEP)
                raise ValueError(
                    f"stage {k} is {self.actions[k].value!r}: a plan that compiles the whole model keeps every stage "
                    "(whole_compile is set; the compiler's partition decides what is saved)"
                )
            if self.compile_budget is not None or self.conv_rule != "default" or self.conv_algos:
                raise ValueError("whole_compile excludes compile_budget and convolution choices (conv_rule "
                                 "'default', no conv_algos): the compiler lowers the whole model")  # fmt: skip
        check_split_keys(  # NOTE [ Spatial splitting ]
            self.spatial_splits,
            segments(self.actions),
            module_stages=self.stages is not None,
            compiled=self.compile_budget is not None,
        )
        return self

    @property
    def kind(self) -> PlanKind:
        """What this plan runs, read off its fields (NOTE [ Plan kinds ]): ``whole_compile`` set is a whole-model
        compile; otherwise ``stages`` named make module stages and ``compile_budget`` set makes them compiled. Not
        stored: a plan's JSON is its fields."""
        if self.whole_compile is not None:
            return PlanKind.WHOLE_COMPILE
        if self.stages is None:
            return PlanKind.CHAIN if self.compile_budget is None else PlanKind.COMPILED_CHAIN
        return PlanKind.MODULE_STAGES if self.compile_budget is None else PlanKind.COMPILED_REGIONS

    def named(self, profile: Profile) -> Plan:
        """This plan as it applies to ``profile``: with the stage names of a profile of module stages, and with the
        compile budget of a compiled profile (NOTE [ Compiled stages ]; convolutions are then the compiler's, as
        they were priced: a compiled profile has no algorithm tables). Unchanged for an eager chain."""
        plan = self
        if profile.modules and plan.stages is None:
            plan = plan.model_copy(update={"stages": tuple(s.name for s in profile.stages)})
        if profile.compile_budget is not None and plan.kind in (PlanKind.CHAIN, PlanKind.MODULE_STAGES):
            plan = plan.with_(
                compile_budget=profile.compile_budget,
                compile_saves=profile.compile_saves,
                eager_stages=profile.eager_stages if plan.stages is not None else (),
                conv_rule="default",
                conv_algos={},
                conv_workspace_limit_bytes=None,
            )
        return plan

    # ---- constructors ----------------------------------------------------------------------------
    @classmethod
    def uniform(cls, n: int, action: Action = Action.KEEP, **knobs: object) -> Plan:
        """A plan giving every one of ``n`` stages the same action."""
        return cls(actions=(action,) * n, **knobs)  # type: ignore[arg-type]

    @classmethod
    def from_actions(cls, actions: Sequence[Action | str], **knobs: object) -> Plan:
        """Build from actions or their letters (``"kkor"``, ``["keep", "offload"]``)."""
        letters = {a.value[0]: a for a in Action}
        return cls(
            actions=tuple(letters[a] if isinstance(a, str) and a in letters else Action(a) for a in actions),
            **knobs,  # type: ignore[arg-type]
        )

    def with_(self, **changes: object) -> Plan:
        """A copy with some fields changed (validated)."""
        data = self.model_dump()
        data.update(changes)
        return Plan.model_validate(data)

    # ---- checks ----------------------------------------------------------------------------------
    def check(self, profile: Profile) -> None:
        """Raise ``PlanError`` if this plan does not fit ``profile`` (stage count, conv keys, selective stages, a
        compiled plan on another profile, spatial splits of stages that cannot be split)."""
        n = profile.n_stages
        if self.whole_compile is not None and all(
            p.activation_budget != self.whole_compile for p in profile.compiler_points
        ):
            have = ", ".join(f"{p.activation_budget:g}" for p in profile.compiler_points) or "none"
            raise PlanError(
                f"the plan compiles the whole model under activation budget {self.whole_compile:g}, which the "
                f"profile has not measured (its compiler points: {have}); `memtune profile --compiler-sweep` "
                "measures them"
            )
        if self.compile_budget is not None and self.compile_budget != profile.compile_budget:
            made = "an eager profile" if profile.compile_budget is None else f"budget {profile.compile_budget:g}"
            raise PlanError(
                f"the plan runs its stages compiled under activation budget {self.compile_budget:g} but the profile "
                f"was measured with {made}; price it on the compiled profile of its budget"
            )
        if self.compile_budget is not None and self.compile_saves != profile.compile_saves:
            raise PlanError(
                f"the plan's compiled stages save by {_saves_words(self.compile_saves)} but the profile was measured "
                f"saving by {_saves_words(profile.compile_saves)}; price it on the compiled profile it was tuned on"
            )
        if self.compile_budget is not None and profile.modules and self.eager_stages != profile.eager_stages:
            mine, theirs = (
                ", ".join(profile.stages[k].name for k in ks if k < n) or "none"
                for ks in (self.eager_stages, profile.eager_stages)
            )
            raise PlanError(
                f"the plan runs stages {list(self.eager_stages)} ({mine}) eager among its compiled regions but the "
                f"profile measured {list(profile.eager_stages)} ({theirs}) so (NOTE [ In-place writes at region "
                "edges ]); a plan is made for the regions it was tuned on"
            )
        if len(self.actions) != n:
            raise PlanError(
                f"plan has {len(self.actions)} actions but {profile.model!r} has {n} stages; "
                "a plan is made for one chain"
            )
        if self.stages is not None and self.stages != tuple(s.name for s in profile.stages):
            diff = next(k for k, (a, b) in enumerate(zip(self.stages, profile.stages, strict=True)) if a != b.name)
            raise PlanError(
                f"plan stage {diff} is {self.stages[diff]!r} but the profile's is {profile.stages[diff].name!r}; "
                "a plan is made for the stages it was tuned on"
            )
        for k, a in enumerate(self.actions):
            st = profile.stages[k]
            if a is Action.SELECTIVE and not st.selective_measured:
                raise PlanError(
                    f"stage {k} ({st.name}) is 'selective' but the profile has no selective measurement for it; "
                    "profile the model again with this version (memtune.profiler.measure.profile) or choose another "
                    "action"
                )
        bad = [p for p in self.sync_points if not 0 <= p < n]
        if bad:
            raise PlanError(f"sync_points {bad} are outside the stage range 0..{n - 1}")
        for key, strips in self.spatial_splits.items():  # NOTE [ Spatial splitting ]
            refusal = spatial_refusal(profile, *parse_segment_key(key), strips)
            if refusal is not None:
                raise PlanError(refusal)
        for key in self.conv_algos:
            stage_s, _, conv = key.partition(".")
            if not stage_s.isdigit() or not 0 <= int(stage_s) < n:
                raise PlanError(f"conv_algos key {key!r}: stage must be an index in 0..{n - 1}")
            names = {c.name for c in profile.stages[int(stage_s)].convs}
            if conv not in names:
                raise PlanError(
                    f"conv_algos key {key!r}: stage {stage_s} ({profile.stages[int(stage_s)].name}) "
                    f"has no convolution named {conv!r} (has {sorted(names) or 'none'})"
                )

    def stage_lookaheads(self) -> tuple[int, ...]:
        """Per stage k, the prefetch lookahead L_k (stages) of the offloaded storages first needed by stage k's
        backward: NOTE [ Prefetch lookahead ], the one place the rule is written (simulator and runtime use it)."""
        if self.sync == "inline":
            return (0,) * len(self.actions)
        if self.prefetch_lookaheads is not None:
            return self.prefetch_lookaheads
        return (self.prefetch_lookahead,) * len(self.actions)

    def counts(self) -> dict[str, int]:
        """How many stages take each action."""
        return {a.value: sum(1 for x in self.actions if x is a) for a in Action}

    def compact(self) -> str:
        """One letter per stage (k, o, r, s): a short human-readable form; a whole-model compile says so."""
        if self.kind is PlanKind.WHOLE_COMPILE:
            return f"compiled whole, budget {self.whole_compile:g}"
        return "".join(a.value[0] for a in self.actions)


_MAX_LOOKAHEAD = 1024  # stages, as ``prefetch_lookahead``'s bound


def _check_lookaheads(lookaheads: Sequence[int], n_actions: int) -> None:
    """Raise ``ValueError`` unless ``lookaheads`` has one value per action, each 0..1024 stages."""
    if len(lookaheads) != n_actions:
        raise ValueError(
            f"prefetch_lookaheads has {len(lookaheads)} values but the plan has {n_actions} actions: give one "
            "lookahead per stage, or None for the global prefetch_lookahead"
        )
    bad = next((k for k, v in enumerate(lookaheads) if not 0 <= v <= _MAX_LOOKAHEAD), None)
    if bad is not None:
        raise ValueError(f"prefetch_lookaheads[{bad}] is {lookaheads[bad]}: a lookahead is 0..{_MAX_LOOKAHEAD} stages")


def segments(actions: Sequence[Action], *, one_stage: bool = False) -> list[tuple[int, int]]:
    """Maximal runs of ``recompute`` as inclusive ``(first, last)`` stage indices; with ``one_stage`` (module stages,
    NOTE [ Plan semantics ]) every recompute stage is a segment of its own."""
    if one_stage:
        return [(k, k) for k, a in enumerate(actions) if a is Action.RECOMPUTE]
    out: list[tuple[int, int]] = []
    start: int | None = None
    for k, a in enumerate(actions):
        if a is Action.RECOMPUTE:
            if start is None:
                start = k
        elif start is not None:
            out.append((start, k - 1))
            start = None
    if start is not None:
        out.append((start, len(actions) - 1))
    return out


class StorageFate(NamedTuple):
    """What a plan does with one saved storage (indices into the profile's stages).

    Attributes:
        fate: ``none`` (not kept), ``keep`` or ``offload``.
        copied: a D2H copy is made (offload, or a wasted copy next to a keep reference).
        copy_stage: the stage during whose forward the copy is issued.
        need: first backward position that reads it (a segment counts at its last stage).
        release: backward position after which it is freed.
    """

    fate: Literal["none", "keep", "offload"]
    copied: bool
    copy_stage: int
    need: int
    release: int


def resolve_storages(profile: Profile, actions: Sequence[Action]) -> list[StorageFate]:
    """Apply NOTE [ Plan semantics ] to every storage of ``profile``; one entry per storage."""
    n = profile.n_stages
    # a reference is (need, release, pack_stage, action); see StorageFate
    seg_refs: dict[int, list[tuple[int, int, int, Action]]] = {}
    modules = profile.modules
    for i, j in segments(actions, one_stage=modules):
        if i == 0 and not modules:
            continue  # the model input is always resident
        before = Action.KEEP if modules or actions[i - 1] is Action.SELECTIVE else actions[i - 1]
        for s in profile.stage_inputs(i):
            seg_refs.setdefault(s, []).append((j, i, i, before))
    for k, a in enumerate(actions):  # a selective stage holds its input (the checkpoint's) as keep does
        if a is Action.SELECTIVE and (k > 0 or modules):
            for s in profile.stage_inputs(k):
                seg_refs.setdefault(s, []).append((k, k, k, Action.KEEP))
    fates: list[StorageFate] = []
    none = StorageFate("none", False, 0, -1, n)
    recompute, keep, selective = Action.RECOMPUTE, Action.KEEP, Action.SELECTIVE
    for sid, st in enumerate(profile.storages):
        saved_by = st.saved_by
        if st.producer < 0:
            fates.append(none)
            continue
        if st.outside:  # no plan reaches it (module stages): kept to the backward of its saver
            r = min(saved_by)
            fates.append(StorageFate("keep", False, 0, r, r))
            continue
        if len(saved_by) == 1 and sid not in seg_refs:  # the common case, decided by one action
            r = saved_by[0]
            a = actions[r]
            if a is recompute or a is selective:
                fates.append(none)
            elif a is keep:
                fates.append(StorageFate("keep", False, 0, r, r))
            else:
                fates.append(StorageFate("offload", True, r, r, r))
            continue
        refs = [(r, r, r, actions[r]) for r in saved_by if actions[r] is not recompute and actions[r] is not selective]
        refs.extend(seg_refs.get(sid, ()))
        if not refs or st.producer < 0:
            fates.append(StorageFate("none", False, 0, -1, n))
            continue
        kinds = {ref[3] for ref in refs}
        packers = [ref[2] for ref in refs if ref[3] is Action.OFFLOAD]
        need = max(ref[0] for ref in refs)
        release = min(ref[1] for ref in refs)
        fate: Literal["keep", "offload"] = "keep" if Action.KEEP in kinds else "offload"
        fates.append(StorageFate(fate, bool(packers), min(packers) if packers else 0, need, release))
    return fates


def _saves_words(saves: str | None) -> str:
    return "the compiler's choice" if saves is None else f"memtune's rule {saves!r}"
