"""vDNN as published (Rhu et al. 2016): VGG-16 at batch 64, 128 and 256 and the very deep VGGs at batch 32 on a
modeled 12 GB Tesla K40, by vDNN's own accounting and by memtune's simulator, the paper's figures beside them.

The K40 profile is the roofline's (``memtune.profiler.modeled``) with algorithm tables carried over from the measured
H100 profile of VGG-16 (NOTE [ Transplanted algorithm tables ] in ``memtune.profiler.algo_transplant``); memory by
vDNN's rules is NOTE [ vDNN accounting ] in ``memtune/tuner/policies/vdnn_accounting.py``. For vDNN_dyn on the very deep
VGGs it also prints where the bytes go at the peak, by vDNN's accounting (``PaperMemory.peak_parts``) and by the
simulator (NOTE [ Peak parts ] in ``memtune.tuner.peak_parts``), and where the simulated step's time goes (compute
against waits for copies). Prints markdown; CPU only, a minute or two.

    python -m benchmarks.vdnn_repro > benchmarks/results/vdnn-repro.md
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from memtune.profiler import Profile, build, find_profile, modeled_profile
from memtune.profiler.algo_transplant import transplant_algos
from memtune.tuner import Plan, SimResult, Simulator, prefetch_trigger
from memtune.tuner.peak_parts import peak_parts, step_parts
from memtune.tuner.plan import resolve_storages
from memtune.tuner.policies.vdnn import vdnn_all, vdnn_conv
from memtune.tuner.policies.vdnn_accounting import paper_memory
from memtune.tuner.policies.vdnn_dyn import vdnn_dyn_passes

GB = 1e9
K40_BYTES = 12 << 30  # the K40's 12 GB are 12 GiB
#: the paper's figures that its text states (section 5, abstract), GB; Figure 9's bars are images only
PAPER = {
    ("vgg16", 128, "base"): "15 (base)",
    ("vgg16", 256, "base"): "28 (base)",
    ("vgg16", 128, "all_m"): "4.8 (max)",
    ("vgg16", 256, "all_m"): "trains in 12; 16 offloaded",
    ("vgg16", 32, "base"): "4.9",
    ("vgg516", 32, "base"): "80.6",
    ("vgg516", 32, "dyn"): "5.8 (largest of the deep VGGs)",
}

PolicyFn = Callable[[Profile], Plan]
POLICIES: dict[str, PolicyFn] = {
    "base_m": lambda p: Plan.uniform(p.n_stages, conv_rule="memory_optimal"),
    "base_p": lambda p: Plan.uniform(p.n_stages, conv_rule="fastest"),
    "all_m": lambda p: vdnn_all(p, 0, conv_rule="memory_optimal"),
    "all_p": lambda p: vdnn_all(p, 0, conv_rule="fastest"),
    "conv_m": lambda p: vdnn_conv(p, 0, conv_rule="memory_optimal"),
    "conv_p": lambda p: vdnn_conv(p, 0, conv_rule="fastest"),
}


def k40_profile(model: str, batch: int, source: Profile) -> Profile:
    """``model`` at ``batch`` on the modeled K40, with cuDNN 4.0's algorithms carried over from ``source``."""
    return transplant_algos(modeled_profile(build(model), batch, "float32", "k40"), source)


def dyn_plans(profile: Profile, sim: Simulator) -> dict[str, tuple[Plan, str]]:
    """vDNN_dyn's adopted plan when its passes run on vDNN's accounting and on the simulator, with the pass."""
    out = {}
    for name, peak in (
        ("paper", lambda plan: paper_memory(profile, plan).max_bytes),
        ("sim", lambda plan: sim.run(plan, check=False).peak_bytes),
    ):
        plan, passes = vdnn_dyn_passes(profile, K40_BYTES, peak=peak)
        adopted = next((r.name for r in reversed(passes) if r.fits), "none fits")
        out[name] = (plan, adopted)
    return out


def _fits(nbytes: float) -> str:
    return f"{nbytes / GB:.2f}" + ("" if nbytes <= K40_BYTES else " *")


def policy_plans(model: str, batch: int, source: Profile) -> tuple[Profile, Simulator, dict[str, Plan]]:
    """The K40 profile, its simulator and every policy's plan, vDNN_dyn's passes on both accountings included."""
    p = k40_profile(model, batch, source)
    sim = Simulator(p, "sgd")
    plans = {name: make(p) for name, make in POLICIES.items()}
    dyn = dyn_plans(p, sim)
    plans["dyn (paper passes)"] = dyn["paper"][0]
    plans["dyn (simulated passes)"] = dyn["sim"][0]
    return p, sim, plans


