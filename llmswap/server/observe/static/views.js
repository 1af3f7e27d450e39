"use strict";
// The status page's views beyond the live tables: the activity filters and their stats, the log chooser,
// the performance charts (requests, tokens, the swap timeline, memory) and the hardware report. Loaded after
// the page's script and activity.js, whose globals it uses (view, el, api, activity, ms, seconds, clock).
// Charts are plain SVG drawn here: nothing is fetched from outside the page.
const CHART_MINUTES = 15;
const CHART_BUCKET_S = 30;
const CHART_W = 560;
const CHART_H = 150;
const PALETTE = ["#58a6ff", "#3fb950", "#d29922", "#f778ba", "#a371f7", "#39c5cf", "#db6d28", "#8b97a6"];
const SVG_NS = "http://www.w3.org/2000/svg";

// ---------------------------------------------------------------- activity filters and stats
const filters = { model: "", status: "", minutes: 0, sort: "id" };

function activityQuery() {
  const params = new URLSearchParams({ limit: "200", sort: filters.sort, order: "desc" });
  if (filters.model) params.append("model", filters.model);
  if (filters.minutes) params.set("start", new Date(Date.now() - filters.minutes * 60000).toISOString());
  return params.toString();
}

function statusMatches(code) {
  switch (filters.status) {
    case "ok": return code >= 200 && code < 300;
    case "client": return code >= 400 && code < 500 && code !== 499;
    case "gone": return code === 499;
    case "server": return code >= 500;
    default: return true;
  }
}

function percentile(values, q) {
  const sorted = values.filter((v) => v != null && v >= 0).sort((a, b) => a - b);
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((q / 100) * sorted.length) - 1))];
}

function renderActivityStats(rows) {
  const box = document.getElementById("act-stats");
  const speeds = rows.map((r) => r.tokens.tokens_per_second).filter((v) => v > 0);
  const waits = rows.map((r) => (r.queue_ms || 0) + (r.load_ms || 0));
  const parts = [
    ["requests", String(rows.length)],
    ["gen tok/s p50", speed(percentile(speeds, 50))], ["p90", speed(percentile(speeds, 90))],
    ["first byte p50", ms(percentile(rows.map((r) => r.ttfb_ms), 50))],
    ["p90", ms(percentile(rows.map((r) => r.ttfb_ms), 90))],
    ["wait p50", ms(percentile(waits, 50))], ["p90", ms(percentile(waits, 90))],
  ];
  box.replaceChildren(...parts.map(([label, value], i) =>
    el("span", { dataset: { stat: i } }, el("small", {}, label + " "), el("b", {}, value))));
}

function filteredRows(rows) {
  return rows.filter((r) => statusMatches(r.resp_status_code));
}

function setupActivityFilters() {
  const bind = (id, key, parse = (v) => v) => {
    const control = document.getElementById(id);
    control.onchange = () => { filters[key] = parse(control.value); loadActivity(); };
  };
  bind("act-model", "model");
  bind("act-status", "status");
  bind("act-window", "minutes", Number);
  bind("act-sort", "sort");
}

function renderFilterModels() {
  const select = document.getElementById("act-model");
  const ids = ["", ...[...view.models.keys()].sort()];
  if (ids.join("\n") === [...select.options].map((o) => o.value).join("\n")) return;
  const chosen = select.value;
  select.replaceChildren(...ids.map((id) => el("option", { value: id }, id || "all models")));
  select.value = ids.includes(chosen) ? chosen : "";
}

// ---------------------------------------------------------------- logs: which, and filtered
const logView = { source: "", filter: "", abort: null };

async function followSource(source) {
  if (logView.abort) logView.abort.abort();
  logView.abort = null;
  logView.source = source;
  logLines = [];
  logPartial = "";
  addLogLines([]);
  if (!source) { reopenEvents(); return; }  // the combined log comes with the event stream
  const controller = new AbortController();
  logView.abort = controller;
  try {
    const response = await api(`/logs/stream/${encodeURIComponent(source)}`, { signal: controller.signal });
    for await (const text of chunks(response)) {
      if (logView.source !== source) return;
      addLogText(text);
    }
  } catch (err) {
    if (err.name !== "AbortError") console.warn("log", source, err);
  }
}

