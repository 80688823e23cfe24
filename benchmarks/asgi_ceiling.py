"""The lookups against the latency ceiling of this machine: the service and a bare ASGI app, alternated in one run.

    python -m benchmarks.asgi_ceiling [--runs 6] [--seconds 10] [--clients 200] [--databases sqlite,postgresql]

A bare ASGI app (``benchmarks.asgi_ceiling:app``: no FastAPI, no database, a constant JSON body) is the floor for
any Python service on the machine. The service (``uvicorn --factory memtune.api.service.main:create_app``, one process)
runs on a fresh SQLite database and on a fresh PostgreSQL one (on ``MEMTUNE_TEST_PG``'s server, dropped afterwards),
each seeded by a real VGG-16 job. All servers stay up for the whole run; each run loads, per database, the bare app,
then ``GET /v1/gpus/h200/best`` and ``GET /v1/leaderboard`` of that database's service, with ``wrk`` (Debian:
``apt-get install wrk``), one wrk thread, ``--clients`` connections back to back for ``--seconds`` after a
``--warmup``, and a request unanswered after ``--timeout`` seconds (wrk's default, 2) counted as a timeout. Each
lookup's p50 and p99 are given as ratios of the bare app's in the load just before it, so that other work on shared
cores moves both alike. Prints every load, then per database and lookup the worst and the median ratio over the
runs, how many runs kept the p99 within ``--target`` times the bare app's, and the timeouts.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import environment
from benchmarks.service_latency import PATH, ROOT, LoadResult, _free_port, _seed, _serve, fresh_postgres, run_wrk

__all__ = ["LEADERBOARD", "app", "main"]

_BODY = b'{"gpu":"h200","step_ms":188.58,"source":"simulated"}'
LEADERBOARD = "/v1/leaderboard?gpu=h200&page_size=50"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A constant JSON answer: the cheapest ASGI endpoint there is."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": _BODY})


@dataclass(frozen=True)
class Load:
    """One load of one server in one run, with the bare app's load just before it."""

    run: int
    database: str
    server: str
    result: LoadResult
    bare: LoadResult

    @property
    def p50_ratio(self) -> float:
        return self.result.p50_ms / self.bare.p50_ms

    @property
    def p99_ratio(self) -> float:
        return self.result.p99_ms / self.bare.p99_ms


def _bare_server(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "uvicorn", "benchmarks.asgi_ceiling:app", "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning", "--no-access-log"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(base + "/", timeout=1).raise_for_status()
            return proc, base
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the bare ASGI app did not start: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _fmt(r: LoadResult) -> str:
    return f"{r.requests} | {r.timeouts} | {r.errors - r.timeouts} | {r.rps:,.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=6, help="rounds of loads (bare app, then each lookup, per database)")
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds of measured load")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each measured one")
    ap.add_argument("--clients", type=int, default=200, help="concurrent connections")
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds after which wrk counts a request timed out")
    ap.add_argument("--databases", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    ap.add_argument("--seed-trials", type=int, default=30, help="trials of the VGG-16 job that seeds each database")
    ap.add_argument("--target", type=float, default=3.0, help="the p99 ratio each run should stay within")
    args = ap.parse_args()
    databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    if not databases or set(databases) - {"sqlite", "postgresql"}:
        ap.error(f"--databases: sqlite and/or postgresql, not {args.databases!r}")

    def load(url: str) -> LoadResult:
        run_wrk(url, args.clients, args.warmup, threads=1, timeout_s=args.timeout)
        return run_wrk(url, args.clients, args.seconds, threads=1, timeout_s=args.timeout)

    loads: list[Load] = []
    tmp = Path(tempfile.mkdtemp(prefix="memtune-asgi-"))
    with ExitStack() as stack:
        bare_proc, bare = _bare_server(tmp / "bare.log")
        stack.callback(_stop, bare_proc)
        services: dict[str, str] = {}
        for db in databases:
            url = f"sqlite:///{tmp / 'memtune.db'}" if db == "sqlite" else stack.enter_context(fresh_postgres())
            _seed(url, args.seed_trials)
            proc, base = _serve(url, 1, tmp / f"serve-{db}.log")
            stack.callback(_stop, proc)
            for path in (PATH, LEADERBOARD):
                httpx.get(base + path, timeout=10).raise_for_status()
            services[db] = base
        for run in range(1, args.runs + 1):
            for db, base in services.items():
                floor = load(bare + "/")
                loads.append(Load(run, db, "bare ASGI", floor, floor))
                for name, path in (("`/best`", PATH), ("`/leaderboard`", LEADERBOARD)):
                    loads.append(Load(run, db, name, load(base + path), floor))
                    print(f"run {run} {db} {name}: p99 {loads[-1].p99_ratio:.2f}x bare", file=sys.stderr, flush=True)

    print(f"environment: {environment()}, load from wrk (1 thread), uvicorn 1 process each, all servers up at once")
    print(f"command: `python -m benchmarks.asgi_ceiling {' '.join(sys.argv[1:])}`")
    print(f"lookups: `GET {PATH}`, `GET {LEADERBOARD}`")
    print()
    print(f"| database | lookup | runs | p99 vs bare, worst | median | runs within {args.target:g}x | timeouts | "
          "p50 vs bare, median | bare p99 ms, median |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for db in databases:
        for name in ("`/best`", "`/leaderboard`"):
            mine = [x for x in loads if x.database == db and x.server == name]
            p99 = [x.p99_ratio for x in mine]
            within = sum(r <= args.target and x.result.timeouts == 0 for r, x in zip(p99, mine, strict=True))
            print(
                f"| {db} | {name} | {len(mine)} | {max(p99):.2f} | {statistics.median(p99):.2f} | {within} | "
                f"{sum(x.result.timeouts for x in mine)} | {statistics.median(x.p50_ratio for x in mine):.2f} | "
                f"{statistics.median(x.bare.p99_ms for x in mine):.1f} |"
            )
    print()
    print(f"{args.clients} connections, {args.seconds:g} s each; timeouts: no answer within {args.timeout:g} s")
    print()
    print("| run | database | server | requests | timeouts | other errors | req/s | p50 ms | p99 ms | p50 vs bare "
          "| p99 vs bare |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for x in loads:
        print(f"| {x.run} | {x.database} | {x.server} | {_fmt(x.result)} | {x.p50_ratio:.2f} | {x.p99_ratio:.2f} |")


if __name__ == "__main__":
    main()
