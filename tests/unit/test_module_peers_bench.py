"""``benchmarks.module_peers``: its tables from JSON alone, and one model's run on the CPU with the GPU's own pieces
stood in for (the unplanned step's CUDA meter, the cap), continued where a stopped run left it."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import module_peers, peer_rows

GiB = 1 << 30


def _peer(name: str, family: str, step_ms: float, reserved_gib: float, **more: Any) -> dict[str, Any]:
    return {"name": name, "family": family, "applies": True, "note": "", "step_ms": step_ms,
            "peak_bytes": int((reserved_gib - 0.5) * GiB), "reserved_bytes": int(reserved_gib * GiB),
            "first_step_s": 2.0, **more}  # fmt: skip


def _finalists_run(monkeypatch: pytest.MonkeyPatch, steps: dict[str, float | None] | None = None) -> list[str]:
    """Stand in for ``run_finalist`` (which needs CUDA): a finalist runs in 10 ms, or in ``steps[name]`` where given
    (None: out of memory under the cap); the names run, in order, are returned as they are run."""
    import dataclasses

    import memtune.tuner.measure.finalists
    from memtune.tuner.finalists import Finalist

    names: list[str] = []

    def run(model: Any, inputs: Any, name: str, c: Any, budget: int, loss: Any, **_k: Any) -> Finalist:
        names.append(name)
        head, ms = Finalist(name, c.step_ms, c.peak_bytes), (steps or {}).get(name, 10.0)
        if ms is None:
            return dataclasses.replace(head, error="PlanOutOfMemoryError: stage 6", out_of_memory=True)
        return dataclasses.replace(head, step_ms=ms, reserved_bytes=c.peak_bytes, peak_bytes=c.peak_bytes)

    monkeypatch.setattr(memtune.tuner.measure.finalists, "run_finalist", run)
    return names


def _row() -> dict[str, Any]:
    return {
        "model": "resnet50",
        "batch": 128,
        "device": "NVIDIA H100 80GB HBM3",
        "unplanned": {"step_ms": 70.0, "peak_bytes": 10 * GiB, "reserved_bytes": 11 * GiB},
        "peers": [
            _peer("torch.compile budget 1", "compiler", 45.0, 10.5, activation_budget=1.0),
            _peer("torch.compile budget 0.5", "compiler", 52.0, 6.2, activation_budget=0.5),
            {"name": "HF gradient checkpointing", "family": "hf_checkpointing", "applies": False,
             "note": "no gradient checkpointing in this model class (ResNet is no Hugging Face model)"},
            _peer("checkpoint_sequential (5 segments)", "checkpoint_sequential", 93.0, 6.0, segments=5),
            {"name": "offload activations (side stream)", "family": "offload_activations", "applies": True,
             "note": "", "error": "out of memory: CUDA out of memory | twice"},
        ],
        "plans": [
            {"fraction": 0.6, "budget_bytes": int(6.3 * GiB), "plan": "compiled whole, budget 0.5",
             "plan_json": {}, "compiled": True, "predicted": {"step_ms": 52.0, "peak_bytes": int(5.7 * GiB)},
             "capped": {"step_ms": 58.0, "peak_bytes": int(5.9 * GiB)}},
            {"fraction": 0.3, "budget_bytes": int(3.2 * GiB), "plan": "rrrrooo", "plan_json": {}, "compiled": False,
             "predicted": {"step_ms": 140.0, "peak_bytes": int(3.0 * GiB)},
             "capped": {"step_ms": 142.0, "peak_bytes": int(3.1 * GiB)}},
            {"fraction": 0.1, "budget_bytes": GiB, "error": "no plan fits"},
        ],
        "run": {"date": "2026-11-27T10:00:00Z", "commit": "0123456789abcdef"},
    }  # fmt: skip


def test_the_fastest_peer_within_a_budget_is_judged_by_its_reserved_peak() -> None:
    row = _row()
    assert peer_rows.fastest_peer_within(row, int(6.3 * GiB))["name"] == "torch.compile budget 0.5"  # type: ignore[index]
    assert peer_rows.fastest_peer_within(row, int(6.1 * GiB))["name"] == "checkpoint_sequential (5 segments)"  # type: ignore[index]
    assert peer_rows.fastest_peer_within(row, 11 * GiB)["name"] == "torch.compile budget 1"  # type: ignore[index]
    assert peer_rows.fastest_peer_within(row, 5 * GiB) is None


def test_the_tables_render_from_the_json_alone(tmp_path: Path) -> None:
    assert "No measurement in" in peer_rows.table(tmp_path)
    (tmp_path / "resnet50.json").write_text(json.dumps(_row()))
    text = peer_rows.table(tmp_path)
    assert "| resnet50 | eager, unplanned | 70.0 | 1.00 | 10.00 | 11.00 | - |" in text
    assert "| resnet50 | torch.compile budget 0.5 | 52.0 | 0.74 | 5.70 | 6.20 | 2 |" in text
    assert ("| resnet50 | HF gradient checkpointing | does not apply: no gradient checkpointing in this model class "
            "(ResNet is no Hugging Face model) | | | | |") in text  # fmt: skip
    assert (
        "| resnet50 | offload activations (side stream) | out of memory: CUDA out of memory \\| twice | | | | |" in text
    )
    assert ("| resnet50 | 60% (6.30) | compiled `compiled whole, budget 0.5` | 52.0 / 5.70 | 58.0 / 5.90 | "
            "torch.compile budget 0.5: 52.0 / 6.20 | 1.12 | - | 1.29 | - | - |") in text  # fmt: skip
    # the row holds no profile: no lower bound; the compiled step is the sweep's budget 1; no point measured twice
    thirty = "| resnet50 | 30% (3.20) | eager `rrrrooo` | 140.0 / 3.00 | 142.0 / 3.10 | none | - | - | 3.16 | - | - |"
    assert thirty in text
    assert "| resnet50 | 10% (1.00) | no plan fits | - | - | none | - | - | - | - | - |" in text
    assert "geometric mean over 1 budgets: 1.115" in text
    assert "- resnet50: batch 128, NVIDIA H100 80GB HBM3, 2026-11-27T10:00:00Z, commit 0123456789" in text


@pytest.mark.slow  # profiles and tunes a small model on the CPU
def test_one_model_runs_on_the_cpu_and_a_second_run_continues_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from torch import nn

    import memtune.tuner.measure.module_bench
    import memtune.tuner.runtime

    torch.manual_seed(0)
    model = nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(32, 32), nn.Tanh())), nn.Linear(32, 4))
    x = torch.randn(64, 32)

    def build(name: str) -> tuple[Any, Any, Any, str, int]:
        return model, x, lambda out: out.square().mean(), "sgd", 64

    steps: list[str] = []

    def measure_step(model: nn.Module, run: nn.Module, *_a: Any, **_k: Any) -> dict[str, Any]:
        steps.append(type(run).__name__)
        return {"step_ms": 10.0, "peak_bytes": 4 << 20, "reserved_bytes": 6 << 20, "alloc_retries_per_step": 0.0,
                "update_ms": 1.5}  # fmt: skip

    monkeypatch.setattr(module_peers, "build", build)
    monkeypatch.setattr(memtune.tuner.measure.module_bench, "measure_step", measure_step)
    monkeypatch.setattr(memtune.tuner.runtime, "budget_guard", lambda *_a, **_k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_a: "CPU stand-in")
    _finalists_run(monkeypatch)
    args = argparse.Namespace(out=tmp_path, fresh=False, warmup=1, steps=1, trials=10, compiler_sweep=[],
                              fractions=[0.9, 0.5], region_depths=[], region_budgets=[1.0], rules=[],
                              math=False, cache="default", replan=False, math_again=False)  # fmt: skip
    row = module_peers.run_model("mlp", args)
    assert "error" not in row and "plans_error" not in row, row
    assert [p["family"] for p in row["peers"]] == ["hf_checkpointing", "checkpoint_sequential", "offload_activations"]
    assert row["peers"][1]["step_ms"] > 0  # measured on the CPU
    assert row["reference"] == {"of": "eager", "peak_bytes": 4 << 20}
    assert [p["fraction"] for p in row["plans"]] == [0.9, 0.5]
    assert all("capped" in p or p.get("error") == "no plan fits" for p in row["plans"]), row["plans"]
    # the bound at a budget every plan fits: above nothing slower than the unplanned step it bounds
    from memtune.tuner import Plan, simulate

    (bound,) = peer_rows.lower_bounds({**row, "plans": [{"fraction": 1.0, "budget_bytes": 1 << 30}]}).values()
    prof = peer_rows.searched_profile(row)
    assert 0 < bound <= simulate(prof, Plan.uniform(prof.n_stages)).step_ms * (1 + 1e-9)
    saved = json.loads((tmp_path / "mlp.json").read_text())
    assert saved["run"]["command"] and saved["profile"]["model"]
    measured = len(steps)
    again = module_peers.run_model("mlp", args)  # continues: everything is there, nothing is measured again
    assert len(steps) == measured and again["plans"] == row["plans"]
    assert all(p["searched_at"] for p in row["plans"])
    # a row measured before steps timed the update, its plans searched at another commit: with --replan the update is
    # timed once in eager steps and every plan searched and measured again; run again, nothing more
    saved = json.loads((tmp_path / "mlp.json").read_text())
    del saved["unplanned"]["update_ms"]
    for p in saved["plans"]:
        p["searched_at"] = "0000000"
    (tmp_path / "mlp.json").write_text(json.dumps(saved))
    args.replan = True
    replanned = module_peers.run_model("mlp", args)
    assert replanned["update_ms"] == 1.5 and peer_rows.row_update_ms(replanned) == 1.5
    assert steps[measured] == "Sequential"  # the update's eager steps
    assert all(p.get("searched_at") != "0000000" for p in replanned["plans"]), replanned["plans"]
    settled = len(steps)
    module_peers.run_model("mlp", args)
    assert len(steps) == settled


@pytest.mark.slow  # CPU inductor compiles two blocks under two policies
def test_region_candidates_are_profiled_kept_and_weighed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from torch import nn

    import memtune.tuner.measure.module_bench
    import memtune.tuner.runtime

    torch.manual_seed(0)

    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.LayerNorm(64))

    model = nn.Sequential(block(), block(), nn.Linear(64, 4))
    x = torch.randn(128, 64)
    monkeypatch.setattr(module_peers, "build", lambda name: (model, x, lambda out: out.square().mean(), "sgd", 128))
    monkeypatch.setattr(memtune.tuner.measure.module_bench, "measure_step", lambda *_a, **_k: {
        "step_ms": 10.0, "peak_bytes": 1 << 30, "reserved_bytes": 1 << 30, "alloc_retries_per_step": 0.0,
        "update_ms": 1.0})  # fmt: skip
    monkeypatch.setattr(memtune.tuner.runtime, "budget_guard", lambda *_a, **_k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_a: "CPU stand-in")
    _finalists_run(monkeypatch)
    args = argparse.Namespace(out=tmp_path, fresh=False, warmup=0, steps=1, trials=10, compiler_sweep=[],
                              fractions=[1.0], region_depths=[1], region_budgets=[1.0], rules=["compute"],
                              math=True, cache="default", replan=False, math_again=False)  # fmt: skip
    row = module_peers.run_model("blocks", args)
    assert "error" not in row and "plans_error" not in row, row
    regions = row["regions"]
    assert [(e["depth"], e["budget"], e["saves"]) for e in regions] == [(1, 1.0, None), (1, 1.0, "compute")]
    assert all(e["error"] is None and e["profile"]["compile_budget"] == 1.0 for e in regions), regions
    assert regions[1]["profile"]["compile_saves"] == "compute"
    (plan,) = row["plans"]
    assert len(plan["candidates"]) == 2 and "save rule 'compute'" in plan["candidates"][1], plan["candidates"]
    # NOTE [ Plans' gradients ]: the served plan checked against the model compiled whole, beside the spread
    assert "spread" in row, (row["plans"], row.get("math_error"))
    assert "math_error" not in row and set(row["spread"]) == {"again", "eager", "recut", "noise"}, row.get("math_error")
    assert plan["math"]["within_spread"], (plan["math"], row["spread"])
    # NOTE [ Gradients against float64 ]: the plan and the spreads' runs judged against a float64 step too
    assert plan["math"]["float64"]["comparable"] and plan["math"]["float64"]["within"], plan["math"]
    assert row["spread"]["again"]["float64"]["ratio"] == 1.0, row["spread"]  # the compiled run repeats exactly
    text = peer_rows.table(tmp_path)
    assert "## Gradients against the unplanned compiled run" in text
    assert f"| {plan['math']['float64']['ratio']:.2f} ({plan['math']['float64']['worst']}) | yes |" in text
    again = module_peers.run_model("blocks", args)  # continues: the region profiles are not measured again
    assert [e["seconds"] for e in again["regions"]] == [e["seconds"] for e in regions]
    assert again["plans"][0]["math"] == plan["math"]  # nor the gradients checked again
    checked = json.loads((tmp_path / "blocks.json").read_text())
    del checked["plans"][0]["math"]["float64"]  # a check made before the float64 judgement existed
    (tmp_path / "blocks.json").write_text(json.dumps(checked))
    args.math_again = True
    rechecked = module_peers.run_model("blocks", args)
    assert rechecked["plans"][0]["math"]["float64"]["within"], rechecked["plans"][0]["math"]
    checked = json.loads((tmp_path / "blocks.json").read_text())
    checked["plans"][0]["math"]["float64"].update(comparable=False, ratio=-1.0)  # its float64 step drew other masks
    (tmp_path / "blocks.json").write_text(json.dumps(checked))
    judged_again = module_peers.run_model("blocks", args)["plans"][0]["math"]["float64"]
    assert judged_again["comparable"] and judged_again["ratio"] != -1.0, judged_again


def test_auto_depths_are_the_depths_of_the_partitions_tune_measures() -> None:
    from benchmarks.module_peers import auto_depths
    from memtune.profiler.region_tree import RegionPartition

    parts = [RegionPartition(d, tuple(f"r{i}" for i in range(n))) for d, n in ((1, 1), (2, 2), (3, 20), (4, 60))]
    assert auto_depths(parts) == [2, 3]  # the Llama decoder's


def test_a_row_of_another_gpu_is_not_continued(tmp_path: Path) -> None:
    from benchmarks.common import same_gpu

    row = tmp_path / "mobilenet_v2.json"
    same_gpu(row, None, "NVIDIA H200")  # a new row
    same_gpu(row, "NVIDIA H200", "NVIDIA H200")
    same_gpu(row, {"name": "NVIDIA H200", "key": "h200"}, "NVIDIA H200")  # compiled_regions keeps the identity
    with pytest.raises(
        SystemExit, match=r"mobilenet_v2.json: measured on NVIDIA H100 80GB HBM3, and this GPU is NVIDIA H200"
    ):
        same_gpu(row, "NVIDIA H100 80GB HBM3", "NVIDIA H200")
    with pytest.raises(SystemExit, match="another --out folder"):
        same_gpu(row, {"name": "NVIDIA H100 80GB HBM3"}, "NVIDIA H200")


H200_ROWS = Path(__file__).resolve().parents[2] / "benchmarks/results/h200/module-peers"
#: MobileNetV2's H200 row of an earlier search, trimmed to its 30% plan and that plan's region profile: the plan ran out
#: of memory under its cap before the simulator held a compiled region's fetches together (no plan fits there now)
INLINE_ROW = Path(__file__).resolve().parent / "data/h200-mobilenet-inline"


def test_a_compiled_regions_inline_backward_holds_every_storage_it_fetched() -> None:
    """NOTE [ Inline fetches ]: MobileNetV2's 30% plan on the H200 (21 compiled regions, inline sync) peaked 2.17 GiB
    without the cap and ran out of memory under its 1.98 GiB budget; holding a compiled region's fetches together
    predicts that peak, and the allocator model the out-of-memory."""
    from memtune.tuner import Plan
    from memtune.tuner._ledger import blocks_peak
    from memtune.tuner.placement import predict_retries
    from memtune.tuner.simulator import Simulator

    row = json.loads((INLINE_ROW / "mobilenet_v2.json").read_text())
    entry = next(e for e in row["plans"] if e["fraction"] == 0.3)
    plan = Plan.model_validate(entry["plan_json"])
    assert plan.sync == "inline" and plan.compile_budget is not None
    prof = peer_rows.plan_profile(row, plan)
    sim = Simulator(prof, row["optimizer"], merge=False).run(plan, timeline=True)
    measured = entry["uncapped"]["peak_bytes"]
    assert sim.peak_bytes == pytest.approx(measured, rel=1e-3)
    assert blocks_peak(sim.base_bytes, sim.blocks) == sim.peak_bytes  # the tensor-by-tensor view agrees
    assert "PlanOutOfMemoryError" in entry["capped"]["error"]
    assert predict_retries(prof, plan, entry["budget_bytes"], optimizer=row["optimizer"]).out_of_memory


@pytest.mark.slow  # every committed plan re-simulated and placed up to ten times: about 5 s
def test_committed_plans_are_repredicted_beside_their_measured_peaks() -> None:
    from memtune.tuner import Plan
    from memtune.tuner.placement import predict_retries

    (line,) = peer_rows.repredicted(INLINE_ROW).splitlines()[2:]
    assert "(-13.4%)" in line and "(+0.0%)" in line  # predicted then, predicted now
    text = peer_rows.repredicted(H200_ROWS)
    # ViT-B/16 at 30%: the plan served ran under its cap, 2.3 retries a step where the allocator model places 0.2 and
    # the out-of-memory once its blocks are 6% larger
    vit = next(x for x in text.splitlines() if x.startswith("| vit_b_16 | 30% |"))
    assert vit.endswith("| 2.3 retries | 0.2 retries; out of memory from blocks x1.06 |"), vit
    # its fastest prediction, a finalist, ran out of memory under the cap at a 148 MiB request: the allocator model
    # places it at the cap and predicts the out-of-memory, at stage 6's workspace, once its blocks are 3% larger
    row = json.loads((H200_ROWS / "vit_b_16.json").read_text())
    e = next(p for p in row["plans"] if p["fraction"] == 0.3)
    (short,) = [f for f in e["finalists"] if "PlanOutOfMemoryError" in f["measured"].get("error", "")]
    assert "in the forward of stage 6" in short["measured"]["error"]
    plan = Plan.model_validate(short["plan_json"])
    prof = peer_rows.plan_profile(row, plan)
    oom = predict_retries(prof, plan, e["budget_bytes"], optimizer=row["optimizer"], block_scale=1.03).out_of_memory
    assert oom is not None and "bytes for (1, ('ws', 6))" in oom, oom


@pytest.mark.slow  # CPU inductor compiles the model whole and its regions: about a minute cold on two cores
def test_the_gradient_check_draws_dropout_as_eager_does() -> None:
    """NOTE [ Plans' gradients ]: under ``compiled_math`` a GPT-2 with dropout 0.1 compiled whole draws eager's masks
    (the eager step differs by rounding only), and a plan of compiled regions, one recomputed and two offloaded, is
    within that spread."""
    import torch
    import transformers

    from memtune.profiler.region_tree import region_partitions
    from memtune.tuner import Plan
    from memtune.tuner.measure._peers import compiled_model
    from memtune.tuner.runtime import check_equivalence, compare_steps, reference_step

    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()
    x = torch.randint(0, 128, (4, 32))
    inputs = ((), {"input_ids": x, "labels": x})
    names = region_partitions(model, inputs)[1].names
    with module_peers.compiled_math():
        run = compiled_model(model, 1.0)
        ref = reference_step(model, inputs, loss_fn=lambda out: out.loss, run=run)
        eager = compare_steps(reference_step(model, inputs, loss_fn=lambda out: out.loss), ref)
        plan = Plan.from_actions("kkkrook", stages=names, compile_budget=1.0)
        eq, pm = check_equivalence(model, plan, inputs, loss_fn=lambda out: out.loss, reference=ref, steps=1)
    assert 0 < eager.grad < 1e-4, eager  # other fusions round otherwise; other masks would differ by order one
    assert max(eq.grad, eq.loss) <= max(eager.grad, eager.loss), (eq, eager)
    assert pm.stats.d2h_copies > 0
    pm.release()


def test_uniform_peaks_name_the_lowest_of_a_committed_row() -> None:
    from benchmarks.uniform_peaks import uniform_peaks

    first = uniform_peaks(json.loads((H200_ROWS / "gpt2.json").read_text()))[0]
    assert first.startswith("gpt2, searched profile: least 7.59 GiB (offload inline)"), first


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_with_the_cache_off_the_hf_like_plan_predicts_hf_checkpointings_measured_peak(model: str) -> None:
    """The committed decoders' rows ran with ``use_cache=False`` (``--cache off``), as Hugging Face's gradient
    checkpointing trains them: their output holds no key/value cache, and memtune's plan that recomputes exactly the
    blocks predicts, from the measured profile, the peak that checkpointing measured."""
    from benchmarks.peer_rows import searched_profile
    from benchmarks.uniform_peaks import released
    from memtune.tuner import Action, Plan, Simulator

    row = json.loads((H200_ROWS / f"{model}.json").read_text())
    assert row["use_cache"] is False
    prof = searched_profile(row)
    assert released(prof) is None  # the output holds nothing past its tensors
    blocks = [s.name.rsplit(".", 1)[-1].isdigit() for s in prof.stages]  # layers.N / h.N
    plan = Plan(actions=tuple(Action.RECOMPUTE if b else Action.KEEP for b in blocks))
    hf = next(p for p in row["peers"] if p["family"] == "hf_checkpointing")
    assert Simulator(prof, row["optimizer"]).run(plan).peak_bytes == pytest.approx(hf["peak_bytes"], rel=1e-5)


def test_the_cache_option_turns_a_decoders_cache_off_and_a_row_keeps_the_one_it_was_measured_with(
    tmp_path: Path,
) -> None:
    import torch
    import transformers

    from benchmarks.module_peers import hf_cache, same_cache
    from benchmarks.promises import Autocast

    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32)
    gpt2 = transformers.GPT2LMHeadModel(config)
    assert hf_cache(gpt2, "default") is True and gpt2.config.use_cache is True
    assert hf_cache(gpt2, "off") is False and gpt2.config.use_cache is False
    wrapped = Autocast(transformers.GPT2LMHeadModel(config), torch.bfloat16, "cpu")  # the Llama decoder's wrapping
    assert hf_cache(wrapped, "off") is False and wrapped.model.config.use_cache is False
    assert hf_cache(torch.nn.Linear(2, 2), "off") is None

    path = tmp_path / "gpt2.json"
    same_cache(path, {}, True, False)  # nothing measured yet: any
    same_cache(path, {"unplanned": {}}, True, True)  # a row from before the option: as shipped
    same_cache(path, {"unplanned": {}, "use_cache": False}, True, False)
    with pytest.raises(SystemExit, match="measured with use_cache=True, this run has use_cache=False"):
        same_cache(path, {"unplanned": {}}, True, False)


def test_offload_overhead_prices_a_committed_plan_per_gib_and_per_stage_offloaded() -> None:
    from benchmarks.offload_overhead import lines

    (line,) = lines(json.loads((H200_ROWS / "gpt2.json").read_text()))
    assert line == (
        "gpt2 at 90%: 2.61 GiB offloaded from 14 of 17 stages (0 recomputed), predicted 170.6 ms, measured 170.9 ms "
        "uncapped, +0.1 ms per GiB, +0.02 ms per stage offloaded"
    )


def test_update_time_adds_the_optimizers_update_to_a_committed_plans_prediction() -> None:
    """The simulator's step is the forward and the backward; the measured steps hold AdamW's update too: on the Llama
    decoder 6.4 ms a step read as the eager step less the simulated one, 6.1 ms timed by the optimizer's hooks. Both of
    its plans compile the model whole (the compiler's budgets 0.7 and 0.5, served by their finalists' measurement),
    searched since the row timed the update: priced without it, so the update is added to them, which takes their
    misses from +9.6% and +8.4% to +2.1% and +1.5%."""
    from benchmarks.update_time import lines, update_ms

    row = json.loads((H200_ROWS / "llama.json").read_text())
    assert update_ms(row) == pytest.approx(6.35, abs=0.01)
    text = lines(row)
    assert text[0] == (
        "llama: update +6.4 ms a step, timed 6.1 ms by the optimizer's step hooks (adam, 1.01 GiB of parameters)"
    )
    assert text[1].endswith("measured 89.8 uncapped: +9.6% before, +2.1% with it"), text[1]
    assert text[2].endswith("measured 96.7 uncapped: +8.4% before, +1.5% with it"), text[2]


def test_a_gradient_as_large_as_its_own_spread_is_not_judged() -> None:
    """NOTE [ Plans' gradients ]: a gradient whose relative error in a spread is 1 or more (BERT's key biases, zero in
    exact arithmetic) is noise; the rest are judged against the spread of the same gradients."""
    from memtune.tuner.runtime import Equivalence

    def eq(loss: float, *grads: float) -> Equivalence:
        return Equivalence(loss, max(grads), 0.0, "", 1, grads)

    names = ["w", "key.bias", "b"]
    again, eager = eq(0.0, 1e-3, 0.5, 0.0), eq(1e-5, 2e-3, 4.9, 1e-4)
    assert module_peers.noise_gradients(again, eager) == [1]
    fine = module_peers.within_spread(eq(0.0, 1.5e-3, 5.3, 0.0), [again, eager], names)
    assert fine == {"judged_grad": 1.5e-3, "judged_worst": "w", "within_spread": True}
    worse = module_peers.within_spread(eq(0.0, 1e-3, 0.1, 3e-3), [again, eager], names)
    assert worse["judged_worst"] == "b" and not worse["within_spread"]  # 3e-3 over the 2e-3 of the worst judged spread
    assert not module_peers.within_spread(eq(5e-3, 0.0, 0.0, 0.0), [again, eager], names)["within_spread"]  # the loss
    # the compiler's own re-cut rounds "b" as the plan does: within that spread
    recut = eq(0.0, 1e-3, 0.2, 4e-3)
    assert module_peers.within_spread(eq(0.0, 1e-3, 0.1, 3e-3), [again, eager, recut], names)["within_spread"]
    assert module_peers.noise_gradients(again, eager, eq(0.0, 1.2, 0.1, 0.0)) == [0, 1]


def test_finalists_set_the_served_plan_beside_the_compiler_point_measured_in_the_same_process() -> None:
    """NOTE [ Measured finalists ]: where the fastest peer within a budget is a compiler point and was a finalist, the
    served plan and that point were measured minutes apart in one process; the table gives that ratio beside the one
    against the sweep's own run. On the Llama decoder at 90% the compiler's budget 0.7 was served (the regions' plan,
    predicted faster, measured slower); on MobileNetV2 at 75% the compiler's budget 0.4, which measured faster than
    budget 0.3, the sweep's fastest point within the budget."""
    llama = json.loads((H200_ROWS / "llama.json").read_text())
    at90 = next(e for e in llama["plans"] if e["fraction"] == 0.9)
    assert [f["name"] for f in at90["finalists"] if f.get("served")] == ["compiled whole 0.7"]
    assert peer_rows.side_by_side(llama, at90) == 1.0
    mobile = json.loads((H200_ROWS / "mobilenet_v2.json").read_text())
    at75 = next(e for e in mobile["plans"] if e["fraction"] == 0.75)
    steps = {f["name"]: f["measured"]["step_ms"] for f in at75["finalists"]}
    ratio = peer_rows.side_by_side(mobile, at75)
    assert [f["name"] for f in at75["finalists"] if f.get("served")] == ["compiled whole 0.4"]
    assert ratio == pytest.approx(steps["compiled whole 0.4"] / steps["compiled whole 0.3"])
    assert ratio is not None and ratio < 1.0
    text = peer_rows.table(H200_ROWS)
    assert "## Finalists measured before serving" in text
    assert "| llama | 90% | compiled whole 0.7 | 81.9 | 88.3 / 12.75 | yes |" in text


def test_an_unrecorded_region_layout_stands_only_where_each_region_alone_ran_it() -> None:
    from torch import nn

    stem = nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU())  # small channels alone: default layout
    body = nn.Sequential(nn.Conv2d(32, 256, 3), nn.Conv2d(256, 256, 3))
    head = nn.Linear(256, 10)
    assert not module_peers.same_alone([stem, body, head])  # together channels-last, the stem alone not
    assert module_peers.same_alone([nn.Sequential(stem, body), head])  # one region holds every convolution
    old: dict[str, Any] = {"depth": 1}
    assert module_peers.ran_in_layout(old, True, alone=True) and old["channels_last"] is True
    assert not module_peers.ran_in_layout({"depth": 2}, True, alone=False)
    assert module_peers.ran_in_layout({"depth": 2, "channels_last": False}, False, alone=False)
    assert not module_peers.ran_in_layout({"depth": 2, "channels_last": False}, True, alone=True)


