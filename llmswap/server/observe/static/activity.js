"use strict";
// The status page's activity, machine and playground panels. Loaded after the page's own script, whose
// globals it uses (view, el, authHeaders, currentKey, needKey, seconds, scheduleRender); the page calls
// onActivity() for each `activity` event, renderExtras() on each render, and cancelInflight() from its
// Cancel buttons.
const ACTIVITY_SHOWN = 50;
const MACHINE_EVERY_MS = 5000;
const activity = { rows: [], pending: false };

async function api(path, options = {}) {
  const sent = currentKey();
  const response = await fetch(path, { ...options, headers: { ...authHeaders(), ...(options.headers || {}) } });
  if (response.status === 401) { await needKey(sent); throw new Error("API key needed"); }
  return response;
}

// ---------------------------------------------------------------- activity
async function loadActivity() {
  if (activity.pending) return;
  activity.pending = true;
  try {
    const query = typeof activityQuery === "function" ? activityQuery() : `limit=${ACTIVITY_SHOWN}`;
    const response = await api(`/api/metrics/activity?${query}`);
    if (response.ok) activity.rows = (await response.json()).data;
  } catch (err) {
    console.warn("activity", err);
  } finally {
    activity.pending = false;
  }
  renderActivity();
}
let activityTimer = null;
function onActivity() {
  // A burst of requests makes a burst of events: one fetch covers them.
  if (!activityTimer) activityTimer = setTimeout(() => { activityTimer = null; loadActivity(); }, 150);
}

// A number and its unit never split across lines (a no-break space between them).
const ms = (v) => (v == null ? "–" : v < 1000 ? `${v}\u00a0ms` : `${(v / 1000).toFixed(2)}\u00a0s`);
const tokens = (n) => (n == null || n < 0 ? "–" : String(n));
const speed = (v) => (v == null || v <= 0 ? "–" : v >= 100 ? v.toFixed(0) : v.toFixed(1));

function activityRow(r) {
  const t = r.tokens;
  const waits = [r.queue_ms ? "queue\u00a0" + ms(r.queue_ms) : "", r.load_ms != null ? "load\u00a0" + ms(r.load_ms) : ""]
    .filter(Boolean).join(" · ") || "–";
  const ok = r.resp_status_code >= 200 && r.resp_status_code < 300;
  const open = el("button", { "data-action": "capture", title: "the request and its answer, as recorded" },
                 "View");
  open.disabled = !r.has_capture;
  open.onclick = () => openCapture(r.id);
  const asked = r.requested_model && r.requested_model !== r.model ?
    el("div", { class: "alias", title: "the name the client asked for" }, "as " + r.requested_model) : null;
  return el("tr", { dataset: { activity: r.id, status: r.resp_status_code } },
    el("td", { class: "sub when" }, new Date(r.timestamp).toLocaleTimeString([], { hour12: false })),
    el("td", {}, el("div", { class: "model-id" }, r.model), asked),
    el("td", { class: "evict path" }, ...pathParts(r.req_path),
       r.origin !== "http" ? el("div", { class: "sub" }, r.origin) : null),
    el("td", {}, el("span", { class: "pill " + (ok ? "o-ok" : "o-failed"), title: r.error_msg || "" },
                    String(r.resp_status_code)),
       r.error_msg ? el("div", { class: "note", title: r.error_msg }, r.error_msg) : null),
    el("td", { class: "num", dataset: { field: "input" } }, tokens(t.input_tokens)),
    el("td", { class: "num", dataset: { field: "cached" } }, tokens(t.cache_tokens)),
    el("td", { class: "num", dataset: { field: "output" } }, tokens(t.output_tokens)),
    el("td", { class: "num", dataset: { field: "prompt-speed" } }, speed(t.prompt_per_second)),
    el("td", { class: "num", dataset: { field: "gen-speed" } }, speed(t.tokens_per_second)),
    el("td", { class: "sub waits" }, waits),
    el("td", { class: "num" }, ms(r.ttfb_ms)),
    el("td", { class: "num" }, ms(r.duration_ms)),
    el("td", { class: "actions" }, open));
}

