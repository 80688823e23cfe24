"""The cost model: simulate one training step of a chain under a plan.

Three engines run side by side: compute, device-to-host copy (D2H) and host-to-device copy (H2D). The
forward pass runs the stages in order and issues offload copies; the backward pass runs them in reverse,
re-running recompute segments and issuing prefetches per the plan. Memory is a timeline of allocations
and frees; its maximum is the peak. The rules for every storage are NOTE [ Plan semantics ] in
``memtune.tuner.plan``, which the runtime follows too.

# NOTE [ Simulator memory accounting ]
Resident for the whole step (``base``): parameters, optimizer state (SGD momentum: 1x parameters, Adam:
2x) and the batch input. In forward, stage k allocates the storages it produces at its start together
with its transient workspace, frees the workspace at its end, and frees every storage nobody keeps once
its last forward reader (the next stage, or a later stage that saves it) has run. Offloaded storages are
freed where compute waits for their copy (and the forward no longer reads them): at the last reader under
``layer`` sync, ``sync_delay`` stages after the pack stage under ``deferred``, at the next sync point under
``points`` (NOTE [ Deferred frees ]).
In backward, stage k allocates the gradient of its input, its parameters' gradients (kept to the end of
the step) and its workspace; it frees its output's gradient and its workspace at its end, and the saved
storages whose last reader it is. Prefetch buffers are allocated when the prefetch is issued.

# NOTE [ Copies during the forward ]
The runtime issues a storage's device-to-host copy at its pack, i.e. while the stage that saves it is still
computing (NOTE [ Offload runtime ]). A storage packed by the stage that produces it (a block's internal
activations) is therefore queued on the copy engine from that stage's start, not its end; it cannot be done
before the stage's compute ends (its last bytes are made then). Storages packed by a later stage (a stage's
input) are queued at the end of the stage before it, which is when that pack happens. Queued at the stage's end,
compute and copies serialised under ``layer`` sync: on the H200 (``scripts/memory_trace.py … policy=vdnn_all_p``) a
GPT fp32 block's forward took 19.45 ms against 28.3 ms simulated (10.04 ms compute, 19.51 ms of copies: the measured
time is their max), and ResNet-50 bf16 ``vdnn_all_m`` forward stages (4–19) 21–32% less than simulated. Treating every
member alike keeps ``merge_storages`` exact. A compiled region is the exception: AOTAutograd saves its graph's
tensors for the backward once the compiled forward has run, so its packs, and its copies, come at its end
(``StorageTables.packs_at_end``: a compiled-region profile's stages but its eager ones), as a trace of the Llama
decoder's per-layer regions on the H200 shows (``benchmarks.region_timing --trace``).

# NOTE [ Re-made copies ]
A re-run makes a fresh tensor for everything its stages save, including a storage that is also kept or
offloaded for a stage after the segment: the last stage's output when it saves it itself (a residual block
ending in ``ReLU(inplace=True)``, which saves its result) and the next stage saves it as its input. The
original serves the next stage; the re-run's copy serves the segment's own stages and lives from the re-run
to the backward of its first saver in the segment. The simulator counted the storage once, under its kept
or offloaded fate: on the H200 (``scripts/memory_trace.py resnet50:256:float32:0.4:plan=…``) the tuned
plan's segment ``layer1.0``–``layer1.1`` peaked in ``layer1.1``'s backward at 8.72 GiB against 7.94
simulated, one 784 MiB block output short, and the bench's run at that budget (8.41 GiB) ran out of memory
allocating it. With the copy counted the stage is simulated at 8.71 GiB.

The simulator is deterministic and pure Python. ``Simulator(profile)`` precomputes the per-profile
tables once, so that ``run(plan)`` costs a few hundred microseconds for a 40-stage chain. A run is four steps:
schedule (``memtune.tuner._schedule``), forward, backward (each stage's in ``memtune.tuner._stage_backward``) and peak,
every memory event written once to a ``Ledger`` (``memtune.tuner._ledger``). The per-profile tables, with NOTE
[ Backward transient ] and NOTE [ Gradients between stages ], are in ``memtune.tuner._storage_tables``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from memtune.profiler import CompilerPoint, ConvAlgo, Profile
from memtune.profiler.loss_model import profile_loss_ms
from memtune.tuner._conv_choice import RuleChoices
from memtune.tuner._conv_costs import price_choices
from memtune.tuner._fast_path import FastPath
from memtune.tuner._host_time import HostTime
from memtune.tuner._ledger import Ledger
from memtune.tuner._schedule import StepState, backward_schedule, forward_schedule
from memtune.tuner._sim_result import SimResult
from memtune.tuner._spatial import SplitPricing, parse_segment_key
from memtune.tuner._stage_backward import stage_backward
from memtune.tuner._storage_tables import StorageTables, backward_transients, merge_storages
from memtune.tuner._whole import compiler_point
from memtune.tuner.calibration import Calibration, calibration_for
from memtune.tuner.plan import Action, Plan, PlanKind, StorageFate, resolve_storages, segments
from memtune.tuner.stage_choices import selective_gain_bytes

__all__ = ["OPTIMIZERS", "SimResult", "Simulator", "StorageTables", "backward_transients", "merge_storages", "simulate"]

Optimizer = Literal["sgd", "adam", "none"]
#: optimizer state bytes per parameter byte
OPTIMIZERS: dict[str, float] = {"sgd": 1.0, "adam": 2.0, "none": 0.0}


class Simulator:
    """Simulates plans for one profile; precomputes what does not depend on the plan.

    Args:
        profile: the chain's profile.
        optimizer: ``sgd`` (with momentum), ``adam`` or ``none``; sets the optimizer state bytes.
        merge: use merged storages where that is exact (``merge_storages``); only faster.
        compute_scale: factor on every compute time (stages, convolution algorithms, loss); None takes the
            profile's calibrated one (NOTE [ Compute scale ]), 1.0 the profile as measured.
        calibration: the GPU type's calibration the simulator prices with (its compute scale here; the search's
            allocator price and the ranks' shared link read it from ``Simulator.calibration``); None looks it up
            once, here, with ``calibration_for(profile.device.key)`` (NOTE [ Calibration is an input ] in
            ``memtune.tuner.calibration``).
    """

    def __init__(
        self,
        profile: Profile,
        optimizer: str = "sgd",
        *,
        merge: bool = True,
        compute_scale: float | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, not {optimizer!r}")
        self.profile = profile
        self.optimizer = optimizer
        # NOTE [ Calibration is an input ]: looked up once, at the edge, when not given
        self.calibration = calibration if calibration is not None else calibration_for(profile.device.key)
        st = profile.stages
        self.n = len(st)
        # NOTE [ Compute scale ]: stage times are measured one stage at a time; a whole step runs them back to
        # back. The calibration's factor per profile (measured unconstrained step / simulated) scales compute
        if compute_scale is None:
            compute_scale = self.calibration.compute_scale_for(profile)
        self.compute_scale = compute_scale
        self._fwd0 = [s.forward_ms for s in st]
        self._bwd0 = [s.backward_ms for s in st]
        self.fwd = [ms * self.compute_scale for ms in self._fwd0]
        self.bwd = [ms * self.compute_scale for ms in self._bwd0]
        self.out = [s.output_bytes for s in st]
        self.ws_f = [s.forward_workspace_bytes for s in st]
        self.ws_b = backward_transients(profile)  # NOTE [ Backward transient ]
        # NOTE [ Lean transients ]: measured above the gradients made, the output's gradient counted while it
        # lives; the simulator holds that gradient (out[k]) through the stage's backward; -1: not measured
        self.lean_b = [
            -1 if s.lean_backward_workspace_bytes is None else max(0, s.lean_backward_workspace_bytes - s.output_bytes)
            for s in st
        ]
        # NOTE [ Inline fetches ]: what fetching on demand adds to the stage's transient; the workspace part
        # stays the plan's (chosen or fallen-back convolution algorithms change it, ``stage_costs``). The
        # measurement counts the output's gradient only while autograd holds it; the simulator holds it (out[k])
        # through the stage's backward, so it is taken off here
        self.inline_extra = [
            None if s.backward_inline_bytes is None else max(0, s.backward_inline_bytes - s.output_bytes - w)
            for s, w in zip(st, self.ws_b, strict=True)
        ]
        # NOTE [ Inline fetches ]: a compiled stage's backward unpacks every saved tensor before it runs
        self.fetch_all = [profile.compile_budget is not None and k not in profile.eager_stages for k in range(len(st))]
        self.pgrad = [s.param_bytes for s in st]
        # NOTE [ Selective stages ] (memtune.profiler.selective): what a selective stage keeps beyond the table, the
        # extra time of its forward (the caching mode) and of its backward (the cheap operations re-run), and its
        # backward's transient; where the transient was not measured (CPU profiles) every storage it re-makes is
        # taken to live through its backward
        scale = compute_scale
        self.sel_keep = [s.selective_saved_bytes or 0 for s in st]
        self.sel_extra_fwd_ms = [max(0.0, s.selective_extra_ms[0]) * scale for s in st]
        self.sel_extra_ms = [max(0.0, s.selective_extra_ms[1]) * scale for s in st]
        self.sel_ws = [
            max(0, s.selective_backward_bytes - s.output_bytes)
            if s.selective_backward_bytes is not None
            else self.ws_b[k] + selective_gain_bytes(profile, k)
            for k, s in enumerate(st)
        ]
        # NOTE [ Recompute priced as measured ]: a recomputed stage's re-run and its backward's transient, where
        # the profile measured the stage under recompute; None: the re-run costs its forward, the transient its
        # plain backward's
        rerun = profile.recompute_rerun_scale * scale
        self.rec_extra_ms = [None if s.recompute_extra_ms is None else s.recompute_extra_ms * rerun for s in st]
        self.rec_ws = [
            None if s.recompute_backward_bytes is None else max(0, s.recompute_backward_bytes - s.output_bytes)
            for s in st
        ]
        # bytes per element of the output: half precision under autocast, else 4 (NOTE [ Loss memory ])
        self.out_itemsize = 4 if profile.dtype == "float32" else 2
        # NOTE [ Loss memory ]: its time, measured or estimated
        self.loss_ms = profile_loss_ms(profile) * self.compute_scale
        # NOTE [ Held output ]: returned storages the loop holds through the backward
        self.held = profile.output_held_bytes or 0
        # NOTE [ Host issue time ] (memtune.tuner._host_time): None where the profile has no host prices
        self.host = HostTime.of(profile)
        # NOTE [ Memory held before the step ] (memtune.profiler._module_step): library workspaces count too
        self.base = (
            int(profile.param_bytes * (1.0 + OPTIMIZERS[optimizer])) + profile.input_bytes + profile.resident_bytes
        )
        self._conv_costs: dict[object, tuple[list[float], list[float], list[int], list[int]]] = {}
        # every workspace size an algorithm of the profile takes: caps between two of them choose alike
        self._ws_sizes = sorted({a.workspace_bytes for s in st for c in s.convs for a in c.algos})
        self._split_costs: dict[object, SplitPricing] = {}  # NOTE [ Spatial splitting ]: by splits and tables
        # merged storages give the same numbers under every sync mode (see merge_storages)
        self._tables = StorageTables(merge_storages(profile) if merge else profile)
        # NOTE [ Inline fetches ]: inline plans hold one storage at a time, so merged storages would over-count
        self._unmerged = self._tables if not merge else None
        self._fast = FastPath(self)  # NOTE [ Fast path ]
        self._choices: RuleChoices | None = None  # each convolution's working algorithms, listed on first use
        self._lean: dict[tuple[int, str], list[ConvAlgo | None]] = {}
        self._last_plan: Plan | None = None  # the plan ``run_bounded`` priced last (held, so its id stays its own)
        self._last_costs = self.fwd, self.bwd, self.ws_f, self.ws_b
        self._labels: dict[tuple[str, int | tuple[int, ...]], str] = {}  # the timeline's, formatted (``Ledger``)

    @property
    def tables(self) -> StorageTables:
        """The per-storage tables the simulator runs on (merged storages, NOTE [ Saved storages ])."""
        return self._tables

    # ------------------------------------------------------------------------------------------------
    def run(self, plan: Plan, *, timeline: bool = False, check: bool = True) -> SimResult:
        """Simulate one step under ``plan``. ``check=False`` skips validating it against the profile."""
        if check:
            plan.check(self.profile)
        if plan.kind is PlanKind.WHOLE_COMPILE:
            return _measured(compiler_point(self.profile, plan))
        if not timeline and self._fast_applies(plan.actions, plan):
            return self._host_floor(self._run_fast(plan.actions, plan), plan.actions)
        return self._host_floor(self._run(plan.actions, plan, timeline), plan.actions)

    def run_actions(self, actions: Sequence[Action], plan: Plan) -> SimResult:
        """Simulate ``actions`` with the other knobs of ``plan`` (a fast path for search loops)."""
        if self._fast_applies(actions, plan):
            return self._host_floor(self._run_fast(actions, plan), actions)
        return self._host_floor(self._run(actions, plan, False), actions)

    def host_ms(self, actions: Sequence[Action]) -> float:
        """The host's time to issue a step of ``actions`` (NOTE [ Host issue time ]), ms; 0 without host prices."""
        return 0.0 if self.host is None else self.host.ms(actions)

    def _host_floor(self, result: SimResult, actions: Sequence[Action]) -> SimResult:
        """``result`` with its host time, its step at least that (NOTE [ Host issue time ])."""
        if self.host is None:
            return result
        host = self.host.ms(actions)
        return replace(result, host_ms=host, step_ms=max(result.step_ms, host))

    def run_bounded(
        self,
        actions: Sequence[Action],
        plan: Plan,
        *,
        peak_limit: int | None = None,
        step_limit: float | None = None,
        step_limit_peak: int = 0,
    ) -> SimResult | None:
        """``run_actions``, or None where the peak exceeds ``peak_limit`` bytes, or the step exceeds ``step_limit`` ms
        and the peak is at least ``step_limit_peak`` bytes.

        # NOTE [ Bounded simulations ]
        A search that compares a plan with its incumbent needs the plan's numbers only where it might win. Over a
        fitting incumbent a plan that does not fit, or whose step is longer, loses whatever its other numbers are;
        the fast path (NOTE [ Fast path ]) knows the peak before it times anything, and the step's clock only runs
        forward, so it stops there: the peak over its limit skips the step's timing, a clock past its limit the rest
        of the backward. Over an incumbent that does not fit, a plan with a higher peak loses, and one with the same
        peak loses if it is slower (``step_limit_peak``). The answers (None, or the same numbers as ``run_actions``)
        decide the same way as full simulations.
        """
        if self._fast_applies(actions, plan):
            if plan is self._last_plan:  # a descent prices most moves with one plan's knobs
                costs = self._last_costs
            else:
                costs = self.stage_costs(plan)
                self._last_plan, self._last_costs = plan, costs
            numbers = self._fast.run(
                actions, plan, costs, peak_limit=peak_limit, step_limit=step_limit, step_limit_peak=step_limit_peak
            )
            if numbers is None:
                return None
            r = self._host_floor(SimResult(*numbers, self.base), actions)
        else:
            r = self._host_floor(self._run(actions, plan, False), actions)
        if peak_limit is not None and r.peak_bytes > peak_limit:
            return None
        if step_limit is not None and r.peak_bytes >= step_limit_peak and r.step_ms > step_limit:
            return None
        return r

    def _run_fast(self, actions: Sequence[Action], plan: Plan) -> SimResult:
        numbers = self._fast.run(actions, plan, self.stage_costs(plan))
        assert numbers is not None  # no limits to break
        return SimResult(*numbers, self.base)

    def _fast_applies(self, actions: Sequence[Action], plan: Plan) -> bool:
        """Whether NOTE [ Fast path ] prices ``actions`` under ``plan``: ``layer`` or ``deferred`` sync, no segment
        split into strips."""
        if plan.sync != "layer" and plan.sync != "deferred":
            return False
        return not plan.spatial_splits or self._split_pricing(plan, actions, self._tables) is None

    def stage_costs(self, plan: Plan) -> tuple[list[float], list[float], list[int], list[int]]:
        """Per stage forward ms, backward ms, forward and backward workspace bytes under the plan's conv choice.

        # NOTE [ Convolution costs ]
        A stage's measured times include its convolutions run with the framework's algorithms
        (``ConvProfile.default_ms``/``default_bwd_ms``, PyTorch's own convolution at the same shapes).
        A chosen triple (``memtune.tuner._conv_choice``) replaces that time by the chosen algorithms' ms, and the
        stage's workspace by the chosen algorithms' largest workspace per pass. The first convolution of
        stage 0 reads the model input, which needs no gradient: its backward is the weight pass alone (the
        profiler times stage 0 so); counting its data pass too over-predicted ResNet-50 bf16 ``vdnn_all_m``'s
        last backward stage 4x (29.8 ms simulated, 7.1 ms measured on the H200: the memory-optimal data pass
        alone takes 27.4 ms).

        # NOTE [ Lean transients ]
        A stage's measured transient is the framework's convolution workspace *and* what the stage allocates for
        a moment besides (a batch norm's and a residual sum's gradients in a bottleneck's backward). Taking the
        chosen algorithms' workspace alone for the stage's transient drops the second part. Where the profile
        measured the stage with every convolution run by its memory-optimal algorithms (``lean_*_workspace_bytes``,
        ``memtune.tuner.measure.lean``), the transient is that, plus what the chosen workspace exceeds the
        memory-optimal one by: a workspace coexists with whatever the stage holds during that convolution, so the sum
        bounds it from above. Without the measurement it stays the chosen workspace. The backward is measured as it runs
        in a chain (``memtune.profiler.measure.chained_backward_bytes``): above the gradients it makes, with the
        incoming gradient freed once used. Measured like ``backward_workspace_bytes`` instead (the incoming gradient
        held by the caller), ResNet-50 fp32's ``layer1.x`` showed 1,568 MiB with the memory-optimal algorithms as with
        the framework's, and the H200 trace of a tuned plan (``scripts/memory_trace.py
        resnet50:256:float32:0.4:plan=…``) ran 0.2-0.75 GiB below that simulation in every backward stage: the in-place
        ReLU that ends a bottleneck frees the incoming gradient as it makes its own. The forward is measured as
        ``forward_workspace_bytes`` is; with it ``layer4.0``'s forward is simulated at the 7.15 GiB the trace shows
        (7.06 with the chosen workspace alone).
        """
        if plan.conv_rule == "default" and not plan.conv_algos:
            return self.fwd, self.bwd, self.ws_f, self.ws_b
        # ``fastest_within`` takes the fastest algorithm whose workspace is within the cap, so a cap chooses as the
        # largest workspace size within it does (-1: none); other rules have no cap
        cap = plan.conv_workspace_limit_bytes
        if plan.conv_rule != "fastest_within":
            cap = None
        elif cap is not None:
            i = bisect_right(self._ws_sizes, cap)
            cap = self._ws_sizes[i - 1] if i else -1
        key = (
            plan.conv_rule,
            cap,
            tuple(sorted((k, (v.fwd, v.bwd_data, v.bwd_filter)) for k, v in plan.conv_algos.items())),
        )
        cached = self._conv_costs.get(key)
        if cached is not None:
            return cached
        fwd, bwd, ws_f, ws_b = list(self._fwd0), list(self._bwd0), list(self.ws_f), list(self.ws_b)
        if self._choices is None:
            self._choices = RuleChoices(self.profile)
        price_choices(self.profile, self._choices.choose(plan), (fwd, bwd, ws_f, ws_b), self.lean_b, self._lean)
        scale = self.compute_scale
        result = ([ms * scale for ms in fwd], [ms * scale for ms in bwd], ws_f, ws_b)
        self._conv_costs[key] = result
        return result

    def _loss(
        self,
        t: float,
        led: Ledger,
        tab: StorageTables,
        fates: Sequence[StorageFate],
    ) -> float:
        """The loss's forward and backward between the two passes: its memory events and blocks; returns the time
        after it, ms.

        # NOTE [ Loss memory ]
        The step's loss is cross-entropy on the output (NOTE [ Bench step ]), computed in fp32: log_softmax of
        out.float() (a copy when the output is half precision under autocast), whose output is saved; its backward
        holds the saved output, the incoming gradient and the gradient it makes (3 fp32 tensors the size of the
        logits), then leaves the output's gradient. Negligible for 1000 classes; for a language model's (batch,
        tokens, vocab) logits it is several GiB. The output itself is freed after the loss's forward unless a stage
        saves it (log_softmax saves its result). Its time is the profile's measured ``loss_ms`` (memtune.profiler.loss),
        else a roofline estimate (memtune.profiler.loss_model, no torch): ~11 ms of a GPT step on the H200, which the
        simulator missed before it counted it.
        A profile of module stages measured the user's own loss function instead (``Profile.loss_saved_bytes``,
        ``memtune.profiler.module_stages``): it holds what that function saves from its forward to its backward, and in
        its backward what was measured there on CUDA (``Profile.loss_backward_bytes``: the loss function's backward and
        that of the model's own code after its last stage, such as a Hugging Face model's cross-entropy over fp32
        logits, which makes two logit-sized gradients; without it GPT-2 and a Llama-style model ran out of memory there
        under their budget on an H100), then leaves the gradient of the model's output.

        # NOTE [ Held output ]
        A training loop that keeps the model's output object (``out = model(**batch); out.loss.backward()``, as many
        loops and Hugging Face's ``Trainer`` do) holds everything the model returned until its backward ends: for a
        language model one more logits tensor (batch x tokens x vocabulary x 4 bytes), which the step alone would
        free after the loss's forward. Measured with the CPU allocator's events (NOTE [ Allocator meters ]) on a
        small ``BertForMaskedLM`` (vocabulary 8192, batch 4 x 128), the held output's peak was 91.5 MiB against 75.5
        dropped. The profile says what the loop holds (``Profile.output_held_bytes``: the returned storages no
        stage saves, the worst case unless the user says the loop drops it); the simulator keeps those bytes from
        the loss's forward to the end of the backward. Returned storages that a stage saves are counted by their
        saver as before.
        """
        n, out, s_bytes = self.n, self.out, tab.s_bytes
        add, blk = led.events.append, led.blocks
        final_out = tab.output_storage[n - 1]
        out_dies = s_bytes[final_out] if final_out is not None and fates[final_out].fate == "none" else 0
        half = self.loss_ms / 2  # the split between its forward and backward does not change the step
        saved = self.profile.loss_saved_bytes
        if saved is not None:
            grad = tab.s_grad[final_out] if final_out is not None else 0
            transient = self.profile.loss_backward_bytes or 0
            add((t, saved, "loss forward", ()))
            add((t + half, -out_dies, "loss forward end", ()))
            if self.held:  # NOTE [ Held output ]: what the loop holds comes back until the backward ends
                add((t + half, self.held, "output held", ()))
            add((t + half, transient + grad, "loss backward", ()))
            add((t + 2 * half, -transient - saved, "loss backward end", ()))
            if blk is not None:
                blk += [("alloc", "loss", saved)] if saved else []
                blk += [("free", ("s", final_out), out_dies)] if out_dies else []
                blk += [("alloc", "held output", self.held)] if self.held else []
                blk += [("alloc", "loss backward", transient)] if transient else []
                blk += [("alloc", ("gs", final_out), grad)] if grad else []
                blk += [("free", "loss backward", transient)] if transient else []
                blk += [("free", "loss", saved)] if saved else []
            return t + 2 * half
        numel = out[n - 1] // self.out_itemsize
        f32 = 4 * numel
        cast = f32 if self.out_itemsize != 4 else 0
        add((t, cast + f32, "loss forward", ()))
        t += half
        add((t, -cast - out_dies, "loss forward end", ()))
        add((t, 2 * f32, "loss backward", ()))
        t += half
        add((t, -2 * f32 + (numel * self.out_itemsize if cast else 0), "loss backward: log_softmax", ()))
        add((t, -cast, "loss grad", ()))
        if blk is not None:
            # the last "loss" block is the gradient of the output, which stage n-1's backward frees as ("g", n-1)
            blk += [("alloc", "cast", cast)] if cast else []
            blk += [("alloc", "log_softmax", f32)]
            blk += [("free", "cast", cast)] if cast else []
            blk += [("free", ("s", final_out), out_dies)] if out_dies else []
            blk += [("alloc", "loss grad", f32), ("alloc", "cast grad" if cast else ("g", n - 1), f32)]
            blk += [("free", "log_softmax", f32), ("free", "loss grad", f32)]
            if cast:
                blk += [("alloc", ("g", n - 1), numel * self.out_itemsize), ("free", "cast grad", f32)]
        return t

    def _grad_blocks(self, k: int) -> tuple[list[tuple[str, object, int]], list[tuple[str, object, int]]]:
        """Stage ``k``'s backward: the gradient blocks it makes and those it frees (NOTE [ Gradients between
        stages ])."""
        if not self.profile.modules:
            made: list[tuple[str, object, int]] = [("alloc", ("g", k - 1), self.out[k - 1])] if k > 0 else []
            return made, [("free", ("g", k), self.out[k])]
        tab = self._tables
        rest = tab.s_grad_rest  # NOTE [ Gradient storages made in the backward ] (memtune.tuner._stage_backward)
        freed: list[tuple[str, object, int]] = [("free", ("gs", sid), tab.s_grad[sid]) for sid in tab.grad_freed[k]]
        freed += [("free", ("gr", sid), rest[sid]) for sid in tab.grad_rest_freed[k]]
        return [("alloc", ("gs", sid), tab.s_grad[sid]) for sid in tab.grad_made[k]], freed

    def _split_pricing(self, plan: Plan, actions: Sequence[Action], tab: StorageTables) -> SplitPricing | None:
        """The plan's spatial splits that are recompute segments of ``actions``, priced (NOTE [ Spatial splitting ]
        in ``memtune.tuner._spatial``); keys of other segments (a search's move changed the actions) are left out."""
        if self.profile.modules:
            return None
        segs = set(segments(actions))
        splits = {ij: s for ij, s in ((parse_segment_key(k), s) for k, s in plan.spatial_splits.items()) if ij in segs}
        if not splits:
            return None
        key = (tab is self._tables, *sorted(splits.items()))
        if key not in self._split_costs:
            args = (self.profile, splits, self.out, tab.produced, tab.output_storage, tab.s_bytes)
            self._split_costs[key] = SplitPricing(*args)
        return self._split_costs[key]

    def _inline_stages(self, tab: StorageTables, fates: Sequence[StorageFate]) -> set[int]:
        """Under ``inline`` sync: the stages whose measured inline transient stands for their backward (NOTE
        [ Inline fetches ]): the profile measured it, and every storage the stage saves goes to host memory.

        NOTE [ Inline fetches ]: inline, a storage comes back at its first unpack and goes at its last, so a
        storage that one stage's backward both needs and releases lives only while that stage's nodes use it,
        one or two at a time: the stage holds its largest such storage, not their sum. A compiled stage's backward
        (``compile_budget`` set, not of ``eager_stages``) is one graph, its saved tensors unpacked together before it
        runs (AOTAutograd reads ``ctx.saved_tensors`` whole): it holds their sum to its end. An H200 MobileNetV2 plan
        of 21 compiled regions, inline, peaked 2.17 GiB against 1.88 predicted by the largest, 2.174 by the sum
        (``benchmarks/results/h200/module-peers/mobilenet_v2.json``, at 30%). Where the profile
        measured it (``backward_inline_bytes``: the stage's backward alone with every saved activation fetched
        on demand, ``memtune.profiler.measure.inline_backward_bytes``) that measured transient stands instead, and a
        storage two such stages share (a block's input, saved by both) is fetched within each: on the H200 the
        largest-storage model put ResNet-50's save_on_cpu identity blocks up to 2.0 GiB above their measured
        backward peak (benchmarks/results/memtrace/trace-resnet50-256-float32-0.6-policy-save_on_cpu.json); with
        the measurement the step's peak is 4.65 GiB against 4.33 measured (the ``-inline`` trace: a stage
        measured alone still needs up to 0.7 GiB more than it does inside the chain)
        """
        saves: list[list[int]] = [[] for _ in range(self.n)]
        for sid, savers in enumerate(tab.s_saved_by):
            if tab.s_producer[sid] >= 0:
                for r in savers:
                    saves[r].append(sid)
        return {
            k
            for k in range(self.n)
            if self.inline_extra[k] is not None and all(fates[sid].fate == "offload" for sid in saves[k])
        }

    def _rerun_ms(self, k: int, fwd: Sequence[float], split: SplitPricing | None) -> float:
        """What re-running stage ``k`` of a recompute segment costs in backward, ms.

        # NOTE [ Recompute priced as measured ]
        A recomputed stage re-runs its forward inside the backward, under a non-reentrant checkpoint. That re-run
        costs more than the forward measured alone: uniform plans on an H100 (``scripts/uniform_steps.py``,
        torch 2.11) added 92.3 ms to DenseNet-121's step with every stage recomputed where the stages' forwards
        sum to 29.4 ms, 46.7 against 18.9 for MobileNetV2 and 80.9 against 47.7 for a Llama config. Timing each
        stage's backward alone under the same checkpoint did not close the gap: DenseNet-121's stages re-ran in
        44.2 ms in all, against 107.1 ms that the whole step measured in the same run (a stage timed alone
        overlaps nothing and is scaled to the whole step, NOTE [ Time outside stages ] in
        ``memtune.profiler.module_profile``; the re-run inside the backward does not shrink so). A module profile
        therefore measures both: each stage's backward under recompute (``recompute_backward_ms``) and its
        transient (``recompute_backward_bytes``), and one whole step with every stage recomputed
        (``Profile.recompute_step_ms``). A stage's re-run costs its measured backward's excess over the plain one,
        scaled so that the stages' re-runs add up to what the whole step measured
        (``Profile.recompute_rerun_scale``); a one-stage segment's backward holds at least the measured transient,
        less the re-made storages the simulator allocates itself. Where the profile did not measure
        the stage (chain profiles, whose segments span stages; a stage autograd refuses to checkpoint), or a
        spatial split prices the segment by its strips, the re-run costs the stage's forward as before.
        """
        extra = self.rec_extra_ms[k]
        if extra is None or (split is not None and k in split.cost):
            return fwd[k]
        return extra

    def _run(self, actions: Sequence[Action], plan: Plan, want_timeline: bool) -> SimResult:
        # the reference: NOTE [ Fast path ] (memtune.tuner._fast_path) prices most plans without a timeline and must
        # count what this counts, to the bit; tests/unit/tuner/test_fast_path.py compares the two
        step = self._schedule(actions, plan)
        # every memory event, and on the timeline path the same tensor by tensor (NOTE [ Allocator placement ])
        led = Ledger(self.base, want_timeline, self._labels)
        sp: list[tuple[str, int, float, float]] | None = [] if want_timeline else None  # SimResult.spans
        self._forward(step, led, sp)
        self._backward(step, led, sp)
        return self._peak(step, led, sp)

    def _schedule(self, actions: Sequence[Action], plan: Plan) -> StepState:
        """The schedule step: the plan's costs, storage fates and tables (``memtune.tuner._schedule``)."""
        fwd, bwd, ws_f, ws_b = self.stage_costs(plan)
        inline = plan.sync == "inline"
        tab = self._tables
        if inline:
            if self._unmerged is None:
                self._unmerged = StorageTables(self.profile)
            tab = self._unmerged
        fates = resolve_storages(tab.profile, actions)
        # NOTE [ Spatial splitting ] (memtune.tuner._spatial): a split segment's stages cost their strips' share
        split = self._split_pricing(plan, actions, tab) if plan.spatial_splits else None
        # what a re-run's second copies hold (NOTE [ Re-made copies ]): one strip's when split
        s_bytes = c_bytes = tab.s_bytes
        if split is not None:
            s_bytes, c_bytes = split.s_bytes, split.copy_bytes
            fwd, bwd, ws_f, ws_b = split.costs(fwd, bwd, ws_f, ws_b)
        fetched = self._inline_stages(tab, fates) if inline else set()
        return StepState(
            tab=tab,
            fates=fates,
            split=split,
            inline=inline,
            sync=plan.sync,
            costs=(fwd, bwd, ws_f, ws_b),
            s_bytes=s_bytes,
            c_bytes=c_bytes,
            selective=[a is Action.SELECTIVE for a in actions],
            fs=forward_schedule(tab, actions, fates, plan, split, self.out),
            bs=backward_schedule(tab, actions, fates, plan, split, fetched),
            n=self.n,
        )

    def _forward(self, step: StepState, led: Ledger, sp: list[tuple[str, int, float, float]] | None) -> None:
        """The forward step: stages in order, their copies and the waits for them; sets the forward's clock, stalls
        and copies on ``step``."""
        n, tab, s_bytes, s_d2h, selective = step.n, step.tab, step.s_bytes, step.tab.s_d2h, step.selective
        fwd, _, ws_f, _ = step.costs
        fs = step.fs
        copy_at, copy_during, wait_at, drop_at = fs.copy_at, fs.copy_during, fs.wait_at, fs.drop_at
        free_at_sync, clone, clone_fwd_free, sync_points = fs.free_at_sync, fs.clone, fs.clone_fwd_free, fs.sync_points
        points = step.sync == "points"
        add, blk = led.events.append, led.blocks
        sel_keep, sel_extra_fwd_ms = self.sel_keep, self.sel_extra_fwd_ms
        t = 0.0
        d2h_free = 0.0
        copy_done, fstall = step.copy_done, step.fstall
        d2h_bytes = 0
        # NOTE [ Deferred frees ]: an offloaded storage is freed only where compute waits for its copy, at
        # a stage boundary fixed by the plan (free_at_sync), never "when the copy happens to be done". The
        # runtime cannot do the latter faithfully: the host enqueues work far ahead of the GPU, so a host
        # poll at a boundary sees copies the GPU finished long ago as pending (measured on the H200: all
        # offload, "free when seen done", peaked at the unconstrained 20.9 GiB). A stream wait costs no host
        # time and orders the free on the compute stream, where the caching allocator reuses it.
        freed = step.freed
        for k in range(n):
            alloc = ws_f[k] + clone[k]
            for sid in tab.produced[k]:
                alloc += s_bytes[sid]
            add((t, alloc, "fwd %d start", k))
            if blk is not None:
                blk += [("alloc", ("clone", k), clone[k])] if clone[k] else []
                blk += [("alloc", ("s", sid), s_bytes[sid]) for sid in tab.produced[k]]
                blk += [("alloc", ("ws", k), ws_f[k]), ("free", ("ws", k), ws_f[k])] if ws_f[k] else []
            t_start = t
            t += fwd[k] + (sel_extra_fwd_ms[k] if selective[k] else 0.0)
            add((t, -ws_f[k], "fwd %d end", k))
            if step.inline:
                for sid in copy_at[k]:
                    d2h_bytes += s_bytes[sid]
                    fstall[k] += s_d2h[sid]
                    t += s_d2h[sid]
                    copy_done[sid] = t
                    if sp is not None:
                        sp.append(("d2h", sid, t - s_d2h[sid], t))
            else:
                # NOTE [ Copies during the forward ]: a storage packed by the stage that makes it is copied
                # while that stage computes (the runtime issues each copy at its pack); the rest at its end
                for during in (True, False):
                    for sid in copy_at[k]:
                        if copy_during[sid] is during:
                            d2h_bytes += s_bytes[sid]
                            d2h_free = max(d2h_free, t_start if during else t) + s_d2h[sid]
                            copy_done[sid] = max(d2h_free, t) if during else d2h_free
                            if sp is not None:
                                sp.append(("d2h", sid, d2h_free - s_d2h[sid], d2h_free))
            if wait_at[k] or (points and k in sync_points):
                wait = max((copy_done[sid] for sid in wait_at[k]), default=0.0)
                if points:  # HMMS waits for every copy issued so far
                    wait = max(wait, d2h_free)
                if wait > t:
                    fstall[k] += wait - t
                    t = wait
            if free_at_sync[k]:
                for sid in free_at_sync[k]:
                    freed[sid] = True
                add((t, -sum(s_bytes[sid] for sid in free_at_sync[k]), "fwd %d offloaded", k))
                if blk is not None:
                    blk += [("free", ("s", sid), s_bytes[sid]) for sid in free_at_sync[k]]
            if drop_at[k]:
                add((t, -sum(s_bytes[sid] for sid in drop_at[k]), "fwd %d drop", k))
                if blk is not None:
                    blk += [("free", ("s", sid), s_bytes[sid]) for sid in drop_at[k]]
            if clone_fwd_free[k]:
                add((t, -clone_fwd_free[k], "fwd %d clone", k))
                if blk is not None:
                    blk.append(("free", ("clone", k - 1), clone_fwd_free[k]))
            if selective[k] and sel_keep[k]:  # NOTE [ Selective stages ]: what it keeps, the rest dropped above
                add((t, sel_keep[k], "fwd %d selective", k))
                if blk is not None:
                    blk.append(("alloc", ("sel", k), sel_keep[k]))
        step.t = step.forward_ms = t
        step.d2h_bytes = d2h_bytes

    def _backward(self, step: StepState, led: Ledger, sp: list[tuple[str, int, float, float]] | None) -> None:
        """The backward step: the loss, then stages in reverse, their prefetches, re-runs and gradients; sets the
        step's clock, stalls and copies on ``step``."""
        n, fates, s_bytes, s_h2d, copy_done = step.n, step.fates, step.s_bytes, step.tab.s_h2d, step.copy_done
        freed, inline, late_wait_at, bstall, ready = (
            step.freed,
            step.inline,
            step.fs.late_wait_at,
            step.bstall,
            step.ready,
        )
        bs, local_max = step.bs, step.local_max
        prefetch_at, need_at, seg_end, local = bs.prefetch_at, bs.need_at, bs.seg_end, bs.local
        add, blk = led.events.append, led.blocks
        h2d_free = 0.0
        h2d_bytes = 0
        t = step.bwd_start = self._loss(step.t, led, step.tab, fates)
        for k in range(n - 1, -1, -1):
            for sid in late_wait_at[k]:  # used in place: its first unpack waits for its copy
                ready[sid] = copy_done[sid]
                if fates[sid].fate == "keep" and copy_done[sid] > t:
                    bstall[k] += copy_done[sid] - t
                    t = copy_done[sid]
            for sid in prefetch_at[k]:
                if not freed[sid]:  # still on the GPU (never waited for in forward): used in place
                    continue
                h2d_bytes += s_bytes[sid]
                if sid in local:  # NOTE [ Inline fetches ]: one at a time, or all at once in a compiled stage
                    local_max[k] = local_max[k] + s_bytes[sid] if self.fetch_all[k] else max(local_max[k], s_bytes[sid])
                else:
                    add((t, s_bytes[sid], "prefetch %d", sid))
                    if blk is not None:
                        blk.append(("alloc", ("s", sid), s_bytes[sid]))
                if inline:
                    t = max(t, copy_done[sid]) + s_h2d[sid]
                    bstall[k] += s_h2d[sid]
                    ready[sid] = t
                else:
                    h2d_free = max(t, h2d_free, copy_done[sid]) + s_h2d[sid]
                    ready[sid] = h2d_free
                if sp is not None:
                    sp.append(("h2d", sid, ready[sid] - s_h2d[sid], ready[sid]))
            if k in seg_end:
                t = self._rerun(step, led, k, seg_end[k], t)
            for sid in need_at[k]:
                if ready[sid] > t:
                    bstall[k] += ready[sid] - t
                    t = ready[sid]
            t = stage_backward(self, step, led, sp, k, t)
        if self.held:  # NOTE [ Held output ]
            add((t, -self.held, "output released", ()))
            if blk is not None:
                blk.append(("free", "held output", self.held))
        step.t = t
        step.h2d_bytes = h2d_bytes

    def _rerun(self, step: StepState, led: Ledger, k: int, i: int, t: float) -> float:
        """The re-run of recompute segment ``i..k`` before stage ``k``'s backward, from ``t`` ms: what it re-makes
        (NOTE [ Re-made copies ]) and its transient; returns the time after it, ms."""
        tab, fates, split, s_bytes, c_bytes, bs = step.tab, step.fates, step.split, step.s_bytes, step.c_bytes, step.bs
        reclone = step.fs.reclone
        src = tab.output_storage[i - 1] if i > 0 and not self.profile.modules else None
        if src is not None and fates[src].fate == "offload" and step.ready[src] > t:
            step.bstall[k] += step.ready[src] - t
            t = step.ready[src]
        remat = bs.remat_at.get(k, ())
        remade = bs.copy_at_seg.get(k, ())
        transient = split.transient(k) if split is not None and k in split.cost else max(self.out[i : k + 1])
        made = sum(s_bytes[sid] for sid in remat) + sum(c_bytes[sid] for sid in remade) + reclone.get(k, 0)
        if i == k:
            step.rec_made[k] = made
        led.events.append((t, made + transient, "recompute %d..%d", (i, k)))
        blk = led.blocks
        if blk is not None:
            blk += [("alloc", ("s", sid), s_bytes[sid]) for sid in remat]
            blk += [("alloc", ("c", sid), c_bytes[sid]) for sid in remade]
            blk += [("alloc", ("clone", i), reclone[k])] if k in reclone else []
            blk += [("alloc", ("r", k), transient), ("free", ("r", k), transient)]
        fwd = step.costs[0]
        seg_ms = sum(self._rerun_ms(r, fwd, split) for r in range(i, k + 1))
        t += seg_ms
        step.recompute_ms += seg_ms
        led.events.append((t, -transient, "recompute %d..%d end", (i, k)))
        return t

    def _peak(self, step: StepState, led: Ledger, sp: list[tuple[str, int, float, float]] | None) -> SimResult:
        """The peak step: the running total over the ledger's events, and the step's numbers as a ``SimResult``."""
        peak, timeline = led.replay()
        return SimResult(
            step_ms=step.t,
            peak_bytes=peak,
            forward_ms=step.forward_ms,
            backward_ms=step.t - step.bwd_start,
            recompute_ms=step.recompute_ms,
            stall_ms=sum(step.fstall) + sum(step.bstall),
            forward_stalls_ms=tuple(step.fstall),
            backward_stalls_ms=tuple(step.bstall),
            d2h_bytes=step.d2h_bytes,
            h2d_bytes=step.h2d_bytes,
            base_bytes=self.base,
            timeline=tuple(timeline) if timeline is not None else (),
            blocks=tuple(led.blocks) if led.blocks is not None else (),
            spans=tuple(sp) if sp is not None else (),
        )


