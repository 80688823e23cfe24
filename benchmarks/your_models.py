"""Your models on a GPU: torchvision and Hugging Face models profiled by module stages, tuned at a fraction of
their measured unconstrained peak, run under ``budget_guard``, and checked for equal gradients.

    python -m benchmarks.your_models --models resnet50,mobilenet_v2 --fraction 0.6 --out results/

Per model, in one process: the unplanned step (median of ``--steps`` after ``--warmup``, CUDA events, SGD with
momentum, its peak allocated bytes); ``memtune.profile`` on CUDA; ``memtune.tuner.search.tune`` at ``fraction`` x that
peak (``--headroom`` of it kept free for the allocator); the best plan run under ``budget_guard`` (step, peak
allocated and reserved, allocator retries, out-of-memory if any) and once more without the cap; the simulator's
prediction beside it; the largest relative gradient and buffer errors of the plan against the unplanned step,
beside the unplanned step's own run-to-run spread; and PyTorch's built-in checkpointing where it applies
(``checkpoint_sequential`` over a model's sequential trunk, Hugging Face's ``gradient_checkpointing_enable``),
uncapped. One JSON object per model (the profile included) goes to ``<out>/<model>.json`` and a line to standard
output.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import model_rows

Loss = Callable[[Any], torch.Tensor]


def _hf(kind: str, batch: int) -> tuple[nn.Module, Any, Loss, int]:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if kind == "gpt2":  # the 124M configuration
        model: nn.Module = GPT2LMHeadModel(GPT2Config(use_cache=False))
        vocab, seq = 50257, 1024
    else:  # a Llama-style decoder: 8 layers, width 1024, grouped-query attention
        cfg = LlamaConfig(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=4,
            vocab_size=32000,
            max_position_embeddings=2048,
            use_cache=False,
        )
        model = LlamaForCausalLM(cfg)
        vocab, seq = 32000, 1024
    ids = torch.randint(0, vocab, (batch, seq), device="cuda")
    return model.cuda(), {"input_ids": ids, "labels": ids}, lambda out: out.loss, seq


def _vision(kind: str, batch: int) -> tuple[nn.Module, Any, Loss, int]:
    import torchvision

    model = getattr(torchvision.models, kind)().cuda()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    return model, x, lambda out: nn.functional.cross_entropy(out, y), 224


MODELS: dict[str, tuple[Callable[[str, int], tuple[nn.Module, Any, Loss, int]], int]] = {
    "resnet50": (_vision, 128),
    "mobilenet_v2": (_vision, 128),
    "densenet121": (_vision, 64),
    "vit_b_16": (_vision, 64),
    "gpt2": (_hf, 8),
    "llama": (_hf, 8),
}


def _sequential_peer(kind: str, model: nn.Module) -> nn.Module | None:
    """The model with ``checkpoint_sequential`` over its sequential trunk (sqrt(n) segments), where it has one."""
    from torch.utils.checkpoint import checkpoint_sequential

    if kind in ("mobilenet_v2", "densenet121"):
        trunk, head = model.features, model.classifier  # type: ignore[union-attr]
        post: Callable[[torch.Tensor], torch.Tensor] = (
            (lambda x: nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))
            if kind == "mobilenet_v2"
            else (lambda x: nn.functional.adaptive_avg_pool2d(nn.functional.relu(x), 1).flatten(1))
        )
    elif kind == "resnet50":
        m = model
        trunk = nn.Sequential(m.conv1, m.bn1, m.relu, m.maxpool, *m.layer1, *m.layer2, *m.layer3, *m.layer4)  # type: ignore[union-attr]
        head, post = m.fc, lambda x: m.avgpool(x).flatten(1)  # type: ignore[union-attr,assignment]
    else:
        return None

    class Peer(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n = len(trunk)
            return head(post(checkpoint_sequential(trunk, max(1, round(math.sqrt(n))), x, use_reentrant=False)))

    return Peer()


def run_model(kind: str, fraction: float, headroom: float, trials: int, warmup: int, steps: int) -> dict[str, Any]:
    """NOTE [ Module bench ] for one model of ``MODELS``, with PyTorch's built-in checkpointing beside it."""
    from memtune.tuner.measure.module_bench import bench_module

    build, batch = MODELS[kind]
    torch.manual_seed(0)
    model, inputs, loss_fn, _ = build(kind, batch)
    peers: dict[str, nn.Module] = {}
    peer = _sequential_peer(kind, model)
    if peer is not None:
        peers["checkpoint_sequential"] = peer
    row = bench_module(model, inputs, loss_fn=loss_fn, fraction=fraction, headroom=headroom, trials=trials,
                       warmup=warmup, steps=steps, builtins=peers)  # fmt: skip
    if peer is None and hasattr(model, "gradient_checkpointing_enable"):
        from memtune.tuner.measure.module_bench import measure_step

        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        row["hf_gradient_checkpointing"] = measure_step(model, model, inputs, loss_fn, warmup=warmup, steps=steps)
        model.gradient_checkpointing_disable()
    return {"model": kind, "batch": batch, **row}


def table(folder: Path) -> str:
    """A Markdown table of the rows in ``folder`` (one ``<model>.json`` each): measured against predicted."""
    gib = float(1 << 30)
    lines = [
        "| model | batch | stages | unplanned ms / GiB | budget GiB (headroom) | plan | predicted ms / GiB "
        "| measured ms / GiB under the cap | step error | peak error | retries/step | grads (spread) "
        "| built-in ms / GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in sorted(folder.glob("*.json")):
        r = json.loads(path.read_text())
        if "predicted" not in r:
            continue
        un, pr, me = r["unplanned"], r["predicted"], r["planned"]
        peer = r.get("checkpoint_sequential") or r.get("hf_gradient_checkpointing")
        peer_name = "checkpoint_sequential" if "checkpoint_sequential" in r else "HF checkpointing"
        if "error" in me:
            measured = step_err = peak_err = retries = "out of memory"
        else:
            measured = f"{me['step_ms']:.1f} / {me['peak_bytes'] / gib:.2f}"
            step_err = f"{(pr['step_ms'] - me['step_ms']) / me['step_ms']:+.1%}"
            peak_err = f"{(pr['peak_bytes'] - me['peak_bytes']) / me['peak_bytes']:+.1%}"
            retries = f"{me.get('alloc_retries_per_step', 0.0):.2f}"
        lines.append(
            f"| {r['model']}{'' if path.stem == r['model'] else f' ({path.stem})'} | {r['batch']} | {r['stages']} | "
            f"{un['step_ms']:.1f} / {un['peak_bytes'] / gib:.2f} | {r['budget_bytes'] / gib:.2f} ({r['headroom']:.0%}) "
            f"| `{r['plan']}` | {pr['step_ms']:.1f} / {pr['peak_bytes'] / gib:.2f} | {measured} | {step_err} | "
            f"{peak_err} | {retries} | {r['equality']['grad']:.1e} ({r['spread']['grad']:.1e}) | "
            + (f"{peer_name} {peer['step_ms']:.1f} / {peer['peak_bytes'] / gib:.2f} |" if peer else "- |")
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--fraction", type=float, default=0.6)
    parser.add_argument("--headroom", type=float, default=0.05)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--table", type=Path, help="print the Markdown table of the rows in this folder and stop")
    args = parser.parse_args()
    if args.table is not None:
        print(table(args.table))
        return
    model_rows(
        args.models,
        MODELS,
        lambda kind: run_model(kind, args.fraction, args.headroom, args.trials, args.warmup, args.steps),
        args.out,
    )


if __name__ == "__main__":
    main()