def test_the_compilers_noise_is_read_from_its_points_measured_again_and_judges_the_plans_within_it() -> None:
    row = json.loads((H200_ROWS / "mobilenet_v2.json").read_text())
    again = peer_rows.repeated_points(row)
    # budget 0.4: the sweep's 28.1 ms, then as three budgets' finalists, and under the three caps as the plan served
    got = [round(x, 1) for x in again[0.4]]
    assert got == [28.1, 27.0, 30.7, 28.1, 28.2, 27.0, 36.0]
    assert peer_rows.point_noise(row) == pytest.approx(max(again[0.4]) / min(again[0.4]) - 1, rel=1e-6)
    assert peer_rows.point_noise({"peers": [], "plans": []}) is None
    text = peer_rows.table(H200_ROWS)
    assert "| 1.06 | yes (noise 34%) |" in text  # the compiler's own point served at 75%: a tie within the noise
    assert "| 1.35 | no (noise 34%) |" in text  # the same point at 60%, capped: just outside the noise
    assert "## The compiler's points measured more than once" in text


def test_where_no_finalist_runs_fallbacks_run_in_turn_and_else_the_budget_serves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [ Measured finalists ], step 5, as the benchmark runs it: the finalists, then the fallbacks of smaller
    predicted peak in turn until one runs (it is served); where none runs, the budget serves no plan and says why."""
    from memtune.profiler import zoo
    from memtune.profiler.modeled import modeled_profile
    from memtune.tuner import Plan, simulate
    from memtune.tuner.finalists import fallback_pool, finalists
    from memtune.tuner.search import tune

    prof = modeled_profile(zoo.build("resnet50"), 64, "float32", "h100")
    result = tune(prof, int(simulate(prof, Plan.uniform(prof.n_stages)).peak_bytes * 0.5), trials=20, seed=0)
    words = module_peers._served_words
    entry = {"fraction": 0.5, "budget_bytes": result.budget_bytes,
             "finalists": [{"name": n, **words(c)} for n, _, c in finalists([result])],
             "fallbacks": [{"name": n, **words(c)} for n, _, c in fallback_pool([result])]}  # fmt: skip
    first = entry["finalists"][0]
    below = [f for f in entry["fallbacks"] if f["predicted"]["peak_bytes"] < first["predicted"]["peak_bytes"]]
    assert len(entry["finalists"]) == 1 and len(below) >= 2
    run = module_peers._Run("resnet50", argparse.Namespace(out=tmp_path, fresh=True))
    fb = [f"{f['name']} (fallback)" for f in below]
    ran = _finalists_run(monkeypatch, {first["name"]: None, fb[0]: None})
    served = json.loads(json.dumps(entry))
    run._finalists(None, None, None, "sgd", served)
    assert ran == [first["name"], fb[0], fb[1]]  # stops at the first that ran
    assert [f.get("served", False) for f in served["finalists"]] == [False, False, True]
    assert served["plan_json"] == below[1]["plan_json"] and "error" not in served
    ran = _finalists_run(monkeypatch, {first["name"]: None} | {f"{f['name']} (fallback)": None for f in below})
    none = json.loads(json.dumps(entry))
    run._finalists(None, None, None, "sgd", none)
    assert len(ran) == 1 + min(len(below), module_peers.FINALISTS) and "plan_json" not in none
    assert none["error"].startswith(f"no plan ran under the budget: {first['name']}: PlanOutOfMemoryError: stage 6; ")