def memory_rows(p: Profile, sim: Simulator, plans: dict[str, Plan]) -> list[str]:
    """One markdown row per policy: vDNN's max and average, the simulator's peak, the paper's figure."""
    model, batch = p.model, p.batch
    base_ms = sim.run(plans["base_p"]).step_ms
    rows = []
    for name, plan in plans.items():
        acc = paper_memory(p, plan)
        r = sim.run(plan)
        key = "dyn" if name.startswith("dyn") else ("base" if name == "base_p" else name)
        paper = PAPER.get((model, batch, key), "")
        rows.append(
            f"| {model} b{batch} | {name} | {_fits(acc.max_bytes)} | {acc.avg_bytes / GB:.2f} | "
            f"{acc.offloaded_bytes / GB:.2f} | {_fits(r.peak_bytes)} | {r.step_ms / base_ms:.2f} | {paper} |"
        )
    return rows


def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:.2f}"


def _copy_outlasts(p: Profile, sim: Simulator, plan: Plan) -> tuple[int, int, float]:
    """Offloaded maps, those whose copy (at the profile's D2H rate) takes longer than the forward of the stage that
    waits for it at its end (``sync="layer"``), and the copies' total ms."""
    tab = sim.tables
    fates = resolve_storages(tab.profile, plan.actions)
    copied = [(sid, f.copy_stage) for sid, f in enumerate(fates) if f.fate == "offload" and tab.s_producer[sid] >= 0]
    longer = sum(1 for sid, k in copied if tab.s_d2h[sid] > sim.fwd[k])
    return len(copied), longer, sum(tab.s_d2h[sid] for sid, _ in copied)


def _kinds(p: Profile, stalls: tuple[float, ...]) -> str:
    """The stages that waited, counted by layer kind: ``508 relu``."""
    counts = Counter(p.stages[k].kind for k, ms in enumerate(stalls) if ms > 0.0)
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none"


def deep_breakdown(p: Profile, sim: Simulator, plans: dict[str, Plan]) -> tuple[str, str, str]:
    """vDNN_dyn (passes on vDNN's accounting) on one deep VGG: a markdown row of its peak by vDNN's accounting, one
    of its simulated peak (NOTE [ Peak parts ]), and one of where its simulated step's time goes, beside base_p's."""
    plan = plans["dyn (paper passes)"]
    acc = paper_memory(p, plan)
    parts = dict(acc.peak_parts)
    label = f"{p.model} b{p.batch}"
    paper_row = (
        f"| {label} | {_gb(acc.max_bytes)} | {acc.peak_layer} ({p.stages[int(acc.peak_layer.split()[1])].name}) | "
        f"{_gb(parts['W and dW'])} | {_gb(parts['feature maps'])} | {_gb(parts['gradient maps'])} | "
        f"{_gb(parts['workspace'])} |"
    )
    r: SimResult = sim.run(plan, timeline=True)
    pk = peak_parts(sim, plan, r)
    q = pk.parts
    other = q["input batch"] + q["recompute"] + q["loss"]
    sim_row = (
        f"| {label} | {_gb(pk.peak_bytes)} | {pk.where} ({pk.stage or 'loss'}) | {_gb(q['parameters'])} | "
        f"{_gb(q['optimizer state'])} | {_gb(q['parameter gradients'])} | {_gb(q['activation gradients'])} | "
        f"{_gb(q['workspace'])} | {_gb(q['kept activations'])} | {_gb(q['offloads in flight'])} | "
        f"{_gb(q['prefetched activations'])} | {_gb(other)} |"
    )
    t = step_parts(r)
    base = sim.run(plans["base_p"])
    maps, longer, copy_ms = _copy_outlasts(p, sim, plan)
    # the same offloads waited for at the end of the convolution that reads each map, as vDNN syncs; then also
    # prefetched at the start of the backward of the convolution above, as vDNN's findPrefetchLayer does
    at_conv = plan.with_(sync="deferred", sync_delay=1)
    variants = [sim.run(at_conv), sim.run(at_conv.with_(prefetch_lookahead=2))]
    time_row = (
        f"| {label} | {base.step_ms / 1000:.1f} | {t.step_ms / 1000:.1f} | {t.step_ms / base.step_ms:.2f} | "
        f"{t.compute_ms / 1000:.1f} | {t.forward_stall_ms / 1000:.1f} ({_kinds(p, r.forward_stalls_ms)}) | "
        f"{t.backward_stall_ms / 1000:.1f} ({_kinds(p, r.backward_stalls_ms)}) | {maps} | {longer} | "
        f"{copy_ms / 1000:.1f} | {(r.forward_ms - t.forward_stall_ms) / 1000:.1f} | "
        + " | ".join(f"{v.step_ms / base.step_ms:.2f} ({_gb(v.peak_bytes)})" for v in variants)
        + " |"
    )
    return paper_row, sim_row, time_row


