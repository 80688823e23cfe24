"""A planned model under DistributedDataParallel keeps the math: two gloo ranks on CPU, each running the plan on half
the batch, end the backward with the gradients one process gets from the unplanned model on the whole batch, with
and without staggered copies (NOTE [ Staggered copies ] in ``memtune.tuner.runtime._stagger``).

The ranks run a second backward on the same batch after zeroing the gradients: the stagger's waits are priced on
the bytes of the step before (the first step does not wait), so the second is the staggered one.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from memtune.profiler import zoo
from memtune.profiler.loss import step_loss
from memtune.tuner import Action, Plan, SharedLink, stagger_for
from memtune.tuner.runtime._stagger import StaggeredRuntime
from memtune.tuner.runtime.ddp import planned_ddp, planned_of, spawn_ranks

BATCH = 4  # two per rank
GPT = {"layers": 2, "width": 32, "heads": 4, "seq_len": 8, "vocab": 64}
LINK = SharedLink.fair_share(1.0, 1.0)  # 1 GB/s: a slot-1 rank waits some microseconds per KB


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "gpt":
        return zoo.build("gpt", GPT).as_sequential()
    return nn.Sequential(  # in-place ReLUs at segment boundaries, a pool's saved indices, no batch norm or dropout
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 10),
    )


def _batch(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if name == "gpt":
        seq, vocab = GPT["seq_len"], GPT["vocab"]
        return torch.randint(0, vocab, (BATCH, seq), generator=g), torch.randint(0, vocab, (BATCH, seq), generator=g)
    return torch.randn(BATCH, 3, 8, 8, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def _plan(name: str) -> Plan:
    n = len(list(_model(name).children())) if name != "gpt" else len(zoo.build("gpt", GPT).stages)
    letters = ("orrkok" * n)[: n - 1] + "k"  # offload, a recompute segment after an offloaded stage, keep
    actions = tuple({"o": Action.OFFLOAD, "r": Action.RECOMPUTE, "k": Action.KEEP}[c] for c in letters)
    return Plan(actions=actions, sync="deferred", sync_delay=1, prefetch_lookahead=1)


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _rank_steps(rank: int, world: int, name: str) -> dict[int, dict[str, Any]]:
    """One rank, per stagger slots (1: none, 2): the plan under DDP on its half of the batch, two backwards; the
    second one's gradients, the copies and the waits."""
    torch.set_num_threads(1)
    x, y = _batch(name)
    half = BATCH // world
    xs, ys = x[rank * half : (rank + 1) * half], y[rank * half : (rank + 1) * half]
    out = {}
    for slots in (1, 2):
        stagger = stagger_for(rank, world, slots, LINK) if slots > 1 else None
        model = planned_ddp(_model(name), _plan(name), stagger=stagger)
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            step_loss(model(xs), ys).backward()
        runtime = planned_of(model)._runtime
        waits = runtime.waits if isinstance(runtime, StaggeredRuntime) else 0
        out[slots] = {"grads": _grads(planned_of(model)), "d2h": planned_of(model).stats.d2h_copies, "waits": waits}
    return out


def _reference(name: str) -> dict[str, torch.Tensor]:
    model = _model(name)
    x, y = _batch(name)
    step_loss(model(x), y).backward()
    return {f"model.{n}": g for n, g in _grads(model).items()}  # the planned model's names: model.<name>


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "convs"])
def test_planned_ddp_gradients_equal_the_unplanned_full_batch(name: str) -> None:
    ranks = spawn_ranks(_rank_steps, 2, name, backend="gloo")
    expected = _reference(name)
    for rank, by_slots in enumerate(ranks):
        for slots, got in by_slots.items():
            where = f"rank {rank}, {'staggered' if slots > 1 else 'lockstep'}"
            assert got["d2h"] > 0, f"{where}: the plan offloads"
            assert got["grads"].keys() == expected.keys()
            for key, grad in expected.items():
                torch.testing.assert_close(got["grads"][key], grad, rtol=1e-5, atol=1e-6, msg=f"{where}: {key}")
            assert (got["waits"] > 0) == (slots > 1 and rank == 1), where  # slot 1 waits its turn, slot 0 never
