"""The two promises on users' models, on a GPU: a plan never changes the math, and a plan that says it fits, fits.

    python -m benchmarks.promises --models gpt2,bert_mlm --fractions 0.4,0.5,0.6,0.7,0.8 --out DIR
    python -m benchmarks.promises --table DIR          # the Markdown tables of the rows in DIR

Per model, in one process, built as users build them (Hugging Face models from their default configs: dropout on,
caches on; torchvision models as shipped), in train mode:

1. the unplanned step (median of ``--steps`` after ``--warmup``, CUDA events; the output held through the backward,
   the profile's default; SGD with momentum, AdamW for the language models), its peak allocated and reserved bytes;
2. ``memtune.profile`` on CUDA (module stages found by default) and its self-check (NOTE [ Profile self-check ]);
3. the memory: at each fraction of the measured unplanned peak, ``memtune.tuner.tune`` with the default headroom (the
GPU
   type's calibration widened by the profile's measured gap, ``memtune.tuner.planning_headroom``), the best plan run
   without a cap, then under ``budget_guard`` at that budget (an out-of-memory is a result, measured last), beside the
   simulator's prediction. The five searches run in parallel processes (pure Python);
4. the math, last, with deterministic kernels and TF32 off (``memtune.tuner.runtime.verify.deterministic_math``, which
   changes what the allocator sees, hence after the memory): one unplanned step's gradients against every uniform
   plan (keep, offload, recompute, selective) and every tuned plan, beside the stages wrapped with ``keep`` (the
   run-to-run spread), with the same seed, dropout drawing its masks (``memtune.tuner.runtime.verify``).

One JSON object per model goes to ``<out>/<model>.json``, a line per model to standard output.
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic GEMMs for the math

import argparse
import gc
import json
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import model_rows

Loss = Callable[[Any], torch.Tensor]
Built = tuple[nn.Module, Any, Loss, str]  # model, batch, loss, optimizer
GiB = float(1 << 30)


class Autocast(nn.Module):
    """The model called under autocast to ``dtype`` on ``device_type``: a bf16 training step as users write it."""

    def __init__(self, model: nn.Module, dtype: torch.dtype, device_type: str = "cuda") -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype
        self.device_type = device_type

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.model(*args, **kwargs)


def hf_loss(out: Any) -> torch.Tensor:
    """A Hugging Face model's own loss (given ``labels``)."""
    return out.loss  # type: ignore[no-any-return]


#: the batch of each torchvision model
VISION_BATCH = {"resnet50": 128, "mobilenet_v2": 128, "densenet121": 64, "vit_b_16": 64}

#: vocabulary, batch and sequence of each language model
SIZES = {
    "gpt2": (50257, 8, 1024),
    "bert_mlm": (30522, 32, 512),
    "t5_small": (32128, 16, 512),
    "llama": (32000, 8, 2048),
}


def tokens(vocab: int, batch: int, seq: int, device: str = "cuda") -> dict[str, torch.Tensor]:
    """Random token ids below ``vocab``, ``(batch, seq)``, as ``input_ids`` and ``labels``."""
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    return {"input_ids": ids, "labels": ids}


def language_model(kind: str, device: str = "cuda", batch: int | None = None) -> Built:
    """One of the language models of ``SIZES`` on ``device``, from its default configuration, with its batch (or
    ``batch`` sequences)."""
    import transformers as hf

    model: nn.Module
    if kind == "gpt2":  # the 124M configuration, as shipped
        model = hf.GPT2LMHeadModel(hf.GPT2Config())
    elif kind == "bert_mlm":  # bert-base
        model = hf.BertForMaskedLM(hf.BertConfig())
    elif kind == "t5_small":  # t5-small's sizes: d_model 512, 6 layers, 8 heads, vocabulary 32,128
        ids: dict[str, Any] = {"decoder_start_token_id": 0, "pad_token_id": 0}
        model = hf.T5ForConditionalGeneration(hf.T5Config(**ids))
    else:  # a Llama-style decoder, bf16 autocast
        cfg = hf.LlamaConfig(
            hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
            vocab_size=32000, max_position_embeddings=2048,
        )  # fmt: skip
        model = Autocast(hf.LlamaForCausalLM(cfg), torch.bfloat16, torch.device(device).type)
    vocab, default, seq = SIZES[kind]
    return nn.Module.to(model, device), tokens(vocab, batch or default, seq, device=device), hf_loss, "adam"


