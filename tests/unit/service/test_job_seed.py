"""One objective everywhere (NOTE [ One objective ] in ``memtune.tuner.search``): a job is searched with the command
line's
default seed, so the same request gives the same plan and step from ``memtune tune`` and from the service."""

from __future__ import annotations

import json

import optuna
import pytest
from typer.testing import CliRunner

from memtune.api.cli import app
from memtune.api.client import MemtuneClient
from memtune.api.service.worker import Worker, job_seed
from memtune.storage.database import Database
from memtune.storage.repositories import JobRepository
from memtune.tuner.search import DEFAULT_SEED


@pytest.mark.slow
def test_a_job_and_the_command_line_give_the_same_plan(client: MemtuneClient, db: Database) -> None:
    request = {"batch": 256, "gpu": "h200", "budget": "13GiB", "trials": 30}
    job = client.submit_job({"zoo": "vgg16"}, **request)  # type: ignore[arg-type]
    assert Worker(db, worker_id="unit-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0).run_once() == job.id
    done = client.get_job(job.id)
    assert done.state == "succeeded" and done.seed == DEFAULT_SEED
    served = next(r for r in client.job_results(job.id).data if r.kind == "optuna")

    out = CliRunner().invoke(app, ["tune", "vgg16", "--batch", "256", "--gpu", "h200", "--budget", "13GiB",
                                   "--trials", "30", "--json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    cli = json.loads(out.output.strip().splitlines()[-1])
    assert cli["seed"] == DEFAULT_SEED
    assert abs(served.step_ms - cli["best"]["step_ms"]) < 1e-4
    assert served.peak_bytes == cli["best"]["peak_bytes"]
    with_plans = client.job_results(job.id, plans=True).data
    plan = next(r for r in with_plans if r.kind == "optuna").plan
    assert plan is not None and plan["actions"] == cli["best"]["plan"]["actions"]

    # the job's study keeps its seed, and its best trial is the served plan at the served step
    with db.session() as s:
        stored = JobRepository(s).get(job.id)
    assert job_seed(stored) == DEFAULT_SEED
    study = optuna.load_study(study_name=stored.study_name, storage=db.url)
    assert study.user_attrs["seed"] == DEFAULT_SEED
    assert abs(study.best_trial.value - served.step_ms) < 1e-4
