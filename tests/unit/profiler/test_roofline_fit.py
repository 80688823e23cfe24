"""The roofline's fit (``benchmarks.fit_roofline``) and the committed modeled-versus-measured table.

Tracing every zoo profile and re-fitting takes about a minute (``python -m benchmarks.fit_roofline``), too long
here: these tests check that the committed constants reproduce the committed table on the ResNets (with the
simulator, as the table was made), that the table's summary counts its own rows, that the fit recovers known
constants from synthetic measurements, and that the constants the script prints are the module's.
"""

from __future__ import annotations

import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from benchmarks.fit_roofline import (
    LOSS_FIELDS,
    STAGE_FIELDS,
    Sample,
    fit_loss,
    fit_stages,
    load_samples,
    modeled_step_ms,
    python_constants,
)
from memtune.profiler import loss_model, modeled
from memtune.profiler.devices import get_gpu
from memtune.profiler.loss_model import roofline_loss_ms
from memtune.profiler.modeled import ROOFLINE, Roofline, meta_facts, modeled_profile
from memtune.profiler.zoo import build
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import Simulator

TABLE = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "modeled-vs-measured.txt"
_ROW = re.compile(r"^\| (h\d+) \| (\w+) \| (\d+) \| (\w+) \| ([\d.]+) \| ([\d.]+) \| ([+-][\d.]+)% \|")
_SUMMARY = re.compile(r"^(h\d+): (\d+)/(\d+) steps within 15%")


def _table() -> dict[tuple[str, str, int, str], tuple[float, float, float]]:
    """``(gpu, model, batch, dtype) -> (measured ms, modeled ms, error %)`` of the committed table."""
    out = {}
    for line in TABLE.read_text().splitlines():
        m = _ROW.match(line)
        if m:
            out[(m[1], m[2], int(m[3]), m[4])] = (float(m[5]), float(m[6]), float(m[7]))
    return out


def test_the_tables_summary_counts_its_rows() -> None:
    rows = _table()
    assert {k[0] for k in rows} == {"h100", "h200"}
    summaries = [_SUMMARY.match(line) for line in TABLE.read_text().splitlines()]
    found = {m[1]: (int(m[2]), int(m[3])) for m in summaries if m}
    for gpu, (within, total) in found.items():
        errors = [e for k, (_, _, e) in rows.items() if k[0] == gpu]
        assert total == len(errors)
        assert within == sum(abs(e) <= 15.0 for e in errors)
    assert set(found) == {"h100", "h200"}


@pytest.mark.slow
def test_committed_constants_reproduce_the_table_on_the_resnets() -> None:
    rows = _table()
    samples = load_samples(models={"resnet18", "resnet50"})
    assert len(samples) == 16
    for s in samples:
        measured, modeled_ms, error = rows[(s.gpu, s.model, s.batch, s.dtype)]
        step, _ = modeled_step_ms(s, ROOFLINE)
        assert s.step_ms == pytest.approx(measured, abs=0.051)
        assert step == pytest.approx(modeled_ms, abs=0.051)
        assert 100 * (step - s.step_ms) / s.step_ms == pytest.approx(error, abs=0.051)
    # what the fit evaluates is what modeled_profile and the simulator give
    s = samples[0]
    prof = modeled_profile(build(s.model), s.batch, s.dtype, s.gpu)
    assert Simulator(prof).run(Plan.uniform(prof.n_stages)).step_ms == pytest.approx(modeled_step_ms(s, ROOFLINE)[0])


def _synthetic(truth: Roofline) -> list[Sample]:
    """Profiles measured as the roofline with ``truth`` says: ResNet-18 and a 2-block GPT, big enough that memory
    and compute matter beside the launches, on the H100 and the H200, in fp32 and bf16."""
    out = []
    models: tuple[tuple[str, dict[str, int], int], ...] = (
        ("resnet18", {}, 128),
        ("gpt", {"layers": 2, "width": 512, "heads": 8}, 8),
    )
    for name, params, batch in models:
        for dtype in ("float32", "bfloat16"):
            facts = meta_facts(build(name, params), batch, dtype)
            for gpu in ("h100", "h200"):
                spec = get_gpu(gpu)
                probe = Sample(gpu, name, batch, dtype, spec, facts, (), (), 0.0, 1.0, 1.0, 1.0)
                step, per = modeled_step_ms(probe, truth)
                loss = roofline_loss_ms(facts.stages[-1].output_bytes, dtype, spec, truth)
                fwd, bwd = (tuple(t[i] for t in per) for i in (0, 1))
                out.append(Sample(gpu, name, batch, dtype, spec, facts, fwd, bwd, loss, step, step, 1.0))
    return out


def test_the_fit_recovers_known_constants() -> None:
    truth = replace(ROOFLINE, conv_efficiency=0.6, memory_efficiency=0.8, launch_ms=0.03, loss_memory_efficiency=0.5)
    samples = _synthetic(truth)
    wanted = {"conv_efficiency", "memory_efficiency", "launch_ms"}
    spec = [f for f in STAGE_FIELDS if f[0] in wanted]
    loss = fit_loss(samples, ROOFLINE)  # as benchmarks.fit_roofline.fit does: the loss first
    assert loss.loss_memory_efficiency == pytest.approx(0.5, rel=1e-3)
    got = fit_stages(samples, loss, spec)
    for name in wanted:
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=1e-3)
    assert got.tensor_efficiency == ROOFLINE.tensor_efficiency  # not in spec: kept
    assert {f[0] for f in STAGE_FIELDS} | {f[0] for f in LOSS_FIELDS} == {f.name for f in fields(Roofline)}


def test_the_printed_constants_are_the_modules() -> None:
    lines = python_constants(ROOFLINE).splitlines()
    assert len(lines) == len(fields(Roofline))
    for line in lines:
        name, value = line.split(" = ")
        home = loss_model if name.startswith("LOSS_") else modeled  # where the script says to paste it
        assert getattr(home, name) == float(value)  # committed as printed: 3 significant digits
        assert getattr(ROOFLINE, name.lower()) == float(value)
