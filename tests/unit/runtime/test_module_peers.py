"""The peers of a module model (NOTE [ Module peers ] in ``memtune.tuner.measure.module_peers``, NOTE [ Peer measurement
] in ``memtune.tuner.measure.peer_measure``): which apply and why not, that each one applied keeps the model's math and
leaves the model as it was, and their measurement on the CPU (``checkpoint_sequential``, Hugging Face checkpointing,
activation offload through the CPU copy path; the compiler's sweep under CPU inductor in the slow test)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memtune.tuner.measure._sequential_chain import ChainLink
from memtune.tuner.measure.module_peers import COMPILER_SWEEP, ModulePeer, applicable_peers, applied
from memtune.tuner.measure.peer_measure import measure_peers


class _Chain(nn.Module):
    """Stages that chain one tensor, with a flatten (a view) before the head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList(_Block() for _ in range(3))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for b in self.blocks:
            x = b(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.bn(self.conv(x)))


class _Scaled(_Chain):
    """The same stages, but the model's own code scales a stage's output in place between stages."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x.mul_(0.5)
        for b in self.blocks:
            x = b(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class _Trunk(nn.Module):
    """A skip around a plain nn.Sequential trunk: the stages do not chain, the trunk does."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.trunk = nn.Sequential(*(nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(4)))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.head(self.trunk(h) + h)


def _mlp() -> nn.Sequential:
    return nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(16, 16), nn.Tanh())), nn.Linear(16, 4))


def _by_family(peers: list[ModulePeer]) -> dict[str, ModulePeer]:
    return {p.family: p for p in peers if p.family != "compiler"}


