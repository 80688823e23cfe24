// memtune web page: fetches the JSON API and draws the charts as inline SVG. No dependencies, no build step.
// Units: the API speaks bytes and milliseconds; the page shows GiB (2^30 bytes) and ms.
"use strict";
(() => {
  const SVGNS = "http://www.w3.org/2000/svg";
  const GIB = 1024 ** 3;
  const C = {
    fwd: "#0072b2", d2h: "#e69f00", front: "#009e73", best: "#d55e00", budget: "#d55e00",
    trial: "#9aa3ad", baseline: "#1d232b", unplanned: "#5b6673",
    keep: "#c9d3dd", offload: "#e69f00", recompute: "#cc79a7", selective: "#009e73", measured: "#56b4e9",
  };

  // ---- small helpers ---------------------------------------------------------------------------
  function el(tag, attrs, parent, text) {
    const svgTags = new Set(["svg", "g", "path", "rect", "circle", "line", "text", "title", "desc", "polyline"]);
    const node = svgTags.has(tag) ? document.createElementNS(SVGNS, tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }
  const gib = (b) => b / GIB;
  const fmtGiB = (b) => `${gib(b).toFixed(gib(b) < 10 ? 2 : 1)} GiB`;
  function fmtMs(x) {
    if (x >= 1000) return `${(x / 1000).toFixed(2)} s`;
    return `${x.toFixed(x < 10 ? 2 : 1)} ms`;
  }
  function fmtNum(x) {
    const a = Math.abs(x);
    if (a === 0) return "0";
    if (a >= 1000) return x.toFixed(0);
    if (a >= 10) return x.toFixed(0);
    if (a >= 1) return x.toFixed(1).replace(/\.0$/, "");
    return x.toPrecision(2);
  }
  async function api(path) {
    const r = await fetch(path, { headers: { Accept: "application/json" } });
    const body = await r.json().catch(() => null);
    if (!r.ok) {
      const err = new Error((body && (body.detail || body.title)) || `${r.status} ${r.statusText}`);
      err.status = r.status;
      err.code = body && body.code;
      throw err;
    }
    return body;
  }
  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }
  function message(node, text, cls) {
    el("p", { class: cls || "muted" }, clear(node), text);
  }

  // ---- scales and axes -------------------------------------------------------------------------
  function niceStep(span, count) {
    const raw = span / Math.max(1, count);
    const p = 10 ** Math.floor(Math.log10(raw));
    const m = raw / p;
    return (m >= 5 ? 10 : m >= 2 ? 5 : m >= 1 ? 2 : 1) * p;
  }
  function linear(d0, d1, r0, r1, count) {
    const step = niceStep(d1 - d0 || 1, count || 6);
    const lo = Math.floor(d0 / step) * step;
    const hi = Math.ceil(d1 / step) * step;
    const f = (v) => r0 + ((v - lo) / (hi - lo || 1)) * (r1 - r0);
    const ticks = [];
    for (let v = lo; v <= hi + step / 2; v += step) ticks.push(Number(v.toPrecision(12)));
    return { f, ticks, lo, hi };
  }
  function logScale(d0, d1, r0, r1) {
    const lo = Math.log10(d0), hi = Math.log10(d1);
    const f = (v) => r0 + ((Math.log10(v) - lo) / (hi - lo || 1)) * (r1 - r0);
    const ticks = [];
    // the sparsest mantissa set that still gives at least four ticks
    for (const ms of [[1], [1, 2, 5], [1, 1.5, 2, 3, 5, 7], [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9]]) {
      ticks.length = 0;
      for (let e = Math.floor(lo); e <= Math.ceil(hi); e++) {
        for (const m of ms) {
          const v = m * 10 ** e;
          if (v >= d0 && v <= d1) ticks.push(v);
        }
      }
      if (ticks.length >= 4) break;
    }
    return { f, ticks, lo: d0, hi: d1, log: true };
  }

  // A chart frame: an accessible <svg> with a plot area inside margins.
  function frame(container, { width, height, margin, title, desc }) {
    const id = `t${Math.random().toString(36).slice(2, 9)}`;
    const svg = el("svg", {
      viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-labelledby": `${id} ${id}d`,
    }, clear(container));
    el("title", { id }, svg, title);
    el("desc", { id: `${id}d` }, svg, desc);
    const m = margin;
    return { svg, width, height, m, x0: m.left, x1: width - m.right, y0: height - m.bottom, y1: m.top };
  }

  function axes(fr, x, y, { xTitle, yTitle, xFmt, yFmt, xTicks }) {
    const grid = el("g", { class: "grid" }, fr.svg);
    for (const t of y.ticks) el("line", { x1: fr.x0, x2: fr.x1, y1: y.f(t), y2: y.f(t) }, grid);
    const ax = el("g", { class: "axis" }, fr.svg);
    el("line", { x1: fr.x0, x2: fr.x1, y1: fr.y0, y2: fr.y0 }, ax);
    el("line", { x1: fr.x0, x2: fr.x0, y1: fr.y0, y2: fr.y1 }, ax);
    for (const t of y.ticks) {
      const g = el("g", { class: "tick" }, ax);
      el("line", { x1: fr.x0 - 4, x2: fr.x0, y1: y.f(t), y2: y.f(t) }, g);
      el("text", { x: fr.x0 - 7, y: y.f(t) + 4, "text-anchor": "end" }, g, (yFmt || fmtNum)(t));
    }
    if (x) {
      for (const t of xTicks || x.ticks) {
        const g = el("g", { class: "tick" }, ax);
        el("line", { x1: x.f(t), x2: x.f(t), y1: fr.y0, y2: fr.y0 + 4 }, g);
        el("text", { x: x.f(t), y: fr.y0 + 17, "text-anchor": "middle" }, g, (xFmt || fmtNum)(t));
      }
    }
    el("text", { class: "axis-title", x: (fr.x0 + fr.x1) / 2, y: fr.height - 6, "text-anchor": "middle" }, fr.svg, xTitle);
    const yt = el("text", { class: "axis-title", "text-anchor": "middle", transform: `translate(14 ${(fr.y0 + fr.y1) / 2}) rotate(-90)` }, fr.svg, yTitle);
    return yt;
  }

  // A legend row above the plot area: [{label, mark: (g, x, y) => void}].
  function legend(fr, items) {
    const g = el("g", { class: "legend" }, fr.svg);
    let x = fr.x0;
    const y = 16;
    for (const it of items) {
      it.mark(g, x + 8, y - 4);
      el("text", { x: x + 20, y }, g, it.label);
      x += 34 + it.label.length * 6.4;
    }
    return g;
  }
  const markDot = (color, hollow) => (g, x, y) =>
    el("circle", { cx: x, cy: y, r: 4, fill: hollow ? "#fff" : color, stroke: color, "stroke-width": 1.5 }, g);
  const markLine = (color, dash, width) => (g, x, y) =>
    el("line", { x1: x - 8, x2: x + 8, y1: y, y2: y, stroke: color, "stroke-width": width || 2.5, "stroke-dasharray": dash }, g);
  const markBox = (color) => (g, x, y) => el("rect", { x: x - 6, y: y - 6, width: 12, height: 12, fill: color }, g);
  const diamond = (x, y, r) => `M${x},${y - r}L${x + r},${y}L${x},${y + r}L${x - r},${y}Z`;

  // Greedy label placement: the first of a few offsets whose box overlaps no box placed before.
  function placeLabels(fr, group, labels, taken) {
    const boxes = taken.slice();
    const offsets = [[9, -7, "start"], [9, 13, "start"], [-9, -7, "end"], [-9, 13, "end"], [0, -12, "middle"],
      [0, 21, "middle"], [9, -19, "start"], [-9, -19, "end"], [9, 25, "start"], [-9, 25, "end"]];
    const overlaps = (b) => boxes.some((o) => b.x0 < o.x1 && o.x0 < b.x1 && b.y0 < o.y1 && o.y0 < b.y1);
    const inside = (b) => b.x0 >= fr.x0 - 2 && b.x1 <= fr.width - 2 && b.y0 >= fr.y1 - 6 && b.y1 <= fr.y0;
    for (const l of labels) {
      const w = l.text.length * (l.bold ? 7.0 : 6.3);
      let chosen = null;
      for (const [dx, dy, anchor] of offsets) {
        const x = l.x + dx, y = l.y + dy;
        const x0 = anchor === "start" ? x : anchor === "end" ? x - w : x - w / 2;
        const b = { x0, x1: x0 + w, y0: y - 11, y1: y + 3 };
        if (inside(b) && !overlaps(b)) { chosen = { x, y, anchor, b }; break; }
      }
      if (!chosen) continue; // dropped: the point keeps its <title> tooltip
      boxes.push(chosen.b);
      el("text", { x: chosen.x, y: chosen.y, "text-anchor": chosen.anchor, class: `label halo${l.bold ? " best" : ""}` }, group, l.text);
    }
  }

  // ---- (b) the Pareto front: every trial, the baselines, the best plan --------------------------
  function drawPareto(container, job, allResults, trials) {
    // the chart is the search's (simulated) view; plans measured on the GPU are drawn beside their prediction
    const results = allResults.filter((r) => r.source !== "measured");
    const measured = allResults.filter((r) => r.source === "measured");
    const feasibleResults = results.filter((r) => r.feasible);
    const best = feasibleResults[0] || null; // results come fastest first
    const baselines = results.filter((r) => r.baseline);
    const pts = trials.map((t) => ({ x: gib(t.peak_bytes), y: t.step_ms, t }));
    const all = pts.concat(allResults.map((r) => ({ x: gib(r.peak_bytes), y: r.step_ms })));
    if (!all.length) return message(container, "No plans were evaluated yet.");
    const fr = frame(container, {
      width: 600, height: 400, margin: { top: 34, right: 18, bottom: 46, left: 62 },
      title: "Step time versus peak GPU memory of every plan tried",
      desc: `${trials.length} trials, ${baselines.length} baseline policies, budget ${fmtGiB(job.budget_bytes)}` +
        (best ? `; best plan ${fmtMs(best.step_ms)} at ${fmtGiB(best.peak_bytes)}` : "; no plan fits") +
        (measured.length ? `; ${measured.length} plan(s) measured on the GPU` : ""),
    });
    // the limit the search used: the budget less the headroom kept free for the caching allocator
    const searched = job.headroom ? searchedBytes(job) : null;
    const xs = all.map((p) => p.x).concat([gib(job.budget_bytes)], searched != null ? [gib(searched)] : []);
    const ys = all.map((p) => p.y);
    const xMin = Math.min(...xs), xMax = Math.max(...xs), xPad = Math.max((xMax - xMin) * 0.06, xMax * 0.01);
    const x = linear(Math.max(0, xMin - xPad), xMax + xPad, fr.x0, fr.x1, 7);
    const yMin = Math.min(...ys), yMax = Math.max(...ys);
    const y = yMax / yMin > 3 ? logScale(yMin * 0.88, yMax * 1.1, fr.y0, fr.y1)
      : linear(Math.max(0, yMin - (yMax - yMin) * 0.08), yMax + (yMax - yMin) * 0.08 + 1e-9, fr.y0, fr.y1, 6);
    axes(fr, x, y, { xTitle: "peak GPU memory (GiB)", yTitle: `step time (ms${y.log ? ", log scale" : ""})` });
    const plot = el("g", {}, fr.svg);
    // budget
    const bx = x.f(gib(job.budget_bytes));
    el("rect", { x: bx, y: fr.y1, width: Math.max(0, fr.x1 - bx), height: fr.y0 - fr.y1, fill: "#fbeee6", opacity: 0.55 }, plot);
    el("line", { x1: bx, x2: bx, y1: fr.y1, y2: fr.y0, stroke: C.budget, "stroke-width": 1.5, "stroke-dasharray": "6 4" }, plot);
    if (searched != null) {
      const sx = x.f(gib(searched));
      const sl = el("line", {
        class: "searched-budget", x1: sx, x2: sx, y1: fr.y1, y2: fr.y0, stroke: C.budget, "stroke-width": 1, "stroke-dasharray": "2 3",
      }, plot);
      el("title", {}, sl, `${headroomText(job)}: plans over this line do not fit`);
    }
    // trials
    const tg = el("g", { class: "trials", "data-count": trials.length }, plot);
    for (const p of pts) {
      const c = el("circle", {
        class: "trial", cx: x.f(p.x).toFixed(1), cy: y.f(p.y).toFixed(1), r: 2.6,
        fill: p.t.feasible ? C.trial : "#fff", stroke: C.trial, "stroke-width": 1, opacity: 0.75,
      }, tg);
      el("title", {}, c, `trial ${p.t.number}${p.t.policy ? ` (${p.t.policy})` : ""}: ${fmtMs(p.y)}, ${fmtGiB(p.t.peak_bytes)}`);
    }
    // the trials' Pareto front (both minimised), as a staircase
    const sorted = pts.slice().sort((a, b) => a.x - b.x || a.y - b.y);
    const front = [];
    for (const p of sorted) if (!front.length || p.y < front[front.length - 1].y) front.push(p);
    if (front.length) {
      let d = `M${x.f(front[0].x)},${y.f(front[0].y)}`;
      for (const p of front.slice(1)) d += `H${x.f(p.x)}V${y.f(p.y)}`;
      el("path", { class: "front", d, fill: "none", stroke: C.front, "stroke-width": 2, "data-count": front.length }, plot);
    }
    // baselines, then the best plan on top
    const labels = [];
    const taken = [];
    const bg = el("g", { class: "baselines", "data-count": baselines.length }, plot);
    for (const r of baselines) {
      const px = x.f(gib(r.peak_bytes)), py = y.f(r.step_ms);
      const d = el("path", {
        class: "baseline", d: diamond(px, py, 5.5), fill: r.feasible ? C.baseline : "#fff", stroke: C.baseline, "stroke-width": 1.5,
      }, bg);
      el("title", {}, d, `${r.name}: ${fmtMs(r.step_ms)}, ${fmtGiB(r.peak_bytes)}${r.feasible ? "" : " (over budget)"}`);
      taken.push({ x0: px - 6, x1: px + 6, y0: py - 6, y1: py + 6 });
      labels.push({ x: px, y: py, text: r.name });
    }
    if (best) {
      const px = x.f(gib(best.peak_bytes)), py = y.f(best.step_ms);
      const c = el("circle", { class: "best", cx: px, cy: py, r: 7, fill: C.best, stroke: "#fff", "stroke-width": 2 }, plot);
      el("title", {}, c, `best plan (${best.name}): ${fmtMs(best.step_ms)}, ${fmtGiB(best.peak_bytes)}`);
      taken.push({ x0: px - 8, x1: px + 8, y0: py - 8, y1: py + 8 });
      labels.unshift({ x: px, y: py, text: `best: ${fmtMs(best.step_ms)}, ${fmtGiB(best.peak_bytes)}`, bold: true });
    }
    // measured plans: a square at the measured numbers, a dotted line back to the simulator's prediction
    const mg = el("g", { class: "measured-plans", "data-count": measured.length }, plot);
    for (const r of measured) {
      const px = x.f(gib(r.peak_bytes)), py = y.f(r.step_ms);
      if (r.predicted_step_ms != null && r.predicted_peak_bytes != null) {
        el("line", {
          x1: px, y1: py, x2: x.f(gib(r.predicted_peak_bytes)), y2: y.f(r.predicted_step_ms),
          stroke: C.measured, "stroke-width": 1.3, "stroke-dasharray": "2 3",
        }, mg);
      }
      const m = el("rect", {
        class: "measured", x: px - 5, y: py - 5, width: 10, height: 10, fill: C.measured, stroke: "#1d232b", "stroke-width": 1,
      }, mg);
      el("title", {}, m, `${r.name}, measured: ${fmtMs(r.step_ms)}, ${fmtGiB(r.peak_bytes)}` +
        (r.predicted_step_ms != null ? ` (simulated ${fmtMs(r.predicted_step_ms)}, ${fmtGiB(r.predicted_peak_bytes)})` : ""));
      taken.push({ x0: px - 6, x1: px + 6, y0: py - 6, y1: py + 6 });
    }
    placeLabels(fr, el("g", { class: "labels" }, plot), labels, taken);
    legend(fr, [
      { label: "trial", mark: markDot(C.trial) },
      { label: measured.length ? "front" : "Pareto front", mark: markLine(C.front) },
      { label: "baseline", mark: (g, cx, cy) => el("path", { d: diamond(cx, cy, 5), fill: C.baseline }, g) },
      { label: "best plan", mark: markDot(C.best) },
      ...(measured.length ? [{ label: "measured", mark: markBox(C.measured) }] : []),
      { label: `budget ${fmtGiB(job.budget_bytes)}`, mark: markLine(C.budget, "6 4", 1.5) },
    ]);
  }

  // ---- (c) the memory timeline of the best plan ---------------------------------------------------
  function stepPath(series, x, y) {
    let d = `M${x.f(0).toFixed(1)},${y.f(gib(series.base_bytes)).toFixed(1)}`;
    for (const p of series.points) d += `H${x.f(p.t_ms).toFixed(1)}V${y.f(gib(p.live_bytes)).toFixed(1)}`;
    return d + `H${x.f(series.step_ms).toFixed(1)}`;
  }
  function drawTimeline(container, tl) {
    const b = tl.best, u = tl.unplanned;
    const fr = frame(container, {
      width: 600, height: 400, margin: { top: 34, right: 18, bottom: 46, left: 62 },
      title: "Live GPU memory over one training step",
      desc: `best plan ${b.name}: peak ${fmtGiB(b.peak_bytes)} in ${fmtMs(b.step_ms)}; unplanned: peak ` +
        `${fmtGiB(u.peak_bytes)} in ${fmtMs(u.step_ms)}; budget ${fmtGiB(tl.budget_bytes)}`,
    });
    const x = linear(0, Math.max(b.step_ms, u.step_ms), fr.x0, fr.x1, 6);
    const y = linear(0, gib(Math.max(b.peak_bytes, u.peak_bytes, tl.budget_bytes)) * 1.06, fr.y0, fr.y1, 6);
    axes(fr, x, y, { xTitle: "time in the step (ms)", yTitle: "live GPU memory (GiB)" });
    const plot = el("g", {}, fr.svg);
    const bd = stepPath(b, x, y);
    el("path", { d: `${bd}V${fr.y0}H${x.f(0)}Z`, fill: C.fwd, opacity: 0.12 }, plot);
    el("path", { class: "line-unplanned", d: stepPath(u, x, y), fill: "none", stroke: C.unplanned, "stroke-width": 1.6, "stroke-dasharray": "5 3" }, plot);
    el("path", { class: "line-best", d: bd, fill: "none", stroke: C.fwd, "stroke-width": 2, "data-count": b.points.length }, plot);
    const by = y.f(gib(tl.budget_bytes));
    el("line", { x1: fr.x0, x2: fr.x1, y1: by, y2: by, stroke: C.budget, "stroke-width": 1.5, "stroke-dasharray": "6 4" }, plot);
    el("text", { x: fr.x1 - 4, y: by - 6, "text-anchor": "end", class: "label halo", fill: C.budget }, plot, `budget ${fmtGiB(tl.budget_bytes)}`);
    // forward | backward
    const fx = x.f(b.forward_ms);
    el("line", { x1: fx, x2: fx, y1: fr.y1, y2: fr.y0, stroke: "#5b6673", "stroke-width": 1, "stroke-dasharray": "2 3" }, plot);
    el("text", { x: fx - 5, y: fr.y0 - 8, "text-anchor": "end", class: "label halo" }, plot, "forward");
    el("text", { x: fx + 5, y: fr.y0 - 8, class: "label halo" }, plot, "backward");
    // the peak of the best plan
    let peak = b.points[0] || { t_ms: 0, live_bytes: b.base_bytes, label: "" };
    for (const p of b.points) if (p.live_bytes > peak.live_bytes) peak = p;
    const px = x.f(peak.t_ms), py = y.f(gib(peak.live_bytes));
    const pc = el("circle", { class: "peak", cx: px, cy: py, r: 4.5, fill: C.best, stroke: "#fff", "stroke-width": 1.5 }, plot);
    el("title", {}, pc, `peak ${fmtGiB(peak.live_bytes)} at ${fmtMs(peak.t_ms)} (${peak.label})`);
    const right = px < (fr.x0 + fr.x1) / 2;
    const ly = Math.abs(py - 8 - by) < 12 ? Math.min(py, by) - 14 : py - 8; // keep clear of the budget line
    el("text", { x: px + (right ? 8 : -8), y: Math.max(fr.y1 + 12, ly), "text-anchor": right ? "start" : "end", class: "label halo best" }, plot, `peak ${fmtGiB(peak.live_bytes)}`);
    legend(fr, [
      { label: b.name === "none" ? "best plan (every stage kept)" : `best plan (${b.name})`, mark: markLine(C.fwd) },
      { label: "unplanned", mark: markLine(C.unplanned, "5 3", 1.6) },
      { label: "budget", mark: markLine(C.budget, "6 4", 1.5) },
    ]);
  }

  // ---- (d) memtune beside the compiler: the whole model compiled at each activation budget ----------
  // The profile's compiler points (NOTE [ Compiler points in the service ]: measured on a GPU of the job's type) as a
  // curve by budget, memtune's stored plans (simulated; squares where the job measured them on the GPU), the budget
  // and the unplanned step, on one time-memory plane. Drawn only for a job whose profile has compiler points.
  const fmtBudget = (b) => String(+b.toFixed(2)); // an activation budget: 0, 0.5, 0.25
  function compilerPoints(profile) {
    const points = (profile && profile.compiler_points) || [];
    return points.filter((p) => p.step_ms > 0 && p.peak_bytes > 0).sort((a, b) => a.activation_budget - b.activation_budget);
  }
  function drawPeers(container, job, allResults, points) {
    const plans = allResults.filter((r) => !r.baseline);
    const simulated = plans.filter((r) => r.source !== "measured");
    const measured = plans.filter((r) => r.source === "measured");
    const best = simulated.find((r) => r.feasible) || null; // results come fastest first
    const un = job.unconstrained;
    const xsAll = points.map((p) => gib(p.peak_bytes)).concat(plans.map((r) => gib(r.peak_bytes)), [gib(job.budget_bytes)],
      un ? [gib(un.peak_bytes)] : []);
    const ysAll = points.map((p) => p.step_ms).concat(plans.map((r) => r.step_ms), un ? [un.step_ms] : []);
    const fr = frame(container, {
      width: 1180, height: 420, margin: { top: 34, right: 18, bottom: 46, left: 62 },
      title: "Step time versus peak GPU memory: memtune's plans beside the whole model compiled",
      desc: `${points.length} compiler points (activation budgets ${points.map((p) => fmtBudget(p.activation_budget)).join(", ")}), ` +
        `${simulated.length} simulated and ${measured.length} measured plans of memtune, budget ${fmtGiB(job.budget_bytes)}` +
        (best ? `; best plan ${fmtMs(best.step_ms)} at ${fmtGiB(best.peak_bytes)}` : ""),
    });
    const xMin = Math.min(...xsAll), xMax = Math.max(...xsAll), xPad = Math.max((xMax - xMin) * 0.05, xMax * 0.01);
    const x = linear(Math.max(0, xMin - xPad), xMax + xPad, fr.x0, fr.x1, 9);
    const yMin = Math.min(...ysAll), yMax = Math.max(...ysAll);
    const y = yMax / yMin > 3 ? logScale(yMin * 0.88, yMax * 1.1, fr.y0, fr.y1)
      : linear(Math.max(0, yMin - (yMax - yMin) * 0.1), yMax + (yMax - yMin) * 0.1 + 1e-9, fr.y0, fr.y1, 6);
    axes(fr, x, y, { xTitle: "peak GPU memory (GiB)", yTitle: `step time (ms${y.log ? ", log scale" : ""})` });
    const plot = el("g", {}, fr.svg);
    const bx = x.f(gib(job.budget_bytes));
    el("rect", { x: bx, y: fr.y1, width: Math.max(0, fr.x1 - bx), height: fr.y0 - fr.y1, fill: "#fbeee6", opacity: 0.55 }, plot);
    el("line", { class: "budget", x1: bx, x2: bx, y1: fr.y1, y2: fr.y0, stroke: C.budget, "stroke-width": 1.5, "stroke-dasharray": "6 4" }, plot);
    if (job.headroom) {
      const sx = x.f(gib(searchedBytes(job)));
      const sl = el("line", { class: "searched-budget", x1: sx, x2: sx, y1: fr.y1, y2: fr.y0, stroke: C.budget, "stroke-width": 1, "stroke-dasharray": "2 3" }, plot);
      el("title", {}, sl, `${headroomText(job)}: plans over this line do not fit`);
    }
    if (un) {
      const uy = y.f(un.step_ms);
      el("line", { class: "unplanned", x1: fr.x0, x2: fr.x1, y1: uy, y2: uy, stroke: C.unplanned, "stroke-width": 1.3, "stroke-dasharray": "5 3" }, plot);
      const uc = el("circle", { cx: x.f(gib(un.peak_bytes)), cy: uy, r: 4.5, fill: "#fff", stroke: C.unplanned, "stroke-width": 1.5 }, plot);
      el("title", {}, uc, `unplanned (simulated): ${fmtMs(un.step_ms)}, ${fmtGiB(un.peak_bytes)}`);
    }
    const labels = [];
    const taken = [];
    // the compiler's curve, by activation budget
    const cg = el("g", { class: "compiler-points", "data-count": points.length }, plot);
    if (points.length > 1) {
      const d = points.map((p, i) => `${i ? "L" : "M"}${x.f(gib(p.peak_bytes)).toFixed(1)},${y.f(p.step_ms).toFixed(1)}`).join("");
      el("path", { class: "compiler-curve", d, fill: "none", stroke: C.fwd, "stroke-width": 2 }, cg);
    }
    for (const p of points) {
      const px = x.f(gib(p.peak_bytes)), py = y.f(p.step_ms);
      const c = el("circle", { class: "compiler-point", cx: px, cy: py, r: 5, fill: C.fwd, stroke: "#fff", "stroke-width": 1.5 }, cg);
      el("title", {}, c, `torch.compile, activation budget ${fmtBudget(p.activation_budget)}: ${fmtMs(p.step_ms)}, ` +
        `${fmtGiB(p.peak_bytes)} allocated` + (p.reserved_bytes ? `, ${fmtGiB(p.reserved_bytes)} reserved` : "") +
        ` (${p.optimizer || "sgd"})`);
      taken.push({ x0: px - 6, x1: px + 6, y0: py - 6, y1: py + 6 });
      labels.push({ x: px, y: py, text: `budget ${fmtBudget(p.activation_budget)}` });
    }
    // memtune's plans: simulated dots, measured squares, the best one large
    const mg = el("g", { class: "memtune-plans", "data-count": plans.length }, plot);
    for (const r of simulated) {
      if (r === best) continue;
      const c = el("circle", {
        class: "plan", cx: x.f(gib(r.peak_bytes)), cy: y.f(r.step_ms), r: 3.5,
        fill: r.feasible ? C.best : "#fff", stroke: C.best, "stroke-width": 1.2, opacity: 0.8,
      }, mg);
      el("title", {}, c, `${r.name} (simulated): ${fmtMs(r.step_ms)}, ${fmtGiB(r.peak_bytes)}${r.feasible ? "" : " (over budget)"}`);
    }
    for (const r of measured) {
      const px = x.f(gib(r.peak_bytes)), py = y.f(r.step_ms);
      const m = el("rect", { class: "measured", x: px - 5, y: py - 5, width: 10, height: 10, fill: C.measured, stroke: "#1d232b", "stroke-width": 1 }, mg);
      el("title", {}, m, `${r.name}, measured: ${fmtMs(r.step_ms)}, ${fmtGiB(r.peak_bytes)}`);
      taken.push({ x0: px - 6, x1: px + 6, y0: py - 6, y1: py + 6 });
    }
    if (best) {
      const px = x.f(gib(best.peak_bytes)), py = y.f(best.step_ms);
      const c = el("circle", { class: "best", cx: px, cy: py, r: 7, fill: C.best, stroke: "#fff", "stroke-width": 2 }, mg);
      el("title", {}, c, `best plan (${best.name}): ${fmtMs(best.step_ms)}, ${fmtGiB(best.peak_bytes)}`);
      taken.push({ x0: px - 8, x1: px + 8, y0: py - 8, y1: py + 8 });
      labels.unshift({ x: px, y: py, text: `memtune: ${fmtMs(best.step_ms)}, ${fmtGiB(best.peak_bytes)}`, bold: true });
    }
    placeLabels(fr, el("g", { class: "labels" }, plot), labels, taken);
    legend(fr, [
      { label: "torch.compile of the whole model", mark: markLine(C.fwd) },
      { label: "memtune plan (simulated)", mark: markDot(C.best) },
      ...(measured.length ? [{ label: "measured", mark: markBox(C.measured) }] : []),
      ...(un ? [{ label: "unplanned", mark: markLine(C.unplanned, "5 3", 1.3) }] : []),
      { label: `budget ${fmtGiB(job.budget_bytes)}`, mark: markLine(C.budget, "6 4", 1.5) },
    ]);
  }

  // ---- (a) the per-stage profile: forward ms vs D2H ms, and the best plan's actions ----------------
  function drawProfile(container, profile, bestPlan) {
    const stages = profile.stages;
    const n = stages.length;
    if (!n) return message(container, "The profile has no stages.");
    const actions = bestPlan && bestPlan.actions && bestPlan.actions.length === n ? bestPlan.actions : null;
    const fr = frame(container, {
      width: 1180, height: 380, margin: { top: 34, right: 18, bottom: actions ? 78 : 52, left: 62 },
      title: "Forward time and device-to-host copy time of each stage",
      desc: `${n} stages of ${profile.model} at batch ${profile.batch} on ${profile.device.name} (${profile.source}); ` +
        `total forward ${fmtMs(stages.reduce((s, st) => s + st.forward_ms, 0))}, ` +
        `total D2H ${fmtMs(stages.reduce((s, st) => s + st.d2h_ms, 0))}`,
    });
    const maxV = Math.max(1e-6, ...stages.map((s) => Math.max(s.forward_ms, s.d2h_ms)));
    const y = linear(0, maxV * 1.05, fr.y0, fr.y1, 6);
    const band = (fr.x1 - fr.x0) / n;
    const bw = Math.max(1, band * 0.38);
    const every = Math.max(1, Math.ceil(n / 30));
    const xTicks = [];
    for (let i = 0; i < n; i += every) xTicks.push(i);
    const x = { f: (i) => fr.x0 + band * (i + 0.5), ticks: xTicks };
    axes(fr, x, y, { xTitle: actions ? "" : "stage (hover a bar for its name)", yTitle: "time (ms)", xFmt: (i) => String(i) });
    const plot = el("g", { class: "bars", "data-stages": n }, fr.svg);
    stages.forEach((s, i) => {
      const cx = x.f(i);
      const f = el("rect", { class: "bar fwd", x: (cx - bw).toFixed(2), width: bw.toFixed(2), y: y.f(s.forward_ms).toFixed(2), height: Math.max(0, fr.y0 - y.f(s.forward_ms)).toFixed(2), fill: C.fwd }, plot);
      el("title", {}, f, `stage ${i} ${s.name} (${s.kind}): forward ${fmtMs(s.forward_ms)}, saves ${fmtGiB(s.saved_bytes)}`);
      const d = el("rect", { class: "bar d2h", x: cx.toFixed(2), width: bw.toFixed(2), y: y.f(s.d2h_ms).toFixed(2), height: Math.max(0, fr.y0 - y.f(s.d2h_ms)).toFixed(2), fill: C.d2h }, plot);
      el("title", {}, d, `stage ${i} ${s.name}: D2H copy of ${fmtGiB(s.saved_bytes)} takes ${fmtMs(s.d2h_ms)} (${s.forward_ms > 0 ? (s.d2h_ms / s.forward_ms).toFixed(1) : "∞"}× forward)`);
    });
    const items = [
      { label: "forward (ms)", mark: markBox(C.fwd) },
      { label: "D2H copy of saved activations (ms)", mark: markBox(C.d2h) },
    ];
    if (actions) {
      const sy = fr.y0 + 26;
      const strip = el("g", { class: "actions" }, fr.svg);
      el("text", { x: fr.x0 - 8, y: sy + 10, "text-anchor": "end", class: "tick" }, strip, "plan");
      actions.forEach((a, i) => {
        const r = el("rect", { class: `action ${a}`, x: (fr.x0 + band * i + 0.5).toFixed(2), width: Math.max(1, band - 1).toFixed(2), y: sy, height: 13, fill: C[a] || "#ddd" }, strip);
        el("title", {}, r, `stage ${i} ${stages[i].name}: ${a}`);
      });
      el("text", { class: "axis-title", x: (fr.x0 + fr.x1) / 2, y: fr.height - 6, "text-anchor": "middle" }, fr.svg,
        "stage index (hover a bar for its name); the strip is the best plan's action per stage");
      items.push({ label: "keep", mark: markBox(C.keep) }, { label: "offload", mark: markBox(C.offload) },
        { label: "recompute", mark: markBox(C.recompute) });
      if (actions.includes("selective")) items.push({ label: "selective", mark: markBox(C.selective) });
    }
    legend(fr, items);
  }

  // ---- tables ---------------------------------------------------------------------------------------
  // head: [{label, num?, name?}]; a num column is right-aligned, a name column (a model's name, up to 64 characters
  // without a space) may break anywhere, so one long name cannot push the table past its card
  function table(container, head, rows) {
    const t = el("table", {}, clear(container));
    const tr = el("tr", {}, el("thead", {}, t));
    const cls = (h) => (h.num ? "num" : h.name ? "name" : null);
    for (const h of head) el("th", { scope: "col", class: cls(h) }, tr, h.label);
    const tb = el("tbody", {}, t);
    for (const row of rows) {
      const r = el("tr", {}, tb);
      row.forEach((cell, i) => {
        const td = el("td", { class: cls(head[i]) }, r);
        if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell;
      });
    }
    return t;
  }
  const link = (href, text) => el("a", { href }, null, text);
  const badge = (text, cls) => el("span", { class: `badge ${cls || text}` }, null, text);
  const sourceBadge = (r) => badge(r.source, r.source === "measured" ? "measured" : "simulated");
  // a measured row's simulated prediction and the simulator's error, e.g. "188.6 ms (+1.2%)"
  function predictedCell(r) {
    if (r.source !== "measured" || r.predicted_step_ms == null) return "–";
    const err = r.step_error != null ? ` (${r.step_error >= 0 ? "+" : ""}${(r.step_error * 100).toFixed(1)}%)` : "";
    return `${fmtMs(r.predicted_step_ms)}${err}`;
  }
  function predictedPeakCell(r) {
    if (r.source !== "measured" || r.predicted_peak_bytes == null) return "–";
    return fmtGiB(r.predicted_peak_bytes);
  }
  // both on two lines of one cell: with the Pareto star beside the plan's name, the leaderboard fits 1024 pixels
  function predictedBothCell(r) {
    if (r.source !== "measured" || r.predicted_step_ms == null) return "–";
    const span = el("span", {}, null, predictedCell(r));
    el("br", {}, span);
    span.appendChild(document.createTextNode(predictedPeakCell(r)));
    return span;
  }
  // a plan's name, starred when it lies on its job's Pareto front
  function planCell(r) {
    const span = el("span", { class: "plan" });
    span.appendChild(badge(r.name, r.baseline ? "baseline" : r.kind));
    if (r.pareto_optimal) el("span", { class: "pareto", title: "on the Pareto front of its job" }, span, " ★");
    return span;
  }
  function progressCell(j) {
    const span = el("span");
    el("progress", { max: j.progress.trials_total, value: j.progress.trials_done, "aria-label": "trials done" }, span);
    span.appendChild(document.createTextNode(` ${j.progress.trials_done}/${j.progress.trials_total}`));
    return span;
  }

  const modelNames = new Map();
  async function modelName(id) {
    if (!modelNames.has(id)) modelNames.set(id, api(`/v1/models/${id}`).then((m) => m.name).catch(() => id.slice(0, 8)));
    return modelNames.get(id);
  }

  // ---- the index page ------------------------------------------------------------------------------
  async function indexPage() {
    const jobsBox = document.getElementById("jobs");
    const boardBox = document.getElementById("board");
    const form = document.getElementById("filters");
    const params = new URLSearchParams(location.search);
    for (const [k, v] of params) if (form.elements[k]) form.elements[k].value = v;
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      for (const k of ["model", "gpu", "batch", "order_by", "source"]) if (form.elements[k].value) q.set(k, form.elements[k].value);
      location.search = q.toString();
    });
    try {
      const jobs = await api("/v1/jobs?limit=15");
      if (!jobs.count) message(jobsBox, "No jobs yet: submit one with POST /v1/jobs (see /docs).");
      else {
        const names = await Promise.all(jobs.data.map((j) => modelName(j.model_id)));
        table(jobsBox, [
          { label: "job" }, { label: "model", name: true }, { label: "GPU" }, { label: "batch", num: true },
          { label: "budget" }, { label: "state" }, { label: "trials" }, { label: "best step", num: true }, { label: "best peak", num: true },
        ], jobs.data.map((j, i) => [
          link(`/jobs/${j.id}`, j.id.slice(0, 8)), names[i], j.gpu, String(j.batch), `${j.budget} (${fmtGiB(j.budget_bytes)})`,
          j.waiting ? badge("queued: no live worker", "queued") : badge(j.state), progressCell(j),
          j.progress.best ? fmtMs(j.progress.best.step_ms) : "–",
          j.progress.best ? fmtGiB(j.progress.best.peak_bytes) : "–",
        ]));
      }
    } catch (e) {
      message(jobsBox, `Could not load jobs: ${e.message}`, "error");
    }
    const q = new URLSearchParams({ page_size: "25" });
    for (const k of ["model", "gpu", "batch", "order_by", "source", "page_token"]) if (params.get(k)) q.set(k, params.get(k));
    try {
      const board = await api(`/v1/leaderboard?${q}`);
      if (!board.count) return message(boardBox, "No stored plans match.");
      const names = await Promise.all(board.data.map((r) => modelName(r.model_id)));
      table(boardBox, [
        { label: "#", num: true }, { label: "model", name: true }, { label: "GPU" }, { label: "batch", num: true },
        { label: "dtype" }, { label: "budget", num: true }, { label: "plan (★ Pareto)" }, { label: "step", num: true },
        { label: "peak", num: true }, { label: "source" }, { label: "simulated step (error), peak", num: true },
        { label: "job" },
      ], board.data.map((r, i) => [
        String(r.rank), names[i], r.gpu, String(r.batch), r.dtype, fmtGiB(r.budget_bytes),
        planCell(r), fmtMs(r.step_ms), fmtGiB(r.peak_bytes), sourceBadge(r), predictedBothCell(r),
        link(`/jobs/${r.job_id}`, r.job_id.slice(0, 8)),
      ]));
      const pager = el("p", { class: "pager muted" }, boardBox, `${board.data.length} of ${board.count} plans. `);
      if (board.next_page_token) {
        const next = new URLSearchParams(params);
        next.set("page_token", board.next_page_token);
        pager.appendChild(link(`/?${next}`, "Next page →"));
      }
    } catch (e) {
      message(boardBox, `Could not load the leaderboard: ${e.message}`, "error");
    }
  }

  // ---- the job page --------------------------------------------------------------------------------
  function stat(parent, k, v, s) {
    const d = el("div", { class: "stat" }, parent);
    el("div", { class: "k" }, d, k);
    el("div", { class: "v" }, d, v);
    if (s) el("div", { class: "s" }, d, s);
  }
  // plans are searched against the budget less the headroom kept free for the caching allocator
  function searchedBytes(job) {
    return Math.floor(job.budget_bytes * (1 - (job.headroom || 0)));
  }
  function headroomText(job) {
    const h = job.headroom || 0;
    if (!h) return "headroom 0%";
    return `headroom ${+(h * 100).toFixed(2)}% (plans fit ${fmtGiB(searchedBytes(job))})`;
  }
  async function renderSummary(box, job, name) {
    clear(box);
    const p = el("p", { class: "facts" }, box);
    p.appendChild(badge(job.state));
    p.appendChild(document.createTextNode(
      ` ${name} · batch ${job.batch} · ${job.dtype} · ${job.gpu} · budget ${job.budget} (${fmtGiB(job.budget_bytes)}) · ` +
      `mode ${job.mode} · optimizer ${job.optimizer} · ${headroomText(job)} · compile ${job.compile || "auto"} · `));
    p.appendChild(progressCell(job));
    if (job.error) el("p", { class: "error" }, box, job.error);
    if (job.waiting) el("p", { class: "validation-note warning" }, box, job.waiting);
    // what the worker did about compiling (NOTE [ Compiler points in the service ], NOTE [ Compiled regions in the
    // service ]): a warning where it planned eager or a compile failed
    if (job.compile_note) {
      const eager = job.compile !== "off" && /eager|failed/.test(job.compile_note);
      el("p", { class: `compile-note validation-note ${eager ? "warning" : "muted"}` }, box, job.compile_note);
    }
    const stats = el("div", { class: "stats" }, box);
    const best = job.progress.best, un = job.unconstrained;
    if (best) {
      const whole = (best.name || "").startsWith("compiled whole");
      const regions = (best.name || "").startsWith("compiled regions");
      stat(stats, "best plan step", fmtMs(best.step_ms), un ? `${(best.step_ms / un.step_ms).toFixed(2)}× the unplanned step` : best.name);
      stat(stats, "best plan compiles", whole ? "the whole model" : regions ? "regions of it" : "no (eager)",
           whole ? `torch.compile: ${best.name}` : regions ? best.name : "");
      stat(stats, "best plan peak", fmtGiB(best.peak_bytes), un ? `${((1 - best.peak_bytes / un.peak_bytes) * 100).toFixed(0)}% below unplanned` : "");
    }
    if (un) stat(stats, "unplanned (PyTorch default)", fmtMs(un.step_ms), `peak ${fmtGiB(un.peak_bytes)}`);
    const v = job.validation;
    if (v) {
      stat(stats, `GPU validation (top ${job.validate_top_k})`, v.state, v.device || "");
      if (v.unconstrained) {
        stat(stats, "unplanned, measured", fmtMs(v.unconstrained.step_ms), `peak ${fmtGiB(v.unconstrained.peak_bytes)} on ${v.device || "the GPU"}`);
      }
      if (v.note) el("p", { class: `validation-note ${v.state === "skipped" || v.state === "failed" ? "warning" : "muted"}` }, box, v.note);
    }
    if (job.started_at && job.finished_at) {
      const s = (Date.parse(job.finished_at) - Date.parse(job.started_at)) / 1000;
      stat(stats, "tuning time", `${s.toFixed(1)} s`, `${job.progress.trials_done} trials, ${job.attempts} attempt(s)`);
    }
  }
  async function jobPage() {
    const id = document.body.dataset.jobId;
    const box = document.getElementById("summary");
    let job;
    try {
      job = await api(`/v1/jobs/${encodeURIComponent(id)}`);
    } catch (e) {
      return message(box, `Could not load the job: ${e.message}`, "error");
    }
    const name = await modelName(job.model_id);
    await renderSummary(box, job, name);
    while (job.state === "queued" || job.state === "running") {
      await new Promise((r) => setTimeout(r, 1000));
      job = await api(`/v1/jobs/${encodeURIComponent(id)}`);
      await renderSummary(box, job, name);
    }
    const [results, trials, timeline, profile] = await Promise.all([
      api(`/v1/jobs/${id}/results?plans=true`).catch((e) => e),
      api(`/v1/jobs/${id}/trials`).catch((e) => e),
      api(`/v1/jobs/${id}/timeline`).catch((e) => e),
      job.profile_id != null ? api(`/v1/profiles/${job.profile_id}`).catch((e) => e) : Promise.resolve(null),
    ]);
    const pareto = document.getElementById("chart-pareto");
    if (results instanceof Error || trials instanceof Error) message(pareto, `Could not load the plans: ${(results instanceof Error ? results : trials).message}`, "error");
    else drawPareto(pareto, job, results.data, trials.data);
    const tlBox = document.getElementById("chart-timeline");
    if (timeline instanceof Error) message(tlBox, timeline.message, timeline.status === 404 ? "muted" : "error");
    else if (!timeline.best) message(tlBox, timeline.detail, "muted");
    else drawTimeline(tlBox, timeline);
    const profBox = document.getElementById("chart-profile");
    // the plan the page names: the job's best as the timeline draws it (the server's rule: the feasible simulated row
    // of that name, else the fastest feasible simulated one); two plans that tie must not swap in the strip
    const bestName = timeline instanceof Error || !timeline.best ? (job.progress.best ? job.progress.best.name : null) : timeline.best.name;
    const simulated = results instanceof Error ? [] : results.data.filter((r) => r.feasible && r.source === "simulated");
    const bestRow = simulated.find((r) => r.name === bestName) || simulated[0] || null;
    if (profile === null) message(profBox, "The job has no profile yet.");
    else if (profile instanceof Error) message(profBox, `Could not load the profile: ${profile.message}`, "error");
    else {
      drawProfile(profBox, profile.profile, bestRow ? bestRow.plan : null);
      const check = profile.memory_check;  // NOTE [ Profile self-check ]: never silent where it is off
      if (check) el("p", { class: check.reported ? "error" : "muted" }, profBox, `Memory check: ${check.text}`);
    }
    // memtune beside the compiler, where the job's profile has compiler points; the figure stays hidden elsewhere
    const points = profile && !(profile instanceof Error) ? compilerPoints(profile.profile) : [];
    if (points.length && !(results instanceof Error)) {
      document.getElementById("fig-peers").hidden = false;
      drawPeers(document.getElementById("chart-peers"), job, results.data, points);
    }
    const resBox = document.getElementById("results");
    if (!(results instanceof Error)) {
      if (!results.count) message(resBox, "The job stored no plans.");
      else table(resBox, [
        { label: "plan" }, { label: "kind" }, { label: "step", num: true }, { label: "peak", num: true },
        { label: "fits budget" }, { label: "Pareto" }, { label: "keep / offload / recompute / selective" }, { label: "source" },
        { label: "simulated step (error)", num: true }, { label: "simulated peak", num: true },
      ], results.data.map((r) => {
        const a = (r.plan && r.plan.actions) || [];
        const count = (k) => a.filter((v) => v === k).length;
        return [
          r.name, badge(r.kind), fmtMs(r.step_ms), fmtGiB(r.peak_bytes), r.feasible ? "yes" : "no",
          r.pareto_optimal ? el("span", { class: "pareto" }, null, "★") : "",
          `${count("keep")} / ${count("offload")} / ${count("recompute")} / ${count("selective")}`, sourceBadge(r),
          predictedCell(r), predictedPeakCell(r),
        ];
      }));
    }
    document.body.dataset.ready = "true";
  }

  document.addEventListener("DOMContentLoaded", () => {
    const page = document.body.dataset.page;
    // data-fits: whether nothing scrolls sideways — neither the page nor a card whose table is wider than it (a
    // column cut off at the card's edge); data-overflows names each that does, with its widths. The browser test
    // reads both.
    const done = () => {
      const root = document.documentElement;
      const over = [root, ...document.querySelectorAll(".card")]
        .filter((n) => n.scrollWidth > n.clientWidth)
        .map((n) => `${n === root ? "page" : n.id || "card"}:${n.scrollWidth}>${n.clientWidth}`);
      document.body.dataset.fits = String(!over.length);
      if (over.length) document.body.dataset.overflows = over.join(" ");
      document.body.dataset.ready = "true";
    };
    if (page === "index") indexPage().finally(done);
    else if (page === "job") jobPage().catch((e) => message(document.getElementById("summary"), e.message, "error")).finally(done);
  });
})();
