"""vDNN as published (Rhu et al. 2016): VGG-16 at batch 64, 128 and 256 and the very deep VGGs at batch 32 on a
modeled 12 GB Tesla K40, by vDNN's own accounting and by memtune's simulator, the paper's figures beside them.

The K40 profile is the roofline's (``profiler.modeled``) with algorithm tables carried over from the measured H100
profile of VGG-16 (NOTE [ Transplanted algorithm tables ] in ``profiler.algo_transplant``); memory by vDNN's rules is
NOTE [ vDNN accounting ] in ``tuner/policies/vdnn_accounting.py``. Prints markdown; CPU only, a minute.

    python -m benchmarks.vdnn_repro > benchmarks/results/vdnn-repro.md
"""

from __future__ import annotations

from collections.abc import Callable

from profiler import Profile, build, find_profile, modeled_profile
from profiler.algo_transplant import transplant_algos
from tuner import Plan, Simulator, prefetch_trigger
from tuner.policies.vdnn import vdnn_all, vdnn_conv
from tuner.policies.vdnn_accounting import paper_memory
from tuner.policies.vdnn_dyn import vdnn_dyn_passes

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


def memory_rows(model: str, batch: int, source: Profile) -> list[str]:
    """One markdown row per policy: vDNN's max and average, the simulator's peak, the paper's figure."""
    p = k40_profile(model, batch, source)
    sim = Simulator(p, "sgd")
    base_ms = sim.run(POLICIES["base_p"](p)).step_ms
    plans = {name: make(p) for name, make in POLICIES.items()}
    dyn = dyn_plans(p, sim)
    plans["dyn (paper passes)"] = dyn["paper"][0]
    plans["dyn (simulated passes)"] = dyn["sim"][0]
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
        raise SystemExit("the measured VGG-16 H100 profile (profiler/data/vgg16-b256-float32-h100.json) is missing")
    print("GB are 1e9 bytes; * marks a peak above the K40's 12 GiB (12.88 GB). step: simulated, over base_p's.\n")
    print("| model | policy | vDNN max GB | vDNN avg GB | offloaded GB | simulated peak GB | step | paper |")
    print("|---|---|---|---|---|---|---|---|")
    for model, batch in (("vgg16", 64), ("vgg16", 128), ("vgg16", 256)):
        for row in memory_rows(model, batch, source):
            print(row)
    print("\n| model | policy | vDNN max GB | vDNN avg GB | offloaded GB | simulated peak GB | step | paper |")
    print("|---|---|---|---|---|---|---|---|")
    for model in ("vgg16", "vgg116", "vgg216", "vgg316", "vgg416", "vgg516"):
        rows = memory_rows(model, 32, source)
        print(rows[1])  # base_p
        print(rows[-2])  # dyn on vDNN's accounting
    print("\nvDNN_all(m), VGG-16 b256, simulated: prefetch lookahead (stages) against peak\n")
    print("| lookahead | simulated peak GB | step s | stall s |")
    print("|---|---|---|---|")
    for row in prefetch_rows(source):
        print(row)


if __name__ == "__main__":
    main()
