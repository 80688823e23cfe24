"""The per-profile storage tables the simulator runs on, built once per profile and independent of the plan.

``StorageTables`` lists each saved storage's bytes (bytes), producer, savers, last forward reader and copy times (ms),
and where each gradient is made and freed; ``backward_transients`` gives each stage's backward transient (bytes) as
the simulator adds it; ``merge_storages`` makes an equivalent profile with fewer storages (NOTE [ Saved storages ]).
``memtune.tuner.simulator`` re-exports all three.
"""

from __future__ import annotations

from memtune.profiler import Profile, SavedStorage
from memtune.tuner._copy_costs import storage_copy_ms

__all__ = ["StorageTables", "backward_transients", "merge_storages"]


def backward_transients(profile: Profile) -> list[int]:
    """Each stage's backward transient as the simulator adds it: bytes above what was live before the stage's
    backward *and* the gradients it makes (input gradient and parameter gradients).

    # NOTE [ Backward transient ]
    The profiler measures a stage's backward alone (``memtune.profiler.measure._workspaces``) as W = peak − max(before,
    after): ``after`` = ``before`` − F + G, where G is the gradients the backward makes and F the bytes of the
    stage's saved storages that its backward frees (those it produced and saves, but not its output, which the
    next stage holds). The simulator's stage peak is live-before + G + transient, so the transient is
    peak − before − G = W + max(0, G − F) − G = W − min(G, F). Taking W itself counted min(G, F) twice: a max-pool
    frees its int64 indices (F) as it makes its input's gradient (G, the same bytes in bf16 on VGG-16), so its
    backward was simulated one input-gradient higher than it runs. On the H200 (``scripts/memory_trace.py``,
    ``benchmarks/results/memtrace/``) VGG-16 bf16 ``checkpoint_sqrt`` peaked at the first max-pool's backward at
    8.34 GiB against 9.80 simulated; the second and third pools were 0.70 and 0.32 GiB over, their input sizes.
    A profile without measured workspaces (W = 0) is unchanged.

    W itself is measured with the output's gradient held by the caller. Inside a chain autograd frees that gradient
    once its first node has used it, and a bottleneck block's in-place ReLU backward makes its own gradient as it
    frees the incoming one: W counted one output-sized gradient too many for ResNet-50 fp32's ``layer1.1`` (1,568 MiB
    measured alone; as in a chain, with memory-optimal convolutions, 784 MiB: the output's gradient, which the
    simulator holds already). Where the profile has
    ``chained_backward_bytes`` (``memtune.profiler.measure.chained_backward_bytes``: the peak above what was live before
    and the gradients made, the output's gradient made inside the backward so that autograd frees it once used),
    the simulator takes that minus the output's gradient, which it holds through the stage's backward, instead.

    A stage that writes its input in place (a lone ``ReLU(inplace=True)``: its output storage among its input
    storages) is the exception. The simulator keeps one gradient per storage, made by the storage's last reader and
    freed by its producer, so it makes no gradient there, while autograd makes the input's gradient as a new tensor
    with the incoming one still live and frees the incoming one after. That new gradient is the one the profile took
    off as made, so the transient is ``chained_backward_bytes`` itself. Measured on an H100 (torch 2.11, ResNet-50
    batch 128, ``scripts/region_plan_peak.py … resnet50 0.6 --trace``, the stem's ``relu`` after ``bn1``): the step
    held 2,007 MiB in that stage's backward where the simulation, subtracting the output's gradient, held 1,608; one
    392 MiB gradient.
    """
    stages = profile.stages
    freed = [0] * len(stages)
    for sid, s in enumerate(profile.storages):
        k = s.producer
        if k >= 0 and k in s.saved_by and stages[k].output_storage != sid:
            freed[k] += s.bytes
    out = []
    for k, st in enumerate(stages):
        grads = (stages[k - 1].output_bytes if k > 0 else 0) + st.param_bytes
        if st.chained_backward_bytes is not None:  # as the chain runs it, the output's gradient held here
            in_place = st.output_storage is not None and st.output_storage in (st.input_storages or ())
            out.append(max(0, st.chained_backward_bytes - (0 if in_place else st.output_bytes)))
        else:
            out.append(max(0, st.backward_workspace_bytes - min(grads, freed[k])))
    return out