async function reopenEvents() {
  // Back to the combined log: its history, then the event stream's lines as they come.
  try {
    const response = await api("/logs");
    if (response.ok && !logView.source) addLogText(await response.text());
  } catch (err) {
    console.warn("log history", err);
  }
}

function logShown(line) {
  return !logView.filter || line.toLowerCase().includes(logView.filter);
}

function setupLogs() {
  const source = document.getElementById("log-source");
  source.onchange = () => followSource(source.value);
  const filter = document.getElementById("log-filter");
  filter.oninput = () => { logView.filter = filter.value.trim().toLowerCase(); addLogLines([]); };
}

function renderLogSources() {
  const select = document.getElementById("log-source");
  const ids = ["", "proxy", "upstream", ...[...view.models.keys()].sort()];
  if (ids.join("\n") === [...select.options].map((o) => o.value).join("\n")) return;
  const chosen = select.value;
  select.replaceChildren(...ids.map((id) => el("option", { value: id },
    id === "" ? "llmswap and models" : id === "proxy" ? "llmswap only" : id === "upstream" ? "all models" : id)));
  select.value = ids.includes(chosen) ? chosen : "";
}

// ---------------------------------------------------------------- charts (plain SVG)
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) if (child) node.append(child);
  return node;
}

function colorOf(model) {
  const ids = [...view.models.keys()].sort();
  const at = ids.indexOf(model);
  return PALETTE[(at < 0 ? ids.length : at) % PALETTE.length];
}

function lineChart(id, title, series, unit, budget) {
  // series: Map model -> [[t (s since epoch), value]]; budget: optional horizontal line [value, label]
  const now = Date.now() / 1000;
  const from = now - CHART_MINUTES * 60;
  let top = budget ? budget[0] : 0;
  for (const points of series.values()) for (const [, v] of points) top = Math.max(top, v);
  top = top > 0 ? top * 1.1 : 1;
  const x = (t) => 40 + ((t - from) / (now - from)) * (CHART_W - 50);
  const y = (v) => CHART_H - 20 - (v / top) * (CHART_H - 35);
  const nodes = [
    svg("text", { x: 40, y: 12, class: "chart-title" }, title),
    svg("line", { x1: 40, y1: CHART_H - 20, x2: CHART_W - 10, y2: CHART_H - 20, class: "axis" }),
    svg("text", { x: 2, y: y(top / 1.1) + 4, class: "tick" }, `${+(top / 1.1).toPrecision(3)}${unit}`),
    svg("text", { x: 40, y: CHART_H - 5, class: "tick" }, `-${CHART_MINUTES} min`),
    svg("text", { x: CHART_W - 40, y: CHART_H - 5, class: "tick" }, "now"),
  ];
  if (budget) {
    nodes.push(svg("line", { x1: 40, y1: y(budget[0]), x2: CHART_W - 10, y2: y(budget[0]), class: "budget" }),
               svg("text", { x: CHART_W - 120, y: y(budget[0]) - 4, class: "tick" }, budget[1]));
  }
  for (const [model, points] of series) {
    if (!points.length) continue;
    const color = colorOf(model);
    nodes.push(svg("polyline", { points: points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "),
                                 stroke: color, class: "series", "data-model": model }));
    for (const [t, v] of points) {
      nodes.push(svg("circle", { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2.5, fill: color,
                                 class: "point", "data-model": model, "data-value": v },
                     svg("title", {}, `${model}: ${+v.toPrecision(3)}${unit} at ${clock(t)}`)));
    }
  }
  document.getElementById(id).replaceChildren(
    svg("svg", { viewBox: `0 0 ${CHART_W} ${CHART_H}`, role: "img", "aria-label": title }, ...nodes));
}

