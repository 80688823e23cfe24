"""Planned models train under Hugging Face's ``Trainer`` (NOTE [ Seen as the model ] in
``memtune.tuner.runtime._planned_base``): the planned model itself is ``Trainer``'s ``model``.

The main test trains a small GPT-2 (two blocks, width 64, dropout on as the default config has it) for three steps,
its regions (NOTE [ Regions ] in ``memtune.profiler.region_tree``) compiled by CPU inductor, once under a plan that
keeps, recomputes and offloads regions and twice without one (the same regions compiled under the same budget, every
region kept: ``CompiledRegions``). Per step it compares the logged loss and gradient norm.

Tolerance: relative 1e-6, a few float32 ulps at a loss of 4.5. The two unplanned runs (the first compiles, the second
reuses the compiled graphs) are measured against each other in the test and their spread asserted to stay within it;
on this 2-core CPU it is 0.0, loss and gradient norm alike, since ``Trainer`` seeds every run the same and the runs
share one thread and the same compiled kernels. The planned run matched them bitwise here too: offload copies
storages exactly, and a recomputed region re-runs the same compiled graph under the random state of its first run
(NOTE [ Random state under recompute ] in ``memtune.tuner.runtime._rng``), so its dropout masks are the same.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import memtune.tuner.runtime._planned_module as planned_module
from memtune.profiler.module_stages import find_stages
from memtune.profiler.region_tree import CompiledRegions, edge_writes, region_partitions
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Plan
from memtune.tuner.runtime import planned

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # Trainer needs it on torch

#: relative tolerance of a planned step's loss and gradient norm against the unplanned compiled step's (docstring)
RTOL = 1e-6
BUDGET = 1.0  # the regions' activation budget, planned and unplanned alike
TOKENS = 16


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _batches(rows: int = 6) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(0, 128, (TOKENS,), generator=g)} for _ in range(rows)]
    for row in data:
        row["labels"] = row["input_ids"].clone()
    return data


def _train(model: nn.Module, tmp_path: Path, data: list[dict[str, torch.Tensor]], **extra: Any) -> Any:
    """Three steps of ``Trainer`` (batch 2, seed 0); the trainer."""
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
        **extra,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return trainer


def _steps(trainer: Any) -> list[tuple[float, float]]:
    """Per step: (loss, gradient norm), as ``Trainer`` logged them."""
    return [(h["loss"], h["grad_norm"]) for h in trainer.state.log_history if "loss" in h]


def _spread(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The largest relative difference between two runs' logged losses and gradient norms."""
    assert len(a) == len(b) == 3
    return max(abs(x - y) / abs(y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def _gpt2() -> Any:
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=128)
    assert config.resid_pdrop == config.embd_pdrop == config.attn_pdrop == 0.1  # dropout on: the default
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.slow  # CPU inductor compiles six graphs: about 40 s cold on a 2-core machine, 6 s from its cache
def test_a_planned_gpt2_of_compiled_regions_trains_under_trainer_as_the_unplanned_compiled_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, data = _gpt2(), _batches()
    state = copy.deepcopy(model.state_dict())
    x = torch.stack([row["input_ids"] for row in data[:2]])
    inputs = ((), {"input_ids": x, "labels": x})
    names = region_partitions(model, inputs)[1].names
    assert names == (
        "transformer.wte",
        "transformer.wpe",
        "transformer.drop",
        "transformer.h.0",
        "transformer.h.1",
        "transformer.ln_f",
        "lm_head",
    )
    assert edge_writes(model, names, inputs, loss_fn=lambda out: out.loss) == {}  # every region runs compiled
    modules = [model.get_submodule(n) for n in names]

    unplanned = []
    for _ in range(2):  # the first compiles the regions, the second reuses them
        model.load_state_dict(state)
        with CompiledRegions(modules, BUDGET, names=names):
            unplanned.append(_steps(_train(model, tmp_path, data)))
    spread = _spread(unplanned[1], unplanned[0])
    assert spread <= RTOL, f"two unplanned compiled runs differ by {spread:.2e} (relative): no tolerance stands"

    reruns = []  # a recomputed region's re-runs in backward
    checkpointed_call = planned_module.checkpointed_call

    def counted(*args: Any, rerun: Any, **kwargs: Any) -> Any:
        def counted_rerun(call: Any) -> Any:
            reruns.append(1)
            return rerun(call)

        return checkpointed_call(*args, rerun=counted_rerun, **kwargs)

    monkeypatch.setattr(planned_module, "checkpointed_call", counted)
    model.load_state_dict(state)
    model.config.use_cache = True  # Trainer turns it off through the planned model (NOTE [ Seen as the model ])
    run = planned(model, Plan.from_actions("kkkrook", stages=names, compile_budget=BUDGET))
    assert inspect.signature(run.forward) == inspect.signature(model.forward)  # Trainer keeps the columns it names
    trainer = _train(run, tmp_path, data)
    assert trainer.model is run and run.training and model.config.use_cache is False
    got = _steps(trainer)
    assert len(reruns) == 3 and run.stats.d2h_copies > 0  # one re-run of region 3 a step; regions 4 and 5 offloaded
    for step, (mine, theirs) in enumerate(zip(got, unplanned[0], strict=True)):
        torch.testing.assert_close(mine, theirs, rtol=RTOL, atol=0.0, msg=f"step {step}: {mine} against {theirs}")
    run.release()

    model.load_state_dict(state)  # the regions ran compiled: eager dropout draws other masks
    eager = _steps(_train(model, tmp_path, data))
    assert _spread(eager, unplanned[0]) > 1e-4


def test_a_planned_llama_counts_the_tokens_of_its_loss_as_the_model_does(tmp_path: Path) -> None:
    """``Trainer`` divides a causal model's summed loss by the tokens after each row's first, where the model's
    ``loss_type`` says its loss shifts the labels (NOTE [ Seen as the model ]): read from the planned model, it is
    the Llama's, and the planned (eager) steps log the model's own losses."""
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model, data = transformers.LlamaForCausalLM(config), _batches()
    state = copy.deepcopy(model.state_dict())
    own = _steps(_train(model, tmp_path, data))
    model.load_state_dict(state)
    x = torch.stack([row["input_ids"] for row in data[:2]])
    stages = tuple(find_stages(model, ((), {"input_ids": x, "labels": x}))[0])
    actions = "".join("r" if ".layers." in n else "o" if n.endswith("norm") else "k" for n in stages)
    assert "r" in actions and "o" in actions
    run = planned(model, Plan.from_actions(actions, stages=stages))
    assert run.loss_type == "ForCausalLM"
    got = _steps(_train(run, tmp_path, data))
    for mine, theirs in zip(got, own, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=RTOL, atol=0.0)
    run.release()


def test_trainer_activation_checkpointing_is_refused_for_a_planned_model(tmp_path: Path) -> None:
    run = planned(_gpt2(), Plan.from_actions("kr", stages=("transformer", "lm_head")))
    with pytest.raises(PlanError, match="the plan's stages: leave it off"):
        _train(run, tmp_path, _batches(), activation_checkpointing=True)
    run.release()
