"""The web page's server side in process: the HTML shells, the static files, and the chart data routes
(``/v1/jobs/{id}/timeline`` re-simulates the stored best plan; ``/v1/jobs/{id}/trials`` reads the study)."""

from __future__ import annotations

import optuna
import pytest
from fastapi.testclient import TestClient
from service_fixtures import SMALL_SPEC

from memtune.api.client import MemtuneClient
from memtune.api.service.worker import Worker
from memtune.storage.database import Database

PROBLEM = "application/problem+json"


def _tuned_job(client: MemtuneClient, db: Database, trials: int = 20) -> str:
    job = client.submit_job({"spec": SMALL_SPEC}, batch=8, gpu="h200", budget="64MiB", trials=trials)
    assert Worker(db, worker_id="web-worker", heartbeat_interval_s=0.5, progress_interval_s=0.0).run_once() == job.id
    assert client.get_job(job.id).state == "succeeded"
    return job.id


@pytest.mark.slow
def test_timeline_and_trials_agree_with_the_stored_results(
    client: MemtuneClient, http: TestClient, db: Database
) -> None:
    job_id = _tuned_job(client, db)
    job = client.get_job(job_id)
    results = client.job_results(job_id).data
    assert job.progress.best is not None
    # the plan the job's summary names (a baseline may tie with it at the top of the results)
    best = next(r for r in results if r.feasible and r.name == job.progress.best.name)
    assert best.step_ms == next(r for r in results if r.feasible).step_ms

    r = http.get(f"/v1/jobs/{job_id}/timeline")
    assert r.status_code == 200, r.text
    tl = r.json()
    assert tl["budget_bytes"] == 64 << 20 and tl["source"] == "simulated"
    series = tl["best"]
    # re-simulating the stored plan gives the stored numbers: the timeline belongs to that plan
    assert series["name"] == best.name and series["peak_bytes"] == best.peak_bytes
    assert abs(series["step_ms"] - best.step_ms) < 1e-6
    assert max(p["live_bytes"] for p in series["points"]) == series["peak_bytes"] <= tl["budget_bytes"]
    times = [p["t_ms"] for p in series["points"]]
    assert times == sorted(times) and 0 < series["forward_ms"] < series["step_ms"]
    assert all(p["live_bytes"] >= 0 and p["label"] for p in series["points"])
    assert job.unconstrained is not None
    assert tl["unplanned"]["peak_bytes"] == job.unconstrained.peak_bytes
    assert abs(tl["unplanned"]["step_ms"] - job.unconstrained.step_ms) < 1e-6

    r = http.get(f"/v1/jobs/{job_id}/trials")
    assert r.status_code == 200, r.text
    trials = r.json()
    # the 20 trials, and the best plan as a trial of its own where no trial held it (NOTE [ One objective ])
    assert trials["count"] == len(trials["data"]) in (20, 21)
    assert [t["number"] for t in trials["data"]] == sorted(t["number"] for t in trials["data"])
    # feasible as the search judged it: the peak within the budget and placed by the allocator model
    study = optuna.load_study(study_name=job.study_name, storage=db.url)
    verdict = {t.number: all(v <= 0 for v in (t.constraints or {}).values()) for t in study.trials}
    assert all(t["feasible"] == verdict[t["number"]] for t in trials["data"] if t["number"] in verdict)
    assert all(t["peak_bytes"] <= 64 << 20 for t in trials["data"] if t["feasible"])
    assert {"none", "checkpoint_sqrt"} <= {t["policy"] for t in trials["data"] if t["policy"]}
    assert best.step_ms <= min(t["step_ms"] for t in trials["data"] if t["feasible"]) + 1e-9
    assert http.get(f"/v1/jobs/{job_id}/trials", params={"limit": 3}).json()["count"] == 3


def test_chart_routes_before_a_job_runs_and_for_unknown_jobs(client: MemtuneClient, http: TestClient) -> None:
    job = client.submit_job({"spec": SMALL_SPEC}, batch=8, gpu="h200", budget="64MiB", trials=5)
    r = http.get(f"/v1/jobs/{job.id}/timeline")  # the job exists: no 404, the series missing and why
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["state"] == "queued" and body["best"] is None and body["unplanned"] is None
    assert job.id in body["detail"] and "no profile yet" in body["detail"]
    assert http.get(f"/v1/jobs/{job.id}/trials").json() == {"data": [], "count": 0}
    for path in ("timeline", "trials"):
        r = http.get(f"/v1/jobs/{'f' * 32}/{path}")
        assert r.status_code == 404 and r.headers["content-type"].startswith(PROBLEM)


def test_pages_and_static_files(client: MemtuneClient, http: TestClient, db: Database) -> None:
    index = http.get("/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert '<script src="/static/app.js" defer></script>' in index.text and 'data-page="index"' in index.text
    js = http.get("/static/app.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert "createElementNS" in js.text and "/v1/jobs/${id}/timeline" in js.text
    css = http.get("/static/style.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")

    job_id = _tuned_job(client, db, trials=6)
    page = http.get(f"/jobs/{job_id}")
    assert page.status_code == 200 and f'data-job-id="{job_id}"' in page.text
    for figure in ("chart-pareto", "chart-timeline", "chart-profile", "chart-peers"):
        assert f'id="{figure}"' in page.text
    assert '<figure class="card" id="fig-peers" hidden>' in page.text  # shown only where there are compiler points

    evil = http.get("/jobs/%22%3E%3Cimg%20src=x%20onerror=alert(1)%3E")
    assert evil.status_code == 404 and "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in evil.text
    assert "<img" not in evil.text

    paths = http.get("/openapi.json").json()["paths"]
    assert "/v1/jobs/{job_id}/timeline" in paths and "/v1/jobs/{job_id}/trials" in paths
    assert "/" not in paths and "/jobs/{job_id}" not in paths
