"""One FSDP2 rank's profile (NOTE [ Sharded ranks ] in ``memtune.tuner._sharding``): shards, gathered units, the
root."""

from __future__ import annotations

import math

import pytest
import torch

import memtune
from memtune.profiler import Profile
from memtune.tuner import Plan, TunerError, shard_units, sharded_profile, simulate

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # spawned ranks or a profile: seconds each


@pytest.fixture(scope="module")
def llama_profile() -> Profile:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=32,
        use_cache=False,
    )
    ids = torch.randint(0, 256, (2, 32))
    return memtune.profile(
        LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}, loss_fn=lambda o: o.loss, progress=False
    )


def test_units_are_the_repeated_blocks() -> None:
    names = ["model.embed_tokens", "model.layers.0", "model.layers.11", "model.norm", "lm_head", "blocks.3.attn"]
    assert shard_units(names) == ("model.layers.0", "model.layers.11")


def test_a_rank_holds_shards_and_gathers_one_unit_ahead(llama_profile: Profile) -> None:
    world = 2
    rank = sharded_profile(llama_profile, world)
    units = set(shard_units(s.name for s in llama_profile.stages))
    assert units == {"model.layers.0", "model.layers.1", "model.layers.2"}
    for k, (whole, shard) in enumerate(zip(llama_profile.stages, rank.stages, strict=True)):
        assert shard.param_bytes == math.ceil(whole.param_bytes / world), whole.name
        if whole.name in units:
            ahead = llama_profile.stages[k + 1].param_bytes if k + 1 < len(rank.stages) else 0
            ahead = ahead if llama_profile.stages[k + 1].name in units else 0
            assert shard.forward_workspace_bytes == whole.forward_workspace_bytes + whole.param_bytes + ahead
            assert shard.backward_workspace_bytes >= whole.backward_workspace_bytes + 2 * whole.param_bytes
        else:
            assert shard.forward_workspace_bytes == whole.forward_workspace_bytes
    root = sum(s.param_bytes for s in llama_profile.stages if s.name not in units) + llama_profile.outside_param_bytes
    assert rank.input_bytes == llama_profile.input_bytes + 2 * root * (world - 1) // world
    keep = Plan.uniform(llama_profile.n_stages).model_copy(update={"stages": tuple(s.name for s in rank.stages)})
    whole_peak = simulate(llama_profile, keep, optimizer="adam").peak_bytes
    rank_peak = simulate(rank, keep, optimizer="adam").peak_bytes
    # the blocks' Adam state and gradients are halved; the root's whole copies and the gathered units are added
    assert rank_peak < whole_peak
    assert sharded_profile(llama_profile, 1) is llama_profile


def test_bad_worlds_and_units_are_refused(llama_profile: Profile) -> None:
    with pytest.raises(TunerError, match="world"):
        sharded_profile(llama_profile, 0)
    with pytest.raises(TunerError, match="not stages"):
        sharded_profile(llama_profile, 2, units=["model.layers.9"])
