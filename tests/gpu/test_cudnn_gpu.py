"""cuDNN algorithms on a real GPU: enumeration, every working algorithm's numerics, workspaces, the swap.

Skipped without CUDA. Each case enumerates one convolution with ``memtune.profiler._conv_enumerate.enumerate_conv`` and
runs every algorithm the profile lists as working through ``CudnnConv2dFunction``; forward, input
gradient and weight gradient are compared with ``F.conv2d`` (and ``torch.nn.grad``) in float64 on the same
values, as the largest error over the largest reference value.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv2d_input, conv2d_weight

from memtune.profiler._conv_enumerate import enumerate_conv, enumerate_stage_convs
from memtune.profiler._profile import ConvAlgo, ConvProfile
from memtune.profiler.chain import ModelChain, flatten
from memtune.profiler.conv_split import enumerate_splits, split_workspace_bytes
from memtune.profiler.cudnn import (
    ALGO_NAMES,
    MATH_FMA,
    PASSES,
    ConvGeometry,
    cudnn_available,
    cudnn_version,
)
from memtune.tuner._conv_choice import select_algo
from memtune.tuner.plan import ConvChoice, Plan
from memtune.tuner.runtime.conv import AlgoChoice, CudnnConv2dFunction, apply_conv_choices

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20


@dataclass(frozen=True)
class Case:
    name: str
    conv: tuple[int, int, int, int, int, int, int]  # in, out, kernel, stride, padding, dilation, groups
    input_shape: tuple[int, int, int, int]
    dtype: str


CASES = [
    Case("vgg3x3", (64, 64, 3, 1, 1, 1, 1), (2, 64, 224, 224), "float32"),
    Case("stem7x7s2", (3, 64, 7, 2, 3, 1, 1), (4, 3, 64, 64), "float32"),
    Case("pointwise", (256, 64, 1, 1, 0, 1, 1), (4, 256, 28, 28), "float32"),
    Case("grouped_dilated", (32, 32, 3, 1, 2, 2, 4), (2, 32, 28, 28), "float32"),
    Case("vgg3x3_bf16", (64, 64, 3, 1, 1, 1, 1), (2, 64, 112, 112), "bfloat16"),
    Case("strided3x3_bf16", (64, 128, 3, 2, 1, 1, 1), (4, 64, 56, 56), "bfloat16"),
]


def _module(case: Case) -> nn.Conv2d:
    cin, cout, k, s, p, d, g = case.conv
    torch.manual_seed(0)
    return nn.Conv2d(cin, cout, k, stride=s, padding=p, dilation=d, groups=g, bias=False).cuda()


def _tolerance(dtype: str, algo: ConvAlgo) -> float:
    """Largest error over the largest reference value allowed for one algorithm."""
    if dtype == "bfloat16":
        return 2e-2  # the result is rounded to bf16 (8 bits of mantissa); a few ulps of the largest value
    if algo.math_type != MATH_FMA:
        return 5e-3  # TF32 tensor cores (10 bits of mantissa)
    if "FFT" in algo.name or "WINOGRAD" in algo.name:
        return 1e-4
    return 1e-5


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.detach().double() - ref).abs().max() / ref.abs().max())


@pytest.fixture(scope="module")
def fp32_strict() -> Iterator[None]:
    """fp32 without TF32 for the references and the enumeration (so fp32 tolerances are fp32's)."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before


def test_library_loads_beside_torch() -> None:
    assert cudnn_available()
    version = cudnn_version()
    print(f"\ncuDNN {version} (torch reports {torch.backends.cudnn.version()})")
    assert version // 10000 == torch.backends.cudnn.version() // 10000


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_working_algorithm_matches_pytorch(case: Case, fp32_strict: None) -> None:
    conv = _module(case)
    prof = enumerate_conv(conv, case.input_shape, case.dtype, warmup=1, repeats=3)
    _print_table(case.name, prof)
    assert prof.dtype == case.dtype and prof.batch == case.input_shape[0]
    assert prof.groups == case.conv[6] and prof.dilation == (case.conv[5],) * 2
    assert prof.default_ms is not None and prof.default_ms > 0
    assert prof.default_bwd_ms is not None and prof.default_bwd_ms > 0

    for pass_ in PASSES:
        rows = [a for a in prof.algos if a.pass_ == pass_]
        ids = [a.algo for a in rows]
        assert len(ids) == len(set(ids)), f"{pass_}: an algorithm listed twice: {ids}"
        assert set(range(len(ALGO_NAMES[pass_]))) == set(ids), f"{pass_}: algorithms dropped or invented: {ids}"
        assert any(a.status == "ok" for a in rows), f"{pass_}: no working algorithm"
        for a in rows:
            assert (a.ms is not None) == (a.status == "ok")
    failures = _run_every_row(case, conv, prof, prof.algos)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_split_run_matches_pytorch(case: Case, fp32_strict: None) -> None:
    """NOTE [ Batch split ]: every split run the profiler lists as working gives the unsplit values."""
    conv = _module(case)
    prof = enumerate_splits(enumerate_conv(conv, case.input_shape, case.dtype, warmup=1, repeats=3), splits=(2, 4))
    split = [a for a in prof.algos if a.split > 1]
    _print_table(case.name + " (split runs)", prof.model_copy(update={"algos": tuple(split)}))
    for a in split:
        whole = next(b for b in prof.algos if (b.pass_, b.algo, b.split) == (a.pass_, a.algo, 1))
        assert a.workspace_bytes < whole.workspace_bytes, f"{a.pass_} {a.name} x{a.split}: no workspace saved"
    failures = _run_every_row(case, conv, prof, tuple(split))
    assert not failures, "\n".join(failures)


def _run_every_row(case: Case, conv: nn.Conv2d, prof: ConvProfile, rows: tuple[ConvAlgo, ...]) -> list[str]:
    """Run each working row of ``rows`` through ``CudnnConv2dFunction`` (the other passes at their fastest) and
    compare its pass with float64 PyTorch; checks its workspace against cuDNN's Get. Returns the failures."""
    geom = ConvGeometry.from_module(conv, case.input_shape, case.dtype)
    dt = geom.torch_dtype
    torch.manual_seed(1)
    x = torch.randn(case.input_shape, device="cuda", dtype=dt)
    w = conv.weight.detach().to(dt)
    dy = torch.randn(geom.output_shape, device="cuda", dtype=dt)
    args = (geom.stride, geom.padding, geom.dilation, geom.groups)
    y_ref = F.conv2d(x.double(), w.double(), None, *args)
    dx_ref = conv2d_input(x.shape, w.double(), dy.double(), *args)
    dw_ref = conv2d_weight(x.double(), w.shape, dy.double(), *args)

    fastest = _fastest(prof)
    failures: list[str] = []
    for a in rows:
        if a.status != "ok":
            continue
        pass_ = a.pass_
        assert a.ms is not None and a.ms > 0
        ws = split_workspace_bytes(geom, pass_, a.algo, a.math_type, a.split)
        assert ws == a.workspace_bytes, f"{pass_} {a.name}: the table says {a.workspace_bytes} B, Get says {ws} B"
        picks = [a if p == pass_ else fastest[p] for p in PASSES]
        choice = AlgoChoice(*(b.algo for b in picks), *(b.math_type for b in picks), *(b.split for b in picks))
        xg = x.clone().requires_grad_(True)
        wg = w.clone().requires_grad_(True)
        y = CudnnConv2dFunction.apply(xg, wg, *args, choice)
        dx, dw = torch.autograd.grad(y, (xg, wg), dy)
        got, ref = {"fwd": (y, y_ref), "bwd_data": (dx, dx_ref), "bwd_filter": (dw, dw_ref)}[pass_]
        assert got.dtype == dt
        err, tol = _rel_err(got, ref), _tolerance(case.dtype, a)
        label = a.name + (f" x{a.split}" if a.split > 1 else "")
        print(f"  {pass_:10s} {label:26s} math {a.math_type} error {err:.2e} (tolerance {tol:.0e})")
        if not err <= tol:
            failures.append(f"{pass_} {label} (math {a.math_type}): error {err:.3e} > {tol:.0e}")
    return failures


def test_fp32_without_tf32_uses_fma_only(fp32_strict: None) -> None:
    conv = _module(CASES[2])
    prof = enumerate_conv(conv, CASES[2].input_shape, "float32", warmup=0, repeats=1)
    maths = {(a.pass_, a.name): a.math_type for a in prof.algos if a.status == "ok"}
    assert set(maths.values()) == {MATH_FMA}, maths


def test_runs_on_the_current_stream(fp32_strict: None) -> None:
    case = CASES[0]
    conv = _module(case)
    prof = enumerate_conv(conv, (1, 64, 56, 56), "float32", warmup=0, repeats=1)
    picks = [_fastest(prof)[p] for p in PASSES]
    choice = AlgoChoice(*(a.algo for a in picks), *(a.math_type for a in picks))
    x = torch.randn(1, 64, 56, 56, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = CudnnConv2dFunction.apply(x, conv.weight.detach(), (1, 1), (1, 1), (1, 1), 1, choice)
        ref = F.conv2d(x, conv.weight.detach(), None, 1, 1)
        err = _rel_err(y, ref.double())
    torch.cuda.current_stream().wait_stream(side)
    assert err < 1e-5


def test_design_fact_64_to_64_3x3_batch64() -> None:
    """The measured case of docs/concepts.md's measured facts (fp32, TF32 as PyTorch defaults): the table is printed for
    the record."""
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False).cuda()
    prof = enumerate_conv(conv, (64, 64, 224, 224), "float32", warmup=1, repeats=5, allow_tf32=True)
    _print_table("design 64->64 3x3, 224x224, batch 64, fp32 (TF32 allowed)", prof)
    fwd = {a.name: a for a in prof.algos if a.pass_ == "fwd"}
    assert fwd["IMPLICIT_GEMM"].status == "ok" and fwd["IMPLICIT_GEMM"].workspace_bytes == 0
    assert fwd["IMPLICIT_PRECOMP_GEMM"].status == "ok"
    assert {a.math_type for a in prof.algos if a.status == "ok"} != {MATH_FMA}  # TF32 was allowed


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(16, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b(torch.relu(self.a(x))) + x)


def _chain() -> ModelChain:
    torch.manual_seed(3)
    seq = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        Block(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    return ModelChain("tiny", flatten(seq), (3, 32, 32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_planned_convs_give_the_unplanned_gradients(dtype: str, fp32_strict: None) -> None:
    from memtune.profiler.measure import profile

    chain = _chain()
    prof = profile(chain, 4, dtype, device="cuda", warmup=1, repeats=2, conv_algos=True)
    keys = [f"{s.index}.{c.name}" for s in prof.stages for c in s.convs]
    assert keys == ["0.", "2.a", "2.b", "3."]
    for s in prof.stages:
        for c in s.convs:
            assert c.algos and c.dtype == dtype and c.batch == 4

    model = chain.as_sequential()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    target = torch.randint(0, 10, (4,), device="cuda")
    params = list(model.parameters())

    def step(seq: nn.Module) -> tuple[torch.Tensor, ...]:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            loss = F.cross_entropy(seq(x), target)
        return (loss.detach(), *torch.autograd.grad(loss, params))

    want = step(model)
    tol = 3e-2 if dtype == "bfloat16" else 1e-4
    # every pass in the largest split the profile measured for it, where it measured one (NOTE [ Batch split ])
    chunked: dict[str, ConvChoice] = {}
    for s in prof.stages:
        for c in s.convs:
            picks = {}
            for p in PASSES:
                rows = [a for a in c.algos if a.pass_ == p and a.status == "ok"]
                picks[p] = max(rows, key=lambda a: (a.split, -(a.ms or 0.0)))
            chunked[f"{s.index}.{c.name}"] = ConvChoice(
                **{p: a.algo for p, a in picks.items()}, **{f"{p}_split": a.split for p, a in picks.items()}
            )
    assert any(v.fwd_split > 1 or v.bwd_data_split > 1 or v.bwd_filter_split > 1 for v in chunked.values())
    plans = {rule: Plan.uniform(prof.n_stages, conv_rule=rule) for rule in ("fastest", "memory_optimal")}
    plans["split"] = Plan.uniform(prof.n_stages, conv_algos=chunked)
    for name, plan in plans.items():
        with apply_conv_choices(chain, plan, prof) as swapped:
            assert sorted(swapped) == sorted(keys)
            got = step(chain.as_sequential())
        for g, r in zip(got, want, strict=True):
            assert _rel_err(g, r.double()) <= tol, name


def test_stage_convs_see_the_real_input_shapes() -> None:
    chain = _chain()
    chain.as_sequential().cuda()
    block = chain.stages[2]
    got = enumerate_stage_convs(block, torch.randn(2, 16, 32, 32, device="cuda"), warmup=0, repeats=1)
    assert [c.name for c in got] == ["a", "b"]
    assert all(c.input_hw == (32, 32) and c.batch == 2 for c in got)


def _fastest(prof: ConvProfile) -> dict[str, ConvAlgo]:
    out: dict[str, ConvAlgo] = {}
    for p in PASSES:
        a = select_algo(prof.algos, p, "fastest")
        assert a is not None, f"{p}: no working algorithm"
        out[p] = a
    return out


def _print_table(title: str, prof: ConvProfile) -> None:
    print(f"\n{title}: default fwd {prof.default_ms:.3f} ms, default bwd {prof.default_bwd_ms:.3f} ms")
    for a in prof.algos:
        ms = f"{a.ms:8.3f} ms" if a.ms is not None else " " * 11
        print(
            f"  {a.pass_:10s} {a.algo} {a.name:22s} {a.status:11s} {ms} "
            f"{a.workspace_bytes / MiB:9.1f} MiB math {a.math_type} det {int(a.deterministic)}"
        )


def test_lean_transients_are_measured_for_convolution_stages() -> None:
    """NOTE [ Lean transients ]: each convolution stage measured with its memory-optimal algorithms; a stage that is
    a convolution then holds no more than that algorithm's workspace (up to the allocator's 2 MiB rounding)."""
    from memtune.profiler.measure import profile
    from memtune.tuner.measure.lean import measure_lean_transients

    chain = _chain()
    prof = profile(chain, 4, "float32", device="cuda", warmup=1, repeats=2, conv_algos=True)
    lean = measure_lean_transients(chain, prof)
    for s in lean.stages:
        if not s.convs:
            assert s.lean_forward_workspace_bytes is None and s.lean_backward_workspace_bytes is None
            continue
        assert s.lean_forward_workspace_bytes is not None and s.lean_backward_workspace_bytes is not None
        if s.kind == "conv2d":
            (conv,) = s.convs
            fwd = select_algo(conv.algos, "fwd", "memory_optimal")
            assert fwd is not None
            assert s.lean_forward_workspace_bytes <= fwd.workspace_bytes + 2 * MiB


def test_a_profile_without_tables_gets_the_chained_transients_only() -> None:
    from memtune.profiler.measure import profile
    from memtune.tuner.measure.lean import measure_lean_transients

    chain = _chain()
    prof = profile(chain, 4, "float32", device="cuda", warmup=1, repeats=2)
    bare = prof.model_copy(
        update={"stages": tuple(s.model_copy(update={"chained_backward_bytes": None}) for s in prof.stages)}
    )
    out = measure_lean_transients(chain, bare)
    assert all(s.chained_backward_bytes is not None for s in out.stages)
    assert all(s.lean_backward_workspace_bytes is None for s in out.stages)
