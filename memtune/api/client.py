"""A small typed Python client for the memtune HTTP API (httpx).

Example::

    from memtune.api.client import MemtuneClient

    with MemtuneClient("http://127.0.0.1:8000", api_key="mtk_…") as mt:
        job = mt.submit_job({"zoo": "vgg16"}, batch=256, gpu="h200", budget="12GiB", trials=300)
        job = mt.wait(job.id, timeout_s=120)
        best = mt.best("h200", model="vgg16", batch=256, budget="12GiB")
        print(best.step_ms, best.peak_bytes, best.source, best.fallback)  # source: simulated or measured

Every non-2xx answer raises ``ApiError`` carrying the problem object (``status``, ``code``, ``detail``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import httpx

from memtune.api.service.schemas import (
    BestPlanPublic,
    CalibrationPublic,
    GpusPublic,
    HealthPublic,
    JobEvent,
    JobPublic,
    JobsPublic,
    LeaderboardPublic,
    LeaderboardRow,
    ModelPublic,
    ProfilePublic,
    ResultsPublic,
)

__all__ = ["ApiError", "MemtuneClient"]


class ApiError(Exception):
    """A problem response (RFC 9457) from the API.

    Attributes:
        status: HTTP status code.
        code: the problem's stable ``code`` (``unknown_gpu``, ``invalid_spec`` …).
        detail: what went wrong.
        problem: the whole problem object.
    """

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.problem = dict(problem)
        self.code = str(problem.get("code", "http_error"))
        self.detail = str(problem.get("detail", ""))
        super().__init__(f"{status} {self.code}: {self.detail}")


class MemtuneClient:
    """Typed access to ``/v1``. Thread safety: as ``httpx.Client`` (one client per thread is simplest).

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000``.
        api_key: sent as ``Authorization: Bearer …`` (needed for writes).
        timeout_s: per-request timeout, seconds.
        http: an existing ``httpx.Client`` to use instead (e.g. Starlette's ``TestClient``).
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        http: httpx.Client | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        if http is None:
            self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)
        else:
            self._http = http
            self._http.headers.update(headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MemtuneClient:
        return self

    def __exit__(self, *exc: object | TracebackType | None) -> None:
        self.close()

    # ---- plumbing ----------------------------------------------------------------------------------
    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        r = self._http.request(method, url, **kwargs)
        if r.status_code >= 400:
            try:
                problem = r.json()
            except ValueError:
                problem = {"code": "http_error", "detail": r.text[:500]}
            raise ApiError(r.status_code, problem if isinstance(problem, dict) else {"detail": str(problem)})
        return r

    # ---- health, models, profiles ------------------------------------------------------------------
    def health(self) -> HealthPublic:
        """``GET /healthz`` (raises ``ApiError`` with status 503 while starting)."""
        return HealthPublic.model_validate(self._request("GET", "/healthz").json())

    def create_model(
        self,
        *,
        zoo: str | None = None,
        params: Mapping[str, int | float | str | bool] | None = None,
        spec: Mapping[str, Any] | None = None,
    ) -> ModelPublic:
        """``POST /v1/models``: a zoo name (with params) or a JSON spec; identical ones share an id."""
        body: dict[str, Any] = {}
        if zoo is not None:
            body["zoo"] = zoo
            if params is not None:
                body["params"] = dict(params)
        if spec is not None:
            body["spec"] = dict(spec)
        return ModelPublic.model_validate(self._request("POST", "/v1/models", json=body).json())

    def upload_exported(
        self, archive: bytes, *, name: str | None = None, int_high: int | None = None, gpu: str | None = None
    ) -> ModelPublic:
        """``POST /v1/models/exported``: a ``torch.export.save`` archive's bytes; the same structure shares an id.

        ``int_high`` bounds the values of integer inputs that index no embedding (e.g. the vocabulary size); ``gpu``
        names the GPU type whose memory every tensor must fit (default: the largest known)."""
        params: dict[str, Any] = {}
        if name is not None:
            params["name"] = name
        if int_high is not None:
            params["int_high"] = int_high
        if gpu is not None:
            params["gpu"] = gpu
        r = self._request(
            "POST",
            "/v1/models/exported",
            content=archive,
            params=params,
            headers={"Content-Type": "application/octet-stream"},
        )
        return ModelPublic.model_validate(r.json())

    def get_model(self, model_id: str) -> ModelPublic:
        return ModelPublic.model_validate(self._request("GET", f"/v1/models/{model_id}").json())

    def profile(self, profile_id: int) -> ProfilePublic:
        """``GET /v1/profiles/{id}``."""
        return ProfilePublic.model_validate(self._request("GET", f"/v1/profiles/{profile_id}").json())

    # ---- jobs --------------------------------------------------------------------------------------
    def submit_job(
        self,
        model: Mapping[str, Any] | str,
        *,
        batch: int,
        gpu: str,
        budget: str | int,
        dtype: str = "float32",
        trials: int = 300,
        mode: str = "fastest",
        optimizer: str = "sgd",
        idempotency_key: str | None = None,
        validate_top_k: int = 0,
        validate_iters: int | None = None,
        headroom: float | None = None,
        compile: str | None = None,
    ) -> JobPublic:
        """``POST /v1/jobs``. ``model``: ``{"zoo": …, "params": …}``, ``{"spec": …}``, or a stored model id.

        ``validate_top_k`` > 0 asks the worker to measure that many of the best plans on a GPU of type
        ``gpu`` (``validate_iters`` timed steps each, server default 6); they are stored labeled ``measured``.
        ``headroom`` (in [0, 0.5)) is the fraction of the budget the search keeps free for the caching
        allocator; left out, the server uses the GPU type's calibrated headroom. The job shows the one used.
        ``compile`` (``auto``, ``on``, ``off``; left out: ``auto``) says whether plans may run the whole model compiled
        by ``torch.compile`` (NOTE [ Whole-model compile ]); the job's ``compile_note`` says what the worker did.
        """
        ref = {"id": model} if isinstance(model, str) else dict(model)
        body: dict[str, Any] = {
            "model": ref,
            "batch": batch,
            "dtype": dtype,
            "gpu": gpu,
            "budget": budget,
            "trials": trials,
            "mode": mode,
            "optimizer": optimizer,
        }
        if validate_top_k:
            body["validate_top_k"] = validate_top_k
        if validate_iters is not None:
            body["validate_iters"] = validate_iters
        if headroom is not None:
            body["headroom"] = headroom
        if compile is not None:
            body["compile"] = compile
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return JobPublic.model_validate(self._request("POST", "/v1/jobs", json=body, headers=headers).json())

    def get_job(self, job_id: str) -> JobPublic:
        return JobPublic.model_validate(self._request("GET", f"/v1/jobs/{job_id}").json())

    def list_jobs(self, *, state: str | None = None, limit: int = 100) -> JobsPublic:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        return JobsPublic.model_validate(self._request("GET", "/v1/jobs", params=params).json())

    def job_results(self, job_id: str, *, plans: bool = False) -> ResultsPublic:
        """``GET /v1/jobs/{id}/results``: the job's baselines, Optuna best and Pareto points."""
        r = self._request("GET", f"/v1/jobs/{job_id}/results", params={"plans": plans})
        return ResultsPublic.model_validate(r.json())

    def cancel_job(self, job_id: str) -> JobPublic:
        return JobPublic.model_validate(self._request("POST", f"/v1/jobs/{job_id}/cancel").json())

    def events(self, job_id: str, *, timeout_s: float = 600.0) -> Iterator[JobEvent]:
        """Follow ``GET /v1/jobs/{id}/events`` (server-sent events) until the ``end`` event."""
        with self._http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=timeout_s) as r:
            if r.status_code >= 400:
                r.read()
                raise ApiError(r.status_code, r.json())
            data: list[str] = []
            for line in r.iter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].strip())
                elif line == "" and data:
                    event = JobEvent.model_validate(json.loads("\n".join(data)))
                    data = []
                    yield event
                    if event.event == "end":
                        return

    def wait(self, job_id: str, *, timeout_s: float = 300.0, poll_s: float = 0.2) -> JobPublic:
        """Poll until the job is succeeded, failed or cancelled; ``TimeoutError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get_job(job_id)
            if job.state in ("succeeded", "failed", "cancelled"):
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {job_id} still {job.state} after {timeout_s} s "
                    f"({job.progress.trials_done}/{job.progress.trials_total} trials); is a worker running?"
                )
            time.sleep(poll_s)

    # ---- GPUs, best plans, leaderboard -------------------------------------------------------------
    def gpus(self) -> GpusPublic:
        return GpusPublic.model_validate(self._request("GET", "/v1/gpus").json())

    def best(self, gpu: str, *, model: str, batch: int, budget: str | int, dtype: str | None = None) -> BestPlanPublic:
        """``GET /v1/gpus/{gpu}/best``: the best stored plan (``fallback`` says how it was found)."""
        params: dict[str, Any] = {"model": model, "batch": batch, "budget": str(budget)}
        if dtype:
            params["dtype"] = dtype
        return BestPlanPublic.model_validate(self._request("GET", f"/v1/gpus/{gpu}/best", params=params).json())

    def calibration(self, gpu: str) -> CalibrationPublic:
        """``GET /v1/gpus/{gpu}/calibration``: the GPU type's calibration in effect and where it was found
        (``origin``); ``ApiError`` 404 ``no_calibration`` when it has none."""
        return CalibrationPublic.model_validate(self._request("GET", f"/v1/gpus/{gpu}/calibration").json())

    def put_calibration(self, data: Mapping[str, Any], *, gpu: str | None = None) -> CalibrationPublic:
        """``PUT /v1/gpus/{gpu}/calibration``: store a calibration (a ``memtune calibrate`` file's JSON object) in
        the service's database; ``gpu`` defaults to the data's ``gpu``. Needs an API key."""
        key = gpu or str(data.get("gpu", ""))
        if not key:
            raise ValueError("the calibration names no GPU type (field 'gpu'); pass gpu=")
        r = self._request("PUT", f"/v1/gpus/{key}/calibration", json=dict(data))
        return CalibrationPublic.model_validate(r.json())

    def leaderboard(
        self,
        *,
        model: str | None = None,
        gpu: str | None = None,
        batch: int | None = None,
        budget: str | None = None,
        order_by: str = "step_ms",
        page_size: int = 50,
        page_token: str | None = None,
        plans: bool = False,
        include_infeasible: bool = False,
        source: str | None = None,
    ) -> LeaderboardPublic:
        """One page of ``GET /v1/leaderboard`` (feasible plans unless ``include_infeasible``; ``source``:
        ``simulated`` or ``measured`` only)."""
        params: dict[str, Any] = {
            "order_by": order_by,
            "page_size": page_size,
            "plans": plans,
            "include_infeasible": include_infeasible,
        }
        for k, v in (
            ("model", model),
            ("gpu", gpu),
            ("batch", batch),
            ("budget", budget),
            ("page_token", page_token),
            ("source", source),
        ):
            if v is not None:
                params[k] = v
        return LeaderboardPublic.model_validate(self._request("GET", "/v1/leaderboard", params=params).json())

    def iter_leaderboard(self, **filters: Any) -> Iterator[LeaderboardRow]:
        """Every leaderboard row over all pages (``filters`` as for ``leaderboard``)."""
        token: str | None = None
        while True:
            page = self.leaderboard(page_token=token, **filters)
            yield from page.data
            if page.next_page_token is None:
                return
            token = page.next_page_token