function pathParts(path) {
  // A path may break after each slash, never inside a word.
  return path.split("/").flatMap((part, i) => (i ? [el("wbr"), "/" + part] : [part]));
}

function renderActivity() {
  const body = document.getElementById("activity");
  const rows = (typeof filteredRows === "function" ? filteredRows(activity.rows) : activity.rows);
  const shown = rows.slice(0, ACTIVITY_SHOWN);
  body.replaceChildren(...(shown.length ? shown.map(activityRow) :
    [el("tr", {}, el("td", { colspan: 13, class: "empty" }, "no requests recorded yet"))]));
  document.getElementById("activity-count").textContent = rows.length;
  if (typeof renderActivityStats === "function") renderActivityStats(rows);
}

// ---------------------------------------------------------------- captures
function decodeBody(b64) {
  if (b64 == null) return "(not kept)";
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const text = new TextDecoder().decode(bytes);
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch { return text; }
}
const headerText = (h) => (h ? Object.entries(h).map(([k, v]) => `${k}: ${v}`).join("\n") : "(not kept)");

async function openCapture(id) {
  const dialog = document.getElementById("capture");
  const fill = (name, text) => { dialog.querySelector(`[data-part="${name}"]`).textContent = text; };
  try {
    const response = await api(`/api/captures/${id}`);
    const body = await response.json();
    if (!response.ok) throw new Error((body.error && body.error.message) || response.status);
    document.getElementById("capture-title").textContent = `Request ${body.id}: ${body.req_path}`;
    fill("req-headers", headerText(body.req_headers));
    fill("req-body", decodeBody(body.req_body));
    fill("resp-headers", headerText(body.resp_headers));
    fill("resp-body", decodeBody(body.resp_body));
  } catch (err) {
    document.getElementById("capture-title").textContent = `Request ${id}: ${err.message || err}`;
    for (const part of ["req-headers", "req-body", "resp-headers", "resp-body"]) fill(part, "");
  }
  dialog.dataset.id = id;
  dialog.showModal();
}
document.getElementById("capture-close").onclick = () => document.getElementById("capture").close();

