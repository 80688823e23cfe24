"""``memtune keys create|list|revoke``, ``worker --once`` and ``calibration push|get`` through Typer, on a SQLite data
directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from fastapi.testclient import TestClient
from service_fixtures import SMALL_SPEC
from typer.testing import CliRunner

from memtune.api.cli.cli_service import register
from memtune.api.client import MemtuneClient
from memtune.api.service.main import create_app
from memtune.api.service.model_refs import store_spec_model
from memtune.api.service.settings import Settings
from memtune.storage.database import Database, default_url
from memtune.storage.repositories import JobRepository, KeyRepository


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


def test_calibration_push_and_get(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db: Database, settings: Settings, api_key: str
) -> None:
    """``memtune calibration push FILE`` / ``get KEY`` through the HTTP client (an in-process app here)."""
    import memtune.api.cli.cli_service

    keys: list[str | None] = []

    admin = settings.model_copy(update={"admin_keys": ["tester"]})  # calibrations are written by admin keys

    def in_process(server: str, key: str | None) -> MemtuneClient:
        keys.append(key)
        return MemtuneClient(api_key=key, http=TestClient(create_app(admin, db=db)))

    monkeypatch.setattr(memtune.api.cli.cli_service, "_client", in_process)
    runner, app = CliRunner(), _app()
    file = tmp_path / "calibration-h100.json"
    file.write_text(
        json.dumps(
            {"gpu": "h100", "headroom": 0.2, "source": "memtune calibrate", "copy_gbps": {"d2h": 53.2, "h2d": 54.3}}
        )
    )

    r = runner.invoke(app, ["calibration", "push", str(file), "--api-key", api_key])
    assert r.exit_code == 0, r.output
    assert "stored the calibration of GPU type 'h100' (headroom 0.2)" in r.output and keys == [api_key]
    r = runner.invoke(app, ["calibration", "get", "h100"])
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output)
    assert (shown["origin"], shown["headroom"], shown["data"]["copy_gbps"]["d2h"]) == ("database", 0.2, 53.2)

    r = runner.invoke(app, ["calibration", "push", str(file)])  # no key
    assert r.exit_code == 1 and "401 missing_api_key" in r.output
    r = runner.invoke(app, ["calibration", "get", "a100-80gb"])
    assert r.exit_code == 1 and "404 no_calibration" in r.output
    file.write_text("{not json")
    r = runner.invoke(app, ["calibration", "push", str(file), "--api-key", api_key])
    assert r.exit_code == 2 and "not a readable JSON file" in r.output


def test_serve_runs_its_worker_in_another_process_by_default(tmp_path: Path) -> None:
    from memtune.api.cli.cli_service import serve_plan

    settings = Settings(data_dir=tmp_path, worker_gpus=["h200"])
    plan = serve_plan(settings)
    assert not plan.settings.embedded_worker  # no worker thread in the API process
    assert plan.worker_command is not None
    assert plan.worker_command[1:6] == ["-m", "memtune.api.cli.cli_service", "worker", "--database-url", settings.url()]
    assert plan.worker_command[-2:] == ["--gpu", "h200"]
    threaded = serve_plan(settings, in_process=True)
    assert threaded.settings.embedded_worker and threaded.worker_command is None
    none = serve_plan(settings, worker=False)
    assert not none.settings.embedded_worker and none.worker_command is None


def test_serve_starts_and_stops_the_worker_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import uvicorn

    import memtune.api.cli.cli_service as cli_service

    started: list[object] = []
    real_start = cli_service._start_worker

    def start(command: list[str]) -> object:
        proc = real_start(command)
        started.append(proc)
        return proc

    seen: dict[str, object] = {}

    def fake_run(app: object, **kwargs: object) -> None:
        (proc,) = started
        seen["alive"] = proc.poll() is None  # type: ignore[attr-defined]
        seen["pid"] = proc.pid  # type: ignore[attr-defined]
        seen["embedded"] = app.state.settings.embedded_worker  # type: ignore[attr-defined]

    monkeypatch.setattr(cli_service, "_start_worker", start)
    monkeypatch.setattr(uvicorn, "run", fake_run)
    r = CliRunner().invoke(_app(), ["serve", "--data-dir", str(tmp_path), "--log-level", "warning"])
    assert r.exit_code == 0, r.output
    assert seen["alive"] is True and seen["pid"] != os.getpid() and seen["embedded"] is False
    (proc,) = started
    assert proc.poll() is not None  # type: ignore[attr-defined]  # stopped with the API


@pytest.mark.slow
def test_the_worker_ends_with_serve_when_serve_is_terminated(tmp_path: Path) -> None:
    """SIGTERM to ``memtune serve`` (docker stop, systemd): uvicorn re-raises the signal after its shutdown, so serve
    may die before it stops its worker; the worker watches for serve and stops itself (NOTE [ Worker process ]).
    Every benchmark run of serve had left its worker behind, polling a dropped database."""
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[3]
    cmd = [sys.executable, "-m", "memtune.api.cli.cli_service", "serve", "--port", str(port),
           "--data-dir", str(tmp_path), "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root)}
    serve = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert serve.poll() is None and time.monotonic() < deadline, "memtune serve did not start"
            time.sleep(0.2)
        children = subprocess.run(["pgrep", "-P", str(serve.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) == 1, children  # the worker process
        serve.terminate()
        serve.wait(timeout=40)
        deadline = time.monotonic() + 20
        while Path(f"/proc/{children[0]}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{children[0]}").exists(), "the worker outlived memtune serve"
    finally:
        if serve.poll() is None:
            serve.kill()
