"""The home and job pages as a browser lays them out, with the jobs a busy service shows.

One ``memtune serve`` for the module, its worker serving only the ``h200`` GPU type, and one headless Chromium driven
over the DevTools protocol (``browser.py``), which measures the pages as laid out instead of reading what they say
about themselves. Jobs: models named with up to 64 characters (with and without hyphens), budgets in bytes and as a
fraction of the GPU, two queued for GPU types no live worker serves (``waiting``), and one job whose stored plans tie.

- At 1400 and 1024 pixels nothing scrolls sideways, neither the page nor a table inside its card, and no cell ends
  past its card's edge (the jobs table's and the leaderboard's JOB column were cut off).
- A job that no live worker serves reads "queued: no live worker" in the home table, and its page shows why it waits.
- Where two feasible plans tie, the job page's per-stage strip draws the plan the page names (the timeline's best,
  by the server's rule), not the one the results list first.
- A job whose profile has no compiler points keeps the picture of memtune beside ``torch.compile`` hidden; once its
  profile has them, the page draws them as a curve beside memtune's plans, the budget and the unplanned step, and
  still fits the window.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from browser import CHROMIUM, Browser, Tab
from live_server import create_key, free_port, spawn

from memtune.api.client import MemtuneClient
from memtune.storage.database import Database
from memtune.storage.records import ResultIn
from memtune.storage.repositories import JobRepository, ProfileRepository, ResultRepository

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"),
]

SPEC: dict[str, Any] = {
    "input_shape": [3, 16, 16],
    "layers": [
        {"type": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1},
        {"type": "relu"},
        {"type": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1},
        {"type": "relu"},
        {"type": "maxpool2d", "kernel_size": 2},
        {"type": "flatten"},
        {"type": "linear", "out_features": 10},
    ],
}
LONG_HYPHENS = "a-very-long-model-name-for-a-research-transformer-variant-v2.1_x"  # 64 characters, the most a name has
LONG_UNBROKEN = "another_extremely_long_model_name_that_has_no_spaces_at_all_0123"
#: (model name, GPU type, budget): the worker serves h200 only, so the others wait
JOBS = [
    (LONG_HYPHENS, "h200", "1.5GiB"),
    (LONG_UNBROKEN, "h100", "0.6 of gpu"),
    ("resnet-like-with-a-long-name", "a100-80gb", "800MB"),
    ("tie", "h200", "12GiB"),
    ("compiled", "h200", "1.5GiB"),
]


@dataclass(frozen=True)
class Site:
    base: str
    database_url: str
    ids: dict[str, str]  # model name -> job id


def _spec(name: str, i: int) -> dict[str, object]:
    layers = [dict(layer) for layer in SPEC["layers"]]
    layers[0]["out_channels"] = 8 + i  # one structure per name: a name belongs to one structure
    return {**SPEC, "name": name, "layers": layers}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("web-pages")
    url = f"sqlite:///{tmp / 'memtune.db'}"
    key = create_key(url)
    port = free_port()
    args = ["serve", "--host", "127.0.0.1", "--port", str(port), "--database-url", url, "--log-level", "warning"]
    proc = spawn(args, tmp / "serve.log", MEMTUNE_WORKER_GPUS=json.dumps(["h200"]))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp / "serve.log").read_text()[-3000:]
            time.sleep(0.2)
        with MemtuneClient(base, api_key=key, timeout_s=30) as mt:
            ids = {
                name: mt.submit_job({"spec": _spec(name, i)}, batch=2048, gpu=gpu, budget=budget, trials=10).id
                for i, (name, gpu, budget) in enumerate(JOBS)
            }
            for name, gpu, _ in JOBS:
                if gpu == "h200":
                    assert list(mt.events(ids[name], timeout_s=180))[-1].event == "end"
                    done = mt.get_job(ids[name])
                    assert done.state == "succeeded", done.error
        yield Site(base, url, ids)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except Exception:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    with Browser(tmp_path_factory.mktemp("chromium-profile")) as b:
        yield b


READY = "document.body && document.body.dataset.ready === 'true'"

# what scrolls sideways, and every cell whose right edge lies past its card's (cut off, to be scrolled to)
LAYOUT = """JSON.stringify((() => {
  const root = document.documentElement;
  const out = { page: [root.scrollWidth, root.clientWidth], cards: {}, cut: [] };
  for (const card of document.querySelectorAll(".card")) {
    out.cards[card.id] = [card.scrollWidth, card.clientWidth];
    const edge = Math.min(card.getBoundingClientRect().right, root.clientWidth);
    for (const cell of card.querySelectorAll("th, td")) {
      if (cell.getBoundingClientRect().right > edge + 0.5) out.cut.push(`${card.id}: ${cell.textContent.slice(0, 30)}`);
    }
  }
  return out;
})())"""


def _layout(tab: Tab) -> dict[str, Any]:
    return json.loads(tab.evaluate(LAYOUT))  # type: ignore[no-any-return]


@pytest.mark.parametrize("width", [1400, 1024])
def test_the_home_pages_tables_fit_the_window(site: Site, browser: Browser, width: int) -> None:
    tab = browser.open(f"{site.base}/", width)
    try:
        tab.wait(READY)
        assert tab.evaluate("document.querySelectorAll('#jobs tbody tr').length") == len(JOBS)
        assert tab.evaluate("document.querySelectorAll('#board tbody tr').length") > 0
        layout = _layout(tab)
        page_scroll, page_width = layout["page"]
        assert page_scroll <= page_width, layout
        for card, (scroll, client) in layout["cards"].items():
            assert scroll <= client, f"#{card} scrolls sideways at {width} px: {scroll} > {client} ({layout})"
        assert layout["cut"] == [], layout
        assert tab.evaluate("document.body.dataset.fits") == "true"  # what the page says agrees
        for name, job_id in site.ids.items():  # every job's link, in full, and its model's name
            row = f"document.querySelector('#jobs a[href=\"/jobs/{job_id}\"]').closest('tr')"
            assert tab.evaluate(f"{row}.cells[0].textContent") == job_id[:8]
            assert tab.evaluate(f"{row}.cells[1].textContent") == name
    finally:
        tab.close()


@pytest.mark.parametrize("width", [1400, 1024])
def test_a_job_page_fits_the_window(site: Site, browser: Browser, width: int) -> None:
    tab = browser.open(f"{site.base}/jobs/{site.ids[LONG_HYPHENS]}", width)
    try:
        tab.wait(READY)
        layout = _layout(tab)
        assert layout["page"][0] <= layout["page"][1], layout
        assert all(s <= c for s, c in layout["cards"].values()), layout
        assert layout["cut"] == [], layout
    finally:
        tab.close()


def test_a_job_no_live_worker_serves_says_it_waits(site: Site, browser: Browser) -> None:
    job_id = site.ids[LONG_UNBROKEN]
    waiting = httpx.get(f"{site.base}/v1/jobs/{job_id}", timeout=10).json()["waiting"]
    assert waiting == "no live worker serves GPU type h100: the job starts when one does"
    home = browser.open(f"{site.base}/", 1400)
    try:
        home.wait(READY)
        state = f"document.querySelector('#jobs a[href=\"/jobs/{job_id}\"]').closest('tr').cells[5]"
        assert home.evaluate(f"{state}.textContent") == "queued: no live worker"
        assert home.evaluate(f"{state}.querySelector('.badge.queued') !== null")
        done = site.ids[LONG_HYPHENS]
        assert home.evaluate(f"document.querySelector('#jobs a[href=\"/jobs/{done}\"]').closest('tr').cells[5]"
                             ".textContent") == "succeeded"  # fmt: skip
    finally:
        home.close()
    page = browser.open(f"{site.base}/jobs/{job_id}", 1400)
    try:  # a queued job's page polls until the job ends, so it never says ready: wait for the summary
        note = page.wait("document.querySelector('#summary .warning')?.textContent")
        assert note == waiting
        assert page.evaluate("document.querySelector('#summary .badge').textContent") == "queued"
    finally:
        page.close()


def test_where_two_plans_tie_the_strip_draws_the_plan_the_page_names(site: Site, browser: Browser) -> None:
    """The job's stored plans are rewritten with a tying plan first: the same step and peak as the job's best, other
    actions, stored before it (results come fastest first, ties by id). The page names the job's best; the strip
    must draw its actions, not the tie's."""
    job_id = site.ids["tie"]
    db = Database(site.database_url)
    try:
        with db.session() as s:
            job = JobRepository(s).get(job_id)
            stored = ResultRepository(s).for_job(job_id)
            best = next(r for r in stored if r.name == job.best_name and r.source == "simulated")
            flipped = ["recompute" if a == "keep" else "keep" for a in best.plan["actions"]]
            tie = ResultIn(
                name="tied_policy",
                kind="baseline",
                plan={**best.plan, "actions": flipped, "label": "tied_policy"},
                step_ms=best.step_ms,
                peak_bytes=best.peak_bytes,
                feasible=True,
            )
            keep = [f.name for f in dataclasses.fields(ResultIn)]
            again = [ResultIn(**{k: getattr(r, k) for k in keep}) for r in stored]
            ResultRepository(s).add_for_job(job, [tie, *again], profile_id=job.profile_id)
    finally:
        db.dispose()
    results = httpx.get(f"{site.base}/v1/jobs/{job_id}/results", params={"plans": "true"}, timeout=10).json()["data"]
    first = next(r for r in results if r["feasible"] and r["source"] == "simulated")
    assert first["name"] == "tied_policy" and first["step_ms"] == best.step_ms  # the tie is listed first
    timeline = httpx.get(f"{site.base}/v1/jobs/{job_id}/timeline", timeout=10).json()
    assert timeline["best"]["name"] == best.name != "tied_policy"  # the server's rule names the job's best

    tab = browser.open(f"{site.base}/jobs/{job_id}", 1400)
    try:
        tab.wait(READY)
        strip = tab.evaluate("[...document.querySelectorAll('#chart-profile rect.action')].map((r) => r.classList[1])")
        assert strip == best.plan["actions"] != flipped, (strip, best.plan["actions"], flipped)
        assert f"best plan {best.name}:" in tab.evaluate("document.querySelector('#chart-timeline desc').textContent")
    finally:
        tab.close()


