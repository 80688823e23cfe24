"""Time from ``POST /v1/jobs`` to a finished 300-trial VGG-16 job, through ``memtune serve``.

    python -m benchmarks.job_time [--runs 3] [--trials 300] [--backend sqlite --backend postgresql]

For each backend a fresh database is made (SQLite in a temporary directory; PostgreSQL on
``MEMTUNE_TEST_PG``'s server, dropped afterwards), ``memtune serve`` (API + its in-process worker) is
started on loopback, and a job for VGG-16, batch 256, float32, h200, 18 GiB is posted ``--runs`` times
(each run a new job: the budget differs by one byte so no result is reused); the clock stops when
``GET /v1/jobs/{id}`` reports a terminal state. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from uuid import uuid4

import httpx

from benchmarks.common import environment

__all__ = ["main", "time_job"]

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("MEMTUNE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
BUDGET = 18 << 30


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _key(url: str) -> str:
    from memtune.storage import Database, upgrade
    from memtune.storage.repositories import KeyRepository

    db = Database(url)
    upgrade(db)
    with db.session() as s:
        _, secret = KeyRepository(s).create(f"bench-{uuid4().hex[:6]}")
    db.dispose()
    return secret


def time_job(base: str, key: str, trials: int, budget_bytes: int) -> tuple[float, float, dict[str, object]]:
    """Post one job and poll it to the end; (seconds POST→finished, seconds the worker ran it, the job)."""
    body = {"model": {"zoo": "vgg16"}, "batch": 256, "gpu": "h200", "budget": f"{budget_bytes}B", "trials": trials}
    with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {key}"}) as c:
        t0 = time.perf_counter()
        r = c.post("/v1/jobs", json=body)
        r.raise_for_status()
        job_id = r.json()["id"]
        while True:
            job = c.get(f"/v1/jobs/{job_id}").json()
            if job["state"] in ("succeeded", "failed", "cancelled"):
                wall = time.perf_counter() - t0
                break
            time.sleep(0.05)
    from datetime import datetime

    ran = (datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"])).total_seconds()
    return wall, ran, job


def time_cli(trials: int, budget_bytes: int) -> float:
    """Seconds ``memtune tune`` takes for the job's search (same model, budget, trials and seed) in a fresh process."""
    cmd = [sys.executable, "-m", "memtune.api", "tune", "vgg16", "--batch", "256", "--gpu", "h200",
           "--budget", f"{budget_bytes}B", "--trials", str(trials), "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def _run_backend(backend: str, runs: int, trials: int) -> tuple[list[float], list[float], dict[str, object]]:
    tmp = Path(tempfile.mkdtemp(prefix="memtune-jobtime-"))
    dbname = None
    if backend == "sqlite":
        url = f"sqlite:///{tmp / 'memtune.db'}"
    else:
        import psycopg

        dbname = f"memtune_bench_{uuid4().hex[:10]}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')
        url = f"{PG_ADMIN.rsplit('/', 1)[0]}/{dbname}"
    port = _free_port()
    log = tmp / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEMTUNE_POLL_INTERVAL_S": "0.1"}
    cmd = [sys.executable, "-m", "memtune.api.cli.cli_service", "serve", "--port", str(port), "--database-url", url]
    out = log.open("wb")
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        key = _key(url)
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"memtune serve did not become healthy:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        walls: list[float] = []
        rans: list[float] = []
        job: dict[str, object] = {}
        for i in range(runs):
            wall, ran, job = time_job(base, key, trials, BUDGET + i)
            if job["state"] != "succeeded":
                raise RuntimeError(f"job ended {job['state']}: {job.get('error')}")
            walls.append(wall)
            rans.append(ran)
        return walls, rans, job
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if dbname is not None:
            import psycopg

            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--backend", action="append", choices=["sqlite", "postgresql"], default=None)
    args = ap.parse_args()
    rows = []
    cli = statistics.median(time_cli(args.trials, BUDGET) for _ in range(args.runs))
    for backend in args.backend or ["sqlite", "postgresql"]:
        walls, rans, job = _run_backend(backend, args.runs, args.trials)
        rows.append((backend, walls, rans, job))
    print(f"environment: {environment()}")
    print(f"command: `python -m benchmarks.job_time {' '.join(sys.argv[1:])}`")
    print(f"`memtune tune` of the same search in a fresh process: {cli:.1f} s (median of {args.runs})")
    print()
    print(
        "| database | job | runs | POST → succeeded, s (median) | min | max | worker ran it, s (median) | "
        "× the command line | best |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for backend, walls, rans, job in rows:
        best = job["progress"]["best"]  # type: ignore[index]
        best_text = f"{best['step_ms']:.1f} ms, {best['peak_bytes'] / 2**30:.2f} GiB" if best else "none fits"
        print(
            f"| {backend} | VGG-16, batch 256, h200, 18 GiB, {args.trials} trials | {len(walls)} | "
            f"{statistics.median(walls):.1f} | {min(walls):.1f} | {max(walls):.1f} | "
            f"{statistics.median(rans):.1f} | {statistics.median(walls) / cli:.2f} | {best_text} |"
        )


if __name__ == "__main__":
    main()
