"""The latency ceiling of this machine: a bare ASGI app (no FastAPI, no database) under the same load.

    python -m benchmarks.asgi_ceiling [--clients 200] [--seconds 30]

Starts one uvicorn process serving a constant JSON body from ``benchmarks.asgi_ceiling:app`` and loads it
with ``wrk`` exactly as ``benchmarks.service_latency`` loads the best-plan lookup. Whatever latency this shows
is the floor for any Python service on the machine, before routing, validation or a query.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import environment
from benchmarks.service_latency import run_wrk

__all__ = ["app", "main"]

_BODY = b'{"gpu":"h200","step_ms":188.58,"source":"simulated"}'


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A constant JSON answer: the cheapest ASGI endpoint there is."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": _BODY})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--port", type=int, default=8799)
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "uvicorn", "benchmarks.asgi_ceiling:app", "--host", "127.0.0.1",
           "--port", str(args.port), "--log-level", "warning", "--no-access-log"]  # fmt: skip
    server = subprocess.Popen(cmd)
    try:
        time.sleep(2.0)
        r = run_wrk(f"http://127.0.0.1:{args.port}/", args.clients, args.seconds, threads=1)
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(f"environment: {environment()}")
    print("| server | clients | seconds | requests | errors | req/s | p50 ms | p90 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| bare ASGI on uvicorn (1 process) | {args.clients} | {args.seconds:.0f} | {r.requests} | {r.errors} | "
        f"{r.rps:,.0f} | {r.p50_ms:.1f} | {r.p90_ms:.1f} | {r.p99_ms:.1f} |"
    )


if __name__ == "__main__":
    main()