def _vision(kind: str, batch: int | None = None) -> Built:
    import torchvision

    batch = batch or VISION_BATCH[kind]
    model = getattr(torchvision.models, kind)().cuda()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    return model, x, lambda out: nn.functional.cross_entropy(out, y), "sgd"


def _unet(_kind: str, batch: int | None = None) -> Built:
    from tests.unit.modules.models import UNet, mean_square

    return UNet(width=64).cuda(), torch.randn(batch or 16, 3, 256, 256, device="cuda"), mean_square, "sgd"


MODELS: dict[str, Callable[..., Built]] = {
    "gpt2": language_model,
    "llama": language_model,
    "bert_mlm": language_model,
    "t5_small": language_model,
    "vit_b_16": _vision,
    "resnet50": _vision,
    "mobilenet_v2": _vision,
    "densenet121": _vision,
    "unet": _unet,
}


def _tune(args: tuple[str, int, float, int, str]) -> dict[str, Any]:
    """One search in a worker process: ``(profile JSON, budget bytes, headroom, trials, optimizer)``."""
    from memtune.profiler import Profile
    from memtune.tuner import tune

    profile_json, budget, headroom, trials, optimizer = args
    result = tune(
        Profile.from_json(profile_json), budget, trials=trials, seed=0, headroom=headroom, optimizer=optimizer
    )
    if result.best is None:
        return {"error": "no plan fits"}
    best = result.best
    return {"plan": best.plan.model_dump(mode="json"), "step_ms": best.step_ms, "peak_bytes": best.peak_bytes}