// ---------------------------------------------------------------- cancel
async function cancelInflight(id, button) {
  button.disabled = true;
  try {
    const response = await api(`/api/inflight/${encodeURIComponent(id)}/cancel`, { method: "POST" });
    if (!response.ok && response.status !== 404) button.disabled = false;
  } catch (err) {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- machine
function gauge(label, percent, text, key) {
  const bar = el("div", { class: "bar" }, el("i", { style: `width:${Math.max(0, Math.min(100, percent || 0))}%` }));
  return el("div", { class: "gauge", dataset: { gauge: key } }, el("div", { class: "sub" }, label), bar,
            el("div", { class: "gauge-text" }, text));
}

async function loadMachine() {
  const box = document.getElementById("machine");
  try {
    const response = await api("/api/performance");
    if (response.status === 503) { box.closest("section").hidden = true; return; }
    const body = await response.json();
    const system = (body.sys_stats || []).at(-1);
    const latest = new Map();
    for (const gpu of body.gpu_stats || []) latest.set(gpu.id, gpu);
    const parts = [];
    if (system) {
      const cores = system.cpu_util_per_core;
      const cpu = cores.reduce((a, b) => a + b, 0) / Math.max(1, cores.length);
      parts.push(gauge(`CPU (${cores.length} cores)`, cpu, `${cpu.toFixed(0)} %`, "cpu"));
      const memory = (system.mem_used_mb / system.mem_total_mb) * 100;
      parts.push(gauge("Memory", memory, `${(system.mem_used_mb / 1024).toFixed(1)} / ${(system.mem_total_mb / 1024).toFixed(1)} GiB`, "memory"));
    }
    for (const gpu of latest.values()) {
      const extra = [gpu.temp_c != null ? `${gpu.temp_c.toFixed(0)} °C` : "", gpu.power_draw_w != null ? `${gpu.power_draw_w.toFixed(0)} W` : ""]
        .filter(Boolean).join(" · ");
      parts.push(gauge(`GPU ${gpu.id} ${gpu.name}`, gpu.gpu_util_pct, `${(gpu.gpu_util_pct ?? 0).toFixed(0)} %` + (extra ? " · " + extra : ""), `gpu-${gpu.id}`));
      parts.push(gauge(`GPU ${gpu.id} memory`, gpu.mem_util_pct, `${(gpu.mem_used_mb / 1024).toFixed(1)} / ${(gpu.mem_total_mb / 1024).toFixed(1)} GiB`, `gpu-${gpu.id}-memory`));
    }
    box.replaceChildren(...(parts.length ? parts : [el("div", { class: "empty" }, "waiting for the first sample…")]));
  } catch (err) {
    console.warn("performance", err);
  }
}

// ---------------------------------------------------------------- KV cache saves (kvCache models)
function size(bytes) {
  return bytes >= 1 << 30 ? `${(bytes / (1 << 30)).toFixed(1)} GiB` : `${(bytes / (1 << 20)).toFixed(1)} MiB`;
}

async function loadKvCache() {
  try {
    const body = await (await api("/api/kvcache")).json();
    const section = document.getElementById("kv-section");
    section.hidden = !body.models.length;
    const rows = [];
    for (const model of body.models) {
      const clear = el("button", { class: "kv-clear", dataset: { model: model.model } }, "Clear");
      clear.onclick = async () => { await api(`/api/kvcache/${encodeURIComponent(model.model)}`, { method: "DELETE" }); loadKvCache(); };
      if (!model.saves.length) rows.push(el("tr", { dataset: { model: model.model } }, el("td", {}, model.model), el("td", { colspan: "5", class: "sub" }, "nothing saved")));
      model.saves.forEach((save, index) => rows.push(el("tr", { dataset: { model: model.model } },
        el("td", {}, model.model), el("td", { class: "num" }, String(save.slot)),
        el("td", { class: "num" }, save.tokens == null ? "–" : save.tokens.toLocaleString()),
        el("td", { class: "num" }, size(save.bytes)), el("td", { class: "num" }, `${Math.round(save.age_seconds)} s`),
        el("td", {}, index === 0 ? clear : ""))));
    }
    document.getElementById("kv-count").textContent = String(body.models.reduce((n, m) => n + m.saves.length, 0));
    document.getElementById("kvcache").replaceChildren(...rows);
  } catch (err) {
    console.warn("kvcache", err);
    setTimeout(loadKvCache, 3000);  // e.g. before the API key was given
  }
}

// ---------------------------------------------------------------- playground
let playing = null;
function renderExtras() {
  if (typeof renderFilterModels === "function") { renderFilterModels(); renderLogSources(); }
  const select = document.getElementById("pg-model");
  const ids = [...view.models.keys()].sort();
  const shown = [...select.options].map((o) => o.value);
  if (ids.join("\n") !== shown.join("\n")) {
    const chosen = select.value;
    select.replaceChildren(...ids.map((id) => el("option", { value: id }, id)));
    if (ids.includes(chosen)) select.value = chosen;
    else select.value = loadedModel(ids) || ids[0] || "";  // a loaded model: asking it swaps nothing
  }
  if (!select.dataset.touched && select.value && view.models.get(select.value)?.state !== "ready") {
    const loaded = loadedModel(ids);  // until the user picks one, follow what is loaded
    if (loaded) select.value = loaded;
  }
}

function loadedModel(ids) {
  return ids.find((id) => view.models.get(id)?.state === "ready");
}

async function play() {
  const button = document.getElementById("pg-send");
  if (playing) { playing.abort(); return; }
  const output = document.getElementById("pg-output");
  const stats = document.getElementById("pg-stats");
  const asked = document.getElementById("pg-prompt").value;
  const system = document.getElementById("pg-system").value.trim();
  const body = {
    model: document.getElementById("pg-model").value, stream: true, stream_options: { include_usage: true },
    messages: [...(system ? [{ role: "system", content: system }] : []), ...chat.turns,
               { role: "user", content: asked }],
  };
  const temperature = document.getElementById("pg-temp").value;
  const maxTokens = document.getElementById("pg-max").value;
  if (temperature !== "") body.temperature = Number(temperature);
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);
  const reasoning = document.getElementById("pg-reasoning");
  reasoning.textContent = "";
  playing = new AbortController();
  button.textContent = "Stop";
  output.textContent = "";
  stats.textContent = "";
  document.getElementById("playground").dataset.state = "streaming";
  const began = performance.now();
  let first = null;
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST", body: JSON.stringify(body), signal: playing.signal,
      headers: { "Content-Type": "application/json" },
    });
    if (!response.ok) {
      const error = await response.json().catch(() => null);
      throw new Error((error && error.error && error.error.message) || `status ${response.status}`);
    }
    let buffer = "";
    for await (const text of chunks(response)) {
      buffer += text.replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of block.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const event = JSON.parse(data);
          if (event.error) throw new Error(event.error.message);
          const delta = event.choices && event.choices[0] && event.choices[0].delta;
          const piece = delta && (delta.content || "");
          const thought = delta && (delta.reasoning_content || delta.reasoning || "");
          if (piece || thought) first = first === null ? performance.now() : first;
          if (piece) output.textContent += piece;
          if (thought) reasoning.textContent += thought;
          if (event.usage) stats.textContent = `${event.usage.prompt_tokens} prompt · ${event.usage.completion_tokens} generated tokens`;
          if (event.timings) stats.dataset.speed = event.timings.predicted_per_second;
        }
      }
    }
    const took = (performance.now() - began) / 1000;
    stats.textContent += (stats.textContent ? " · " : "") + `first token ${first ? ((first - began) / 1000).toFixed(2) : "–"} s · ${took.toFixed(2)} s`;
    if (stats.dataset.speed) stats.textContent += ` · ${speed(Number(stats.dataset.speed))} tok/s`;
    chat.turns.push({ role: "user", content: asked }, { role: "assistant", content: output.textContent });
    showTurns(stats.textContent);
    document.getElementById("pg-prompt").value = "";
    document.getElementById("playground").dataset.state = "done";
  } catch (err) {
    stats.textContent = err.name === "AbortError" ? "stopped" : `failed: ${err.message || err}`;
    document.getElementById("playground").dataset.state = err.name === "AbortError" ? "stopped" : "failed";
  } finally {
    playing = null;
    button.textContent = "Send";
  }
}
document.getElementById("pg-send").onclick = play;

// A multi-turn chat: every answer is kept and sent back with the next message, until "New chat".
const chat = { turns: [], stats: [] };
function showTurns(latest) {
  chat.stats.push(latest);
  const box = document.getElementById("pg-transcript");
  box.replaceChildren(...chat.turns.map((turn, i) => el("div", { class: "turn " + turn.role, dataset: { turn: i } },
    el("span", { class: "sub" }, turn.role === "user" ? "you: " : "model: "), turn.content,
    turn.role === "assistant" ? el("div", { class: "sub" }, chat.stats[(i - 1) / 2] || "") : null)));
}
document.getElementById("pg-new").onclick = () => {
  chat.turns = [];
  chat.stats = [];
  document.getElementById("pg-transcript").replaceChildren();
  for (const id of ["pg-output", "pg-reasoning", "pg-stats"]) document.getElementById(id).textContent = "";
};

loadActivity();
loadKvCache();
loadMachine();
setInterval(loadMachine, MACHINE_EVERY_MS);
document.getElementById("pg-model").addEventListener("change", (event) => { event.target.dataset.touched = "1"; });
