"""Users' models beside every peer, on one GPU: the compiler's sweep, Hugging Face checkpointing, checkpoint_sequential,
side-stream activation offload, and memtune's plans at fractions of the compiled unconstrained peak.

    python -m benchmarks.module_peers --models resnet50,gpt2 --out benchmarks/results/h100/module-peers
    python -m benchmarks.module_peers --table benchmarks/results/h100/module-peers   # the Markdown tables
    python -m benchmarks.module_peers --repredict benchmarks/results/h200/module-peers   # peaks measured vs predicted
    python -m benchmarks.peer_curves benchmarks/results/h100/module-peers/*.json --out docs/images   # the pictures

Per model, in one process, built as users build them (torchvision models as shipped; Hugging Face models from their
default configurations, as ``benchmarks.promises`` builds them, the Llama-style decoder under bf16 autocast; with
``--cache off`` a decoder's ``use_cache`` is False, as Hugging Face's gradient checkpointing sets it, ``hf_cache``), in
train mode; every step is forward, loss, backward and the optimizer's update (SGD with momentum; AdamW for the
language models), the output held through the backward (the profile's default), the median of ``--steps`` after
``--warmup`` by CUDA events, with the peak bytes allocated and reserved:

1. ``unplanned``: the eager step (``memtune.tuner.measure.module_bench.measure_step``).
2. ``peers``: every peer of NOTE [ Module peers ] (``memtune.tuner.measure.module_peers``), uncapped, each measured as
   NOTE [ Peer measurement ] says (the first step's seconds include compiling), those that do not apply with their
   reason: ``torch.compile`` of the whole model at each ``--compiler-sweep`` budget, Hugging Face checkpointing,
   ``checkpoint_sequential``, ``OffloadActivations``.
3. ``plans``: ``memtune.profile`` of the model with the sweep's points as its compiler points (so that a plan may
   compile the whole model where that is fastest, NOTE [ Whole-model compile ]); at each of ``--fractions`` of the
   compiled unconstrained peak (the allocated peak at activation budget 1; the eager peak where that did not run)
   ``memtune.tuner.tune`` with the default headroom (``memtune.tuner.planning_headroom``), the plans searched in
   parallel processes; each plan measured under ``budget_guard`` at its budget (an out-of-memory is a result) and
   without the cap, beside the simulator's prediction. A compiled plan runs at a budget of the sweep, so its compiled
   graph is the sweep's (``memtune.profiler.compiled.budget_backend``). With ``--region-depths`` (e.g. ``1,2``; ``auto``
   picks them per model, ``auto_depths``) the search also weighs compiled regions (NOTE [ Compiled-region
   candidates ] in ``memtune.tuner.region_plans``): the model's region partitions of those depths profiled compiled
   at each of ``--region-budgets`` and under each of ``--rules`` (``memtune.profiler.region_profile.profile_regions``,
   kept in the row as they are measured), every one searched at each budget, the fastest plan of them all served
   (``memtune.tuner.pipeline.tune_profiles``). With ``--gpus N`` the models run N at a time, one per GPU (NOTE [ One
   model per GPU ] in ``benchmarks.gpu_pool``).
4. ``math`` (unless ``--no-math``): every measured plan's loss and gradients against one step of the model compiled
   whole at activation budget 1, beside the compiler's own spread, each plan's entry ``math``, the row's ``spread``
   (NOTE [ Plans' gradients ], ``compiled_math``).

``<out>/<model>.json`` is written after every measurement (with NOTE [ Run record ] and the versions of transformers
and torchvision), so a run stopped by a time limit keeps what it measured, and the same command run again continues
where it stopped (``--fresh`` starts over). A line per model goes to standard output when it is done.

# NOTE [ Torch and library names the peer benchmark relies on ]
No private torch name is called here. Through memtune: ``torch._functorch.config.activation_memory_budget`` and
``torch._dynamo.config`` recompile limits (``memtune.profiler.compiled``), as the compiled measurements of torch 2.11
used. Public: ``torch.utils.checkpoint.checkpoint_sequential(functions, segments, input, use_reentrant=False)`` (a list
of callables or an ``nn.Sequential``), ``saved_tensors_hooks``, ``torch.OutOfMemoryError``. transformers: a model's
``activation_checkpointing_enable(activation_checkpointing_kwargs=...)`` where it has it (5.24 here), else
``gradient_checkpointing_enable(gradient_checkpointing_kwargs=...)`` (transformers 4 and 5; a deprecated alias in
5.24), and ``supports_gradient_checkpointing``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.gpu_pool import run_across_gpus, shared_host
from benchmarks.peer_rows import (
    RECUT_BUDGET,
    compiled_top,
    region_runs,
    repredicted,
    row_update_ms,
    searched_profile,
    table,
)

__all__ = [
    "MODELS",
    "auto_depths",
    "compiled_math",
    "hf_cache",
    "main",
    "noise_gradients",
    "ran_in_layout",
    "run_model",
    "same_alone",
    "same_cache",
    "within_spread",
]


#: torchvision models and their batch (images of 224 x 224)
VISION = {"resnet50": 128, "efficientnet_b0": 128, "mobilenet_v2": 128, "vit_b_16": 64}
#: Hugging Face models (``benchmarks.promises.language_model``: batch and sequence from ``promises.SIZES``)
LANGUAGE = ("gpt2", "bert_mlm", "llama")
MODELS = (*LANGUAGE, *VISION)
FRACTIONS = (0.9, 0.75, 0.6, 0.45, 0.3)
#: plans measured at each budget before one is served, as ``memtune.tune`` does (NOTE [ Measured finalists ])
FINALISTS = 3
#: the fastest fitting plans of the searches' Pareto fronts kept with each budget, for the fallbacks where no finalist
#: runs (NOTE [ Measured finalists ], step 5)
FALLBACK_POOL = 12


def build(name: str) -> tuple[Any, Any, Callable[[Any], Any], str, int]:
    """The model ``name`` on CUDA in train mode: (model, batch, loss, optimizer, batch size)."""
    import torch
    from torch import nn

    if name in VISION:
        import torchvision

        n = VISION[name]
        model = getattr(torchvision.models, name)().cuda().train()
        x = torch.randn(n, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (n,), device="cuda")
        return model, x, lambda out: nn.functional.cross_entropy(out, y), "sgd", n
    # benchmarks.promises sets CUBLAS_WORKSPACE_CONFIG for its deterministic math when imported; these steps are timed
    # with cuBLAS's default workspace, as users run them
    before = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    from benchmarks import promises

    if before is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    model, inputs, loss, opt = promises.language_model(name)
    return model.train(), inputs, loss, opt, promises.SIZES[name][1]


def hf_cache(model: Any, cache: str) -> bool | None:
    """Apply ``--cache`` to a Hugging Face model (``default``: its configuration's ``use_cache`` as shipped; ``off``:
    ``use_cache = False``, as its gradient checkpointing sets it) and return the ``use_cache`` it trains with; None for
    a model without one. A decoder with the cache on returns every layer's keys and values, which a step that holds
    the output keeps to the end of its backward (NOTE [ Held output ] in ``memtune.tuner.simulator``)."""
    for m in (model, getattr(model, "model", None)):  # the Llama decoder is wrapped in its autocast
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "use_cache"):
            if cache == "off":
                config.use_cache = False
            return bool(config.use_cache)
    return None


def same_cache(path: Path, row: dict[str, Any], shipped: bool | None, use_cache: bool | None) -> None:
    """Refuse to continue a row measured with another ``use_cache`` than this run's (a row without the field ran with
    the ``shipped`` one): every measurement of a row is of one model."""
    measured_with = row.get("use_cache", shipped)
    if "unplanned" in row and measured_with != use_cache:
        raise SystemExit(
            f"{path} was measured with use_cache={measured_with}, this run has use_cache={use_cache}: give another "
            "--out, or --fresh to start the row over"
        )


def _error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:400] if text else ''}"


def _libraries() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for name in ("transformers", "torchvision"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


class _Run:
    """One model's row, saved after every measurement (see the module docstring)."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name, self.args = name, args
        self.path: Path = args.out / f"{name}.json"
        self.row: dict[str, Any] = {}
        if not args.fresh and self.path.exists():
            old = json.loads(self.path.read_text())
            if old.get("model") == name:
                self.row = old

    def save(self) -> None:
        from memtune.profiler.provenance import run_record

        self.row.update(run=run_record(), processes_on_host=shared_host())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.row, indent=1) + "\n")

    def measure(self) -> dict[str, Any]:
        """Measure what the row lacks; an unexpected failure is the row's ``error``, what it held before stays."""
        try:
            self._measure()
        except Exception as exc:
            self.row.update(model=self.name, error=_error(exc))
            self.save()
        return self.row

    def _measure(self) -> None:
        import torch

        from benchmarks.common import same_gpu
        from memtune.profiler.provenance import source_commit
        from memtune.tuner.measure.module_bench import measure_step

        args, row = self.args, self.row
        same_gpu(self.path, row.get("device"), torch.cuda.get_device_name())
        torch.manual_seed(0)
        try:
            model, inputs, loss, opt, batch = build(self.name)
        except Exception as exc:  # a missing library: the row says so, what it held before stays
            row.update(model=self.name, error=_error(exc))
            return
        self._head(model, batch, opt)
        if "unplanned" not in row:
            row["unplanned"] = measure_step(model, model, inputs, loss, warmup=args.warmup, steps=args.steps,
                                            output_held=True, optimizer=opt)  # fmt: skip
            self.save()
        self._peers(model, inputs, loss, opt)
        self._update(model, inputs, loss, opt)
        if args.replan:  # searched again over what the row holds (its peers, profile and regions), once per commit
            row["plans"] = [e for e in row.get("plans", []) if e.get("searched_at") == source_commit()[0]]
        try:
            self._plans(model, inputs, loss, opt)
        except Exception as exc:  # the peers stand; the plans' failure is the row's
            row["plans_error"] = _error(exc)
        self.save()
        if args.math:
            if args.math_again:  # NOTE [ Gradients against float64 ]: the checks it could not judge, made again
                for e in row.get("plans", []):
                    if "math" in e and not judged(e["math"]):
                        del e["math"]
            try:
                self._math(model, inputs, loss)
            except Exception as exc:  # the plans stand; the check's failure is the row's
                row["math_error"] = _error(exc)
            self.save()

    def _update(self, model: Any, inputs: Any, loss: Callable[[Any], Any], opt: str) -> None:
        """The optimizer's update, timed in eager steps, where the row's compiler points and unplanned step were
        measured before steps timed it (``row_update_ms``)."""
        from memtune.tuner.measure.module_bench import measure_step

        if row_update_ms(self.row) is None:
            args = self.args
            self.row["update_ms"] = measure_step(model, model, inputs, loss, warmup=args.warmup, steps=args.steps,
                                                 output_held=True, optimizer=opt)["update_ms"]  # fmt: skip
            self.save()

    def _head(self, model: Any, batch: int, opt: str) -> None:
        """The row's description of its model, its ``use_cache`` applied (``--cache``; a row measured with another
        is refused, ``same_cache``)."""
        import torch

        row = self.row
        shipped = hf_cache(model, "default")  # what a row measured before the option existed ran with
        use_cache = hf_cache(model, self.args.cache)
        same_cache(self.path, row, shipped, use_cache)
        row.pop("error", None)
        row.update(model=self.name, batch=batch, optimizer=opt, output_held=True, libraries=_libraries())
        if use_cache is not None:
            row["use_cache"] = use_cache
        row["device"] = torch.cuda.get_device_name()

    def _peers(self, model: Any, inputs: Any, loss: Callable[[Any], Any], opt: str) -> None:
        """Every applicable peer the row lacks, measured uncapped, the row saved after each."""
        from memtune.tuner.measure.module_peers import applicable_peers
        from memtune.tuner.measure.peer_measure import measure_peers

        args, row = self.args, self.row
        done = {p["name"]: p for p in row.get("peers", []) if "step_ms" in p or "error" in p or not p["applies"]}
        peers = applicable_peers(model, inputs, compiler_budgets=args.compiler_sweep)
        for i, peer in enumerate(peers):
            if peer.name not in done:
                print(f"{self.name}: {peer.name} ({i + 1} of {len(peers)})", flush=True)
                done[peer.name] = measure_peers(model, inputs, peers=[peer], loss_fn=loss, optimizer=opt,  # type: ignore[arg-type]
                                                warmup=args.warmup, steps=args.steps, output_held=True)[0]  # fmt: skip
            row["peers"] = [done[p.name] for p in peers[: i + 1]]
            self.save()

    def _plans(self, model: Any, inputs: Any, loss: Callable[[Any], Any], opt: str) -> None:
        import memtune
        from memtune.profiler import Profile
        from memtune.profiler.provenance import source_commit
        from memtune.tuner import planning_headroom

        args, row = self.args, self.row
        kept = {e["fraction"]: e for e in row.get("plans", []) if "capped" in e or "plan_json" not in e}
        todo = [f for f in args.fractions if f not in kept]
        if not todo:
            return
        row.pop("plans_error", None)
        if "profile" in row:
            prof = Profile.from_json(json.dumps(row["profile"]))
        else:
            t0 = time.perf_counter()
            prof = memtune.profile(model, inputs, loss_fn=loss, progress=False)
            row["profile_s"] = round(time.perf_counter() - t0, 1)
            row.update(stages=prof.n_stages, profile=json.loads(prof.to_json()))
            self.save()
        prof = searched_profile(row)
        top = compiled_top(row)
        reference = top["peak_bytes"] if top is not None else row["unplanned"]["peak_bytes"]
        row["reference"] = {"of": "compiled, budget 1" if top is not None else "eager", "peak_bytes": reference}
        headroom = planning_headroom(prof)
        row["headroom"] = headroom
        regions = self._regions(model, inputs, loss)
        budgets = [int(f * reference) for f in todo]
        jobs = [(prof.to_json(), b, headroom, args.trials, opt, regions) for b in budgets]
        with ProcessPoolExecutor(max_workers=min(len(budgets), 5)) as pool:
            found = list(pool.map(_tune, jobs))
        for fraction, budget, best in zip(todo, budgets, found, strict=True):
            entry: dict[str, Any] = {"fraction": fraction, "budget_bytes": budget, **best}
            entry["searched_at"] = source_commit()[0]
            if "plan_json" in entry:
                self._served(model, inputs, loss, opt, entry)
            kept[fraction] = entry
            row["plans"] = [kept[f] for f in args.fractions if f in kept]
            self.save()

    def _served(self, model: Any, inputs: Any, loss: Callable[[Any], Any], opt: str, entry: dict[str, Any]) -> None:
        """The entry's finalists measured and the fastest served (NOTE [ Measured finalists ] in
        ``memtune.tuner.finalists``; the fallbacks where none ran, and none served where none of them ran either), then
        the served plan measured without the cap and under it."""
        import gc

        import torch

        from memtune.tuner import Plan
        from memtune.tuner.measure.module_bench import measure_step
        from memtune.tuner.runtime import budget_guard, planned

        args, budget = self.args, entry["budget_bytes"]
        if entry.get("finalists"):
            self._finalists(model, inputs, loss, opt, entry)
        if "plan_json" not in entry:  # no finalist nor fallback ran: none is served
            return
        plan = Plan.model_validate(entry["plan_json"])
        entry["compiled"] = plan.whole_compile is not None or plan.compile_budget is not None
        pm = planned(model, plan)

        def step(run: Any) -> dict[str, Any]:
            return measure_step(model, run, inputs, loss, warmup=args.warmup, steps=args.steps, output_held=True,
                                optimizer=opt)  # fmt: skip

        entry["uncapped"] = step(pm)
        try:
            with budget_guard(budget, pm):
                entry["capped"] = step(pm)
        except Exception as exc:  # an out-of-memory under the cap is a result
            entry["capped"] = {"error": _error(exc)}
        pm.release()  # its stage modules' own forward back (NOTE [ Stage modules are wrapped once ])
        del pm
        gc.collect()
        torch.cuda.empty_cache()

    def _finalists(self, model: Any, inputs: Any, loss: Callable[[Any], Any], opt: str, entry: dict[str, Any]) -> None:
        """Each finalist of ``entry`` run under its budget (``run_finalist``), its measure kept in it; where none ran,
        the fallbacks in turn until one runs (NOTE [ Measured finalists ], step 5), each added to the finalists; the
        entry's plan becomes the fastest that ran, and where none ran the entry serves none (its ``error`` says so)."""
        from memtune.tuner import Candidate, Plan
        from memtune.tuner.finalists import fastest_measured, measured_in_turn

        def candidate(f: dict[str, Any]) -> Any:
            return Candidate(f["name"], Plan.model_validate(f["plan_json"]), f["predicted"]["step_ms"],
                             f["predicted"]["peak_bytes"], True)  # fmt: skip

        kept = entry["finalists"]
        chosen = [(f["name"], f, candidate(f)) for f in kept]
        pool = [(f"{f['name']} (fallback)", {**f, "name": f"{f['name']} (fallback)"}, candidate(f))
                for f in entry.get("fallbacks", [])]  # fmt: skip

        def run(plans: Any, total: int) -> list[Any]:
            if plans is not chosen:  # a fallback joins the entry's finalists
                kept.extend(f for _, f, _ in plans)
            return [self._finalist(model, inputs, loss, opt, entry, f, c, next(k for k, g in enumerate(kept) if g is f),
                                   total) for _, f, c in plans]  # fmt: skip

        ran = measured_in_turn(chosen, pool, run, FINALISTS)
        k = fastest_measured(ran)
        if k is None:
            entry["error"] = "no plan ran under the budget: " + "; ".join(f"{g.name}: {g.error}" for g in ran)
            for key in ("plan", "plan_json", "predicted"):
                entry.pop(key, None)
            self.save()
            return
        won = kept[k]
        won["served"] = True
        entry.update(plan=won["plan"], plan_json=won["plan_json"], predicted=won["predicted"])

    def _finalist(self, model: Any, inputs: Any, loss: Callable[[Any], Any], opt: str, entry: dict[str, Any],
                  f: dict[str, Any], c: Any, k: int, total: int) -> Any:  # fmt: skip
        """Finalist ``f`` (candidate ``c``, the ``k``-th of ``total``) run under the entry's budget, its measure kept in
        ``f`` and the row saved; the ``Finalist``."""
        import dataclasses

        from memtune.tuner.measure.finalists import run_finalist

        print(f"{self.name}: {entry['fraction']:.0%} finalist {k + 1} of {total}: {f['name']}", flush=True)
        got = run_finalist(model, inputs, f["name"], c, entry["budget_bytes"], loss, optimizer=opt, output_held=True,
                           dtype="float32")  # fmt: skip
        kept = ("step_ms", "reserved_bytes", "error")
        f["measured"] = {key: v for key, v in dataclasses.asdict(got).items() if key in kept and v is not None}
        self.save()
        return got

    def _math(self, model: Any, inputs: Any, loss: Callable[[Any], Any]) -> None:
        """Every measured plan's gradients against the unplanned compiled run's (NOTE [ Plans' gradients ]), each kept
        in its entry as ``math`` as soon as it is checked; the spread once, as the row's ``spread``."""
        from memtune.tuner import Plan
        from memtune.tuner.measure.module_peers import applicable_peers, applied
        from memtune.tuner.runtime import (
            check_equivalence,
            compare_steps,
            fitting_float64_step,
            reference_step,
        )

        row = self.row
        todo = [e for e in row.get("plans", []) if "plan_json" in e and "math" not in e]
        if not todo:
            return
        row.pop("math_error", None)
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        params = [p for p in model.parameters() if p.requires_grad]

        def errors(eq: Any) -> dict[str, Any]:
            return {"loss": eq.loss, "grad": eq.grad, "buffer": eq.buffer, "worst": eq.worst_grad}

        whole, recut = (p for p in applicable_peers(model, inputs, compiler_budgets=[1.0, RECUT_BUDGET])
                        if p.family == "compiler")  # fmt: skip
        with compiled_math(), applied(model, whole) as run, applied(model, recut) as other:
            ref = reference_step(model, inputs, loss_fn=loss, run=run)
            truth, error = fitting_float64_step(model, inputs, loss_fn=loss)
            row.pop("float64_error", None)
            if error is not None:
                row["float64_error"] = error
            steps = {"again": reference_step(model, inputs, loss_fn=loss, run=run),
                     "eager": reference_step(model, inputs, loss_fn=loss),
                     "recut": reference_step(model, inputs, loss_fn=loss, run=other)}  # fmt: skip
            spreads = {k: compare_steps(v, ref, names) for k, v in steps.items()}
            noise = [names[i] for i in noise_gradients(*spreads.values())]
            row["spread"] = {**{k: errors(v) for k, v in spreads.items()}, "noise": noise}
            if truth is not None:  # the spreads' runs against float64 too, the plans' measure beside them
                for k, v in steps.items():
                    row["spread"][k]["float64"] = against_float64(v.grads, ref, truth, names, spreads[k].loss)
            del steps
            for e in todo:
                print(f"{self.name}: gradients of the plan at {e['fraction']:g}", flush=True)
                eq, pm = check_equivalence(model, Plan.model_validate(e["plan_json"]), inputs, loss_fn=loss,
                                           reference=ref, steps=1)  # fmt: skip
                grads = [p.grad for p in params]
                e["math"] = {**errors(eq), **within_spread(eq, list(spreads.values()), names)}
                if truth is not None:
                    e["math"]["float64"] = against_float64(grads, ref, truth, names, eq.loss)
                pm.release()
                del pm
                self.save()

    def _regions(self, model: Any, inputs: Any, loss: Callable[[Any], Any]) -> list[dict[str, Any]]:
        """The region profiles ``--region-depths`` asks for, measured where the row lacks them (each kept in the row as
        soon as it is measured): one entry per partition and policy, its profile's JSON or its error."""
        from memtune.profiler.module_profile import as_inputs
        from memtune.profiler.region_layout import regions_channels_last
        from memtune.profiler.region_profile import profile_regions
        from memtune.profiler.region_tree import region_partitions

        args, row = self.args, self.row
        if not args.region_depths:
            return []
        parts = region_partitions(model, as_inputs(inputs))
        depths = auto_depths(parts) if args.region_depths == "auto" else args.region_depths
        parts = [p for p in parts if p.depth in depths]
        # a profile measured in another layout than its regions now compile in is measured again (NOTE [ Regions in
        # the whole model's layout ])
        layout = {p.depth: regions_channels_last([model.get_submodule(n) for n in p.names]) for p in parts}
        alone = {p.depth: same_alone([model.get_submodule(n) for n in p.names]) for p in parts}
        row["regions"] = [e for e in row.get("regions", []) if e["depth"] not in layout
                          or ran_in_layout(e, layout[e["depth"]], alone[e["depth"]])]  # fmt: skip
        done = row["regions"]
        have = {(e["depth"], e["budget"], e.get("saves")) for e in done}
        policies = [(b, None) for b in args.region_budgets] + [(1.0, r) for r in args.rules]
        for part in parts:
            for budget, saves in policies:
                if (part.depth, budget, saves) in have:
                    continue
                print(f"{self.name}: regions {part.label} at budget {budget:g}{f' rule {saves}' if saves else ''}")
                (run,) = profile_regions(
                    model, inputs, () if saves else (budget,), partitions=[part], loss_fn=loss,
                    warmup=args.warmup, repeats=5, rules=(saves,) if saves else (),
                )  # fmt: skip
                done.append({
                    "depth": part.depth, "regions": list(part.names), "budget": budget, "saves": saves,
                    "channels_last": layout[part.depth],
                    "seconds": round(run.seconds, 1), "error": run.error,
                    "profile": json.loads(run.profile.to_json()) if run.profile is not None else None,
                })  # fmt: skip
                self.save()
        mine = [e for e in done if e["depth"] in depths]
        self._host_prices(model, inputs, loss, mine)
        return mine

    def _host_prices(self, model: Any, inputs: Any, loss: Callable[[Any], Any], entries: list[dict[str, Any]]) -> None:
        """Each region profile of ``entries`` without host prices priced here (NOTE [ Host prices ] in
        ``memtune.tuner.measure.host_price``), its ``host_seconds`` kept beside it, and saved as soon as it is."""
        import time

        from memtune.profiler import Profile
        from memtune.tuner.measure.host_price import with_host_prices

        for e in entries:
            if e.get("profile") is None or e["profile"].get("host") is not None:
                continue
            print(f"{self.name}: pricing the host of depth {e['depth']} at budget {e['budget']:g}"
                  f"{' rule ' + e['saves'] if e.get('saves') else ''}")  # fmt: skip
            began = time.perf_counter()
            priced = with_host_prices(model, inputs, Profile.from_json(json.dumps(e["profile"])), loss)
            if priced.host is not None:
                e["profile"] = json.loads(priced.to_json())
                e["host_seconds"] = round(time.perf_counter() - began, 1)
                self.save()