def run_model(
    kind: str, fractions: list[float], trials: int, warmup: int, steps: int, batch: int | None = None
) -> dict[str, Any]:
    """The row of one model (see the module docstring); ``batch`` replaces the model's own batch size."""
    import memtune
    from memtune.tuner import Plan, peak_check, planning_headroom
    from memtune.tuner.measure.module_bench import measure_step
    from memtune.tuner.runtime import budget_guard, planned
    from memtune.tuner.runtime.verify import deterministic_math

    torch.manual_seed(0)
    model, inputs, loss_fn, opt = MODELS[kind](kind, batch=batch)
    model.train()

    def step(run: nn.Module) -> dict[str, Any]:
        return measure_step(model, run, inputs, loss_fn, warmup=warmup, steps=steps, output_held=True, optimizer=opt)

    row: dict[str, Any] = {"model": kind, "optimizer": opt, "torch": torch.__version__}
    if batch is not None:
        row["batch"] = batch
    row["unplanned"] = step(model)
    t0 = time.perf_counter()
    prof = memtune.profile(model, inputs, loss_fn=loss_fn, progress=False)
    row["profile_s"] = round(time.perf_counter() - t0, 1)
    row.update(stages=prof.n_stages, device=prof.device.name, profile=json.loads(prof.to_json()))
    check = peak_check(prof)
    row["self_check"] = None if check is None else {"text": str(check), "gap": check.gap}
    headroom = planning_headroom(prof)
    row["headroom"] = headroom
    budgets = [int(f * row["unplanned"]["peak_bytes"]) for f in fractions]
    with ProcessPoolExecutor(max_workers=len(fractions)) as pool:
        tuned = list(pool.map(_tune, [(prof.to_json(), b, headroom, trials, opt) for b in budgets]))
    # the memory first, as a user's process runs it (deterministic kernels change the allocator's picture): each plan
    # without the cap, then under it (after an out-of-memory nothing else is measured)
    row["fractions"] = [
        {"fraction": f, "budget_bytes": b, **t} for f, b, t in zip(fractions, budgets, tuned, strict=True)
    ]
    for entry in row["fractions"]:
        if "plan" not in entry:
            continue
        pm = planned(model, Plan.model_validate(entry["plan"]))
        entry["uncapped"] = step(pm)
        try:
            with budget_guard(entry["budget_bytes"], pm):
                entry["capped"] = step(pm)
        except Exception as exc:  # an out-of-memory under the cap is a result, reported as such
            entry["capped"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        del pm
        gc.collect()
        torch.cuda.empty_cache()
    # the math last, against a reference taken now (the steps above moved the parameters); deterministic kernels, so
    # that the spread is the framework's (atomics in an embedding's backward), not the autotuner's choices
    torch.use_deterministic_algorithms(True, warn_only=True)
    with deterministic_math():
        _math(row, model, inputs, loss_fn, prof)
    torch.use_deterministic_algorithms(False)
    return row


def _math(row: dict[str, Any], model: nn.Module, inputs: Any, loss_fn: Loss, prof: Any) -> None:
    """Gradient errors of every uniform plan and every tuned plan against one unplanned step, and the spread."""
    from memtune.tuner import Action, Plan
    from memtune.tuner.runtime import check_equivalence, reference_step

    ref = reference_step(model, inputs, loss_fn=loss_fn)

    def grad_error(plan: Plan) -> float:
        eq, pm = check_equivalence(model, plan, inputs, loss_fn=loss_fn, reference=ref, steps=1)
        del pm
        return eq.grad

    n = prof.n_stages
    row["spread"] = grad_error(Plan.uniform(n, Action.KEEP).named(prof))
    row["actions"] = {a.value: grad_error(Plan.uniform(n, a).named(prof)) for a in Action}
    for entry in row["fractions"]:
        if "plan" in entry:
            entry["compact"] = Plan.model_validate(entry["plan"]).compact()
            entry["grad"] = grad_error(Plan.model_validate(entry["plan"]))


def table(folder: Path) -> str:
    """The Markdown tables of the rows in ``folder``: the math (every action) and the memory (every fraction)."""
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    rows = [r for r in rows if "fractions" in r]
    math = [
        "| model | stages | spread | keep | offload | recompute | selective | tuned plans (worst) |",
        "|" + "---|" * 8,
    ]
    mem = [
        "| model | unplanned ms / GiB | self-check | fraction | budget GiB (headroom) | plan | predicted ms / GiB "
        "| under the cap | uncapped ms / GiB | peak error | step error |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        a = r["actions"]
        tuned = max((e.get("grad", 0.0) for e in r["fractions"]), default=0.0)
        math.append(
            f"| {r['model']} | {r['stages']} | {r['spread']:.1e} | {a['keep']:.1e} | {a['offload']:.1e} | "
            f"{a['recompute']:.1e} | {a['selective']:.1e} | {tuned:.1e} |"
        )
        un = r["unplanned"]
        gap = f"{r['self_check']['gap']:+.1%}" if r.get("self_check") else "-"
        for e in r["fractions"]:
            head = (
                f"| {r['model']} | {un['step_ms']:.1f} / {un['peak_bytes'] / GiB:.2f} | {gap} | {e['fraction']:.0%} | "
                f"{e['budget_bytes'] / GiB:.2f} ({r['headroom']:.1%}) |"
            )
            if "plan" not in e:
                mem.append(f"{head} no plan fits | - | - | - | - | - |")
                continue
            cap, unc = e["capped"], e["uncapped"]
            capped = "out of memory" if "error" in cap else f"fits, {cap['step_ms']:.1f} ms"
            mem.append(
                f"{head} `{e['compact']}` | {e['step_ms']:.1f} / {e['peak_bytes'] / GiB:.2f} | {capped} | "
                f"{unc['step_ms']:.1f} / {unc['peak_bytes'] / GiB:.2f} | "
                f"{(e['peak_bytes'] - unc['peak_bytes']) / unc['peak_bytes']:+.1%} | "
                f"{(e['step_ms'] - unc['step_ms']) / unc['step_ms']:+.1%} |"
            )
    return "\n".join(math) + "\n\n" + "\n".join(mem)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--fractions", default="0.4,0.5,0.6,0.7,0.8")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, help="every model at this batch size instead of its own")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--table", type=Path, help="print the Markdown tables of the rows in this folder and stop")
    args = parser.parse_args()
    if args.table is not None:
        print(table(args.table))
        return
    fractions = [float(f) for f in args.fractions.split(",")]
    model_rows(
        args.models,
        MODELS,
        lambda kind: run_model(kind, fractions, args.trials, args.warmup, args.steps, args.batch),
        args.out,
    )


if __name__ == "__main__":
    main()