function buckets(rows, value) {
  // Per model, per CHART_BUCKET_S bucket of the last CHART_MINUTES: the sum of value(row) / bucket seconds.
  const from = Date.now() / 1000 - CHART_MINUTES * 60;
  const series = new Map();
  for (const r of rows) {
    const t = Date.parse(r.timestamp) / 1000;
    if (t < from) continue;
    const start = from + Math.floor((t - from) / CHART_BUCKET_S) * CHART_BUCKET_S;
    const per = series.get(r.model) || new Map();
    per.set(start, (per.get(start) || 0) + value(r));
    series.set(r.model, per);
  }
  return new Map([...series].map(([model, per]) =>
    [model, [...per].sort((a, b) => a[0] - b[0]).map(([t, sum]) => [t + CHART_BUCKET_S / 2, sum / CHART_BUCKET_S])]));
}

function swapTimeline() {
  // One lane per model: a bar from each finished swap that loaded it to the next swap that evicted it.
  const now = Date.now() / 1000;
  const from = now - CHART_MINUTES * 60;
  const models = [...view.models.keys()].sort();
  const lane = 18;
  const top = 34;  // below the title and the phases' legend
  const height = top + lane * Math.max(1, models.length);
  const x = (t) => 90 + ((Math.max(t, from) - from) / (now - from)) * (CHART_W - 100);
  const done = view.swaps.filter((s) => s.outcome === "ok").sort((a, b) => a.started - b.started);
  const nodes = [svg("text", { x: 90, y: 12, class: "chart-title" }, "which model was loaded when (swaps)")];
  models.forEach((model, i) => {
    nodes.push(svg("text", { x: 2, y: top + 10 + i * lane, class: "tick" }, model.slice(0, 14)));
  });
  PHASE_NAMES.forEach((phase, k) => {  // the legend of the phases each swap is drawn as
    const left = 90 + k * 62;
    nodes.push(svg("rect", { x: left, y: 18, width: 8, height: 8, class: `phase phase-${phase}` }),
               svg("text", { x: left + 11, y: 26, class: "tick" }, phase));
  });
  done.forEach((s, index) => {
    const i = models.indexOf(s.model);
    if (i < 0) return;
    const loaded = s.started + (s.duration || 0);
    const evictor = done.slice(index + 1).find((later) => later.evict.includes(s.model) || later.model === s.model);
    const until = evictor ? evictor.started : now;
    if (until < from) return;
    const bar = svg("rect", { x: x(loaded).toFixed(1), y: top + i * lane, width: Math.max(2, x(until) - x(loaded)).toFixed(1),
                              height: lane - 6, fill: colorOf(s.model), class: "loaded", "data-model": s.model },
                    svg("title", {}, `${s.model} loaded at ${clock(loaded)} (${s.rule})` +
                                     (evictor ? `, until ${clock(until)}: ${evictor.model} (${evictor.rule})` : "")));
    nodes.push(bar);
    nodes.push(...swapPhases(s, models, x, lane, from, top));
  });
  document.getElementById("chart-swaps").replaceChildren(
    svg("svg", { viewBox: `0 0 ${CHART_W} ${height}`, role: "img", "aria-label": "swap timeline" }, ...nodes));
}

const PHASE_NAMES = ["drain", "save", "stop", "prefetch", "start", "restore", "wake"];