def same_alone(regions: Sequence[Any]) -> bool:
    """Whether every region of ``regions`` that holds a convolution, compiled alone, runs it in the layout that all of
    them compiled together run theirs in (``regions_channels_last``): then compiling each region with its own layout
    decision and with the regions' common one is the same."""
    from memtune.profiler.region_layout import CONVOLUTIONS, regions_channels_last

    together = regions_channels_last(regions)
    holding = [r for r in regions if any(isinstance(m, CONVOLUTIONS) for m in r.modules())]
    return all(regions_channels_last([r]) == together for r in holding)


def ran_in_layout(entry: dict[str, Any], channels_last: bool, alone: bool) -> bool:
    """Whether a row's region profile ``entry`` ran its convolutions in the layout ``channels_last`` that its regions
    compile in now. An entry from before the layout was recorded ran each region's own decision, which is that layout
    where ``alone`` (``same_alone``); it is then marked with it."""
    if "channels_last" in entry:
        return bool(entry["channels_last"]) == channels_last
    if alone:
        entry["channels_last"] = channels_last
    return alone


def judged(math: dict[str, Any]) -> bool:
    """Whether a plan's gradient check (its row entry's ``math``) was judged against float64 with the same random
    numbers as the float32 runs (NOTE [ Gradients against float64 ]): False where it was checked before that judgement
    existed, or where its float64 step drew other numbers (``comparable`` False), as before ``Float32Draws``."""
    return bool(math.get("float64", {}).get("comparable", False))


