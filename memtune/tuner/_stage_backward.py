"""One stage's backward in the simulator's backward step (``Simulator._backward`` in ``memtune.tuner.simulator``):
the gradients it makes and frees, its transient, and the storages it releases, written to the step's ``Ledger``
(bytes), its clock advanced by the stage's backward (ms).

# NOTE [ Gradient storages made in the backward ]
Where a stage's backward makes a gradient as a view of a larger storage (NOTE [ Gradient storages ] in
``memtune.profiler.module_profile``: the U-Net decoder's ``torch.cat``), the storage's rest beyond the gradient's own
bytes is made where the eager runtime makes it: inside the stage's backward, as the input gradient of the convolution
that reads the concatenation, while that convolution's workspace lives (autograd frees a workspace when the
convolution's backward returns), and after the stage's incoming gradients are gone (autograd frees an incoming
gradient once the stage's first node has used it: NOTE [ Backward transient ] in ``memtune.tuner._storage_tables``).
The simulator holds the incoming gradients through the stage's backward and takes its transient above them, so the
rest is held by the two together: its first bytes by the incoming gradients' room, the remainder
(``StorageTables.grad_rest_floor``) by the transient, which is at least that. Both views of the ledger follow this
order. The running total counts the stage at its start (gradients made, transient) and at its end frees the
transient and the incoming gradients but keeps the rest, as before. The blocks allocate the transient less what it
holds of the rest (``("wsb", k)``) and the gradients, free the incoming gradients, allocate the rest (``("gr",
sid)``), then free the transient: the two peak alike.

Before, the blocks freed the transient first, then allocated the rest while the incoming gradients were still live:
on the committed H100 U-Net (stage ``dec.2``: transient 0 above its 256 MiB incoming gradient, rest 256 MiB) they
peaked 256 MiB above ``SimResult.peak_bytes`` on 73 of 100 random plans, so the allocator model (NOTE [ Allocator
placement ] in ``memtune.tuner.placement``) replayed a step 0.25 GiB larger than the one priced. Counting the rest on
top of the transient in the running total instead would have put the unplanned step at 5.71 GiB against the 5.36
GiB the H100 measured (5.46 simulated, ``benchmarks/results/h100/promises/unet.json``). The peaks are unchanged on
every committed profile: on both U-Nets the incoming gradients hold every rest, and the transient's floor is 0.
``tests/unit/tuner/test_simulator_views.py`` checks that the two views agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memtune.tuner._ledger import Ledger
from memtune.tuner._schedule import StepState

if TYPE_CHECKING:
    from memtune.tuner.simulator import Simulator

__all__ = ["stage_backward"]


def stage_backward(
    sim: Simulator, step: StepState, led: Ledger, sp: list[tuple[str, int, float, float]] | None, k: int, t: float
) -> float:
    """Stage ``k``'s backward from ``t`` ms: its gradients, transient and the storages it releases; returns the
    time after it, ms."""
    tab, split, s_bytes, c_bytes, bs = step.tab, step.split, step.s_bytes, step.c_bytes, step.bs
    _, bwd, _, ws_b = step.costs
    grad_made, grad_freed = sim._grad_blocks(k)
    if split is not None and split.member[k] >= 0:  # NOTE [ Spatial splitting ]: one node, strip gradients
        grad_made, grad_freed = split.grad_blocks(k)
    grad_in = sum(b[2] for b in grad_made)
    held = step.local_max[k]  # NOTE [ Inline fetches ]
    ws_k = ws_b[k]
    bwd_k = bwd[k]
    kept_k = 0
    if k in bs.fetched:  # its measured transient holds its fetches
        held, ws_k = 0, ws_b[k] + (sim.inline_extra[k] or 0)
    elif k in step.rec_made and split is None:  # NOTE [ Recompute priced as measured ]
        ws_k = max(ws_k, (sim.rec_ws[k] or 0) - step.rec_made[k])
    elif step.selective[k]:  # NOTE [ Selective stages ]: re-runs its cheap operations, then frees what it kept
        ws_k, kept_k = max(ws_k, sim.sel_ws[k]), sim.sel_keep[k]
        bwd_k += sim.sel_extra_ms[k]
        step.recompute_ms += sim.sel_extra_ms[k]
    # NOTE [ Gradient storages made in the backward ]: the rest of a gradient's storage made here, and what of it
    # the transient holds (the incoming gradients', freed before it is made, hold the others)
    rest_k, floor_k = tab.grad_rest_made[k], tab.grad_rest_floor[k]
    if ws_k < floor_k:
        ws_k = floor_k
    led.events.append((t, grad_in + sim.pgrad[k] + ws_k + held, "bwd %d start", k))
    t += bwd_k
    if sp is not None:
        sp.append(("backward", k, t - bwd_k, t))
    local, freed = bs.local, step.freed
    released = [sid for sid in bs.release_at[k] if sid not in local or not freed[sid]]
    copies = bs.copy_release_at[k]
    clone_bwd_free = step.fs.clone_bwd_free[k]
    freed_now = (
        ws_k
        - rest_k  # NOTE [ Gradient storages made in the backward ]: stays, the gradients' storage
        + sum(b[2] for b in grad_freed)
        + held
        + kept_k
        + clone_bwd_free
        + sum(s_bytes[sid] for sid in released)
        + sum(c_bytes[sid] for sid in copies)
    )
    led.events.append((t, -freed_now, "bwd %d end", k))
    blk = led.blocks
    if blk is not None:
        together = sim.fetch_all[k]  # NOTE [ Inline fetches ]: a compiled stage holds its fetches to its end
        blk += [("alloc", ("inline", k), held)] if held else []
        blk += [("free", ("inline", k), held)] if held and not together else []
        work = ws_k - floor_k  # the transient less what it holds of the gradients' storage
        blk += [("alloc", ("wsb", k), work)] if work else []
        blk += grad_made
        blk += [("alloc", ("p", k), sim.pgrad[k])] if sim.pgrad[k] else []
        if rest_k:  # NOTE [ Gradient storages made in the backward ]: the incoming gradients go first, the rest is
            # made while the transient lives
            incoming = len(tab.grad_freed[k])
            rests = tab.s_grad_rest
            blk += grad_freed[:incoming]
            blk += [("alloc", ("gr", sid), rests[sid]) for sid in tab.grad_made[k] if rests[sid]]
            blk += [("free", ("wsb", k), work)] if work else []
            blk += grad_freed[incoming:]
        else:
            blk += [("free", ("wsb", k), work)] if work else []
            blk += grad_freed
        blk += [("free", ("inline", k), held)] if held and together else []
        blk += [("free", ("s", sid), s_bytes[sid]) for sid in released]
        blk += [("free", ("c", sid), c_bytes[sid]) for sid in copies]
        blk += [("free", ("clone", k), clone_bwd_free)] if clone_bwd_free else []
        blk += [("free", ("sel", k), kept_k)] if kept_k else []
    return t