function swapPhases(s, models, x, lane, from, top) {
  // A swap drawn as its phases: the victims' drain (before the swap began), save and stop on their lanes, the
  // started model's start (or wake) and restore on its own lane, ending as it was ready; its prefetch, which
  // overlaps the others, as a thin stripe from the moment it began.
  const took = (phase, model) => (s.phases || []).filter((p) => p.phase === phase && p.model === model)
    .reduce((total, p) => total + p.seconds, 0);
  const loaded = s.started + (s.duration || 0);
  const drained = Math.max(0, ...s.evict.map((v) => took("drain", v)));
  const spans = [];
  for (const victim of s.evict) {
    const save = took("save", victim);
    spans.push(["drain", victim, s.started - took("drain", victim), took("drain", victim)],
               ["save", victim, s.started, save], ["stop", victim, s.started + save, took("stop", victim)]);
  }
  const restore = took("restore", s.model);
  const start = took("start", s.model) + took("wake", s.model);
  spans.push([took("wake", s.model) ? "wake" : "start", s.model, loaded - restore - start, start],
             ["restore", s.model, loaded - restore, restore]);
  const nodes = [];
  for (const [phase, model, begin, seconds] of spans) {
    const i = models.indexOf(model);
    if (i < 0 || seconds <= 0 || begin + seconds < from) continue;
    nodes.push(svg("rect", { x: x(begin).toFixed(1), y: top + i * lane, height: lane - 6, class: `phase phase-${phase}`,
                             width: Math.max(1, x(begin + seconds) - x(begin)).toFixed(1), "data-phase": phase },
                   svg("title", {}, `${phase} of ${model}: ${seconds.toFixed(2)} s (swap to ${s.model})`)));
  }
  const prefetch = took("prefetch", s.model);
  const i = models.indexOf(s.model);
  if (prefetch > 0 && i >= 0) {
    const begin = s.started - drained;
    nodes.push(svg("rect", { x: x(begin).toFixed(1), y: top + i * lane + lane - 9, height: 3, class: "phase phase-prefetch",
                             width: Math.max(1, x(begin + prefetch) - x(begin)).toFixed(1), "data-phase": "prefetch" },
                   svg("title", {}, `prefetch of ${s.model}: ${prefetch.toFixed(2)} s, beside the others`)));
  }
  return nodes;
}

async function loadCharts() {
  try {
    const start = new Date(Date.now() - CHART_MINUTES * 60000).toISOString();
    const response = await api(`/api/metrics/activity?limit=999&start=${encodeURIComponent(start)}`);
    if (response.ok) {
      const rows = (await response.json()).data;
      lineChart("chart-requests", "requests per second, by model", buckets(rows, () => 1), "/s");
      lineChart("chart-tokens", "tokens generated per second, by model",
                buckets(rows, (r) => Math.max(0, r.tokens.output_tokens)), " tok/s");
    }
    swapTimeline();
    const perf = await api("/api/performance");
    if (perf.ok) {
      const body = await perf.json();
      const at = (sample) => Date.parse(sample.timestamp) / 1000;
      const memory = new Map([["host memory", (body.sys_stats || []).map((s) => [at(s), s.mem_used_mb / 1024])]]);
      for (const gpu of body.gpu_stats || []) {
        const key = `GPU ${gpu.id}`;
        memory.set(key, [...(memory.get(key) || []), [at(gpu), gpu.mem_used_mb / 1024]]);
      }
      const last = (body.sys_stats || []).at(-1);
      const budget = view.budget ? [view.budget / 2 ** 30, "vram budget"] :
        last ? [last.mem_total_mb / 1024, "host memory"] : null;
      lineChart("chart-memory", "memory in use (GiB)", memory, " GiB", budget);
    }
  } catch (err) {
    console.warn("charts", err);
  }
}

// ---------------------------------------------------------------- hardware
function gibText(bytes) {
  return bytes ? `${(bytes / 2 ** 30).toFixed(1)} GiB` : "";
}

