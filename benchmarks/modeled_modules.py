"""A module profile made on the CPU for an H100 against the measured H100 profile of the same model: same plans?

    python -m benchmarks.modeled_modules --models gpt2,bert_mlm,t5_small --measured DIR --out OUT
    python -m benchmarks.modeled_modules --models gpt2 --measured DIR --out OUT --reuse   # tune again, no profiling
    python -m benchmarks.modeled_modules --models gpt2,bert_mlm,t5_small --count-only --out OUT   # times only
    python -m benchmarks.modeled_modules --table OUT          # the Markdown tables of the rows in OUT

Per model, built on the CPU with ``torch.manual_seed(0)`` as ``benchmarks.promises`` builds it on CUDA (same
configuration, batch, loss and optimizer; Hugging Face models from their default configurations, train mode):

1. ``memtune.profile(model, batch, gpu="h100", warmup=0, repeats=1)`` on the CPU: every stage's compute priced by
   the H100's roofline (NOTE [ Modeled module profiles ] in ``memtune.profiler.module_roofline``), the copies the
   spec's;
2. the measured H100 profile of the same model, ``<measured>/<model>.json`` (a ``benchmarks.promises`` row: its
   ``profile``, and ``unplanned.peak_bytes``, the measured unplanned peak; ``--measured`` defaults to
   ``benchmarks/results/h100/promises``);
3. at each fraction of that measured peak, ``memtune.tuner.tune(profile, budget, trials, seed=0, optimizer, headroom)``
on
   both profiles with the same budget and the same headroom (``--headroom``, 0.05: not the calibrated headroom, which
   differs between a measured and a modeled profile), in parallel processes; per fraction, each best plan (compact
   form, counts of each action), its simulated step and peak, its plan family (below), whether the families agree,
   the share of stages given the same action, and the CPU-modeled plan simulated on the measured profile (what it
   would cost on the H100 by the measured profile, and whether it fits there);
4. both profiles' simulated unplanned steps (the 15% criterion), the printout's header line of each
   (``str(Tuned)``, whose ``device_label`` names the modeled GPU) and, per stage, modeled beside measured times.

# Plan family
A plan frees memory through offload (a stage's saved bytes go to the host) or through recompute (``recompute``
frees the stage's saved bytes; ``selective`` frees its saved bytes less those it keeps, ``selective_saved_bytes``).
Each stage's bytes are the measured H100 profile's, for both plans (the same weights, so that two plans differ in
family only through their actions); the family is ``recompute`` where recompute and selective free at least 2/3 of
the bytes the plan frees, ``offload`` where offload does, ``mixed`` otherwise, and ``keep`` where the plan frees
nothing. The shares are computed with the modeled profile's own bytes too (``own``), for reference.

# NOTE [ Counted times ]
A modeled profile runs the whole training step on the CPU several times (the trace, every stage plain and
selectively, the step, its peak), so the host must hold a step's activations. On the CPU these are larger than on
an H100: with attention dropout PyTorch takes its math path there and saves the attention matrices, and each
dropout keeps a float32 noise tensor where CUDA's fused kernel keeps a bool mask (the stage trace at batch 1, times
8: 1848 MiB saved per GPT-2 block where the measured H100 profile has 733 MiB; BERT 2016 against 793). At the batches
above (2026-11-26, torch 2.13 CPU, 2 cores, 23 GB): GPT-2 grew the process by 3.8 GB at batch 1 and 7.3 GB at
batch 2 (about 28 GB at batch 8), BERT 2.3 GB at batch 2 and 4.5 GB at batch 4 (about 36 GB at batch 32), and one
step of GPT-2 at batch 2 took 106 s. ``--count-only`` keeps what needs no such memory: the profile's compute times.
They depend on the ops of one forward and loss (``count_module_step``), which run the same without grad, and on
which stage inputs need a gradient, which does not depend on the batch: the stages and those flags are taken from
the model on one sequence of ``--small-seq`` tokens, the ops are counted on the full batch under ``no_grad`` and
priced as ``profile_module`` prices them. On GPT-2, BERT and T5 at batch 2 x 128 this gave every stage's forward
and backward and ``loss_ms`` of ``memtune.profile(..., gpu="h100")`` exactly (difference 0.0 ms), and its simulated
unplanned step. The row also holds the printout of a modeled profile made at the small batch (its header line,
``device_label``, ``compute_source``). No plan is searched: the saved bytes need the whole step.

One JSON object per model goes to ``<out>/<model>.json`` (the modeled profile in it, except in a ``--count-only``
row), a line per model to standard output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.promises import SIZES, language_model, tokens

Loss = Callable[[Any], torch.Tensor]
GiB = float(1 << 30)
STEP_LIMIT = 0.15  # the claim: the modeled unplanned step within 15% of the measured one
FAMILY_SHARE = 2 / 3  # a family's share of the freed bytes that names it (NOTE in the module docstring)


MODELS = tuple(SIZES)  # the language models of benchmarks.promises


def family(plan: Any, weights: Any) -> dict[str, Any]:
    """The plan family of ``plan`` with each stage's bytes taken from the profile ``weights`` (module docstring)."""
    offload = recompute = 0
    for action, stage in zip(plan.actions, weights.stages, strict=True):
        if action.value == "offload":
            offload += stage.saved_bytes
        elif action.value == "recompute":
            recompute += stage.saved_bytes
        elif action.value == "selective":
            recompute += max(0, stage.saved_bytes - stage.selective_saved_bytes)
    freed = offload + recompute
    share = recompute / freed if freed else 0.0
    name = (
        "keep"
        if freed == 0
        else "recompute"
        if share >= FAMILY_SHARE
        else "offload"
        if 1.0 - share >= FAMILY_SHARE
        else "mixed"
    )
    return {"family": name, "recompute_share": share, "offload_bytes": offload, "recompute_bytes": recompute}