def _grads(model: nn.Module, run: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(3)
    loss = run(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_a_sequential_model_is_checkpointed_whole_and_no_hf_or_cpu_offload_applies() -> None:
    model = _mlp()
    peers = applicable_peers(model, torch.randn(8, 16))
    assert [p.activation_budget for p in peers if p.family == "compiler"] == list(COMPILER_SWEEP)
    assert COMPILER_SWEEP == (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    fam = _by_family(peers)
    seq = fam["checkpoint_sequential"]
    assert seq.applies and seq.target == "" and seq.segments == 3 and not seq.chain  # round(sqrt(9))
    assert not fam["hf_checkpointing"].applies
    assert fam["hf_checkpointing"].note.startswith("no gradient checkpointing in this model class (Sequential")
    assert not fam["offload_activations"].applies and "CUDA" in fam["offload_activations"].note


def test_stages_that_chain_one_tensor_through_a_view_are_checkpointed_with_the_models_math() -> None:
    torch.manual_seed(0)
    model = _Chain()
    x = torch.randn(2, 3, 8, 8)
    seq = _by_family(applicable_peers(model, x))["checkpoint_sequential"]
    assert seq.applies, seq.note
    assert seq.chain == (
        ChainLink("conv1"), ChainLink("blocks.0"), ChainLink("blocks.1"), ChainLink("blocks.2"), ChainLink("pool"),
        ChainLink("fc", (2, 8)),
    )  # fmt: skip
    assert seq.segments == 2 and "6 stages chain one tensor, 1 input(s) reshaped" in seq.note
    model.eval()  # batch statistics would make each forward update the running ones
    want = _grads(model, model, x)
    with applied(model, seq) as run:
        got = _grads(model, run, x)
    torch.testing.assert_close(got, want)


def test_an_in_place_write_between_stages_breaks_the_chain() -> None:
    seq = _by_family(applicable_peers(_Scaled(), torch.randn(2, 3, 8, 8)))["checkpoint_sequential"]
    assert not seq.applies
    assert "stage 'blocks.0' does not take the tensor stage 'conv1' handed on, as it was" in seq.note


def test_a_trunk_inside_the_model_is_swapped_in_place_and_given_back() -> None:
    torch.manual_seed(0)
    model = _Trunk()
    x = torch.randn(8, 16)
    seq = _by_family(applicable_peers(model, x))["checkpoint_sequential"]
    assert seq.applies and seq.target == "trunk" and seq.segments == 2, seq.note
    assert seq.name == "checkpoint_sequential (2 segments over trunk)"
    assert "do not chain one tensor" in seq.note
    trunk = model.trunk
    want = _grads(model, model, x)
    with applied(model, seq) as run:
        assert run is model and model.trunk is not trunk
        got = _grads(model, run, x)
    assert model.trunk is trunk
    torch.testing.assert_close(got, want)


def test_a_model_with_neither_chain_nor_sequence_says_why() -> None:
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.a(x) + self.b(y)

    seq = _by_family(applicable_peers(Pair(), (torch.randn(2, 4), torch.randn(2, 4))))["checkpoint_sequential"]
    assert not seq.applies
    assert seq.note == ("the model is not called with one tensor, and it holds no nn.Sequential of 3 or more modules")


def _tiny_gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, use_cache=False)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def test_hugging_face_checkpointing_applies_in_training_mode_only_and_is_turned_off_after() -> None:
    model = _tiny_gpt2()
    ids = torch.randint(0, 64, (2, 16))
    batch = {"input_ids": ids, "labels": ids}
    model.eval()
    hf = _by_family(applicable_peers(model, batch, compiler_budgets=()))["hf_checkpointing"]
    assert not hf.applies and "eval mode" in hf.note
    model.train()
    fam = _by_family(applicable_peers(model, batch, compiler_budgets=()))
    assert fam["hf_checkpointing"].applies and fam["hf_checkpointing"].note.startswith("GPT2LMHeadModel's own")
    assert not fam["checkpoint_sequential"].applies  # keyword inputs, and no nn.Sequential inside
    rows = measure_peers(model, batch, peers=[fam["hf_checkpointing"]], warmup=1, steps=2)
    assert rows[0]["step_ms"] > 0 and "error" not in rows[0]
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_a_wrapped_hugging_face_model_is_found_inside_and_one_without_support_says_so() -> None:
    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.model = inner

        def forward(self, **kw: torch.Tensor) -> object:
            return self.model(**kw)

    hf = _by_family(applicable_peers(Wrapper(_tiny_gpt2()), {"input_ids": torch.zeros(1, 4, dtype=torch.long)},
                                     compiler_budgets=()))["hf_checkpointing"]  # fmt: skip
    assert hf.applies and hf.target == "model" and "(the GPT2LMHeadModel at 'model')" in hf.note

    class NoSupport(nn.Linear):
        supports_gradient_checkpointing = False

        def gradient_checkpointing_enable(self, **_kw: object) -> None:
            raise AssertionError("not to be called")

    hf = _by_family(applicable_peers(NoSupport(4, 4), torch.randn(2, 4), compiler_budgets=()))["hf_checkpointing"]
    assert (
        not hf.applies
        and hf.note == "no gradient checkpointing in NoSupport (supports_gradient_checkpointing is False)"
    )


def test_the_peers_measure_on_the_cpu_and_leave_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    model = _Chain()
    x = torch.randn(4, 3, 16, 16)
    params = [p.detach().clone() for p in model.parameters()]
    stats = [b.detach().clone() for b in model.buffers()]
    peers = applicable_peers(model, x, compiler_budgets=(), offload_on_cpu=True)
    seen: list[tuple[int, int, str]] = []
    rows = measure_peers(model, x, peers=peers, warmup=1, steps=2, progress=lambda *a: seen.append(a))
    by = {r["family"]: r for r in rows}
    assert not by["hf_checkpointing"]["applies"] and "step_ms" not in by["hf_checkpointing"]
    for fam in ("checkpoint_sequential", "offload_activations"):
        r = by[fam]
        assert "error" not in r, r
        assert r["step_ms"] > 0 and r["peak_bytes"] > 0 and r["first_step_s"] > 0
        assert 0 < r["update_ms"] < r["step_ms"]  # the optimizer's update, timed inside the step by its hooks
    assert seen == [(0, 2, by["checkpoint_sequential"]["name"]), (1, 2, by["offload_activations"]["name"]),
                    (2, 2, "done")]  # fmt: skip
    assert by["checkpoint_sequential"]["chain"][-1] == ["fc", [4, 8]]
    for p, q in zip(params, model.parameters(), strict=True):
        assert torch.equal(p, q)  # a learning rate of 0
    for s, t in zip(stats, model.buffers(), strict=True):
        assert torch.equal(s, t)  # running statistics restored
    assert all(p.grad is None for p in model.parameters())


def test_an_out_of_memory_is_the_peers_result() -> None:
    model = _mlp()
    peer = _by_family(applicable_peers(model, torch.randn(8, 16), compiler_budgets=()))["checkpoint_sequential"]

    def loss(out: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. If reserved but unallocated ...")

    row = measure_peers(model, torch.randn(8, 16), peers=[peer], loss_fn=loss, warmup=1, steps=1)[0]
    assert row["error"] == "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert "step_ms" not in row


def test_bad_arguments_are_refused() -> None:
    model = _mlp()
    with pytest.raises(ValueError, match=r"compiler_budgets: activation budgets are shares from 0 to 1, not 1\.5"):
        applicable_peers(model, torch.randn(2, 16), compiler_budgets=(1.5,))
    with pytest.raises(ValueError, match="segments: checkpoint_sequential needs at least 2"):
        applicable_peers(model, torch.randn(2, 16), segments=1)
    with pytest.raises(ValueError, match="optimizer must be 'sgd' or 'adam'"):
        measure_peers(model, torch.randn(2, 16), peers=[], optimizer="lion")  # type: ignore[arg-type]
    with (
        pytest.raises(ValueError, match="does not apply"),
        applied(model, ModulePeer("x", "hf_checkpointing", False, "no")),
    ):
        pass


@pytest.mark.slow  # two compilations by CPU inductor
def test_the_compilers_sweep_measures_under_cpu_inductor() -> None:
    torch.manual_seed(0)
    model = _mlp()
    x = torch.randn(32, 16)
    peers = [p for p in applicable_peers(model, x, compiler_budgets=(0.0, 1.0)) if p.family == "compiler"]
    want = _grads(model, model, x)
    with applied(model, peers[0]) as run:
        got = _grads(model, run, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    rows = measure_peers(model, x, peers=peers, warmup=1, steps=2)
    assert [r["activation_budget"] for r in rows] == [0.0, 1.0]
    measured = [{k: r.get(k) for k in ("name", "error", "step_ms", "peak_bytes")} for r in rows]
    assert all("error" not in r and r["step_ms"] > 0 and r["peak_bytes"] > 0 for r in rows), measured