def against_float64(grads: Sequence[Any], ref: Any, truth: Any, names: Sequence[str], loss_error: float) -> Any:
    """A run's gradients ``grads`` (its loss ``loss_error`` off the reference's, relative) judged against the float64
    step ``truth`` beside the reference ``ref``, JSON-ready (NOTE [ Gradients against float64 ])."""
    from memtune.tuner.runtime import judge_against_float64

    return judge_against_float64(grads, ref, truth, names, run_loss_error=loss_error).summary()


def noise_gradients(*spreads: Any) -> list[int]:
    """The indices of the gradients that carry no signal (NOTE [ Plans' gradients ]): those whose relative error is 1
    or more in any of ``spreads`` (``memtune.tuner.runtime.Equivalence`` with per-gradient ``grads``)."""
    return [i for i, errs in enumerate(zip(*(s.grads for s in spreads), strict=True)) if max(errs) >= 1.0]


def within_spread(eq: Any, spreads: Sequence[Any], names: Sequence[str]) -> dict[str, Any]:
    """A plan's check (``eq``) judged against ``spreads`` (NOTE [ Plans' gradients ]): its largest error over the
    gradients that carry signal (``judged_grad``, ``judged_worst``) and its loss error, each against the largest of the
    spreads over the same gradients; ``within_spread`` whether both are within."""
    noise = set(noise_gradients(*spreads))
    signal = [i for i in range(len(names)) if i not in noise]
    worst = max(signal, key=lambda i: eq.grads[i], default=None)
    judged = eq.grads[worst] if worst is not None else 0.0
    tolerance = max([*(s.loss for s in spreads), *(max(s.grads[i] for s in spreads) for i in signal)])
    return {
        "judged_grad": judged,
        "judged_worst": names[worst] if worst is not None else "",
        "within_spread": max(judged, eq.loss) <= tolerance,
    }


