"""State a model threads through its stages (NOTE [ State threaded between stages ] in
``memtune.profiler.module_stages``): Hugging Face models with their default configs, caches on, profile and every plan
is exact; a toy model threading its
own
state object does too; state that cannot be copied is refused with an error that names the stage and the type.

The regression: ``GPT2LMHeadModel(GPT2Config(...))`` (``use_cache=True``, the default) failed to profile with
"Trying to backward through the graph a second time": the profiler called each stage again and again with the same
``DynamicCache``, which every call grew; and a ``recompute``/``selective`` stage's re-run in backward updated the cache
a second time (a T5 decoder block's cross-attention then differed between the two runs).

CPU, fp32, dropout at the configs' defaults (0.1); plans are compared with the unplanned step at 1e-6 relative.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from memtune.profiler._profile import Profile
from memtune.profiler.module_profile import profile_module
from memtune.profiler.module_stages import copy_structure, tensor_leaves
from memtune.profiler.profiler_errors import ProfilerError
from memtune.tuner._tuner_errors import PlanError
from memtune.tuner.plan import Action, Plan
from memtune.tuner.runtime._planned import planned
from memtune.tuner.runtime.verify import ReferenceStep, check_equivalence, reference_step
from tests.unit.modules import models
from tests.unit.modules.models import hf_loss, mean_square

RTOL = 1e-6
#: one letter per plan: every stage keep, offload, recompute, selective; "mixed": the four in turn over the stages
PLANS = ("k", "o", "r", "s", "mixed")


def plan_for(profile: Profile, spec: str) -> Plan:
    actions = "".join("orsk"[k % 4] for k in range(profile.n_stages)) if spec == "mixed" else spec * profile.n_stages
    return Plan.from_actions(actions).named(profile)


# ---- copy_structure ------------------------------------------------------------------------------------


class Tape:
    """State a model threads through its blocks, as a Hugging Face cache does: each block reads what the block
    before it left there and appends its own output."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []


class LockedTape(Tape):
    """A ``Tape`` that cannot be copied."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def test_copy_structure_copies_objects_and_shares_tensors() -> None:
    w = torch.randn(3, requires_grad=True)
    made = w * 2  # a tensor with a graph: copy.deepcopy would refuse it
    tape = Tape()
    tape.seen.append(made)
    layer = nn.Linear(2, 2)
    x = torch.randn(2)
    args, kwargs = copy_structure(((x, tape), {"tape": tape, "layer": layer, "flag": True, "n": 3}))
    got = args[1]
    assert got is not tape and got.seen is not tape.seen and got.seen[0] is made  # objects copied, tensors shared
    assert kwargs["tape"] is got  # an object reached twice is copied once
    assert kwargs["layer"] is layer and args[0] is x and kwargs["flag"] is True
    got.seen.append(x)
    assert len(tape.seen) == 1  # the copy's updates do not reach the original


def test_copy_structure_takes_leaves_in_order() -> None:
    a, b = torch.zeros(1), torch.ones(1)
    new = [torch.full((1,), 2.0), torch.full((1,), 3.0)]
    copied = copy_structure(((a, [b]), {}), iter(new))
    assert list(tensor_leaves(copied)) == new


def test_copy_structure_of_hugging_face_caches() -> None:
    """``DynamicCache`` and ``EncoderDecoderCache``: the copy's layers are new objects holding the same tensors, and
    an update to the copy (a concatenation) leaves the original as it was."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    k = torch.randn(2, 2, 4, 8, requires_grad=True) * 1.0
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    cache.self_attention_cache.update(k, k, 0)
    copied = copy_structure(cache)
    assert copied is not cache and copied.self_attention_cache is not cache.self_attention_cache
    layer, original = copied.self_attention_cache.layers[0], cache.self_attention_cache.layers[0]
    assert layer is not original and layer.keys is original.keys  # type: ignore[union-attr]
    copied.self_attention_cache.update(k, k, 0)
    assert copied.get_seq_length() == 8 and cache.get_seq_length() == 4
    copied.is_updated[0] = True
    assert not cache.is_updated.get(0, False)


def test_copy_structure_names_what_it_cannot_copy() -> None:
    with pytest.raises(ProfilerError, match="LockedTape object cannot be copied"):
        copy_structure(((torch.zeros(1), LockedTape()), {}))


# ---- a toy model threading its own state -------------------------------------------------------------------


