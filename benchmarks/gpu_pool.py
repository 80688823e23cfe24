"""Per-model benchmarks spread over the GPUs of one host: one process per GPU, the next model on the first GPU free.

    python -m benchmarks.module_peers --models gpt2,bert_mlm,vit_b_16 --gpus 4 --out DIR

# NOTE [ One model per GPU ]
A per-model benchmark run with ``--gpus N`` (N > 1) starts itself again once per model, as ``--models NAME --gpus 1``
with ``CUDA_VISIBLE_DEVICES`` naming one of the first N visible GPUs, at most one process per GPU at a time; each
child's lines go to standard output behind its model's name. A model's measurements are its own process's on its own
GPU; what the processes share is the host: its CPU cores (compiling, the search's worker processes), its memory
bandwidth and its PCIe root complex (offload over the host link). How much that moves a row's numbers against a run
alone has not been measured. Each child
is told how many processes the run started at once (``SHARED_HOST_ENV``) and a row records it. Stopping the parent
(a time limit's SIGTERM, Ctrl-C) stops every child; what each one had saved stays.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any

__all__ = ["SHARED_HOST_ENV", "child_argv", "run_across_gpus", "shared_host"]

#: the environment variable that tells a child how many processes of one run share its host
SHARED_HOST_ENV = "MEMTUNE_BENCH_PROCESSES"


def shared_host() -> int:
    """How many processes of this run share the host, one per GPU (1 for a run alone)."""
    return int(os.environ.get(SHARED_HOST_ENV, "1"))


def child_argv(argv: Sequence[str], model: str) -> list[str]:
    """``argv`` (a benchmark's options) for one child: ``--models`` set to ``model`` and ``--gpus`` to 1."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--models", "--gpus"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return [*out, "--models", model, "--gpus", "1"]


def _echo(stream: IO[str], prefix: str) -> None:
    for line in stream:
        print(f"{prefix}{line}", end="", flush=True)


def run_across_gpus(module: str, models: Sequence[str], argv: Sequence[str], gpus: int) -> int:
    """Run ``python -m module`` once per model of ``models`` (NOTE [ One model per GPU ]) on ``gpus`` GPUs; returns
    how many children exited with an error. ``argv`` is the parent's options (``child_argv`` rewrites them)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [d for d in visible.split(",") if d.strip()] if visible else [str(i) for i in range(gpus)]
    if len(devices) < gpus:
        raise SystemExit(f"--gpus {gpus}: CUDA_VISIBLE_DEVICES names only {len(devices)}")
    queue = list(models)
    running: dict[str, tuple[subprocess.Popen[str], threading.Thread, str]] = {}
    failed = 0

    def stop(*_: Any) -> None:
        raise SystemExit(f"stopped with {len(running)} model(s) running: {', '.join(m for *_, m in running.values())}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        while queue or running:
            for device in devices[:gpus]:
                if device not in running and queue:
                    model = queue.pop(0)
                    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device, SHARED_HOST_ENV: str(min(gpus, len(models)))}
                    proc = subprocess.Popen([sys.executable, "-m", module, *child_argv(argv, model)], env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
                    assert proc.stdout is not None
                    prefix = f"[{model} on GPU {device}] "
                    echo = threading.Thread(target=_echo, args=(proc.stdout, prefix), daemon=True)
                    echo.start()
                    running[device] = (proc, echo, model)
            for device, (proc, echo, _) in list(running.items()):
                try:
                    code = proc.wait(timeout=1.0 / max(len(running), 1))
                except subprocess.TimeoutExpired:
                    continue
                echo.join()
                failed += code != 0
                del running[device]
    finally:
        signal.signal(signal.SIGTERM, previous)
        for proc, _, _ in running.values():
            proc.terminate()
        for proc, _, _ in running.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return failed