@contextlib.contextmanager
def compiled_math() -> Iterator[None]:
    """The setting of NOTE [ Plans' gradients ]: ``memtune.tuner.runtime.verify.deterministic_math``, PyTorch's
    deterministic algorithms (warning only where an operation has none) and inductor's random numbers drawn as eager
    draws them (``torch._inductor.config.fallback_random``); all restored after.

    # NOTE [ Plans' gradients ]
    A plan's gradients are checked against one step of the model compiled whole at activation budget 1 (the unplanned
    compiled run), all from the same parameters, buffers, inputs and seed, and judged against the compiler's own
    spread, measured in the same setting: that run again (atomics, as in an embedding's backward, make two runs
    differ), the eager step against it (what compiling alone changes: other fusions, other rounding) and the model
    compiled whole at activation budget ``RECUT_BUDGET`` against it (``recut``: the compiler's own graph cut
    otherwise, recomputing what budget 1 saves, which is what a plan's regions do; on the H200 the compiler's own
    budget-0.3 point of EfficientNet-B0 was 24x off budget 1 on a batch norm's bias, against 1.5 eager). A plan's
    regions are compiled apart, so its rounding is the compiler's on other graphs; an error no larger than the largest
    of the spreads (loss and gradients) is "within the spread". A gradient whose relative error in any spread is 1 or
    more carries no signal (its size is that of the rounding: BERT's attention key biases, whose gradient is zero in
    exact arithmetic, since softmax ignores a bias added to every key, showed 4.9 eager against compiled): it is listed
    as the spread's ``noise`` and not judged, and the rest are judged each against the same gradients' spreads
    (``within_spread``). Rows checked before the ``recut`` spread have the other two only. Dropout must draw the same
    masks in every run:
    inductor's own random numbers depend on how the model was cut into graphs, so inductor draws them as eager does
    (``fallback_random``), which compiles every graph of the check again; deterministic kernels and no TF32 keep the
    spread the framework's and not the autotuner's. The check is of the plans' math, not of the timed runs: those
    ran with inductor's own random numbers and the default kernels.

    NOTE: ``torch._inductor.config.fallback_random``, read in torch 2.13's ``torch/_inductor/config.py``; inductor's
    configuration has held it since its first releases, so torch 2.11 has it too. ``config.patch`` restores it.
    """
    import torch
    import torch._inductor.config as inductor_config

    from memtune.tuner.runtime.verify import deterministic_math

    was = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with deterministic_math(), inductor_config.patch(fallback_random=True):
            yield
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])


