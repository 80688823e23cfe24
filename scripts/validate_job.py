"""Run tuning jobs with measured validation through the service, on this machine's GPU, and report them.

For each ``model:batch:dtype:frac`` configuration (``scripts/configs.py``; the budget is ``frac`` of the
unconstrained simulated peak) a job is submitted to an in-process app on a fresh SQLite database and run by a
``Worker`` with the real validator: the Optuna search, then its top ``--top-k`` plans and, where the best
chooses cuDNN algorithms, the best plan without algorithm choice, each measured in a fresh process (NOTE
[ Measured validation ] in ``memtune.api.service.worker``, NOTE [ Measured selection ] in ``memtune.tuner.search``).
Writes one JSON file per configuration (job, simulated and measured rows, the best-plan answer) and prints a summary.

Usage (on the H200, after the wheels of ``scripts/gpu_wheels.sh``)::

    python3 scripts/validate_job.py --out $OUT resnet50:256:bfloat16:0.5 vgg16:256:bfloat16:0.9
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from configs import read_config
from fastapi.testclient import TestClient

from memtune.api import MemtuneClient, create_app
from memtune.api.service.settings import Settings
from memtune.api.service.worker import Worker
from memtune.profiler.identity import cuda_identity
from memtune.storage import Database, upgrade
from memtune.storage.repositories import KeyRepository


def run_job(
    text: str, *, gpu: str, trials: int, top_k: int, iters: int, headroom: float | None, work: Path
) -> dict[str, Any]:
    """Submit and run one job with measured validation; the job, its rows and the best-plan answer."""
    cfg = read_config(text)
    db = Database(f"sqlite:///{work / (text.replace(':', '-') + '.db')}")
    upgrade(db)
    with db.session() as s:
        _, secret = KeyRepository(s).create("validate-job")
    settings = Settings(data_dir=work, progress_interval_s=1.0)
    started = time.monotonic()
    with TestClient(create_app(settings, db=db)) as http:
        client = MemtuneClient(api_key=secret, http=http)
        job = client.submit_job(
            {"zoo": cfg.model},
            batch=cfg.batch,
            dtype=cfg.dtype,
            gpu=gpu,
            budget=cfg.budget_bytes,
            trials=trials,
            validate_top_k=top_k,
            validate_iters=iters,
            headroom=headroom,
        )
        Worker(db, worker_id="validate-job", progress_interval_s=1.0).run_once()
        done = client.get_job(job.id)
        results = client.job_results(job.id, plans=True).data
        best = client.best(gpu, model=job.model_id, batch=cfg.batch, budget=cfg.budget_bytes, dtype=cfg.dtype)
    db.dispose()
    return {
        "config": text,
        "budget_bytes": cfg.budget_bytes,
        "wall_s": round(time.monotonic() - started, 1),
        "job": done.model_dump(mode="json"),
        "results": [r.model_dump(mode="json") for r in results if r.source == "measured" or r.kind == "optuna"],
        "best": best.model_dump(mode="json"),
    }


def summary(report: dict[str, Any]) -> str:
    """One line per measured plan, and which one the service serves."""
    v = report["job"]["validation"] or {}
    lines = [f"{report['config']}: {report['budget_bytes'] / 2**30:.2f} GiB, {report['wall_s']} s, {v.get('note')}"]
    base = (v.get("unconstrained") or {}).get("step_ms")  # None where nothing was measured
    if base:
        lines.append(f"  unconstrained (measured) {base:.1f} ms")
    for r in report["results"]:
        if r["source"] == "measured":
            lines.append(
                f"  {r['name']:<30} measured {r['step_ms']:7.1f} ms {r['peak_bytes'] / 2**30:6.2f} GiB"
                f"   predicted {r['predicted_step_ms']:7.1f} ms {r['predicted_peak_bytes'] / 2**30:6.2f} GiB"
            )
    b = report["best"]
    lines.append(f"  served: {b['name']} ({b['source']}) {b['step_ms']:.1f} ms")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+", help="model:batch:dtype:frac, e.g. resnet50:256:bfloat16:0.5")
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--top-k", type=int, default=1, help="plans measured besides the best without algorithm choice")
    ap.add_argument("--iters", type=int, default=6, help="timed steps per plan")
    ap.add_argument("--headroom", type=float, default=None, help="default: the GPU type's calibrated headroom")
    ap.add_argument("--gpu", default=None, help="GPU type (default: this machine's; without CUDA, h200, unmeasured)")
    ap.add_argument("--out", type=Path, required=True, help="folder for one JSON file per configuration")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = args.gpu or (cuda_identity().key if torch.cuda.is_available() else "h200")
    with tempfile.TemporaryDirectory() as tmp:
        for text in args.configs:
            run = {"trials": args.trials, "top_k": args.top_k, "iters": args.iters, "headroom": args.headroom}
            report = run_job(text, gpu=gpu, work=Path(tmp), **run)
            (args.out / f"validate-{text.replace(':', '-')}.json").write_text(json.dumps(report, indent=1) + "\n")
            print(summary(report), flush=True)


if __name__ == "__main__":
    main()