def _tune(args: tuple[str, str, int, float, int, str, str]) -> dict[str, Any]:
    """One search in a worker process: ``(side, profile JSON, budget, headroom, trials, optimizer, weights JSON)``."""
    import optuna

    from memtune.profiler import Profile
    from memtune.tuner import tune
    from memtune.tuner.tuned import Tuned

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    side, profile_json, budget, headroom, trials, optimizer, weights_json = args
    prof = Profile.from_json(profile_json)
    t0 = time.perf_counter()
    result = tune(prof, budget, trials=trials, seed=0, headroom=headroom, optimizer=optimizer)
    out: dict[str, Any] = {
        "side": side,
        "tune_s": round(time.perf_counter() - t0, 1),
        "header": str(Tuned(result, None)).splitlines()[0],
        "unplanned_step_ms": result.unconstrained.step_ms,
        "unplanned_peak_bytes": result.unconstrained.peak_bytes,
    }
    best = result.best
    if best is None:
        return {**out, "error": "no plan fits"}
    actions = [a.value for a in best.plan.actions]
    return {
        **out,
        "plan": best.plan.model_dump(mode="json"),
        "compact": best.plan.compact(),
        "counts": {a: actions.count(a) for a in ("keep", "offload", "recompute", "selective")},
        "step_ms": best.step_ms,
        "peak_bytes": best.peak_bytes,
        "label": best.plan.label,
        **family(best.plan, Profile.from_json(weights_json)),
        "own": family(best.plan, prof),
    }


def _cross(entry: dict[str, Any], measured: Any, optimizer: str, headroom: float) -> dict[str, Any] | None:
    """The CPU-modeled best plan simulated on the measured profile: step, peak, whether it fits there."""
    from memtune.tuner import Plan, simulate

    if "plan" not in entry["modeled"]:
        return None
    try:
        r = simulate(measured, Plan.model_validate(entry["modeled"]["plan"]), optimizer=optimizer)
    except Exception as exc:  # a plan the measured profile does not allow (a selective stage it cannot run)
        return {"error": f"{type(exc).__name__}: {exc}"[:400]}
    out: dict[str, Any] = {
        "step_ms": r.step_ms,
        "peak_bytes": r.peak_bytes,
        "fits": r.peak_bytes <= int(entry["budget_bytes"] * (1.0 - headroom)),
    }
    if "step_ms" in entry["measured"]:
        out["regret"] = r.step_ms / entry["measured"]["step_ms"] - 1.0
    return out