class StorageTables:
    """Per-storage tables of one profile (see NOTE [ Saved storages ])."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        st = profile.stages
        n = len(st)
        storages = profile.storages
        self.s_bytes = [s.bytes for s in storages]
        self.s_producer = [s.producer for s in storages]
        self.s_saved_by = [s.saved_by for s in storages]
        # last forward reader of each storage: who saves it, and the stage after any stage whose output it is; for
        # module stages who reads it or holds it as measured (NOTE [ Module stages ] in memtune.profiler.module_stages)
        last = [max((*s.saved_by, *s.read_by, s.producer, 0)) for s in storages]
        if not profile.modules:
            for k, stage in enumerate(st):
                if stage.output_storage is not None:
                    last[stage.output_storage] = max(last[stage.output_storage], min(k + 1, n - 1))
        self.s_last_use = last
        # copy times: the first saver's measured ms, shared by bytes; else the device bandwidth
        self.s_d2h, self.s_h2d = storage_copy_ms(profile)
        # storages produced by each stage (allocated at its forward start)
        self.produced: list[list[int]] = [[] for _ in range(n)]
        for sid, p in enumerate(self.s_producer):
            if p >= 0:
                self.produced[p].append(sid)
        self.output_storage = [s.output_storage for s in st]
        self.inputs = [profile.stage_inputs(k) for k in range(n)]
        # NOTE [ Copies during the forward ] (memtune.tuner.simulator): a compiled region packs what it saves as its
        # compiled forward returns, so its copies queue at its end
        compiled = profile.compile_budget is not None
        self.packs_at_end = [compiled and k not in profile.eager_stages for k in range(n)]
        # NOTE [ Gradients between stages ]: in a chain stage k's backward makes its input's gradient (the
        # output of stage k-1) and frees its output's; between module stages a tensor's gradient is made by the
        # backward of its last reader (the first to run backward) and freed at the end of its producer's,
        # the loss making that of the model's output. By storage: made at, freed at
        self.grad_made: list[list[int]] = [[] for _ in range(n)]
        self.grad_freed: list[list[int]] = [[] for _ in range(n)]
        self.s_grad = [s.grad_bytes for s in storages]
        # NOTE [ Gradient storages ] (memtune.profiler.module_profile): what a gradient's storage holds beyond its own
        # bytes, from the end of its maker's backward until the next gradient is summed into it; per stage, what it
        # leaves
        self.s_grad_rest = [max(0, (s.grad_storage_bytes or 0) - s.grad_bytes) for s in storages]
        self.grad_rest_made = [0] * n
        self.grad_rest_freed: list[list[int]] = [[] for _ in range(n)]
        # NOTE [ Gradient storages made in the backward ] (memtune.tuner._stage_backward): per stage, what its transient
        # holds of the rest it makes, the part its incoming gradients' bytes (freed by then) do not, bytes
        self.grad_rest_floor = [0] * n
        if profile.modules:
            final = st[-1].output_storage
            for sid, s in enumerate(storages):
                if s.grad_bytes <= 0 or s.producer < 0:
                    continue
                readers = [k for k in range(n) if sid in self.inputs[k]]
                if sid != final and readers:
                    self.grad_made[max(readers)].append(sid)
                    self.grad_freed[s.producer].append(sid)
                    if self.s_grad_rest[sid]:
                        self.grad_rest_made[max(readers)] += self.s_grad_rest[sid]
                        self.grad_rest_freed[self._next_gradient(sid, max(readers))].append(sid)
                elif sid == final:
                    self.grad_freed[s.producer].append(sid)
            for k in range(n):
                if self.grad_rest_made[k]:
                    incoming = sum(self.s_grad[sid] for sid in self.grad_freed[k])
                    self.grad_rest_floor[k] = max(0, self.grad_rest_made[k] - incoming)

    def _next_gradient(self, sid: int, maker: int) -> int:
        """The stage at whose backward's end the next gradient reaches storage ``sid`` after ``maker``'s, and autograd
        sums the two out of place, freeing the view ``maker`` made (NOTE [ Gradient storages ]): the latest stage
        before ``maker`` that reads another tensor its producer made (the skip's max-pooled copy), else the
        producer."""
        p = self.s_producer[sid]
        return next(
            (k for k in range(maker - 1, p, -1) if any(i != sid and self.s_producer[i] == p for i in self.inputs[k])),
            p,
        )


def merge_storages(profile: Profile) -> Profile:
    """An equivalent profile with fewer storages, for speed.

    Storages that are no stage's output and have the same producer and the same savers always get the same
    fate under any plan (NOTE [ Plan semantics ]); merging them (bytes and copy times add up) changes no
    number under any sync mode (members are freed together, where compute waits for all of them; the copy
    queue keeps its order; a test checks this). A residual block's dozens of internal storages become one or two.
    """
    outputs = {st.output_storage for st in profile.stages if st.output_storage is not None}
    # module stages: what flows between stages keeps its own lifetime and gradient
    outputs |= {sid for k in range(profile.n_stages) for sid in (profile.stages[k].input_storages or ())}
    outputs |= {sid for sid, s in enumerate(profile.storages) if s.read_by or s.outside or s.grad_bytes}
    d2h, h2d = storage_copy_ms(profile)
    groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for sid, s in enumerate(profile.storages):
        if sid not in outputs:
            groups.setdefault((s.producer, tuple(sorted(set(s.saved_by)))), []).append(sid)
    if all(len(g) == 1 for g in groups.values()):
        return profile
    # keep the original order (it is the copy engines' queue order): a group stands at its first member
    merged: list[SavedStorage] = []
    remap: dict[int, int] = {}
    for sid, s in enumerate(profile.storages):
        if sid in outputs:
            remap[sid] = len(merged)
            merged.append(s)
            continue
        key = (s.producer, tuple(sorted(set(s.saved_by))))
        members = groups[key]
        if members[0] == sid:
            total = sum(profile.storages[m].bytes for m in members)
            merged.append(SavedStorage(bytes=total, saved_by=key[1], producer=key[0]))
    # copy times must survive the merge: give each stage d2h/h2d ms equal to what its first-saved storages cost
    stages = []
    for st in profile.stages:
        owned = [sid for sid, s in enumerate(profile.storages) if s.saved_by and min(s.saved_by) == st.index]
        stages.append(
            st.model_copy(
                update={
                    "output_storage": remap.get(st.output_storage) if st.output_storage is not None else None,
                    "input_storages": None
                    if st.input_storages is None
                    else tuple(remap[sid] for sid in st.input_storages),
                    "saved_bytes": sum(profile.storages[sid].bytes for sid in owned),
                    "d2h_ms": sum(d2h[sid] for sid in owned),
                    "h2d_ms": sum(h2d[sid] for sid in owned),
                }
            )
        )
    return profile.model_copy(update={"stages": tuple(stages), "storages": tuple(merged)})
