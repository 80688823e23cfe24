"""Per-model benchmarks spread over the GPUs of one host: one process per GPU, the next model on the first GPU free.

    python -m benchmarks.module_peers --models gpt2,bert_mlm,vit_b_16 --gpus 4 --out DIR

# NOTE [ One model per GPU ]
A per-model benchmark run with ``--gpus N`` (N > 1) starts itself again once per model, as ``--models NAME --gpus 1``
with ``CUDA_VISIBLE_DEVICES`` naming one of the first N visible GPUs, at most one process per GPU at a time; each
child's lines go to standard output behind its model's name. A model's measurements are its own process's on its own
GPU; what the processes share is the host: its CPU cores, its memory bandwidth and its PCIe root complex (offload
over the host link). The cores are split: each GPU's processes are pinned to their own share of the parent's cores
(``core_shares``) and inductor's compile workers limited to that share (``TORCHINDUCTOR_COMPILE_THREADS``): by default
inductor's workers take every core they see, and a model compiling could stall another model's timed steps, which
launch their kernels from one CPU thread. Before the split, on two H200s of one host with another model running on the
other GPU, one MobileNetV2 plan of two compiled regions stepped 29.3, 32.7 and 42.8 ms in three timed runs (predicted
26.2); that the other process's compiling caused the spread is the likeliest reading, not a measured one.
Memory bandwidth and the host link stay shared, and how much they move a row against a run alone has not been
measured. Each child is told how many processes the run started at once (``SHARED_HOST_ENV``) and a row records it.
Stopping the parent (a time limit's SIGTERM, Ctrl-C) stops every child; what each one had saved stays.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, Any

__all__ = ["SHARED_HOST_ENV", "child_argv", "core_shares", "run_across_gpus", "shared_host"]

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


def core_shares(cores: Sequence[int], n: int) -> list[list[int]]:
    """``cores`` split into ``n`` disjoint runs of consecutive entries as even as can be (the first ones one longer),
    each at least one core: the ``n`` GPUs' shares (NOTE [ One model per GPU ]). With fewer cores than ``n`` the shares
    reuse them in turn.

    Raises:
        ValueError: no cores, or ``n`` < 1.
    """
    if not cores or n < 1:
        raise ValueError(f"cannot share {len(cores)} core(s) among {n} GPU(s)")
    ordered = sorted(cores)
    if len(ordered) < n:
        return [[ordered[i % len(ordered)]] for i in range(n)]
    size, extra = divmod(len(ordered), n)
    shares, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        shares.append(ordered[start:end])
        start = end
    return shares


def _start(
    module: str, argv: Sequence[str], model: str, device: str, cores: list[int], shared: int
) -> tuple[subprocess.Popen[str], threading.Thread, str]:
    """One child on ``device``, pinned to ``cores`` (its compile workers inherit the pin), its lines echoed."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device, SHARED_HOST_ENV: str(shared),
           "TORCHINDUCTOR_COMPILE_THREADS": str(len(cores))}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", module, *child_argv(argv, model)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    if hasattr(os, "sched_setaffinity"):  # Linux; before the child imports torch and starts any thread
        os.sched_setaffinity(proc.pid, cores)
    assert proc.stdout is not None
    echo = threading.Thread(target=_echo, args=(proc.stdout, f"[{model} on GPU {device}] "), daemon=True)
    echo.start()
    return proc, echo, model


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
    all_cores = (
        sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    )
    shares = dict(zip(devices[:gpus], core_shares(all_cores, gpus), strict=True))
    running: dict[str, tuple[subprocess.Popen[str], threading.Thread, str]] = {}
    failed = 0

    def stop(*_: Any) -> None:
        raise SystemExit(f"stopped with {len(running)} model(s) running: {', '.join(m for *_, m in running.values())}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        while queue or running:
            for device in devices[:gpus]:
                if device not in running and queue:
                    running[device] = _start(module, argv, queue.pop(0), device, shares[device], min(gpus, len(models)))
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