def _stages(modeled: Any, measured: Any) -> list[dict[str, Any]]:
    """Per stage, the modeled times and bytes beside the measured ones."""
    rows = []
    for a, b in zip(modeled.stages, measured.stages, strict=False):
        rows.append(
            {
                "name": b.name,
                "same_name": a.name == b.name,
                "modeled": {
                    "forward_ms": a.forward_ms,
                    "backward_ms": a.backward_ms,
                    "selective_backward_ms": a.selective_backward_ms,
                    "saved_bytes": a.saved_bytes,
                    "selective_saved_bytes": a.selective_saved_bytes,
                    "d2h_ms": a.d2h_ms,
                },
                "measured": {
                    "forward_ms": b.forward_ms,
                    "backward_ms": b.backward_ms,
                    "selective_backward_ms": b.selective_backward_ms,
                    "saved_bytes": b.saved_bytes,
                    "selective_saved_bytes": b.selective_saved_bytes,
                    "d2h_ms": b.d2h_ms,
                },
            }
        )
    return rows


def counted_times(model: nn.Module, inputs: Any, loss_fn: Loss, small: Any, gpu: str = "h100") -> dict[str, Any]:
    """The modeled profile's compute times without its memory (``--count-only``, NOTE [ Counted times ]).

    The stages and which of their inputs need a gradient come from ``small`` (the same model on a smaller batch:
    neither depends on the batch); the ops of one forward and loss on ``inputs`` are counted without grad and priced
    as ``profile_module`` prices them (``memtune.profiler.module_roofline``). Returns the stage names, each stage's
    modeled forward and backward ms, ``loss_ms`` and the step (stages plus ``loss_ms``, the simulated unplanned
    step)."""
    from memtune.profiler import find_stages, get_gpu
    from memtune.profiler.module_profile import as_inputs
    from memtune.profiler.module_roofline import count_module_step, modeled_stage_ms, outside_ms
    from memtune.profiler.module_stages import trace_stages

    spec = get_gpu(gpu)
    small_in = as_inputs(small)
    names, _ = find_stages(model, small_in)
    trace = trace_stages(model, names, small_in, loss_fn=loss_fn, output_held=True)
    modules = [model.get_submodule(n) if n else model for n in names]
    state = torch.get_rng_state()
    with torch.no_grad():
        counted = count_module_step(model, as_inputs(inputs), modules, trace.input_grad, loss_fn)
    torch.set_rng_state(state)
    times = [modeled_stage_ms(f, spec) for f in counted.stages]
    loss_ms = outside_ms(counted, spec)
    return {
        "names": names,
        "forward_ms": [t.forward_ms for t in times],
        "backward_ms": [t.backward_ms for t in times],
        "loss_ms": loss_ms,
        "step_ms": sum(t.forward_ms + t.backward_ms for t in times) + loss_ms,
    }


