"""How well a region profile's host prices predict the host's time of mixed plans (NOTE [ Host prices ] in
``memtune.tuner.measure.host_price``), on one GPU.

    python -m benchmarks.host_price_check --model resnet50 --regions 1:1:,2:1:compute --out DIR

For each of a ``benchmarks.module_peers`` row's region profiles named by ``--regions`` (``depth:budget:rule``, the rule
empty for none), in one process: the profile priced again as ``memtune`` prices it now; then, one after another, its
kept plan, the plans the row served on that profile and ``--random`` seeded mixed plans (keep, offload, recompute
drawn alike), each run and timed as the prices are (``issue_ms``: 2 untimed steps and 5 timed), each plan's measured
host time beside what the new prices and the row's committed ones predict (``Simulator.host_ms``). Written to
``<out>/<model>-host-prices.json``; a line per plan to standard output.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "mixed_plans"]


def mixed_plans(n: int, count: int, seed: int) -> list[str]:
    """``count`` seeded plans of ``n`` stages in compact form, each stage kept, offloaded or recomputed alike."""
    rng = random.Random(seed)
    return ["".join(rng.choice("kor") for _ in range(n)) for _ in range(count)]


def _entry(row: dict[str, Any], spec: str) -> dict[str, Any]:
    """The row's region profile named by ``depth:budget:rule``; a spec of another form, or one the row lacks, stops the
    command with a message that says which."""
    try:
        depth, budget, rule = spec.split(":")
        wanted = (int(depth), float(budget))
    except ValueError:
        raise SystemExit(f"--regions {spec!r}: expected depth:budget:rule, e.g. 1:1: or 2:1:compute") from None
    for e in row["regions"]:
        if (e["depth"], e["budget"]) == wanted and (e.get("saves") or "") == rule:
            return e
    raise SystemExit(f"--regions {spec}: the row holds no region profile of depth {depth} at budget {budget}"
                     f"{' under rule ' + rule if rule else ''}")  # fmt: skip


def _served_on(row: dict[str, Any], profile: Any) -> list[str]:
    """The compact actions of the row's plans served on ``profile``'s regions under its policy."""
    out = []
    for e in row.get("plans", []):
        plan = e.get("plan_json")
        if plan is None or plan.get("stages") is None or list(plan["stages"]) != [s.name for s in profile.stages]:
            continue
        if plan.get("compile_budget") == profile.compile_budget and plan.get("compile_saves") == profile.compile_saves:
            out.append("".join(a[0] for a in plan["actions"]))
    return out


def check(
    model: Any, inputs: Any, loss_fn: Any, row: dict[str, Any], entry: dict[str, Any], count: int, seed: int
) -> dict[str, Any]:
    """One region profile of ``row`` priced again and its plans' host times measured beside both prices'
    predictions."""
    import gc

    import torch

    from memtune.profiler import Profile
    from memtune.tuner import Action, Plan, Simulator
    from memtune.tuner.measure.host_price import HOST_STEPS, issue_ms, measure_host_prices
    from memtune.tuner.runtime import planned

    committed = Profile.from_json(json.dumps(entry["profile"]))
    began = time.perf_counter()
    host = measure_host_prices(model, inputs, committed, loss_fn)
    seconds = time.perf_counter() - began
    new = Simulator(committed.model_copy(update={"host": host})) if host is not None else None
    old = Simulator(committed) if committed.host is not None else None
    n = committed.n_stages
    compacts = ["k" * n, *_served_on(row, committed), *mixed_plans(n, count, seed)]
    base = Plan.uniform(n).named(committed)
    letters = {"k": Action.KEEP, "o": Action.OFFLOAD, "r": Action.RECOMPUTE}
    plans = []
    for c in dict.fromkeys(compacts):
        actions = [letters[a] for a in c]
        run = planned(model, base.with_(actions=actions))
        got: dict[str, Any] = {"plan": c, "measured_ms": None, "error": None}
        try:
            got["measured_ms"] = issue_ms(model, run, inputs, loss_fn, committed.dtype, True, HOST_STEPS)
        except Exception as exc:  # an out-of-memory: the plan's line says so
            got["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            run.release()
            gc.collect()
            torch.cuda.empty_cache()
        got["new_ms"] = new.host_ms(actions) if new is not None else None
        got["old_ms"] = old.host_ms(actions) if old is not None else None
        plans.append(got)
    return {"depth": entry["depth"], "budget": entry["budget"], "saves": entry.get("saves"), "seconds": seconds,
            "prices": host.model_dump() if host is not None else None, "plans": plans}  # fmt: skip


def main() -> None:
    import torch

    from benchmarks.module_peers import build

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--rows", type=Path, default=Path("benchmarks/results/h200/module-peers"))
    parser.add_argument("--regions", default="1:1:", help="region profiles as depth:budget:rule, comma-separated")
    parser.add_argument("--random", type=int, default=6, help="seeded mixed plans per profile")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("."))
    a = parser.parse_args()
    row = json.loads((a.rows / f"{a.model}.json").read_text())
    entries = [_entry(row, spec) for spec in a.regions.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model, inputs, loss_fn, _, _ = build(a.model)
    out: dict[str, Any] = {"model": a.model, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "command": "python -m benchmarks.host_price_check " + " ".join(
                               f"--{k} {v}" for k, v in (("model", a.model), ("regions", a.regions),
                                                         ("random", a.random), ("seed", a.seed))),
                           "profiles": []}  # fmt: skip
    for entry in entries:
        got = check(model, inputs, loss_fn, row, entry, a.random, a.seed)
        out["profiles"].append(got)
        (a.out / f"{a.model}-host-prices.json").write_text(json.dumps(out, indent=1))
        for p in got["plans"]:
            where = f"depth {entry['depth']} budget {entry['budget']:g} {entry.get('saves') or ''}"
            print(f"{a.model} {where} {p['plan']}: measured {p['measured_ms']} ms, new prices {p['new_ms']}, "
                  f"committed {p['old_ms']}"
                  f"{' ' + p['error'] if p['error'] else ''}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