def _measured(point: CompilerPoint) -> SimResult:
    """A whole-model compile plan's cost: its measured point less its update (NOTE [ The optimizer's update ] in
    ``memtune.tuner._whole``), no copies or stalls, reported as forward: one compiled step is not split in phases."""
    return SimResult(
        step_ms=point.forward_backward_ms,
        peak_bytes=point.peak_bytes,
        forward_ms=point.forward_backward_ms,
        backward_ms=0.0,
        recompute_ms=0.0,
        stall_ms=0.0,
        forward_stalls_ms=(),
        backward_stalls_ms=(),
        d2h_bytes=0,
        h2d_bytes=0,
        base_bytes=0,
    )


def simulate(
    profile: Profile,
    plan: Plan,
    *,
    optimizer: str = "sgd",
    timeline: bool = False,
    calibration: Calibration | None = None,
) -> SimResult:
    """Simulate one training step of ``profile`` under ``plan``.

    Args:
        profile: the chain's profile.
        plan: the plan; it must have one action per stage.
        optimizer: ``sgd`` (momentum), ``adam`` or ``none``.
        timeline: also return the memory timeline (slower).
        calibration: the GPU type's calibration; None: ``calibration_for(profile.device.key)`` (``Simulator``).

    Returns:
        A ``SimResult`` with step ms, peak bytes, stalls and (optionally) the timeline.

    Example::

        >>> result = simulate(profile, Plan.uniform(profile.n_stages))
        >>> result.step_ms, result.peak_bytes
    """
    return Simulator(profile, optimizer, calibration=calibration).run(plan, timeline=timeline)