def count_row(kind: str, measured_dir: Path, small_seq: int) -> dict[str, Any]:
    """The ``--count-only`` row of one model (NOTE [ Counted times ]): no plans, the compute times only."""
    import optuna

    import memtune
    from memtune.profiler import Profile
    from memtune.tuner import Action, Plan, simulate, tune
    from memtune.tuner.tuned import Tuned, device_label

    source = measured_dir / f"{kind}.json"
    ref = json.loads(source.read_text())
    measured = Profile.model_validate(ref["profile"])
    torch.manual_seed(0)
    model, inputs, loss_fn, opt = language_model(kind, device="cpu")
    model.train()
    vocab, _, _ = SIZES[kind]
    small = tokens(vocab, 1, small_seq, device="cpu")
    # the printout of a modeled profile of the same model, at the small batch (the full one does not fit)
    t0 = time.perf_counter()
    small_prof = memtune.profile(model, small, loss_fn=loss_fn, gpu="h100", warmup=0, repeats=1, progress=False)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    small_tuned = tune(small_prof, measured.device.memory_bytes, trials=5, seed=0, optimizer=opt)
    small_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    counted = counted_times(model, inputs, loss_fn, small)
    count_s = time.perf_counter() - t0
    keep = Plan.uniform(measured.n_stages, Action.KEEP).named(measured)
    measured_step = simulate(measured, keep, optimizer=opt).step_ms
    by_name = {s.name: s for s in measured.stages}
    stage_table = [
        {
            "name": n,
            "modeled": {"forward_ms": f, "backward_ms": b},
            "measured": {
                "forward_ms": by_name[n].forward_ms if n in by_name else float("nan"),
                "backward_ms": by_name[n].backward_ms if n in by_name else float("nan"),
            },
        }
        for n, f, b in zip(counted["names"], counted["forward_ms"], counted["backward_ms"], strict=True)
    ]
    return {
        **_provenance(kind, source, ref),
        "count_only": True,
        "optimizer": opt,
        "stages": {"modeled": len(counted["names"]), "measured": measured.n_stages},
        "same_stages": counted["names"] == [s.name for s in measured.stages],
        "small_batch": {"batch": 1, "seq": small_seq, "seconds": round(small_s, 1)},
        "count_s": round(count_s, 1),
        "compute_source": {"modeled": small_prof.compute_source, "measured": measured.compute_source},
        "device_label": {"modeled": device_label(small_prof), "measured": device_label(measured)},
        "header": {"modeled": str(Tuned(small_tuned, None)).splitlines()[0]},
        "loss_ms": {"modeled": counted["loss_ms"], "measured": measured.loss_ms},
        "stage_sum_ms": {
            "modeled": counted["step_ms"] - counted["loss_ms"],
            "measured": sum(s.forward_ms + s.backward_ms for s in measured.stages),
        },
        "sim_unplanned": {"modeled": {"step_ms": counted["step_ms"]}, "measured": {"step_ms": measured_step}},
        "step_ratio": counted["step_ms"] / measured_step,
        "step_within": abs(counted["step_ms"] / measured_step - 1.0) <= STEP_LIMIT,
        "stage_table": stage_table,
    }


