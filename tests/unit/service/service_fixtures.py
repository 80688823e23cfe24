"""Shared data of the service tests (a module with a unique name, importable from every test file):
a small spec model, and a test double for the GPU measurement that the worker takes as ``validator``."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, MetaData, Table, func, inspect, select

from memtune.profiler._profile import DeviceIdentity, Profile
from memtune.profiler.chain import ModelChain
from memtune.profiler.devices import GPUS
from memtune.profiler.identity import spec_identity
from memtune.storage.database import Database
from memtune.storage.migrate import alembic_config, current_revision, head_revision, upgrade
from memtune.storage.orm import Base, utcnow
from memtune.storage.records import ResultIn
from memtune.storage.repositories import JobRepository, ResultRepository
from memtune.tuner.measure.bench import BenchRow
from memtune.tuner.measure.validate import ValidationRun
from memtune.tuner.plan import Plan
from memtune.tuner.simulator import simulate

__all__ = ["SMALL_SPEC", "FakeValidator", "migration_round_trip", "schema_diff"]


def schema_diff(db: Database) -> list[Any]:
    """Differences between the migrated database's memtune tables (``mt_*``) and the ORM rows; [] when they match."""
    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={
                "include_object": lambda o, n, t, r, c: t != "table" or (n or "").startswith("mt_"),
                "compare_type": True,
            },
        )
        return [d for d in compare_metadata(ctx, Base.metadata) if d[0] != "remove_table"]


SMALL_SPEC: dict[str, Any] = {
    "name": "tiny-cnn",
    "input_shape": [3, 16, 16],
    "layers": [
        {"type": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1},
        {"type": "relu", "inplace": True},
        {"type": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1},
        {"type": "relu"},
        {"type": "maxpool2d", "kernel_size": 2},
        {"type": "conv2d", "out_channels": 16, "kernel_size": 3, "padding": 1},
        {"type": "relu"},
        {"type": "flatten"},
        {"type": "linear", "out_features": 10},
    ],
}


