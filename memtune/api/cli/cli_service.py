"""Service commands for the ``memtune`` CLI: ``serve``, ``worker``, ``keys create|list|revoke`` and
``calibration push|get`` (a GPU type's calibration in a running service, through ``memtune.api.client``).

The lead's ``memtune/api/cli/_commands.py`` attaches them with ``register(app)``.
``python -m memtune.api.cli.cli_service …`` runs them standalone (same commands, same options).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # the database's modules load in the commands that use them: `memtune --help` stays quick
    from memtune.api import MemtuneClient
    from memtune.api.service.settings import Settings
    from memtune.storage import Database

__all__ = ["ServePlan", "register", "serve_plan"]

DataDir = Annotated[
    Path | None, typer.Option("--data-dir", help="directory of the default SQLite database [MEMTUNE_DATA_DIR]")
]
DatabaseUrl = Annotated[
    str | None,
    typer.Option("--database-url", help="SQLAlchemy URL, e.g. postgresql://user@host/db [MEMTUNE_DATABASE_URL]"),
]


def _settings(data_dir: Path | None, database_url: str | None, **more: object) -> Settings:
    overrides: dict[str, object] = {k: v for k, v in more.items() if v is not None}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if database_url is not None:
        overrides["database_url"] = database_url
    from memtune.api.service.settings import Settings

    return Settings(**overrides)  # type: ignore[arg-type]


def _database(settings: Settings) -> Database:
    from memtune.storage import Database, StorageError, upgrade

    db = Database(settings.url())
    try:
        upgrade(db)
    except StorageError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    return db


def _allocator_settings() -> None:
    """memtune's caching-allocator settings for measured validation, set before CUDA is initialized.

    Set later, they would reach only segments made from then on (NOTE [ Allocator retries ] in
    ``memtune.tuner.runtime.guard``); ``PYTORCH_CUDA_ALLOC_CONF`` in the environment wins.
    """
    from memtune.tuner.runtime.guard import configure_allocator

    configure_allocator()


@dataclass(frozen=True)
class ServePlan:
    """What ``memtune serve`` starts: the API's settings, and the worker process's command (None: no process).

    ``settings.embedded_worker`` is True only in the in-process mode (``--worker-in-process``), where the worker is
    a thread of the API process.
    """

    settings: Settings
    worker_command: list[str] | None


def serve_plan(settings: Settings, *, worker: bool = True, in_process: bool = False) -> ServePlan:
    """The launch plan of ``memtune serve`` (NOTE [ Worker process ]): by default the API process serves requests
    only and one ``memtune worker`` runs beside it in its own process, on the same database."""
    if not worker:
        return ServePlan(settings.model_copy(update={"embedded_worker": False}), None)
    if in_process:
        return ServePlan(settings.model_copy(update={"embedded_worker": True}), None)
    command = [sys.executable, "-m", "memtune.api.cli.cli_service", "worker", "--database-url", settings.url()]
    for key in settings.worker_gpus:
        command += ["--gpu", key]
    return ServePlan(settings.model_copy(update={"embedded_worker": False}), command)


# NOTE [ Worker process ]
# ``memtune serve`` runs its job worker in a child process (``memtune worker`` on the same database), not as a thread
# of the API process. A search is CPU-bound Python: in one process it holds the GIL against the event loop and the
# request threads, so lookups slowed by an order of magnitude while a job ran, and the job ran slower for sharing
# the interpreter with the API. The worker claims jobs from the database exactly as a ``memtune worker`` on another
# host does; serve migrates the database before starting it, stops it (SIGTERM, then SIGKILL after 30 s) when the
# API stops, and the API answers jobs as before. ``--worker-in-process`` keeps the older single-process mode.
# uvicorn re-raises the SIGTERM it shut down on, so serve can die before its ``finally`` stops the worker; the worker
# therefore also watches for serve (``MEMTUNE_SERVE_PID``) and stops itself when serve is gone (every benchmark run
# of ``memtune serve`` had left its worker polling a dropped database).


#: the pid of the ``memtune serve`` that started a worker, in the worker's environment (NOTE [ Worker process ])
SERVE_PID_ENV = "MEMTUNE_SERVE_PID"


def _start_worker(command: list[str]) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env[SERVE_PID_ENV] = str(os.getpid())
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.Popen(command, env=env)


def _stop_worker(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def serve(
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    worker: Annotated[bool, typer.Option("--worker/--no-worker", help="run one job worker beside the API")] = True,
    worker_in_process: Annotated[
        bool,
        typer.Option(
            "--worker-in-process", help="run the worker as a thread of the API process (default: its own process)"
        ),
    ] = False,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
) -> None:
    """Run the HTTP API (uvicorn) and one job worker in its own process; migrations run on start."""
    import uvicorn

    from memtune.api import create_app

    plan = serve_plan(_settings(data_dir, database_url), worker=worker, in_process=worker_in_process)
    if plan.settings.embedded_worker:
        _allocator_settings()
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(plan.settings)
    supervisor = None
    if plan.worker_command is not None:
        from memtune.api.service.supervisor import WorkerSupervisor

        _database(plan.settings).dispose()  # migrate once, before the two processes open the database
        command = plan.worker_command
        supervisor = WorkerSupervisor(lambda: _start_worker(command), _stop_worker)  # NOTE [ Supervised worker ]
        supervisor.start()
        app.state.worker_supervisor = supervisor
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        if supervisor is not None:
            supervisor.stop()


def worker(
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    gpu: Annotated[list[str] | None, typer.Option("--gpu", help="GPU type key to serve (repeat); default: all")] = None,
    worker_id: Annotated[str | None, typer.Option(help="id recorded on claimed jobs")] = None,
    heartbeat_interval: Annotated[float | None, typer.Option(help="seconds between heartbeats")] = None,
    stale_after: Annotated[float | None, typer.Option(help="seconds before a silent job is reclaimed")] = None,
    poll_interval: Annotated[float | None, typer.Option(help="idle seconds between claims")] = None,
    once: Annotated[bool, typer.Option("--once", help="run at most one job, then exit")] = False,
) -> None:
    """Claim and run tuning jobs from the database until interrupted (SIGINT/SIGTERM)."""
    from memtune.api.service.worker import Worker

    _allocator_settings()

    settings = _settings(
        data_dir,
        database_url,
        worker_gpus=gpu or None,
        heartbeat_interval_s=heartbeat_interval,
        stale_after_s=stale_after,
        poll_interval_s=poll_interval,
    )
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    w = Worker.from_settings(_database(settings), settings, worker_id=worker_id)
    typer.echo(f"worker {w.worker_id} on {settings.url().split('@')[-1]}")
    if once:
        w.run_once()
        return
    done = threading.Event()

    def _graceful(*_: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _graceful)
    signal.signal(signal.SIGINT, _graceful)
    parent = os.environ.get(SERVE_PID_ENV)  # NOTE [ Worker process ]: started by serve, it ends with serve
    w.start()
    while not done.wait(0.5):
        if not w.alive:
            raise typer.Exit(1)
        if parent is not None and str(os.getppid()) != parent:
            logging.getLogger(__name__).warning("memtune serve (pid %s) is gone; stopping its worker", parent)
            break
    w.stop()


keys_app = typer.Typer(help="API keys for write requests (stored hashed; shown once).", no_args_is_help=True)


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option("--name", help="who the key is for (unique)")],
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Create an API key; the key is printed as the last line (it is not stored and cannot be shown again)."""
    from memtune.storage import StorageError
    from memtune.storage.repositories import KeyRepository

    db = _database(_settings(data_dir, database_url))
    try:
        with db.session() as s:
            key, secret = KeyRepository(s).create(name)
    except StorageError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(f"created API key {key.name!r} ({key.prefix}…); store it now, it is not shown again:")
    typer.echo(secret)


