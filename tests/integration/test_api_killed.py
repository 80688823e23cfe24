"""The API process SIGKILLed while clients write: every job it answered 202 for is there after a restart on the same
PostgreSQL database, whole (its model, budget and state readable), and nothing half-written breaks a read."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from live_server import create_key, free_port, spawn

from memtune.api.client import MemtuneClient

pytestmark = pytest.mark.integration

#: per-key job limits out of the way: this test writes as fast as it can
UNLIMITED = {"MEMTUNE_MAX_ACTIVE_JOBS_PER_KEY": "100000", "MEMTUNE_MAX_JOBS_PER_HOUR_PER_KEY": "100000"}


def _serve(database_url: str, log: Path) -> tuple[object, str]:
    port = free_port()
    args = ["serve", "--host", "127.0.0.1", "--port", str(port), "--database-url", database_url, "--no-worker"]
    proc = spawn(args, log, **UNLIMITED)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code in (200, 503):
                return proc, base
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def test_every_answered_write_survives_a_killed_api(postgres_url: str, tmp_path: Path) -> None:
    key = create_key(postgres_url)
    proc, base = _serve(postgres_url, tmp_path / "first.log")
    answered: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=5) as client:
            while not stop.is_set():
                body = {"model": {"zoo": "vgg16"}, "batch": 8, "gpu": "h100", "budget": "2GiB", "trials": 10}
                try:
                    r = client.post("/v1/jobs", json=body)
                except httpx.TransportError:  # the API is gone
                    return
                if r.status_code == 202:
                    answered.append(r.json()["id"])

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(answered) < 40:
        assert time.monotonic() < deadline, f"only {len(answered)} jobs answered in 60 s"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
    proc.wait()  # type: ignore[attr-defined]
    stop.set()
    for t in threads:
        t.join(timeout=10)

    again, base = _serve(postgres_url, tmp_path / "second.log")
    try:
        with MemtuneClient(base, api_key=key, timeout_s=30) as mt:
            for job_id in answered:
                job = mt.get_job(job_id)
                assert job.state == "queued" and job.batch == 8, job
            listed = {j.id for j in mt.list_jobs(limit=500).data}
            assert set(answered) <= listed
    finally:
        again.terminate()  # type: ignore[attr-defined]
        again.wait(timeout=20)  # type: ignore[attr-defined]