def auto_depths(partitions: Sequence[Any]) -> list[int]:
    """``--region-depths auto``: the depths of the ``RegionPartition``s that ``memtune.tune`` measures
    (``memtune.profiler.region_tree.candidate_partitions``, NOTE [ Candidate depths ]): ResNet-50 1 and 2, BERT 1 and
    3, the Llama decoder 2 and 3."""
    from memtune.profiler.region_tree import candidate_partitions

    return [p.depth for p in candidate_partitions(partitions)]


def _tune(job: tuple[str, int, float, int, str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One search in a worker process: ``(profile JSON, budget bytes, headroom, trials, optimizer, region entries)``;
    with region entries, every region profile is searched too and the fastest plan of them all is served."""
    from memtune.profiler import Profile
    from memtune.tuner.finalists import fallback_pool, finalists
    from memtune.tuner.pipeline import tune_profiles

    profile_json, budget, headroom, trials, optimizer, regions = job
    tuned = tune_profiles(Profile.from_json(profile_json), budget, regions=region_runs(regions), trials=trials,
                          seed=0, optimizer=optimizer, headroom=headroom, progress=False)  # fmt: skip
    candidates = [t.line() for t in tuned.regions]
    best = tuned.result.best
    if best is None:
        return {"error": "no plan fits", "candidates": candidates}
    return {
        **_served_words(best),
        "candidates": candidates,
        "finalists": [  # NOTE [ Measured finalists ] in memtune.tuner.finalists
            {"name": name, **_served_words(c)} for name, _, c in finalists(tuned.searched, limit=FINALISTS)
        ],
        "fallbacks": [  # what is measured in turn where no finalist runs (step 5)
            {"name": name, **_served_words(c)} for name, _, c in fallback_pool(tuned.searched)[:FALLBACK_POOL]
        ],
    }


def _served_words(c: Any) -> dict[str, Any]:
    """A served candidate's entry fields: its plan in words and as JSON, its prediction."""
    saves = f" (save rule {c.plan.compile_saves!r})" if c.plan.compile_saves else ""
    return {
        "plan": c.plan.compact() + saves,
        "plan_json": c.plan.model_dump(mode="json"),
        "predicted": {"step_ms": c.step_ms, "peak_bytes": c.peak_bytes},
    }


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The row of one model (see the module docstring); what ``<out>/<name>.json`` held is continued."""
    row = _Run(name, args).measure()
    return {k: v for k, v in row.items() if k != "run"}  # benchmarks.common.model_rows adds this process's


# ---- the tables (from the committed JSON alone) ------------------------------------------------------------------


def _floats(text: str, option: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{option} {text!r}: give comma-separated numbers, e.g. 0.9,0.6,0.3") from None
    if not values:
        raise SystemExit(f"{option}: give at least one number")
    return values


def main(argv: Sequence[str] | None = None) -> None:
    from benchmarks.common import model_rows
    from memtune.tuner.measure.module_peers import COMPILER_SWEEP

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--compiler-sweep", default=",".join(f"{b:g}" for b in COMPILER_SWEEP))
    parser.add_argument("--fractions", default=",".join(f"{f:g}" for f in FRACTIONS),
                        help="memtune's budgets, as fractions of the compiled unconstrained peak")  # fmt: skip
    parser.add_argument("--trials", type=int, default=150)
    parser.add_argument("--region-depths", default="", help="region partitions' depths to weigh too: 1,2 or auto")
    parser.add_argument("--region-budgets", default="1,0.5", help="activation budgets of the region partitions")
    parser.add_argument("--rules", default="compute", help="memtune's save rules of the region partitions ('' none)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/h100/module-peers"))
    parser.add_argument("--gpus", type=int, default=1, help="spread the models over this many GPUs, one process each")
    parser.add_argument("--cache", choices=("default", "off"), default="default",
                        help="a Hugging Face model's use_cache: 'default' as its configuration ships it (a decoder's "
                        "True), 'off' False, as its gradient checkpointing sets it; a row keeps the one it was "
                        "measured with")  # fmt: skip
    parser.add_argument("--no-math", dest="math", action="store_false",
                        help="skip the plans' gradient check (NOTE [ Plans' gradients ])")  # fmt: skip
    parser.add_argument("--math-again", action="store_true", help="check again the gradients of the plans checked "
                        "before they were judged against float64, or whose float64 step drew other random numbers "
                        "(its judgement not comparable; NOTE [ Gradients against float64 ])")  # fmt: skip
    parser.add_argument("--fresh", action="store_true", help="start over instead of continuing what --out holds")
    parser.add_argument("--replan", action="store_true", help="search and measure again, with their gradient check, "
                        "the plans searched at another commit, over what the rows hold (their peers, profiles and "
                        "regions)")  # fmt: skip
    parser.add_argument("--table", type=Path, help="print the Markdown tables of the rows in this folder and stop")
    parser.add_argument("--repredict", type=Path, help="print every plan's measured and predicted peaks, then and "
                        "now, of the rows in this folder (CPU, nothing measured) and stop")  # fmt: skip
    args = parser.parse_args(argv)
    if args.table is not None:
        print(table(args.table), end="")
        return
    if args.repredict is not None:
        if not args.repredict.is_dir():
            parser.error(f"--repredict {args.repredict}: no such folder of rows")
        print(repredicted(args.repredict), end="")
        return
    args.compiler_sweep = _floats(args.compiler_sweep, "--compiler-sweep")
    args.fractions = _floats(args.fractions, "--fractions")
    if args.region_depths != "auto":
        depths = _floats(args.region_depths, "--region-depths") if args.region_depths else []
        args.region_depths = [int(d) for d in depths]
    args.region_budgets = _floats(args.region_budgets, "--region-budgets")
    args.rules = [r for r in args.rules.split(",") if r]
    from memtune.profiler.saved_tags import SAVE_RULES

    unknown = [r for r in args.rules if r not in SAVE_RULES]
    if unknown:  # refused before anything is measured
        raise SystemExit(f"--rules {','.join(unknown)}: memtune's save rules are {', '.join(SAVE_RULES)}")
    if any(not 0.0 <= b <= 1.0 for b in args.compiler_sweep):
        raise SystemExit("--compiler-sweep: activation budgets are shares from 0 to 1")
    if args.gpus < 1:
        raise SystemExit(f"--gpus {args.gpus}: give at least 1")
    if args.gpus > 1:
        names = [m for m in args.models.split(",") if m]
        unknown = [m for m in names if m not in MODELS]
        if unknown:
            raise SystemExit(f"--models: {', '.join(unknown)} not of {', '.join(MODELS)}")
        failed = run_across_gpus("benchmarks.module_peers", names, sys.argv[1:] if argv is None else argv, args.gpus)
        raise SystemExit(1 if failed else 0)
    model_rows(args.models, MODELS, lambda name: run_model(name, args), args.out)


if __name__ == "__main__":
    main()