def prefetch_rows(source: Profile) -> list[str]:
    """vDNN_all(m) on VGG-16 b256: global prefetch lookaheads, and the per-layer trigger within the K40's 12 GiB."""
    p = k40_profile("vgg16", 256, source)
    sim = Simulator(p, "sgd")
    plan = vdnn_all(p, 0, conv_rule="memory_optimal")
    rows = []
    for lookahead in (2, 1, 0):
        r = sim.run(plan.with_(prefetch_lookahead=lookahead))
        rows.append(f"| {lookahead} | {_fits(r.peak_bytes)} | {r.step_ms / 1000:.1f} | {r.stall_ms / 1000:.2f} |")
    trig = prefetch_trigger(p, plan, K40_BYTES, simulator=sim)
    r = trig.result
    rows.append(f"| per layer | {_fits(r.peak_bytes)} | {r.step_ms / 1000:.1f} | {r.stall_ms / 1000:.2f} |")
    return rows


def main() -> None:
    source = find_profile("vgg16", 256, "float32", "h100")
    if source is None:
        raise SystemExit(
            "the measured VGG-16 H100 profile (memtune/profiler/data/vgg16-b256-float32-h100.json) is missing"
        )
    print("GB are 1e9 bytes; * marks a peak above the K40's 12 GiB (12.88 GB). step: simulated, over base_p's.\n")
    print("| model | policy | vDNN max GB | vDNN avg GB | offloaded GB | simulated peak GB | step | paper |")
    print("|---|---|---|---|---|---|---|---|")
    for model, batch in (("vgg16", 64), ("vgg16", 128), ("vgg16", 256)):
        for row in memory_rows(*policy_plans(model, batch, source)):
            print(row)
    print("\n| model | policy | vDNN max GB | vDNN avg GB | offloaded GB | simulated peak GB | step | paper |")
    print("|---|---|---|---|---|---|---|---|")
    deep = []
    for model in ("vgg16", "vgg116", "vgg216", "vgg316", "vgg416", "vgg516"):
        runs = policy_plans(model, 32, source)
        rows = memory_rows(*runs)
        print(rows[1])  # base_p
        print(rows[-2])  # dyn on vDNN's accounting
        if model != "vgg16":  # VGG-16 at batch 32 fits without offload: dyn is base_p
            deep.append(deep_breakdown(*runs))
    print(
        "\nvDNN_dyn (passes on vDNN's accounting), batch 32: where the bytes go at vDNN's maximum, by vDNN's accounting"
    )
    print("(GB; W and dW: the weights and their gradients; gradient maps: the layer's dY and dX)\n")
    print("| model | vDNN max GB | at | W and dW | feature maps | gradient maps | workspace |")
    print("|---|---|---|---|---|---|---|")
    for paper_row, _, _ in deep:
        print(paper_row)
    print("\nThe same plans at the simulator's peak (GB; other: the input batch, re-made tensors and the loss's)\n")
    print(
        "| model | simulated peak GB | at | parameters | optimizer state | parameter gradients | activation gradients "
        "| workspace | kept activations | offloads in flight | prefetched activations | other |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for _, sim_row, _ in deep:
        print(sim_row)
    print(
        "\nWhere the simulated step's time goes (s): compute, and the waits for copies with the layers that waited; "
        "the\noffloaded maps, those whose copy takes longer than the forward of the layer that waits for it, the "
        "copies'\ntotal time and the forward's compute. Then the same offloads and algorithms waited for at the end "
        "of the\nconvolution that reads each map (vDNN's sync), and also prefetched at the start of the backward of "
        "the\nconvolution above (vDNN's findPrefetchLayer): step over base_p's (simulated peak GB)\n"
    )
    print(
        "| model | base_p step s | dyn step s | x base_p | compute s | forward waits s | backward waits s | "
        "offloaded maps | copy longer than its layer | copies s | forward compute s | sync at the conv | "
        "and prefetch a conv ahead |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for _, _, time_row in deep:
        print(time_row)
    print("\nvDNN_all(m), VGG-16 b256, simulated: prefetch lookahead (stages) against peak\n")
    print("| lookahead | simulated peak GB | step s | stall s |")
    print("|---|---|---|---|")
    for row in prefetch_rows(source):
        print(row)


if __name__ == "__main__":
    main()
