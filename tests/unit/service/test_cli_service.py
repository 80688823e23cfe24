"""``memtune keys create|list|revoke`` and ``worker --once`` through Typer, on a SQLite data directory."""

from __future__ import annotations

from pathlib import Path

import typer
from service_fixtures import SMALL_SPEC
from typer.testing import CliRunner

from api.cli_service import register
from api.model_refs import store_spec_model
from storage.database import Database, default_url
from storage.repositories import JobRepository, KeyRepository


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """memtune (test root)"""

    register(app)
    return app


def test_keys_create_list_revoke(tmp_path: Path) -> None:
    runner = CliRunner()
    app = _app()
    r = runner.invoke(app, ["keys", "create", "--name", "ci", "--data-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    secret = r.output.strip().splitlines()[-1]
    assert secret.startswith("mtk_")
    db = Database(default_url(tmp_path))
    with db.session() as s:
        assert KeyRepository(s).authenticate(secret) is not None
    r = runner.invoke(app, ["keys", "create", "--name", "ci", "--data-dir", str(tmp_path)])
    assert r.exit_code == 1 and "exists" in r.output
    r = runner.invoke(app, ["keys", "list", "--data-dir", str(tmp_path)])
    assert r.exit_code == 0 and r.output.startswith("ci\t") and secret not in r.output
    r = runner.invoke(app, ["keys", "revoke", "ci", "--data-dir", str(tmp_path)])
    assert r.exit_code == 0
    with db.session() as s:
        assert KeyRepository(s).authenticate(secret) is None
    r = runner.invoke(app, ["keys", "revoke", "nobody", "--data-dir", str(tmp_path)])
    assert r.exit_code == 1 and "no API key named" in r.output


def test_worker_once_runs_a_job(tmp_path: Path) -> None:
    runner = CliRunner()
    app = _app()
    assert runner.invoke(app, ["keys", "list", "--data-dir", str(tmp_path)]).exit_code == 0  # migrates
    db = Database(default_url(tmp_path))
    with db.session() as s:
        model, _ = store_spec_model(s, SMALL_SPEC)
        job, _ = JobRepository(s).create(
            model_id=model.id,
            gpu_key="h100",
            batch=4,
            dtype="float32",
            budget_text="1GiB",
            budget_bytes=1 << 30,
            trials=8,
            mode="pareto",
            optimizer="adam",
            owner="cli",
            request_hash="x",
        )
    r = runner.invoke(app, ["worker", "--once", "--data-dir", str(tmp_path), "--worker-id", "cli-w"])
    assert r.exit_code == 0, r.output
    with db.session() as s:
        done = JobRepository(s).get(job.id)
    assert done.state == "succeeded" and done.worker_id == "cli-w" and done.trials_done == 8