function hardwareRows(report) {
  // The report (llmswap.machine.hardware) as a person reads it: one line per part, in words.
  const os = report.operating_system || {};
  const env = report.environment || {};
  const cpu = report.cpu || {};
  const join = (...parts) => parts.filter((p) => p !== null && p !== undefined && p !== "").join(" ");
  const cores = cpu.physical_core_count ? `${cpu.physical_core_count} cores` : "";
  const threads = cpu.logical_thread_count ? `${cpu.logical_thread_count} threads` : "";
  const rows = [
    ["cpu", "CPU", join(cpu.model || cpu.vendor || "unknown", [cores, threads].filter(Boolean).length ?
                       `(${[cores, threads].filter(Boolean).join(", ")})` : "")],
    ["memory", "Memory", gibText((report.memory || {}).capacity_bytes) || "unknown"],
    ["system", "System", join(os.name || os.family, os.version, os.kernel ? `(kernel ${os.kernel})` : "")],
    ["architecture", "Architecture", (report.architecture || {}).name || "unknown"],
    ["environment", "Runs in", env.kind === "native" ? "the machine itself" :
      join((env.kind || "unknown").replace("_", " "), env.name ? `(${env.name})` : "")],
  ];
  const gpus = report.accelerators || [];
  if (!gpus.length) rows.push(["accelerators", "GPUs", "none found"]);
  gpus.forEach((gpu, i) => rows.push([`accelerators[${i}]`, `GPU ${gpu.index ?? i}`,
    join(gpu.vendor, gpu.model, gibText((gpu.memory || {}).capacity_bytes) ? `, ${gibText(gpu.memory.capacity_bytes)}` : "",
         gpu.driver && gpu.driver.version ? `(driver ${gpu.driver.version})` : "").replace(" ,", ",")]));
  return rows;
}

async function loadHardware() {
  const body = document.getElementById("hardware");
  try {
    const response = await api("/api/hardware");
    if (response.status === 503) { setTimeout(loadHardware, 3000); return; }  // still detecting, or failed
    if (!response.ok) { body.closest("section").hidden = true; return; }
    const rows = hardwareRows(await response.json());
    body.replaceChildren(...rows.map(([key, label, value]) =>
      el("tr", { dataset: { key } }, el("td", { class: "sub" }, label), el("td", {}, value))));
  } catch (err) {
    console.warn("hardware", err);
    setTimeout(loadHardware, 3000);  // e.g. before the API key was given
  }
}

// ---------------------------------------------------------------- hosts (discover: true peers, a shared task queue)
async function loadHosts() {
  try {
    const response = await api("/api/hosts");
    if (!response.ok) return;
    const answer = await response.json();
    const hosts = answer.hosts;
    const queue = answer.queue || [];
    document.getElementById("hosts-section").hidden = hosts.length < 2 && queue.length === 0;
    document.getElementById("hosts-count").textContent = String(hosts.length);
    // The hosts draining a shared task queue (tasks.db: postgresql://...): name, heartbeat, task types.
    document.getElementById("queue-hosts").hidden = queue.length === 0;
    document.getElementById("queue-hosts-list").replaceChildren(...queue.map((host) =>
      el("tr", { dataset: { queueHost: host.name, live: String(host.live) } },
        el("td", { class: "model-id" }, host.name + (host.this ? " (this host)" : "")),
        el("td", {}, el("span", { class: "pill " + (host.live ? "o-ok" : "o-failed") }, host.live ? "live" : "gone")),
        el("td", { class: "num" }, `${host.heartbeat_age.toFixed(1)} s ago`),
        el("td", {}, host.types.join(", ") || "–"))));
    document.getElementById("hosts").replaceChildren(...hosts.map((host) => {
      const loaded = host.models.filter((m) => m.state === "ready").map((m) => m.id).join(", ") || "–";
      const flight = host.models.reduce((n, m) => n + m.in_flight, 0);
      return el("tr", { dataset: { host: host.name, fresh: String(host.fresh) } },
        el("td", { class: "model-id" }, host.name, host.url ? el("div", { class: "sub" }, host.url) : null),
        el("td", {}, el("span", { class: "pill " + (host.fresh ? "o-ok" : "o-failed") }, host.fresh ? "live" : "down or stale")),
        el("td", {}, loaded), el("td", { class: "num" }, String(flight)),
        el("td", { class: "num" }, host.free_memory == null ? "–" : `${(host.free_memory / 2 ** 30).toFixed(1)} GiB`));
    }));
  } catch (err) {
    console.warn("hosts", err);
  }
}

setupActivityFilters();
setupLogs();
loadHardware();
loadHosts();
setInterval(loadHosts, 5000);
loadCharts();
setInterval(loadCharts, 10000);
