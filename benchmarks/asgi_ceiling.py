"""The lookups against the latency ceiling of this machine, in one run: the service and a bare ASGI app.

    python -m benchmarks.asgi_ceiling [--clients 200] [--seconds 30] [--seed-trials 30] [--database-url URL]

A bare ASGI app (``benchmarks.asgi_ceiling:app``: no FastAPI, no database, a constant JSON body) is the floor for
any Python service on the machine. The service (``uvicorn --factory api.main:create_app``, one process, on a SQLite
database seeded by a real VGG-16 job, or on ``--database-url``) is loaded the same way for each lookup
(``GET /v1/gpus/h200/best``, ``GET /v1/leaderboard``), with ``wrk`` (Debian: ``apt-get install wrk``), one wrk
thread, ``--clients`` connections back to back. Prints req/s and latency percentiles of each, and each lookup's
req/s and p99 as ratios of the bare app's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import environment
from benchmarks.service_latency import PATH, LoadResult, _seed, _serve, run_wrk

__all__ = ["app", "main"]

_BODY = b'{"gpu":"h200","step_ms":188.58,"source":"simulated"}'


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A constant JSON answer: the cheapest ASGI endpoint there is."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": _BODY})


def _bare(port: int, clients: int, seconds: float) -> LoadResult:
    cmd = [sys.executable, "-m", "uvicorn", "benchmarks.asgi_ceiling:app", "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning", "--no-access-log"]  # fmt: skip
    server = subprocess.Popen(cmd)
    try:
        time.sleep(2.0)
        run_wrk(f"http://127.0.0.1:{port}/", clients, 2, threads=1)  # warm-up
        return run_wrk(f"http://127.0.0.1:{port}/", clients, seconds, threads=1)
    finally:
        server.terminate()
        server.wait(timeout=10)


LEADERBOARD = "/v1/leaderboard?gpu=h200&page_size=50"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--port", type=int, default=8799)
    ap.add_argument("--seed-trials", type=int, default=30, help="trials of the VGG-16 job that seeds the database")
    ap.add_argument("--database-url", default=None, help="an already seeded database (default: a fresh SQLite one)")
    ap.add_argument("--bare-only", action="store_true", help="load the bare ASGI app only")
    args = ap.parse_args()
    bare = _bare(args.port, args.clients, args.seconds)
    rows: list[tuple[str, LoadResult]] = [("bare ASGI on uvicorn (1 process)", bare)]
    if not args.bare_only:
        import httpx

        tmp = Path(tempfile.mkdtemp(prefix="memtune-asgi-"))
        url = args.database_url or f"sqlite:///{tmp / 'memtune.db'}"
        if args.database_url is None:
            _seed(url, args.seed_trials)
        proc, base = _serve(url, 1, tmp / "serve.log")
        try:
            for path in (PATH, LEADERBOARD):
                httpx.get(base + path, timeout=10).raise_for_status()
                run_wrk(base + path, args.clients, 2, threads=1)  # warm-up
                rows.append((f"`GET {path}`", run_wrk(base + path, args.clients, args.seconds, threads=1)))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        rows.append(("bare ASGI again", _bare(args.port, args.clients, args.seconds)))
    ttl = os.environ.get("MEMTUNE_LOOKUP_CACHE_TTL_S", "1 (default)")
    print(f"environment: {environment()}, load from wrk (1 thread), lookup cache TTL {ttl} s")
    print(f"command: `python -m benchmarks.asgi_ceiling {' '.join(sys.argv[1:])}`")
    print()
    print(
        "| server | clients | seconds | requests | errors | req/s | p50 ms | p90 ms | p99 ms "
        + "| req/s vs bare | p99 vs bare |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(
            f"| {name} | {args.clients} | {args.seconds:.0f} | {r.requests} | {r.errors} | {r.rps:,.0f} | "
            f"{r.p50_ms:.1f} | {r.p90_ms:.1f} | {r.p99_ms:.1f} | "
            f"{r.rps / bare.rps:.2f} | {r.p99_ms / bare.p99_ms:.2f} |"
        )


if __name__ == "__main__":
    main()
