"""A planned model sharded by FSDP2 keeps the math: two gloo ranks on CPU, each running the plan on half the batch
with the parameters sharded (``memtune.tuner.runtime.fsdp.planned_fsdp``), end the backward with the gradients one
process gets from the unplanned model on the whole batch, and copy to the host exactly what the same plan copies
unsharded on that half: no gathered parameter is offloaded (NOTE [ Sharded parameters ] in
``memtune.tuner.runtime._planned_module``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from memtune.profiler import find_stages
from memtune.tuner import Action, Plan, TunerError
from memtune.tuner.runtime import planned
from memtune.tuner.runtime.ddp import spawn_ranks
from memtune.tuner.runtime.fsdp import planned_fsdp

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # spawned ranks or a profile: seconds each

BATCH, SEQ, VOCAB = 4, 16, 128


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        use_cache=False,
    )
    return LlamaForCausalLM(config)


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def plan_of_stages() -> Plan:
    ids = _ids()
    names, _ = find_stages(llama(), ((), {"input_ids": ids[:2], "labels": ids[:2]}))
    chosen = {"model.layers.0": Action.OFFLOAD, "model.layers.1": Action.RECOMPUTE, "lm_head": Action.OFFLOAD}
    chosen["model.layers.2"] = Action.SELECTIVE
    actions = tuple(chosen.get(n, Action.KEEP) for n in names)
    return Plan(actions=actions, stages=tuple(names), sync="deferred", sync_delay=1, prefetch_lookahead=1)


def half(rank: int, world: int) -> torch.Tensor:
    per = BATCH // world
    return _ids()[rank * per : (rank + 1) * per]


def sharded_rank(
    rank: int, world: int, plan: dict[str, Any], cuda: bool = False
) -> tuple[dict[str, torch.Tensor], int]:
    """One rank's gradients (whole, on the CPU) and bytes copied to the host after a planned, sharded step."""
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    model = llama().to(device)
    wrapped = planned_fsdp(model, Plan.model_validate(plan))
    ids = half(rank, world).to(device)
    wrapped(input_ids=ids, labels=ids).loss.backward()
    grads = {n: p.grad.full_tensor().cpu() for n, p in model.named_parameters()}  # type: ignore[union-attr]
    return grads, wrapped.stats.d2h_bytes


def test_planned_fsdp_equals_the_full_batch_and_offloads_no_parameter() -> None:
    plan = plan_of_stages()
    reference = llama()
    for rank in range(2):  # FSDP2 averages the ranks' gradients: each half's loss counts 1/2
        ids = half(rank, 2)
        (reference(input_ids=ids, labels=ids).loss / 2).backward()
    alone = planned(llama(), plan)
    ids = half(0, 2)
    alone(input_ids=ids, labels=ids).loss.backward()
    results = spawn_ranks(sharded_rank, 2, plan.model_dump(mode="json"), backend="gloo")
    for rank, (grads, d2h_bytes) in enumerate(results):
        for name, p in reference.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-7, msg=f"rank {rank} {name}")
        # a gathered parameter offloaded would add its bytes (layer 0's weights alone are 36 KiB): FSDP2's views of a
        # unit's inputs change which storages the runtime dedupes, not what it copies
        assert 0 < d2h_bytes <= alone.stats.d2h_bytes, (rank, d2h_bytes, alone.stats.d2h_bytes)


def test_shard_needs_a_process_group_and_real_units() -> None:
    with pytest.raises(TunerError, match="init_process_group"):
        planned_fsdp(llama(), plan_of_stages())