def test_a_job_with_compiler_points_draws_memtune_beside_the_compiler(site: Site, browser: Browser) -> None:
    """The job's stored profile has no compiler points (this worker has no GPU to measure them on): the figure stays
    hidden and the page is whole. Points are then stored with the profile, as a worker on a GPU of the type stores
    them; the page draws each one, memtune's plans, the budget and the unplanned step, and fits the window."""
    from memtune.profiler import CompilerPoint

    job_id = site.ids["compiled"]
    tab = browser.open(f"{site.base}/jobs/{job_id}", 1400)
    try:
        tab.wait(READY)
        assert tab.evaluate("document.getElementById('fig-peers').hidden") is True
        assert tab.evaluate("document.querySelectorAll('#chart-peers svg').length") == 0
        assert tab.evaluate("document.querySelectorAll('#chart-pareto svg').length") == 1
    finally:
        tab.close()
    db = Database(site.database_url)
    try:
        with db.session() as s:
            job = JobRepository(s).get(job_id)
            assert job.profile_id is not None and job.unconstrained_step_ms and job.unconstrained_peak_bytes
            record = ProfileRepository(s).get(job.profile_id)
            step, peak = job.unconstrained_step_ms, job.unconstrained_peak_bytes
            points = tuple(
                CompilerPoint(
                    activation_budget=b,
                    step_ms=step * (1.2 - 0.4 * b),
                    peak_bytes=int(peak * (0.4 + 0.5 * b)),
                    reserved_bytes=int(peak * (0.5 + 0.5 * b)),
                )
                for b in (0.0, 0.5, 1.0)
            )
            ProfileRepository(s).store(record.model_id, record.profile().model_copy(update={"compiler_points": points}))
    finally:
        db.dispose()
    tab = browser.open(f"{site.base}/jobs/{job_id}", 1400)
    try:
        tab.wait(READY)
        assert tab.evaluate("document.getElementById('fig-peers').hidden") is False
        assert tab.evaluate("document.querySelectorAll('#chart-peers circle.compiler-point').length") == 3
        assert tab.evaluate("document.querySelector('#chart-peers path.compiler-curve') !== null")
        plans = int(tab.evaluate("document.querySelector('#chart-peers g.memtune-plans').dataset.count"))
        assert plans >= 1
        assert tab.evaluate("document.querySelector('#chart-peers circle.best') !== null")
        assert tab.evaluate("document.querySelector('#chart-peers line.budget') !== null")
        assert tab.evaluate("document.querySelector('#chart-peers line.unplanned') !== null")
        desc = tab.evaluate("document.querySelector('#chart-peers desc').textContent")
        assert desc.startswith("3 compiler points (activation budgets 0, 0.5, 1)"), desc
        title = tab.evaluate("document.querySelector('#chart-peers circle.compiler-point title').textContent")
        assert title.startswith("torch.compile, activation budget 0: ") and "reserved" in title, title
        layout = _layout(tab)
        assert layout["page"][0] <= layout["page"][1], layout
        assert all(s <= c for s, c in layout["cards"].values()), layout
    finally:
        tab.close()