class TapeBlock(nn.Module):
    """A block whose math depends on the state it is given: it multiplies its input by the last output on the tape
    and divides by the tape's length, so a second call on the same tape computes something else (what its linear
    layer and tanh save for backward included: a re-run on the tape as the first run left it gives other
    gradients)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, tape: Tape) -> torch.Tensor:
        if tape.seen:
            x = x * tape.seen[-1]
        h = self.drop(torch.tanh(self.lin(x) / (1 + len(tape.seen))))
        tape.seen.append(h)
        return h


class TapeNet(nn.Module):
    def __init__(self, tape: type[Tape] = Tape, width: int = 16) -> None:
        super().__init__()
        self.tape = tape
        self.stem = nn.Linear(8, width)
        self.blocks = nn.ModuleList(TapeBlock(width) for _ in range(3))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tape = self.tape()
        h = self.stem(x)
        for block in self.blocks:
            h = block(h, tape=tape)
        return self.head(h) * len(tape.seen)  # type: ignore[no-any-return]


@pytest.mark.parametrize("spec", PLANS)
def test_stages_threading_state_profile_and_plans_are_exact(spec: str) -> None:
    torch.manual_seed(0)
    model, x = TapeNet().train(), torch.randn(8, 8)
    profile = profile_module(model, x, loss_fn=mean_square, warmup=1, repeats=2)
    assert [s.name for s in profile.stages] == ["stem", "blocks.0", "blocks.1", "blocks.2", "head"]
    eq, _ = check_equivalence(model, plan_for(profile, spec), x, loss_fn=mean_square)
    assert eq.ok(RTOL), (spec, eq)


def test_state_that_cannot_be_copied_is_refused_with_what_to_do() -> None:
    """The profiler names the stage, the type and the way out; so does the runtime for a re-run stage, while keep
    and offload, which run a stage once, still apply."""
    torch.manual_seed(0)
    model, x = TapeNet(LockedTape).train(), torch.randn(8, 8)
    # stages are measured last to first (NOTE [ Incoming gradients as the chain makes them ]): the last block is named
    with pytest.raises(ProfilerError, match=r"stage 'blocks\.2'.*LockedTape.*use_cache=False"):
        profile_module(model, x, loss_fn=mean_square, warmup=0, repeats=1)
    stages = ("stem", "blocks.0", "blocks.1", "blocks.2", "head")
    with pytest.raises(PlanError, match=r"stage 1 \(blocks\.0\).*LockedTape.*use_cache=False"):
        planned(model, Plan.from_actions("krrrk", stages=stages))(x)
    for actions in ("kkkkk", "ooook"):
        mean_square(planned(model, Plan.from_actions(actions, stages=stages))(x)).backward()


# ---- Hugging Face models with their default configs ------------------------------------------------------


def gpt2() -> nn.Module:
    model = models.gpt2()  # the test set's, its configuration's defaults kept: caches and dropout on
    config: Any = model.config
    assert config.use_cache and config.resid_pdrop == 0.1
    return model


def llama() -> nn.Module:
    model = models.llama()
    config: Any = model.config
    assert config.use_cache
    return model


def t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(  # type: ignore[call-arg]
        d_model=32,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        d_kv=8,
        vocab_size=256,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    assert config.use_cache and config.dropout_rate == 0.1
    return T5ForConditionalGeneration(config)


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=256
    )
    assert config.hidden_dropout_prob == 0.1
    return BertForMaskedLM(config)


#: name: (model builder, stage patterns or None for the default stages)
HF: dict[str, tuple[Callable[[], nn.Module], list[str] | None]] = {
    "gpt2": (gpt2, None),
    "llama": (llama, None),
    "t5_blocks": (t5, ["encoder", "decoder.block.*", "lm_head"]),
    "t5": (t5, None),
    "bert": (bert, None),
}


@dataclass(frozen=True)
class Profiled:
    model: nn.Module
    inputs: dict[str, torch.Tensor]
    profile: Profile
    reference: ReferenceStep


@pytest.fixture(scope="module")
def hf_profiles() -> Callable[[str], Profiled]:
    """``hf_profiles(name)``: the model ``name`` (caches on, as its config defaults), profiled once in this module."""
    done: dict[str, Profiled] = {}

    def get(name: str) -> Profiled:
        if name not in done:
            pytest.importorskip("transformers")
            make, stages = HF[name]
            torch.manual_seed(0)
            model = make().train()
            ids = torch.randint(0, 256, (2, 16))
            inputs = {"input_ids": ids, "labels": ids}
            profile = profile_module(model, inputs, loss_fn=hf_loss, stages=stages, warmup=0, repeats=1)
            done[name] = Profiled(model, inputs, profile, reference_step(model, inputs, loss_fn=hf_loss))
        return done[name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("spec", PLANS)
@pytest.mark.parametrize("name", list(HF))
def test_hugging_face_default_config_profiles_and_plans_are_exact(
    hf_profiles: Callable[[str], Profiled], name: str, spec: str
) -> None:
    p = hf_profiles(name)
    if name == "t5_blocks":
        assert [s.name for s in p.profile.stages] == ["encoder", "decoder.block.0", "decoder.block.1", "lm_head"]
    plan = plan_for(p.profile, spec)
    if spec == "mixed":
        assert {Action.OFFLOAD, Action.RECOMPUTE, Action.SELECTIVE} <= set(plan.actions)
    eq, _ = check_equivalence(p.model, plan, p.inputs, loss_fn=hf_loss, reference=p.reference)
    assert eq.ok(RTOL), (name, plan.compact(), plan.stages, eq)


@pytest.mark.slow
def test_a_cache_the_caller_passes_is_left_as_given() -> None:
    """Every forward the profiler runs sees the caller's cache as given (empty here), and it stays empty."""
    pytest.importorskip("transformers")
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    model = gpt2().train()
    ids = torch.randint(0, 256, (2, 16))
    cache = DynamicCache()
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.2x: "cache"
    inputs: dict[str, Any] = {"input_ids": ids, "labels": ids, key: cache}
    profile = profile_module(model, inputs, loss_fn=hf_loss, warmup=0, repeats=1)
    assert profile.n_stages > 1 and cache.get_seq_length() == 0