@keys_app.command("list")
def keys_list(data_dir: DataDir = None, database_url: DatabaseUrl = None) -> None:
    """List API keys (name, prefix, created, revoked)."""
    from memtune.storage.repositories import KeyRepository

    db = _database(_settings(data_dir, database_url))
    with db.session() as s:
        keys = KeyRepository(s).list_all()
    for k in keys:
        revoked = k.revoked_at.isoformat(timespec="seconds") if k.revoked_at else "-"
        typer.echo(f"{k.name}\t{k.prefix}…\tcreated {k.created_at.isoformat(timespec='seconds')}\trevoked {revoked}")


@keys_app.command("revoke")
def keys_revoke(
    name: Annotated[str, typer.Argument(help="the key's name")],
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Revoke an API key by name; requests with it get 401 from then on."""
    from memtune.storage import StorageError
    from memtune.storage.repositories import KeyRepository

    db = _database(_settings(data_dir, database_url))
    try:
        with db.session() as s:
            key = KeyRepository(s).revoke(name)
    except StorageError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(f"revoked API key {key.name!r}")


calibration_app = typer.Typer(
    help="A GPU type's calibration in a running service: push a `memtune calibrate` file, get the one in use.",
    no_args_is_help=True,
)
Server = Annotated[str, typer.Option("--server", envvar="MEMTUNE_SERVER", help="the service's base URL")]
ApiKeyOption = Annotated[
    str | None, typer.Option("--api-key", envvar="MEMTUNE_API_KEY", help="an API key (`memtune keys create`)")
]


def _client(server: str, api_key: str | None) -> MemtuneClient:
    """The HTTP client of the calibration commands (a test replaces it)."""
    from memtune.api import MemtuneClient

    return MemtuneClient(server, api_key=api_key)


def _call_service(server: str, api_key: str | None, call: Any) -> Any:
    """``call(client)``; an API error or an unreachable server is printed, exit status 1."""
    import httpx

    from memtune.api.client import ApiError

    try:
        with _client(server, api_key) as mt:
            return call(mt)
    except ApiError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    except httpx.TransportError as e:
        typer.echo(f"error: the service at {server} cannot be reached: {e}", err=True)
        raise typer.Exit(1) from e


@calibration_app.command("push")
def calibration_push(
    file: Annotated[Path, typer.Argument(help="a calibration file (`memtune calibrate` writes one)")],
    gpu: Annotated[str | None, typer.Option("--gpu", help="the GPU type (default: the file's 'gpu')")] = None,
    server: Server = "http://127.0.0.1:8000",
    api_key: ApiKeyOption = None,
) -> None:
    """Store a GPU type's calibration in the service (PUT /v1/gpus/{gpu}/calibration): new jobs of that type get
    its headroom, and workers use it from their next job on."""
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        typer.echo(f"error: {file} is not a readable JSON file: {e}", err=True)
        raise typer.Exit(2) from e
    if not isinstance(data, dict):
        typer.echo(f"error: {file} holds no calibration (a JSON object with 'gpu' and 'headroom')", err=True)
        raise typer.Exit(2)
    stored = _call_service(server, api_key, lambda mt: mt.put_calibration(data, gpu=gpu))
    typer.echo(f"stored the calibration of GPU type {stored.gpu!r} (headroom {stored.headroom:g}) at {server}")


@calibration_app.command("get")
def calibration_get(
    gpu: Annotated[str, typer.Argument(help="the GPU type's key (h100)")],
    server: Server = "http://127.0.0.1:8000",
    api_key: ApiKeyOption = None,
) -> None:
    """Print the calibration the service uses for a GPU type, and where it found it (origin), as JSON."""
    found = _call_service(server, api_key, lambda mt: mt.calibration(gpu))
    typer.echo(found.model_dump_json(indent=1))


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``worker`` and the ``keys`` and ``calibration`` groups to the ``memtune`` Typer app."""
    app.command("serve")(serve)
    app.command("worker")(worker)
    app.add_typer(keys_app, name="keys")
    app.add_typer(calibration_app, name="calibration")


if __name__ == "__main__":
    _app = typer.Typer(help="memtune service commands", no_args_is_help=True)
    register(_app)
    _app()