@dataclass
class FakeValidator:
    """A stand-in for ``memtune.tuner.measure.validate.validate_plans`` in CPU tests (never in product code).

    It "measures" each plan as its simulated numbers scaled by ``step_scale`` and ``peak_scale`` on the
    roofline identity of the job's GPU type, reports progress like the real one, polls ``should_stop``
    between plans, and lets a test act while a plan is "running" (``on_plan(index, name)``). The plans at the
    1-based positions ``fail_at`` come back with an out-of-memory error and no numbers, as ``bench_plans``
    reports them.
    """

    step_scale: float = 1.1
    peak_scale: float = 0.9
    #: per plan name, a step scale in place of ``step_scale`` (e.g. to make one plan measure faster)
    step_scale_of: dict[str, float] = field(default_factory=dict)
    fail_at: tuple[int, ...] = ()
    on_plan: Callable[[int, str], None] | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(
        self,
        chain: Any,
        profile: Profile,
        batch: int,
        dtype: str,
        budget_bytes: int,
        plans: Sequence[tuple[str, str, Plan]],
        *,
        gpu_key: str,
        iters: int = 6,
        warmup: int = 3,
        progress: Callable[[int, int, str, DeviceIdentity], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> ValidationRun:
        assert callable(chain), "the worker hands over a chain factory, built only where a GPU measures"
        # NOTE [ Bench isolation ]: the factory travels to a fresh process per plan, so it must survive pickling
        assert isinstance(pickle.loads(pickle.dumps(chain))(), ModelChain)
        self.calls.append(
            {"gpu_key": gpu_key, "iters": iters, "warmup": warmup, "budget_bytes": budget_bytes, "plans": list(plans)}
        )
        device = spec_identity(GPUS[gpu_key])
        if progress is not None:
            progress(0, len(plans), "unconstrained", device)
        unconstrained = BenchRow("unconstrained", "unconstrained", 10.0, 1000, 1600.0, True, reserved_bytes=2000)
        rows: list[BenchRow] = []
        for i, (name, kind, plan) in enumerate(plans, 1):
            if should_stop is not None and should_stop():
                return ValidationRun(device, unconstrained, rows, stopped=True)
            if progress is not None:
                progress(i, len(plans), name, device)
            if self.on_plan is not None:
                self.on_plan(i, name)
            sim = simulate(profile, plan)
            if i in self.fail_at:
                error = f"out of memory: plan {name!r} ran out of GPU memory in the backward of stage 3 (conv)"
                rows.append(BenchRow(name, kind, None, None, None, False, sim.step_ms, sim.peak_bytes, error=error))
                continue
            scale = self.step_scale_of.get(name, self.step_scale)
            step_ms, peak = sim.step_ms * scale, int(sim.peak_bytes * self.peak_scale)
            rows.append(
                BenchRow(
                    name,
                    kind,
                    step_ms,
                    peak,
                    batch / (step_ms / 1e3),
                    peak <= budget_bytes,
                    sim.step_ms,
                    sim.peak_bytes,
                    budget_bytes,
                    plan.compact(),
                    reserved_bytes=peak + 4096,
                )
            )
        return ValidationRun(device, unconstrained, rows, stopped=False)


def insert_old_job(conn: Connection, meta: MetaData, **columns: object) -> None:
    """Insert model ``m1`` and its succeeded job ``j1`` as an older schema stores them (``columns``: that
    schema's extra job columns), through reflected tables, for migration tests."""
    now = utcnow()
    models, jobs = (Table(t, meta, autoload_with=conn) for t in ("mt_models", "mt_jobs"))
    conn.execute(
        models.insert().values(
            id="m1", name="vgg16", kind="zoo", content_hash="c1", definition={"zoo": "vgg16"}, created_at=now
        )
    )
    conn.execute(
        jobs.insert().values(
            id="j1", model_id="m1", gpu_key="h200", batch=8, dtype="float32", budget_text="1GiB",
            budget_bytes=1 << 30, trials=5, mode="fastest", optimizer="sgd", state="succeeded",
            trials_done=5, owner="t", request_hash="h", study_name="memtune-job-j1", attempts=1,
            cancel_requested=False, created_at=now, updated_at=now, **columns,
        )
    )  # fmt: skip


def migration_round_trip(url: str) -> None:
    """0001 with a job and a result in it -> head (defaults filled in: no validation, headroom 0; measured rows
    storable) -> 0001 (the new columns gone, the rows kept) -> head again, matching the ORM rows. Used on SQLite
    and PostgreSQL."""
    db = Database(url)
    try:
        assert upgrade(db, "0001", optuna_tables=False) == "0001"
        now = utcnow()
        with db.engine.begin() as conn:
            meta = MetaData()
            results = Table("mt_results", meta, autoload_with=conn)
            insert_old_job(conn, meta)
            conn.execute(
                results.insert().values(
                    job_id="j1", model_id="m1", gpu_key="h200", batch=8, dtype="float32", budget_bytes=1 << 30,
                    name="optuna", kind="optuna", plan={"actions": ["keep"]}, step_ms=2.0, peak_bytes=1 << 20,
                    feasible=True, pareto_optimal=True, source="simulated", created_at=now,
                )
            )  # fmt: skip

        assert upgrade(db) == head_revision()
        with db.session() as s:
            job = JobRepository(s).get("j1")
            assert (job.validate_top_k, job.validate_iters, job.validation_state) == (0, 6, None)
            assert job.headroom == 0.0  # tuned before jobs carried a headroom, i.e. without one
            assert job.measured_unconstrained_step_ms is None
            (old,) = ResultRepository(s).for_job("j1")
            assert old.source == "simulated" and old.predicted_step_ms is None
            measured = ResultIn(
                "optuna", "optuna", {"actions": ["keep"]}, 2.5, 1 << 19, True, "measured", 2.0, 1 << 20, 1 << 21, 9.0
            )
            ResultRepository(s).add_measured(job, [measured], profile_id=None)

        command.downgrade(alembic_config(db.url), "0001")
        assert current_revision(db) == "0001"
        insp = inspect(db.engine)
        assert not {"validate_top_k", "headroom"} & {c["name"] for c in insp.get_columns("mt_jobs")}
        assert "predicted_step_ms" not in {c["name"] for c in insp.get_columns("mt_results")}
        with db.engine.connect() as conn:
            meta = MetaData()
            results = Table("mt_results", meta, autoload_with=conn)
            assert conn.scalar(select(func.count()).select_from(results)) == 2  # the rows survive the downgrade

        assert upgrade(db) == head_revision()
        assert schema_diff(db) == []
        with db.session() as s:
            assert {r.source for r in ResultRepository(s).for_job("j1")} == {"simulated", "measured"}
    finally:
        db.dispose()
