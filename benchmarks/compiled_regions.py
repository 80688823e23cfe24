"""Compiled regions on users' models, on one GPU: eager, the whole model compiled, each region partition compiled, and
memtune's plans among them under a cap.

    python -m benchmarks.compiled_regions --models resnet50,efficientnet_b0,gpt2 --out DIR
    python -m benchmarks.compiled_regions --models resnet50 --phases plans --out DIR   # reuse what DIR holds
    python -m benchmarks.compiled_regions --table DIR                                 # Markdown tables of DIR

Per model, in one process, built as users build them (torchvision models as shipped, imported here only; Hugging Face
models from their default configurations, as ``benchmarks.promises`` builds them), in train mode; every step is
forward, loss, backward and the optimizer's update (SGD with momentum; AdamW for the language models), the output held
through the backward (the profile's default), the median of ``--steps`` after ``--warmup`` by CUDA events, with the
peak bytes allocated and reserved (``memtune.tuner.measure.module_bench.measure_step``):

1. ``eager``: the unplanned step.
2. ``whole``: the whole model compiled (``memtune.profiler.compiled.CompiledStage``) at each of ``--budgets``
   (``activation_memory_budget``), with its first step's seconds (compiling).
3. ``regions``: memtune's eager profile (saved as ``<model>-profile.json``, with the whole model's compiler points
   measured by ``memtune.tuner.measure.compiler_points.measure_module_points``), then every candidate region partition
   (``memtune.profiler.region_tree.region_partitions``; ``--depths`` picks some) profiled compiled at each of
   ``--region-budgets`` (``memtune.profiler.module_profile.profile_module(..., compile_budget=b)``, saved as
   ``<model>-regions-d<depth>-b<budget>.json``): its regions' forward and backward summed, the profile's step (that
   sum and the time outside the regions, measured), the whole model's compiled step at the same budget, the
   partition's measured training step with every region kept (a planned model), the graphs it compiled, its compile
   and profile seconds, the regions it runs eager and why; or its error.
4. ``plans``: at each of ``--fractions`` of the whole model's compiled peak (allocated, budget 1), memtune's search
   over all of them (``memtune.tuner.pipeline.tune_profiles``: the eager plans, the compiler's points, every
   compiled-region profile); the plan served (its kind, its regions and budget), its predicted step and peak, and the
   same plan measured under ``budget_guard`` at that budget (an out-of-memory is a result), with every candidate's
   line.

Each phase writes ``<out>/<model>.json`` as it ends (with NOTE [ Run record ]: date, commit, command, versions, and
the device), so a run stopped by a time limit keeps what it measured, and a later ``--phases`` run adds to it. A
line per model goes to standard output.

# NOTE [ Torch names the compiled-region benchmark relies on ]
This script calls no private torch name itself. Through memtune it relies on ``torch._functorch.config.
activation_memory_budget`` (patched while the partitioner runs), ``torch._inductor.compile_fx.compile_fx`` with
``config_patches={"keep_output_stride": False}``, and ``torch._dynamo.config.recompile_limit`` /
``accumulated_recompile_limit`` (``memtune.profiler.compiled``): the names memtune's compiled stages and compiler points
ran with in the H100 measurements on torch 2.11 (docs/results/torch-compile.md, each table's environment line), and
present in torch 2.13, whose source the CPU tests run against. A run on another torch checks them by running: a missing
name fails the first compile, and that error is the row's. ``torch.nn.Module._call_impl`` calling the instance's
``forward`` (NOTE [ Regions are wrapped once ]) is long-standing behaviour of every torch 2.x. Graph counts come from
``memtune.profiler.compiled.GRAPHS_COMPILED`` (memtune's own backend), not from dynamo's counters.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import same_gpu

Loss = Callable[[Any], torch.Tensor]
Built = tuple[nn.Module, Any, Loss, str]  # model, batch, loss, optimizer
GiB = float(1 << 30)

#: torchvision models and their default batch (images of 224 x 224)
VISION = {"resnet50": 128, "efficientnet_b0": 128, "mobilenet_v2": 128, "vit_b_16": 64}
#: Hugging Face models (``benchmarks.promises.language_model`` builds them, with their batches)
LANGUAGE = ("gpt2", "bert_mlm", "llama")
MODELS = (*VISION, *LANGUAGE)
PHASES = ("eager", "whole", "regions", "plans")


def build(name: str, batch: int | None) -> Built:
    """The model ``name`` on CUDA with its batch (``batch`` overrides a vision model's), loss and optimizer."""
    if name in VISION:
        import torchvision  # the GPU image has it; the CPU machine need not

        n = batch or VISION[name]
        model = getattr(torchvision.models, name)().cuda()
        x = torch.randn(n, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (n,), device="cuda")
        return model, x, lambda out: nn.functional.cross_entropy(out, y), "sgd"
    from benchmarks.promises import language_model

    return language_model(name)


def _error(exc: BaseException) -> str:
    if isinstance(exc, torch.OutOfMemoryError):
        return "out of memory: " + str(exc).split(" If reserved but unallocated")[0].strip()[:400]
    from memtune.profiler.region_tree import first_line

    return first_line(exc)


def _clean() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


class _Keeper:
    """An idle runner attached to a partition's regions while it is profiled, so that their ``RegionForward`` (and its
    compiled callables) outlive the profile and the partition's planned step reuses them (NOTE [ Regions are wrapped
    once ])."""

    in_step = False

    def run_region(self, region: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise AssertionError("an idle runner runs no region")


class Bench:
    """One model's row, phase by phase (see the module docstring)."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name, self.args = name, args
        self.out: Path = args.out
        self.path = self.out / f"{name}.json"
        self.row: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {"model": name}
        same_gpu(self.path, self.row.get("device"), torch.cuda.get_device_name())
        torch.manual_seed(0)
        self.model, self.inputs, self.loss, self.optimizer = build(name, args.batch)
        self.model.train()
        self.row.update(optimizer=self.optimizer, batch=args.batch or VISION.get(name))

    def save(self) -> None:
        from memtune.profiler.identity import cuda_identity
        from memtune.profiler.provenance import run_record

        self.row["run"] = run_record(module="benchmarks.compiled_regions")
        self.row["device"] = cuda_identity(torch.cuda.current_device()).model_dump(mode="json")
        self.out.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.row, indent=1) + "\n")

    def step(self, run: nn.Module) -> dict[str, Any]:
        """One measured training step of ``run`` (sharing the model's parameters), or its error."""
        from memtune.tuner.measure.module_bench import measure_step

        began = time.perf_counter()
        try:
            got = measure_step(
                self.model,
                run,
                self.inputs,
                self.loss,
                warmup=self.args.warmup,
                steps=self.args.steps,
                output_held=True,
                optimizer=self.optimizer,
            )
        except Exception as exc:  # an out-of-memory or a compile error is the row's result
            got = {"error": _error(exc)}
        finally:
            self.model.zero_grad(set_to_none=True)
            _clean()
        got["seconds"] = round(time.perf_counter() - began, 2)
        return got

    def first_step(self, run: nn.Module) -> dict[str, Any]:
        """One training step of ``run``, uncapped: it compiles a plan's regions and tunes their kernels (NOTE
        [ Regions compile at their first call ] in ``memtune.tuner.runtime._planned_module``); ``{}`` or its error."""
        from memtune.tuner.measure.module_bench import measure_step

        try:
            measure_step(self.model, run, self.inputs, self.loss, warmup=0, steps=1, optimizer=self.optimizer)
        except Exception as exc:  # a compile error is the row's result
            return {"error": _error(exc)}
        finally:
            self.model.zero_grad(set_to_none=True)
            _clean()
        return {}

    # ---- phases ----------------------------------------------------------------------------------
    def eager(self) -> None:
        self.row["eager"] = self.step(self.model)

    def whole(self) -> None:
        from memtune.profiler.compiled import CompiledStage

        self.row["whole"] = [{"budget": b, **self.step(CompiledStage(self.model, b))} for b in self.args.budget_list]

    def regions(self) -> None:
        import memtune
        from memtune.profiler.module_profile import as_inputs
        from memtune.profiler.region_tree import region_partitions
        from memtune.tuner.measure.compiler_points import measure_module_points, with_compiler_points

        if not (self.out / f"{self.name}-profile.json").exists():  # a later run of the phase reuses it
            began = time.perf_counter()
            prof = memtune.profile(self.model, self.inputs, loss_fn=self.loss, progress=False)
            points, errors = measure_module_points(
                self.model, self.inputs, prof, self.args.budget_list, loss_fn=self.loss, optimizer=self.optimizer
            )
            prof = with_compiler_points(prof, points)
            (self.out / f"{self.name}-profile.json").write_text(prof.to_json())
            self.row["profile"] = {
                "stages": prof.n_stages,
                "seconds": round(time.perf_counter() - began, 1),
                "point_errors": {str(k): v for k, v in errors.items()},
            }
            _clean()
        parts = region_partitions(self.model, as_inputs(self.inputs))
        if self.args.depth_list:
            parts = [p for p in parts if p.depth in self.args.depth_list]
        whole = {w["budget"]: w for w in self.row.get("whole", []) if "step_ms" in w}
        policies = [(b, None) for b in self.args.region_budget_list] + [(1.0, r) for r in self.args.rule_list]
        done = {(e["depth"], e["budget"], e.get("saves")) for e in self.row.get("partitions", [])}
        rows: list[dict[str, Any]] = [e for e in self.row.get("partitions", [])]  # a later run adds to them
        for part in parts:
            for budget, saves in policies:
                if (part.depth, budget, saves) in done:
                    continue
                rows.append(self._partition(part, budget, saves, whole))
                self.row["partitions"] = rows
                self.save()
                _clean()

    def _partition(self, part: Any, budget: float, saves: str | None, whole: dict[float, Any]) -> dict[str, Any]:
        """One partition profiled compiled under ``budget`` (and save rule ``saves``), its file written, and its
        unplanned step measured as a planned model that keeps every region."""
        from memtune.profiler.compiled import GRAPHS_COMPILED
        from memtune.profiler.region_profile import profile_regions
        from memtune.profiler.region_tree import install_region
        from memtune.tuner import Plan
        from memtune.tuner.runtime import planned

        keeper = _Keeper()
        regions = [install_region(self.model.get_submodule(n)) for n in part.names]
        for r in regions:
            r.attach(keeper)
        graphs = sum(GRAPHS_COMPILED.values())
        (run,) = profile_regions(
            self.model,
            self.inputs,
            () if saves else (budget,),
            partitions=[part],
            loss_fn=self.loss,
            warmup=self.args.warmup,
            repeats=self.args.repeats,
            rules=(saves,) if saves else (),
        )
        entry: dict[str, Any] = {
            "depth": part.depth,
            "regions": list(part.names),
            "budget": budget,
            "saves": saves,
            "profile_seconds": round(run.seconds, 1),
            "graphs": sum(GRAPHS_COMPILED.values()) - graphs,
            "whole_step_ms": whole.get(budget, {}).get("step_ms"),
            "whole_peak_bytes": whole.get(budget, {}).get("peak_bytes"),
        }
        if run.profile is None:
            entry["error"] = run.error
        else:
            p = run.profile
            path = self.out / f"{self.name}-regions-d{part.depth}-b{budget:g}{f'-{saves}' if saves else ''}.json"
            path.write_text(p.to_json())
            stage_sum = sum(s.forward_ms + s.backward_ms for s in p.stages)
            entry.update(
                profile=path.name,
                compile_seconds=p.compile_seconds,
                eager_regions=p.model_params.get("eager_regions"),
                stage_sum_ms=stage_sum,
                profile_step_ms=stage_sum + (p.loss_ms or 0.0),
                compute_source=p.compute_source,
            )
            pm = planned(self.model, Plan.uniform(p.n_stages).named(p))
            entry["measured"] = self.step(pm)
            pm.release()
        for r in regions:
            r.detach(keeper)
        return entry

    def plans(self) -> None:
        import memtune
        from memtune.profiler import Profile
        from memtune.profiler.region_profile import RegionProfile
        from memtune.profiler.region_tree import RegionPartition
        from memtune.tuner.pipeline import tune_profiles
        from memtune.tuner.runtime import PlanOutOfMemoryError

        prof = Profile.from_json((self.out / f"{self.name}-profile.json").read_text())
        runs = [
            RegionProfile(
                RegionPartition(e["depth"], tuple(e["regions"])),
                e["budget"],
                Profile.from_json((self.out / e["profile"]).read_text()) if "profile" in e else None,
                e.get("error"),
                e["profile_seconds"],
                e.get("saves"),
            )
            for e in self.row.get("partitions", [])
        ]
        whole = next((w for w in self.row.get("whole", []) if w["budget"] == 1.0 and "peak_bytes" in w), None)
        if whole is None:
            raise SystemExit(f"{self.name}: the plans phase needs the whole phase's budget-1 peak (--phases whole)")
        rows: list[dict[str, Any]] = []
        for fraction in self.args.fraction_list:
            budget = int(fraction * whole["peak_bytes"])
            tuned = tune_profiles(
                prof, budget, regions=runs, trials=self.args.trials, optimizer=self.optimizer, progress=False
            )
            entry: dict[str, Any] = {
                "fraction": fraction,
                "budget_bytes": budget,
                "candidates": [t.line() for t in tuned.regions],
            }
            best = tuned.result.best
            if best is None:
                entry["error"] = "no plan fits"
                rows.append(entry)
                continue
            plan = best.plan
            entry.update(
                kind="compiled whole"
                if plan.whole_compile is not None
                else "compiled regions"
                if plan.compile_budget is not None
                else "eager",
                plan=plan.model_dump(mode="json"),
                compact=plan.compact() + (f" (save rule {plan.compile_saves!r})" if plan.compile_saves else ""),
                predicted_step_ms=best.step_ms,
                predicted_peak_bytes=best.peak_bytes,
            )
            run = memtune.planned(self.model, plan)
            first = self.first_step(run)  # NOTE [ Regions compile at their first call ]: before the cap
            if "error" in first:
                entry["measured"] = first
            else:
                try:
                    with memtune.budget_guard(budget, run):
                        entry["measured"] = self.step(run)
                except PlanOutOfMemoryError as exc:
                    entry["measured"] = {"error": f"out of memory: {exc}"[:600]}
            run.release()
            rows.append(entry)
            self.row["plans"] = rows
            self.save()
            _clean()


def run_model(name: str, args: argparse.Namespace) -> None:
    bench = Bench(name, args)
    for phase in args.phase_list:
        began = time.perf_counter()
        try:
            getattr(bench, phase)()
        except Exception as exc:  # the phase's error is the row's; the next phase may still run
            bench.row[f"{phase}_error"] = _error(exc)
        bench.row.setdefault("phase_seconds", {})[phase] = round(time.perf_counter() - began, 1)
        bench.save()
    shown = {k: v for k, v in bench.row.items() if k in ("model", "eager", "whole", "phase_seconds")}
    print(json.dumps(shown)[:3000], flush=True)


def lower_bounds(folder: Path, row: dict[str, Any]) -> dict[float, float]:
    """Per plan fraction of ``row``, the least step any plan of memtune's may take within its budget, ms: the smaller
    of the eager bound (NOTE [ Budget bound ] in ``memtune.tuner.bound``) on the row's eager profile and the compiled
    bound (NOTE [ Compiled lower bound ] in ``memtune.tuner.compiled_bound``) on it and every region profile of the
    folder, computed from the committed profiles by the code as it stands; a fraction with neither is left out."""
    from memtune.profiler import Profile
    from memtune.tuner.compiled_bound import least_step_ms

    path = folder / f"{row['model']}-profile.json"
    if not row.get("plans") or not path.exists():
        return {}
    eager = Profile.from_json(path.read_text())
    entries = [e for e in row.get("partitions", []) if "profile" in e]
    regions = [Profile.from_json((folder / e["profile"]).read_text()) for e in entries]
    bounds = {p["fraction"]: least_step_ms(eager, regions, p["budget_bytes"], row.get("optimizer", "sgd"))
              for p in row["plans"]}  # fmt: skip
    return {f: b for f, b in bounds.items() if b is not None}


def table(folder: Path) -> str:
    """Markdown tables of the rows in ``folder``: per model, the compiled steps and the plans, each plan beside the
    lower bound on memtune's step at its budget (``lower_bounds``)."""
    lines: list[str] = []
    for path in sorted(folder.glob("*.json")):
        row = json.loads(path.read_text())
        if "model" not in row or "run" not in row:
            continue  # a saved profile
        device = row.get("device", {}).get("name", "?")
        lines += [f"### {row['model']} ({device}, {row['run'].get('date')}, commit {row['run'].get('commit')})", ""]
        lines += ["| run | step ms | peak GiB | vs whole compiled |", "|---|---|---|---|"]
        eager = row.get("eager", {})
        if "step_ms" in eager:
            lines.append(f"| eager | {eager['step_ms']:.1f} | {eager['peak_bytes'] / GiB:.2f} | |")
        for w in row.get("whole", []):
            if "step_ms" in w:
                lines.append(f"| compiled whole, budget {w['budget']:g} | {w['step_ms']:.1f} | "
                             f"{w['peak_bytes'] / GiB:.2f} | 1.00 |")  # fmt: skip
        for p in row.get("partitions", []):
            m = p.get("measured", {})
            policy = f"save rule {p['saves']!r}" if p.get("saves") else f"budget {p['budget']:g}"
            label = f"regions depth {p['depth']} ({len(p['regions'])}), {policy}"
            if "step_ms" not in m:
                lines.append(f"| {label} | {p.get('error') or m.get('error')} | | |")
                continue
            ratio = f"{m['step_ms'] / p['whole_step_ms']:.2f}" if p.get("whole_step_ms") else ""
            lines.append(f"| {label} | {m['step_ms']:.1f} | {m['peak_bytes'] / GiB:.2f} | {ratio} |")
        if row.get("plans"):  # the plans phase ran
            head = "| budget | plan | predicted ms / GiB | measured ms / GiB | lower bound ms | measured / bound |"
            lines += ["", head, "|---|---|---|---|---|---|"]
        bounds = lower_bounds(folder, row)
        for p in row.get("plans", []):
            m = p.get("measured", {})
            # an error in its first two sentences (a CUDA out-of-memory goes on to list the allocator's state)
            error = ". ".join(m.get("error", "").split(". ")[:2])
            measured = f"{m['step_ms']:.1f} / {m['peak_bytes'] / GiB:.2f}" if "step_ms" in m else error
            predicted = (
                f"{p['predicted_step_ms']:.1f} / {p['predicted_peak_bytes'] / GiB:.2f}"
                if "predicted_step_ms" in p
                else p.get("error", "")
            )
            kind, compact = p.get("kind", ""), p.get("compact", "")
            plan = compact if compact.startswith(kind) else f"{kind} {compact}".strip()
            bound = bounds.get(p["fraction"])
            ratio = f"{m['step_ms'] / bound:.2f}" if bound and "step_ms" in m else ""
            lines.append(
                f"| {p['fraction']:.0%} ({p['budget_bytes'] / GiB:.2f} GiB) | {plan} | {predicted} | {measured} | "
                f"{f'{bound:.1f}' if bound else ''} | {ratio} |"
            )
        lines.append("")
    return "\n".join(lines)


def _floats(text: str, option: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v]
    except ValueError:
        raise SystemExit(f"{option} takes comma-separated numbers, not {text!r}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--models", default="resnet50,efficientnet_b0,gpt2", help=f"comma-separated, of {', '.join(MODELS)}"
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/h100/compiled-regions"))
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    ap.add_argument("--budgets", default="1,0.5,0.25", help="activation budgets of the whole model compiled")
    ap.add_argument("--region-budgets", default="1,0.5,0.25", help="activation budgets of the region partitions")
    ap.add_argument("--rules", default="compute", help="memtune's save rules, each at budget 1 ('' for none)")
    ap.add_argument("--depths", default="", help="partition depths to measure (default: every partition)")
    ap.add_argument("--fractions", default="0.6,0.4", help="plan budgets, fractions of the compiled peak")
    ap.add_argument("--batch", type=int, default=None, help="a vision model's batch (default per model)")
    ap.add_argument("--trials", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds per region in a region profile")
    ap.add_argument("--table", type=Path, default=None, help="print the Markdown tables of this folder and exit")
    args = ap.parse_args()
    if args.table is not None:
        print(table(args.table))
        return
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark measures on a CUDA GPU, and none is visible")
    args.budget_list = _floats(args.budgets, "--budgets")
    args.region_budget_list = _floats(args.region_budgets, "--region-budgets")
    args.rule_list = [r for r in args.rules.split(",") if r]
    from memtune.profiler.saved_tags import SAVE_RULES

    unknown = [r for r in args.rule_list if r not in SAVE_RULES]
    if unknown:  # refused before anything is measured
        raise SystemExit(f"--rules {','.join(unknown)}: memtune's save rules are {', '.join(SAVE_RULES)}")
    args.fraction_list = _floats(args.fractions, "--fractions")
    args.depth_list = [int(d) for d in _floats(args.depths, "--depths")]
    args.phase_list = [p for p in args.phases.split(",") if p]
    bad = [p for p in args.phase_list if p not in PHASES] + [m for m in args.models.split(",") if m not in MODELS]
    if bad:
        raise SystemExit(f"unknown phase or model: {', '.join(bad)}")
    from memtune.tuner.runtime.guard import configure_allocator

    configure_allocator()
    for name in args.models.split(","):
        run_model(name, args)
        _clean()


if __name__ == "__main__":
    main()