def _provenance(kind: str, source: Path, ref: dict[str, Any]) -> dict[str, Any]:
    """The head of a row: the model, the versions and host it ran on, and the measured row it is compared with."""
    import transformers

    return {
        "model": kind,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "host": f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads",
        "measured_source": str(source),
        "measured_sha256": _sha256(source),
        "measured_unplanned": ref["unplanned"],
    }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_model(
    kind: str,
    measured_dir: Path,
    fractions: list[float],
    trials: int,
    headroom: float,
    workers: int,
    out: Path,
    reuse: bool,
) -> dict[str, Any]:
    """The row of one model (see the module docstring)."""

    import memtune
    from memtune.profiler import Profile
    from memtune.tuner.tuned import device_label

    source = measured_dir / f"{kind}.json"
    ref = json.loads(source.read_text())
    measured = Profile.model_validate(ref["profile"])
    peak = int(ref["unplanned"]["peak_bytes"])
    row: dict[str, Any] = {
        **_provenance(kind, source, ref),
        "headroom": headroom,
        "trials": trials,
    }
    old = out / f"{kind}.json"
    if reuse and old.exists() and "modeled_profile" in (prev := json.loads(old.read_text())):
        modeled = Profile.model_validate(prev["modeled_profile"])
        row.update({k: prev[k] for k in ("torch", "transformers", "host", "profile_s", "optimizer") if k in prev})
        row["reused"] = True
    else:
        torch.manual_seed(0)
        model, inputs, loss_fn, opt = language_model(kind, device="cpu")
        model.train()
        t0 = time.perf_counter()
        modeled = memtune.profile(model, inputs, loss_fn=loss_fn, gpu="h100", warmup=0, repeats=1, progress=False)
        row["profile_s"] = round(time.perf_counter() - t0, 1)
        row["optimizer"] = opt
        del model, inputs
    opt = row.get("optimizer", "adam")
    row["stages"] = {"modeled": modeled.n_stages, "measured": measured.n_stages}
    row["same_stages"] = [s.name for s in modeled.stages] == [s.name for s in measured.stages]
    row["compute_source"] = {"modeled": modeled.compute_source, "measured": measured.compute_source}
    row["device_label"] = {"modeled": device_label(modeled), "measured": device_label(measured)}
    row["loss_ms"] = {"modeled": modeled.loss_ms, "measured": measured.loss_ms}
    row["stage_sum_ms"] = {
        "modeled": sum(s.forward_ms + s.backward_ms for s in modeled.stages),
        "measured": sum(s.forward_ms + s.backward_ms for s in measured.stages),
    }
    row["step_peak"] = {
        side: None if p.step_peak is None else p.step_peak.model_dump()
        for side, p in (("modeled", modeled), ("measured", measured))
    }
    budgets = [int(f * peak) for f in fractions]
    weights = measured.to_json() if row["same_stages"] else modeled.to_json()
    jobs = [
        (side, prof.to_json(), b, headroom, trials, opt, weights if side == "modeled" else measured.to_json())
        for b in budgets
        for side, prof in (("modeled", modeled), ("measured", measured))
    ]
    with ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        done = list(pool.map(_tune, jobs))
    first = {d["side"]: d for d in done}
    row["header"] = {side: first[side]["header"] for side in ("modeled", "measured")}
    sim = {side: {"step_ms": first[side]["unplanned_step_ms"], "peak_bytes": first[side]["unplanned_peak_bytes"]}
           for side in ("modeled", "measured")}  # fmt: skip
    row["sim_unplanned"] = sim
    row["step_ratio"] = sim["modeled"]["step_ms"] / sim["measured"]["step_ms"]
    row["step_within"] = abs(row["step_ratio"] - 1.0) <= STEP_LIMIT
    row["fractions"] = []
    for k, (f, b) in enumerate(zip(fractions, budgets, strict=True)):
        mod, mea = done[2 * k], done[2 * k + 1]
        drop = ("header", "unplanned_step_ms", "unplanned_peak_bytes", "side")
        entry: dict[str, Any] = {
            "fraction": f,
            "budget_bytes": b,
            "modeled": {x: y for x, y in mod.items() if x not in drop},
            "measured": {x: y for x, y in mea.items() if x not in drop},
        }
        if "plan" in mod and "plan" in mea:
            entry["family_agree"] = mod["family"] == mea["family"]
            same = [x == y for x, y in zip(mod["plan"]["actions"], mea["plan"]["actions"], strict=True)]
            entry["stage_agree"] = sum(same) / len(same)
            entry["step_ratio"] = mod["step_ms"] / mea["step_ms"]
        elif "plan" in mod or "plan" in mea:
            entry["family_agree"] = False  # one found a plan, the other none
        entry["cross"] = _cross(entry, measured, opt, headroom) if row["same_stages"] else None
        row["fractions"].append(entry)
    row["stage_table"] = _stages(modeled, measured)
    row["modeled_profile"] = json.loads(modeled.to_json())
    return row


def _plan(side: dict[str, Any]) -> str:
    if "plan" not in side:
        return "no plan fits | - | -"
    return f"`{side['compact']}` | {side['family']} ({side['recompute_share']:.0%}) | {side['step_ms']:.1f}"


