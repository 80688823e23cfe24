"""One stage's backward in the simulator's backward step (``Simulator._backward`` in ``memtune.tuner.simulator``):
the gradients it makes and frees, its transient, and the storages it releases, written to the step's ``Ledger``
(bytes), its clock advanced by the stage's backward (ms).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memtune.tuner.ledger import Ledger
from memtune.tuner.schedule import StepState

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
        - tab.grad_rest_made[k]  # NOTE [ Gradient storages ]
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
        blk += [("alloc", ("inline", k), held), ("free", ("inline", k), held)] if held else []
        blk += [("alloc", ("wsb", k), ws_k)] if ws_k else []
        blk += grad_made
        blk += [("alloc", ("p", k), sim.pgrad[k])] if sim.pgrad[k] else []
        blk += [("free", ("wsb", k), ws_k)] if ws_k else []
        rests = tab.s_grad_rest  # NOTE [ Gradient storages ]
        blk += [("alloc", ("gr", sid), rests[sid]) for sid in tab.grad_made[k] if rests[sid]]
        blk += grad_freed
        blk += [("free", ("s", sid), s_bytes[sid]) for sid in released]
        blk += [("free", ("c", sid), c_bytes[sid]) for sid in copies]
        blk += [("free", ("clone", k), clone_bwd_free)] if clone_bwd_free else []
        blk += [("free", ("sel", k), kept_k)] if kept_k else []
    return t
