"""A plan's chosen convolution algorithms priced into each stage's costs (NOTE [ Convolution costs ] and NOTE
[ Lean transients ] in ``memtune.tuner.simulator``, whose ``Simulator.stage_costs`` calls ``price_choices``).
Times are ms before the compute scale, workspaces and transients bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memtune.profiler import ConvAlgo, ConvProfile, Profile
from memtune.tuner._conv_choice import PASSES, ConvTriple, select_algo, working_algos

__all__ = ["price_choices"]


def price_choices(
    profile: Profile,
    chosen: Mapping[str, ConvTriple],
    costs: tuple[list[float], list[float], list[int], list[int]],
    measured_lean_b: Sequence[int],
    lean_cache: dict[tuple[int, str], list[ConvAlgo | None]],
) -> None:
    """Put the ``chosen`` triples (by ``"stage.conv"``) into ``costs``, per stage forward ms, backward ms, forward and
    backward transient bytes, in place. ``measured_lean_b``: each stage's measured lean backward transient less its
    output's gradient (-1: not measured); ``lean_cache``: each convolution's memory-optimal algorithm per pass, filled
    on first use."""
    fwd, bwd, ws_f, ws_b = costs
    by_stage: dict[int, list[tuple[ConvProfile, ConvTriple]]] = {}
    for ckey, triple in chosen.items():
        stage_s, _, name = ckey.partition(".")
        stage = profile.stages[int(stage_s)]
        conv = next(c for c in stage.convs if c.name == name)
        by_stage.setdefault(stage.index, []).append((conv, triple))
    for k, items in by_stage.items():
        first = profile.stages[k].convs[0].name
        ws_bk = 0
        lean_f = lean_b = 0  # the memory-optimal algorithms' largest workspace per direction
        for conv, tr in items:
            if conv.default_ms is not None and tr.fwd.ms is not None:
                fwd[k] = max(0.0, fwd[k] + tr.fwd.ms - conv.default_ms)
            lean = lean_cache.get((k, conv.name))
            if lean is None:  # the memory-optimal algorithms, the same under every plan
                lean = lean_cache[k, conv.name] = [select_algo(conv.algos, p, "memory_optimal") for p in PASSES]
            lean_f = max(lean_f, lean[0].workspace_bytes if lean[0] else 0)
            if k == 0 and conv.name == first and conv.default_bwd_ms is not None:
                # the model input needs no gradient: only the weight pass runs (the stage was timed so),
                # and the framework's own weight pass is taken to be the fastest one listed
                weight_ms = [a.ms or 0.0 for a in working_algos(conv.algos, "bwd_filter")]
                fastest = min(weight_ms, default=None)
                if fastest is not None and tr.bwd_filter.ms is not None:
                    bwd[k] = max(0.0, bwd[k] + tr.bwd_filter.ms - fastest)
                ws_bk = max(ws_bk, tr.bwd_filter.workspace_bytes)
                lean_b = max(lean_b, lean[2].workspace_bytes if lean[2] else 0)
                continue
            if conv.default_bwd_ms is not None:
                bwd[k] = max(0.0, bwd[k] + tr.backward_ms - conv.default_bwd_ms)
            ws_bk = max(ws_bk, tr.bwd_data.workspace_bytes, tr.bwd_filter.workspace_bytes)
            lean_b = max(lean_b, max((a.workspace_bytes for a in lean[1:] if a is not None), default=0))
        ws_fk = max(tr.fwd.workspace_bytes for _, tr in items)
        # NOTE [ Lean transients ]: the stage's own transient with lean convolutions, plus what the chosen
        # algorithms' workspace adds to theirs
        measured_f = profile.stages[k].lean_forward_workspace_bytes
        ws_f[k] = ws_fk if measured_f is None else measured_f + max(0, ws_fk - lean_f)
        ws_b[k] = ws_bk if measured_lean_b[k] < 0 else measured_lean_b[k] + max(0, ws_bk - lean_b)