def table(folder: Path, top: int = 4) -> str:
    """The Markdown tables of the rows in ``folder``: unplanned steps, plans per fraction, the largest stages."""
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    rows = [r for r in rows if "fractions" in r or r.get("count_only")]
    step = [
        "| model | stages | CPU-modeled header | simulated unplanned ms: modeled / measured | ratio | within 15% | "
        "loss_ms modeled / measured | peak GiB modeled / measured |",
        "|" + "---|" * 8,
    ]
    plans = [
        "| model | fraction | budget GiB | H100-measured plan | family (recompute share) | step ms | "
        "CPU-modeled plan | family (recompute share) | step ms | same family | stages alike | step ratio | "
        "modeled plan on measured: ms / fits / regret |",
        "|" + "---|" * 13,
    ]
    stages = [
        "| model | stage | forward ms modeled / measured | backward ms modeled / measured | "
        "saved MiB modeled / measured |",
        "|" + "---|" * 5,
    ]
    for r in rows:
        sim = r["sim_unplanned"]
        peaks = (
            "not run (count only)"
            if r.get("count_only")
            else f"{sim['modeled']['peak_bytes'] / GiB:.2f} / {sim['measured']['peak_bytes'] / GiB:.2f}"
        )
        step.append(
            f"| {r['model']} | {r['stages']['modeled']} / {r['stages']['measured']} | `{r['header']['modeled']}` | "
            f"{sim['modeled']['step_ms']:.1f} / {sim['measured']['step_ms']:.1f} | {r['step_ratio']:.2f} | "
            f"{'yes' if r['step_within'] else 'no'} | {r['loss_ms']['modeled']:.2f} / {r['loss_ms']['measured']:.2f} | "
            f"{peaks} |"
        )
        if r.get("count_only"):
            plans.append(f"| {r['model']} | - | - | not run (count only) |" + " - |" * 9)
        for e in r.get("fractions", []):
            cross = e.get("cross")
            if cross is None:
                crossed = "-"
            elif "error" in cross:
                crossed = cross["error"][:60]
            else:
                regret = f"{cross['regret']:+.1%}" if "regret" in cross else "-"
                crossed = f"{cross['step_ms']:.1f} / {'yes' if cross['fits'] else 'no'} / {regret}"
            agree = e.get("family_agree")
            same = "-" if agree is None else "yes" if agree else "no"
            alike = f"{e['stage_agree']:.0%}" if "stage_agree" in e else "-"
            ratio = f"{e['step_ratio']:.2f}" if "step_ratio" in e else "-"
            plans.append(
                f"| {r['model']} | {e['fraction']:.0%} | {e['budget_bytes'] / GiB:.2f} | {_plan(e['measured'])} | "
                f"{_plan(e['modeled'])} | {same} | {alike} | {ratio} | {crossed} |"
            )
        by_time = sorted(r["stage_table"], key=lambda s: -(s["measured"]["forward_ms"] + s["measured"]["backward_ms"]))
        for s in by_time[:top]:
            a, b = s["modeled"], s["measured"]
            saved = (
                f"{a['saved_bytes'] / (1 << 20):.0f} / {b['saved_bytes'] / (1 << 20):.0f}"
                if "saved_bytes" in a
                else "-"
            )
            stages.append(
                f"| {r['model']} | {s['name']} | {a['forward_ms']:.2f} / {b['forward_ms']:.2f} | "
                f"{a['backward_ms']:.2f} / {b['backward_ms']:.2f} | {saved} |"
            )
        sums = r["stage_sum_ms"]
        stages.append(
            f"| {r['model']} | all stages (fwd+bwd) / loss_ms | {sums['modeled']:.1f} / {sums['measured']:.1f} | "
            f"{r['loss_ms']['modeled']:.2f} / {r['loss_ms']['measured']:.2f} | - |"
        )
    return "\n".join(step) + "\n\n" + "\n".join(plans) + "\n\n" + "\n".join(stages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2,bert_mlm,t5_small")
    parser.add_argument("--measured", type=Path, default=Path("benchmarks/results/h100/promises"))
    parser.add_argument("--fractions", default="0.4,0.5,0.6,0.7,0.8")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--headroom", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=min(10, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--reuse", action="store_true", help="take the modeled profile from <out>/<model>.json")
    parser.add_argument("--count-only", action="store_true", help="the compute times only (NOTE [ Counted times ])")
    parser.add_argument("--small-seq", type=int, default=64, help="--count-only: the small batch's sequence")
    parser.add_argument("--table", type=Path, help="print the Markdown tables of the rows in this folder and stop")
    args = parser.parse_args()
    if args.table is not None:
        print(table(args.table))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    fractions = [float(f) for f in args.fractions.split(",")]
    for kind in args.models.split(","):
        if kind not in MODELS:
            raise SystemExit(f"--models: {kind!r} is not one of {', '.join(MODELS)}")
        try:
            if args.count_only:
                row = count_row(kind, args.measured, args.small_seq)
            else:
                row = run_model(
                    kind, args.measured, fractions, args.trials, args.headroom, args.workers, args.out, args.reuse
                )
        except Exception as exc:
            row = {"model": kind, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        (args.out / f"{kind}.json").write_text(json.dumps(row, indent=1) + "\n")
        brief = {k: v for k, v in row.items() if k not in ("modeled_profile", "stage_table")}
        print(json.dumps(brief)[:3000], flush=True)


if __name__ == "__main__":
    main()
