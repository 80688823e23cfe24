"""A model whose output holds a cache of keys and values says so, with its bytes and how to drop it (NOTE [ Held
output ] in ``memtune.tuner.simulator``): a Hugging Face decoder trained with ``config.use_cache`` on returns every
layer's keys and values, which a loop that keeps the output holds until the backward ends."""

from __future__ import annotations

import warnings

import pytest
import torch

import memtune
from benchmarks.uniform_peaks import released
from memtune.api.cli._common import print_profile_checks
from memtune.profiler.module_stages import held_objects
from memtune.tuner import PlanError, held_output_note

transformers = pytest.importorskip("transformers")


def _decoder(use_cache: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=256, max_position_embeddings=512, use_cache=use_cache,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 256, (4, 512), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


@pytest.mark.slow  # a profile and a search of a small decoder: about 3 s
def test_a_decoder_with_its_cache_on_says_what_its_output_holds(capsys: pytest.CaptureFixture[str]) -> None:
    model, batch = _decoder(True), _batch()
    cache = 2 * 2 * 4 * 2 * 512 * 16 * 4  # layers x (keys, values) x batch x kv heads x tokens x head dim x fp32
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = memtune.profile(model, batch, gpu="h100", progress=False)
    assert prof.model_params["held_object_bytes"] == cache
    # the output's field is ``cache`` in newer transformers, ``past_key_values`` before
    assert str(prof.model_params["held_objects"]) in ("cache (DynamicCache)", "past_key_values (DynamicCache)")
    note = held_output_note(prof)
    assert note is not None and "holds 1.00 MiB" in note and "use_cache = False" in note
    lighter = released(prof)  # the benchmarks' profile with the cache let go: the same bytes leave it
    assert lighter is not None and lighter[1] == cache
    assert any("use_cache = False" in str(w.message) for w in caught)
    assert note in str(memtune.tune(prof, "90% of peak", trials=8, progress=False))
    with pytest.raises(PlanError, match=r"or shed what the output holds: the model.s output holds 1\.00 MiB"):
        memtune.planned(model, memtune.tune(prof, 1 << 20, trials=8, progress=False))  # 1 MiB: nothing fits
    print_profile_checks(prof)  # what `memtune profile` and `memtune tune` print under the profile
    assert note in " ".join(capsys.readouterr().out.split())


def test_the_same_decoder_with_its_cache_off_holds_nothing_besides_its_tensors() -> None:
    model, batch = _decoder(False), _batch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = memtune.profile(model, batch, gpu="h100", progress=False)
    assert "held_objects" not in prof.model_params
    assert held_output_note(prof) is None
    assert not any("use_cache" in str(w.message) for w in caught)


def test_held_objects_are_named_by_where_they_are_found() -> None:
    class Box:
        def __init__(self, *tensors: torch.Tensor) -> None:
            self.tensors = tensors

    a, b = torch.zeros(10), torch.zeros(20)
    assert held_objects({"logits": a, "cache": Box(a, b, b[5:])}) == [("cache (Box)", 120)]
    assert held_objects((a, Box(b))) == [("[1] (Box)", 80)]
    assert held_objects(Box(a)) == [("Box (Box)", 40)]
    assert held_objects(a) == []
