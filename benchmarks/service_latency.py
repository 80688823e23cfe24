"""Best-plan lookup latency under load: ``GET /v1/gpus/h200/best?model=vgg16&batch=256&budget=18GiB``.

    python -m benchmarks.service_latency [--clients 200] [--duration 60] [--workers 2] [--database-url URL]

Against PostgreSQL (a fresh database on ``MEMTUNE_TEST_PG``'s server, dropped afterwards, unless
``--database-url`` is given). The database is seeded by a real tuning job (VGG-16, batch 256, 18 GiB,
``--seed-trials`` trials, run in this process by a ``Worker``), the API is started as
``uvicorn --factory memtune.api.service.main:create_app`` with ``--workers`` processes, and ``--clients`` connections
ask for the best plan back to back (closed loop) for ``--duration`` seconds after a warm-up. The load comes
from ``wrk`` when it is installed (Debian: ``apt-get install wrk``), else from an ``httpx.AsyncClient``
in this process (which then competes with the server for the same cores). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx

from benchmarks.common import environment

__all__ = ["LoadResult", "fresh_postgres", "main", "run_httpx", "run_wrk"]

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("MEMTUNE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PATH = "/v1/gpus/h200/best?model=vgg16&batch=256&budget=18GiB"


@dataclass(frozen=True)
class LoadResult:
    """Latencies (ms) and counts of one load run. ``errors`` counts failed requests, timeouts among them;
    ``timeouts`` those that had no answer within the load tool's timeout (left out of the percentiles)."""

    tool: str
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    timeouts: int = 0

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def _pct(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


async def _httpx_load(url: str, clients: int, duration_s: float, rate: float) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        start = time.perf_counter()
        deadline = start + duration_s

        async def one_client(k: int) -> None:
            nonlocal errors
            period = 1.0 / rate if rate > 0 else 0.0
            next_at = start + period * k / clients  # paced clients are spread evenly over one period
            while time.perf_counter() < deadline:
                if period:
                    await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                    next_at += period
                t0 = time.perf_counter()
                try:
                    r = await client.get(url)
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    latencies.append((time.perf_counter() - t0) * 1000)
                else:
                    errors += 1

        await asyncio.gather(*(one_client(k) for k in range(clients)))
        return latencies, errors, time.perf_counter() - start


def run_httpx(url: str, clients: int, duration_s: float, rate: float = 0.0) -> LoadResult:
    """Load from ``clients`` concurrent tasks of one ``httpx.AsyncClient``: back to back (``rate`` 0, closed
    loop) or each client sending ``rate`` requests per second on a fixed schedule."""
    lat, errors, seconds = asyncio.run(_httpx_load(url, clients, duration_s, rate))
    lat.sort()
    return LoadResult("httpx", len(lat) + errors, errors, seconds, _pct(lat, 0.5), _pct(lat, 0.9), _pct(lat, 0.99))


def _wrk_ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if m is None:
        raise ValueError(f"cannot read wrk latency {text!r}")
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def run_wrk(url: str, clients: int, duration_s: float, threads: int = 2, timeout_s: float = 10.0) -> LoadResult:
    """Closed-loop load from ``wrk -c clients`` (``--latency`` percentiles); a request unanswered after
    ``timeout_s`` counts as a timeout (wrk's own default is 2 s)."""
    wrk = shutil.which("wrk")
    assert wrk is not None
    out = subprocess.run(
        [
            wrk,
            f"-t{threads}",
            f"-c{clients}",
            f"-d{int(duration_s)}s",
            "--timeout",
            f"{timeout_s:g}s",
            "--latency",
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pct = {m.group(1): _wrk_ms(m.group(2)) for m in re.finditer(r"^\s+(50|90|99)%\s+(\S+)", out, re.M)}
    requests = int(re.search(r"(\d+) requests in ([\d.]+)(\w+)", out).group(1))  # type: ignore[union-attr]
    errors = timeouts = 0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errors += int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errors += sum(int(g) for g in m.groups())
        timeouts = int(m.group(4))
    return LoadResult("wrk", requests, errors, duration_s, pct["50"], pct["90"], pct["99"], timeouts)


def _seed(url: str, trials: int) -> None:
    """A real tuned job for VGG-16 batch 256 at 18 GiB on h200, so that the lookup has rows to find."""
    from memtune.api.service.model_refs import store_zoo_model
    from memtune.api.service.worker import Worker
    from memtune.storage import Database, upgrade
    from memtune.storage.repositories import JobRepository

    db = Database(url)
    upgrade(db)
    with db.session() as s:
        model, _ = store_zoo_model(s, "vgg16", None)
        JobRepository(s).create(
            model_id=model.id,
            gpu_key="h200",
            batch=256,
            dtype="float32",
            budget_text="18GiB",
            budget_bytes=18 << 30,
            trials=trials,
            mode="fastest",
            optimizer="sgd",
            owner="bench",
            request_hash=uuid4().hex,
            idempotency_key=None,
        )
    Worker(db, worker_id="bench-seed").run_once()
    db.dispose()


@contextmanager
def fresh_postgres() -> Iterator[str]:
    """A new, empty database on ``MEMTUNE_TEST_PG``'s server, as a SQLAlchemy URL; dropped afterwards."""
    import psycopg

    from memtune.storage import normalize_url

    dbname = f"memtune_bench_{uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield normalize_url(f"{PG_ADMIN.rsplit('/', 1)[0]}/{dbname}")
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(url: str, workers: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "MEMTUNE_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "memtune.api.service.main:create_app", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--workers", str(workers), "--log-level", "warning", "--no-access-log"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server not healthy after 60 s: {log.read_text()[-2000:]}")


def _measure(url: str, args: argparse.Namespace, tool: str) -> tuple[LoadResult, list[float], dict[str, Any]]:
    """Seed ``url``, serve it, load the lookup and time it from one client; (load, one-client ms, the answer)."""
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"memtune-bench-{os.getpid()}.log"
    proc = None
    try:
        _seed(url, args.seed_trials)
        proc, base = _serve(url, args.workers, log)
        first = httpx.get(base + PATH, timeout=10)
        first.raise_for_status()
        answer = first.json()
        if tool == "wrk":
            run_wrk(base + PATH, args.clients, args.warmup)
            res = run_wrk(base + PATH, args.clients, args.duration)
        else:
            run_httpx(base + PATH, args.clients, args.warmup, args.rate)
            res = run_httpx(base + PATH, args.clients, args.duration, args.rate)
        single = []
        with httpx.Client(base_url=base, timeout=10) as c:
            for _ in range(300):
                t0 = time.perf_counter()
                c.get(PATH).raise_for_status()
                single.append((time.perf_counter() - t0) * 1000)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    return res, single, answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=200, help="concurrent connections")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of measured load")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of load before measuring")
    # NOTE: with --workers > 1 uvicorn 0.54 passes a listening socket whose proto is 0, so asyncio never sets
    # TCP_NODELAY and every keep-alive response waits ~40 ms for a delayed ACK (Kludex/uvicorn#3149).
    ap.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (see the NOTE above)")
    ap.add_argument("--seed-trials", type=int, default=100, help="trials of the seeding job")
    ap.add_argument("--tool", choices=["auto", "wrk", "httpx"], default="auto")
    ap.add_argument("--rate", type=float, default=0.0, help="requests/s per client (httpx); 0: back to back")
    ap.add_argument("--database-url", default=None, help="use this database instead of a fresh PostgreSQL one")
    args = ap.parse_args()
    tool = args.tool if args.tool != "auto" else ("wrk" if shutil.which("wrk") and not args.rate else "httpx")
    if tool == "wrk" and args.rate:
        ap.error("--rate needs --tool httpx (wrk has no fixed-rate mode)")

    from memtune.storage import normalize_url

    with ExitStack() as stack:
        url = normalize_url(args.database_url) if args.database_url else stack.enter_context(fresh_postgres())
        res, single, answer = _measure(url, args, tool)
    backend = url.split("://", 1)[0]
    print(f"environment: {environment()}, {backend}, uvicorn workers {args.workers}, load from {tool}")
    print(f"command: `python -m benchmarks.service_latency {' '.join(sys.argv[1:])}`")
    print(f"answer: {answer['name']} {answer['step_ms']:.1f} ms, {answer['peak_bytes'] / 2**30:.2f} GiB")
    print()
    load = f"{args.rate:g} req/s each" if args.rate else "back to back"
    print("| request | clients | load | seconds | requests | errors | timeouts | req/s | p50 ms | p90 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| `GET {PATH}` | {args.clients} | {load} | {res.seconds:.0f} | {res.requests} | {res.errors} | "
        f"{res.timeouts} | {res.rps:.0f} | {res.p50_ms:.1f} | {res.p90_ms:.1f} | {res.p99_ms:.1f} |"
    )
    single.sort()
    print(
        f"| same, one client, 300 requests | 1 | back to back | - | 300 | 0 | 0 | - | "
        f"{statistics.median(single):.2f} | {_pct(single, 0.9):.2f} | {_pct(single, 0.99):.2f} |"
    )


if __name__ == "__main__":
    main()
