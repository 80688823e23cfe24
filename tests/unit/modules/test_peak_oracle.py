"""The simulator's unplanned peak against the CPU allocator's own events, for every kind of model users bring.

The oracle is independent of the profile's tables: one forward and backward of the model, as a training loop runs
it, under ``torch.profiler``'s memory events (``memtune.profiler.memory_meter.metered``, NOTE [ Allocator meters ]). The
simulator's prediction of the same step is ``simulate(profile, all keep, optimizer="none")`` less the parameters and
the batch, which were resident before the step. Each model is checked with its output held through the backward
(``out = model(x); loss(out).backward()``) and dropped before it (``model(x).loss.backward()``): NOTE [ Held output ]
in ``memtune.tuner.simulator``. The language models have a vocabulary large enough for the logits to dominate, as in
real ones, so that a missing logits tensor shows; their configurations are the defaults otherwise (dropout, caches on).
The profiles keep the CPU's own transients (``transients="cpu"``), not the GPU's convolution workspaces a profile
for a GPU models (NOTE [ GPU transients from the CPU's allocator ] in ``memtune.profiler.memory_meter``): the oracle is
the CPU's allocator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from memtune.profiler.memory_meter import metered
from memtune.profiler.module_profile import as_inputs, profile_module
from memtune.tuner._peak_check import GAP_TOLERANCE, peak_check
from memtune.tuner.plan import Action, Plan
from memtune.tuner.simulator import simulate
from tests.unit.modules.models import UNet, hf_loss, mean_square

pytestmark = pytest.mark.slow

TOLERANCE = 0.10  # a planned step's bar
UNPLANNED_TOLERANCE = GAP_TOLERANCE  # the unplanned step: within 1% on every model here, 3% asserted
VOCAB = 8192


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip


def language_model(kind: str) -> nn.Module:
    import transformers as hf

    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
    if kind == "gpt2":
        return hf.GPT2LMHeadModel(hf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB))
    if kind == "llama":
        return hf.LlamaForCausalLM(hf.LlamaConfig(**small, vocab_size=VOCAB))
    if kind == "bert":
        return hf.BertForMaskedLM(hf.BertConfig(**small, vocab_size=VOCAB))
    config = hf.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=VOCAB)
    return hf.T5ForConditionalGeneration(config.__class__(**{**config.to_dict(), "decoder_start_token_id": 0}))


def lm_case(kind: str) -> tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]:
    pytest.importorskip("transformers")
    ids = torch.randint(0, VOCAB, (2, 64))
    return language_model(kind), {"input_ids": ids, "labels": ids}, hf_loss


CASES: dict[str, Callable[[], tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]]] = {
    "cnn": lambda: (cnn(), torch.randn(4, 3, 32, 32), mean_square),
    "unet": lambda: (UNet(), torch.randn(2, 3, 32, 32), mean_square),
    "gpt2": lambda: lm_case("gpt2"),
    "llama": lambda: lm_case("llama"),
    "bert_mlm": lambda: lm_case("bert"),
    "t5": lambda: lm_case("t5"),
    "gpt2_tied": lambda: tied_embedding_case(),
}


def tied_embedding_case() -> tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]:
    """GPT-2 whose tied embedding (8,192 x 256, 8 MiB) outweighs its activations (batch 1 x 16): NOTE [ Tied
    weights ] decides its peak."""
    import transformers as hf

    ids = torch.randint(0, VOCAB, (1, 16))
    model = hf.GPT2LMHeadModel(hf.GPT2Config(n_embd=256, n_layer=1, n_head=4, vocab_size=VOCAB))
    return model, {"input_ids": ids, "labels": ids}, hf_loss


def allocator_peak(model: nn.Module, inputs: Any, loss_fn: Callable[[Any], torch.Tensor], *, held: bool) -> int:
    """One training step's peak by the CPU allocator's events, bytes above what was live before it."""
    args, kwargs = as_inputs(inputs)
    torch.manual_seed(1)
    with metered(torch.device("cpu")) as reading:
        out = model(*args, **kwargs)
        loss = loss_fn(out)
        if not held:
            del out
        loss.backward()
        del loss
        out = None
    model.zero_grad(set_to_none=True)
    return reading.peak_bytes


@pytest.mark.parametrize("held", [True, False], ids=["output-held", "output-dropped"])
@pytest.mark.parametrize("name", list(CASES))
def test_simulated_unplanned_peak_matches_the_allocator(name: str, held: bool) -> None:
    torch.manual_seed(0)
    model, inputs, loss_fn = CASES[name]()
    model.train()
    profile = profile_module(model, inputs, loss_fn=loss_fn, warmup=0, repeats=1, output_held=held, transients="cpu")
    sim = simulate(profile, Plan.uniform(profile.n_stages, Action.KEEP), optimizer="none")
    predicted = sim.peak_bytes - sim.base_bytes
    measured = allocator_peak(model, inputs, loss_fn, held=held)
    assert abs(predicted / measured - 1) <= UNPLANNED_TOLERANCE, (name, held, predicted, measured)
    # the profile's own check measured the same step and agrees with this oracle
    check = peak_check(profile)
    assert check is not None and check.output_held is held
    assert check.predicted_bytes == predicted
    assert abs(check.measured_bytes / measured - 1) <= GAP_TOLERANCE, (check, measured)


def test_a_recompute_plan_lowers_the_peak_the_allocator_sees() -> None:
    """A planned peak, not only the unconstrained one: the Llama-style model with every decoder layer recomputed."""
    from memtune.tuner.runtime import planned

    torch.manual_seed(0)
    model, inputs, loss_fn = CASES["llama"]()
    model.train()
    profile = profile_module(model, inputs, loss_fn=loss_fn, warmup=0, repeats=1, output_held=False, transients="cpu")
    actions = [Action.RECOMPUTE if ".layers." in s.name else Action.KEEP for s in profile.stages]
    plan = Plan.from_actions(actions).named(profile)
    sim = simulate(profile, plan, optimizer="none")
    predicted = sim.peak_bytes - sim.base_bytes
    unplanned = allocator_peak(model, inputs, loss_fn, held=False)
    measured = allocator_peak(planned(model, plan), inputs, loss_fn, held=False)
    assert measured < unplanned
    assert abs(predicted / measured - 1) <= TOLERANCE, (predicted, measured)


def test_a_selective_decoder_block_holds_its_skip_gradients_storage() -> None:
    """NOTE [ Gradient storages ]: the U-Net's last decoder block concatenates the upsampled tensor with the skip; the
    backward of the concatenation makes one gradient for both, and the skip's gradient, a slice of it, holds the
    whole storage until the encoder's max-pooled branch adds its part. The simulator once missed it: the selective
    block's planned peak was 4.7% under the allocator's here (7.3% on an H100, out of memory at 60% of the peak)."""
    from memtune.tuner.runtime import planned

    torch.manual_seed(0)
    model, x = UNet(width=16), torch.randn(2, 3, 64, 64)
    model.train()
    profile = profile_module(model, x, loss_fn=mean_square, warmup=0, repeats=1, output_held=False, transients="cpu")
    skip = next(s for s in profile.storages if s.grad_storage_bytes)
    assert skip.producer == 0 and skip.grad_storage_bytes == 2 * skip.grad_bytes
    codes = {"k": Action.KEEP, "r": Action.RECOMPUTE, "s": Action.SELECTIVE}
    for compact in ("kkkkkksk", "kkkkkrsk"):
        plan = Plan.from_actions([codes[c] for c in compact]).named(profile)
        sim = simulate(profile, plan, optimizer="none")
        predicted = sim.peak_bytes - sim.base_bytes
        measured = allocator_peak(planned(model, plan), x, mean_square, held=False)
        assert abs(predicted / measured - 1) <= 0.01, (compact, predicted, measured)
