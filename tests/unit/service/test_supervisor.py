"""NOTE [ Supervised worker ]: a worker process that dies is reaped, started again after a back-off, given up on
loudly after too many exits, and ``/healthz`` says so (503 ``degraded`` while it is not up)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from memtune.api.service.supervisor import WorkerSupervisor


def _sleeper(seconds: float) -> Callable[[], subprocess.Popen[bytes]]:
    return lambda: subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def _until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_killed_worker_is_reaped_and_started_again(caplog: pytest.LogCaptureFixture) -> None:
    sup = WorkerSupervisor(_sleeper(60), _stop, backoff_s=(0.1,), poll_s=0.05)
    sup.start()
    try:
        first = sup.pid
        assert first is not None and sup.state == "up"
        with caplog.at_level(logging.ERROR, logger="memtune.api.service.supervisor"):
            os.kill(first, signal.SIGKILL)
            _until(lambda: sup.restarts == 1 and sup.state == "up")
        assert sup.pid != first
        assert any("exited with code -9" in r.getMessage() for r in caplog.records)
        with pytest.raises(ChildProcessError):  # reaped: no zombie left behind
            os.waitpid(first, os.WNOHANG)
    finally:
        sup.stop()


def test_a_worker_that_keeps_dying_is_given_up_loudly(caplog: pytest.LogCaptureFixture) -> None:
    sup = WorkerSupervisor(_sleeper(0), _stop, backoff_s=(0.05,), max_restarts=3, window_s=60, poll_s=0.05)
    with caplog.at_level(logging.ERROR, logger="memtune.api.service.supervisor"):
        sup.start()
        _until(lambda: sup.state == "down")
    sup.stop()
    assert sup.restarts == 2
    assert any(r.levelno == logging.CRITICAL and "not starting it again" in r.getMessage() for r in caplog.records)


def test_healthz_is_degraded_while_the_worker_is_not_up(http: TestClient) -> None:
    class _Down:
        state = "down"

    http.app.state.worker_supervisor = _Down()  # type: ignore[attr-defined]
    r = http.get("/healthz")
    assert (r.status_code, r.json()["status"], r.json()["worker"]) == (503, "degraded", "down")
    _Down.state = "restarting"
    assert http.get("/healthz").status_code == 503
    _Down.state = "up"
    r = http.get("/healthz")
    assert (r.status_code, r.json()["worker"]) == (200, "up")
