// The plan explorer: builds a SearchRequest from the form, runs it as a background search (POST /searches), polls
// its progress, and draws the answer. The page's state lives in the URL's fragment, so a link reopens the same view.
"use strict";

const $ = (id) => document.getElementById(id);
const GiB = 2 ** 30;
const HF = "hf";  // the workload choice that reads a pasted config.json
const state = { catalog: null, job: null, response: null, points: [], request: null, sort: ["time", 1], selected: 0 };

// ---- the form <-> the URL -------------------------------------------------------------------------------------

const FIELDS = { w: "workload", seq: "seq", gbs: "gbs", hw: "hardware", nodes: "nodes", per: "per-node",
  mem: "memory", fw: "framework", obj: "objective", trials: "trials", k: "top-k" };

function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  for (const [key, id] of Object.entries(FIELDS)) {
    if (params.has(key)) $(id).value = params.get(key);
  }
  if (params.has(HF)) $("hf").value = decodeConfig(params.get(HF));
  if (params.has("sort")) { const [k, d] = params.get("sort").split(":"); state.sort = [k, d === "desc" ? -1 : 1]; }
  state.selected = Number(params.get("sel") || 0);
  return params;
}

function writeHash(extra = {}) {
  const params = new URLSearchParams();
  for (const [key, id] of Object.entries(FIELDS)) {
    const el = $(id);
    if (el.value !== "" && !el.closest("[hidden]")) params.set(key, el.value);
  }
  if ($("workload").value === HF && $("hf").value.trim()) params.set(HF, encodeConfig($("hf").value));
  params.set("sort", `${state.sort[0]}:${state.sort[1] < 0 ? "desc" : "asc"}`);
  for (const [k, v] of Object.entries(extra)) params.set(k, v);
  if (state.response) params.set("run", "1");
  if (state.response) params.set("sel", String(state.selected));
  history.replaceState(null, "", "#" + params.toString());
  $("share").href = location.href;
}

function encodeConfig(text) {
  let compact = text;
  try { compact = JSON.stringify(JSON.parse(text)); } catch (e) { /* kept as typed: the service says what is wrong */ }
  const bytes = new TextEncoder().encode(compact);
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function decodeConfig(text) {
  try {
    const raw = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
    const json = new TextDecoder().decode(Uint8Array.from(raw, (c) => c.charCodeAt(0)));
    return JSON.stringify(JSON.parse(json), null, 1);
  } catch (e) { return ""; }
}

// ---- the choices ----------------------------------------------------------------------------------------------

function option(select, value, text) {
  const o = document.createElement("option");
  o.value = value; o.textContent = text; select.append(o);
}

async function loadCatalog() {
  const c = await (await fetch("/catalog")).json();
  state.catalog = c;
  for (const name of Object.keys(c.workloads)) option($("workload"), name, name);
  option($("workload"), HF, "Hugging Face config.json…");
  for (const name of Object.keys(c.hf_configs)) option($("hf-example"), name, name);
  const presets = document.createElement("optgroup"); presets.label = "datasheet presets";
  for (const p of c.presets) option(presets, "preset:" + p.id, `${p.id} (${p.devices_per_node} per node)`);
  const prints = document.createElement("optgroup"); prints.label = "measured fingerprints";
  for (const f of c.fingerprints) option(prints, "fingerprint:" + f, f);
  $("hardware").append(presets, prints);
  for (const f of c.frameworks) option($("framework"), f, f);
  $("workload").value = "llama-3.1-70b" in c.workloads ? "llama-3.1-70b" : Object.keys(c.workloads)[0];
  $("hardware").value = "preset:h100-80gb";
  fillWorkload();
  const m = await (await fetch("/model")).json();
  const val = m.metrics && m.metrics.val_selection;
  $("model-info").textContent = `model: ${m.name || m.uri || "plansight"}${m.version ? ` version ${m.version}` : ""}` +
    (m.split ? ` (trained on ${m.split})` : "") + (val ? `, validation selection metric ${val.toFixed(3)}` : "");
}

function fillWorkload() {
  const name = $("workload").value;
  $("hf-box").hidden = name !== HF;
  const w = state.catalog.workloads[name];
  if (w) { $("seq").value = w.seq_len; $("gbs").value = w.global_batch_size; }
}

function fillHardware() {
  const [kind, id] = $("hardware").value.split(":");
  const preset = state.catalog.presets.find((p) => p.id === id);
  $("memory-box").hidden = kind !== "fingerprint";
  $("per-node").placeholder = preset ? String(preset.devices_per_node) : "ranks per node";
  const gpus = Number($("nodes").value || 1) * Number($("per-node").value || (preset ? preset.devices_per_node : 0));
  $("cluster-hint").textContent = preset
    ? `${gpus} GPUs, ${(preset.memory_bytes / GiB).toFixed(0)} GiB each. ${preset.notes}`
    : "a machine measured by `make collect`: give its ranks per node and memory per rank";
}

// ---- the request ----------------------------------------------------------------------------------------------

function workloadOf() {
  const seq = intOrText($("seq").value), gbs = intOrText($("gbs").value);
  if ($("workload").value !== HF) {
    const w = { ...state.catalog.workloads[$("workload").value], seq_len: seq, global_batch_size: gbs };
    w.micro_batch_size = 1;
    return w;
  }
  let config;
  try { config = JSON.parse($("hf").value); } catch (e) {
    throw { field: "hf-error", message: `not JSON: ${e.message}` };
  }
  return { hf_config: config, seq_len: seq, global_batch_size: gbs, micro_batch_size: 1, dtype: "bfloat16" };
}

function clusterOf() {
  const [kind, id] = $("hardware").value.split(":");
  const cluster = { [kind]: id, nodes: intOrText($("nodes").value) };
  if ($("per-node").value) cluster.devices_per_node = intOrText($("per-node").value);
  if (kind === "fingerprint" && $("memory").value) cluster.memory_bytes = Math.round(Number($("memory").value) * GiB);
  return cluster;
}

function requestOf() {
  return { workload: workloadOf(), cluster: clusterOf(), framework: $("framework").value,
    objective: $("objective").value, trials: intOrText($("trials").value), top_k: intOrText($("top-k").value) };
}

function intOrText(v) { return /^-?\d+$/.test(v.trim()) ? Number(v) : v; }

// ---- errors next to their fields ------------------------------------------------------------------------------

const ERROR_IDS = ["workload-error", "hf-error", "seq-error", "gbs-error", "cluster-error", "trials-error",
  "top-k-error", "search-error", "general-error"];

function clearErrors() {
  for (const id of ERROR_IDS) $(id).textContent = "";
  for (const el of document.querySelectorAll(".invalid")) el.classList.remove("invalid");
}

function fieldOf(loc) {
  const [where, first, second] = loc[0] === "body" ? loc.slice(1) : loc;
  if (where === "workload") {
    if (first === "seq_len") return "seq-error";
    if (first === "global_batch_size") return "gbs-error";
    return $("workload").value === HF ? "hf-error" : "workload-error";
  }
  if (where === "cluster") return "cluster-error";
  if (where === "trials" || where === "sampler") return "trials-error";
  if (where === "top_k") return "top-k-error";
  if (where === "framework" || where === "objective" || where === "micro_batch_sizes") return "search-error";
  return "general-error";
}

function showErrors(detail) {
  const list = Array.isArray(detail) ? detail : [{ loc: [], msg: String(detail) }];
  for (const e of list) {
    const id = fieldOf(e.loc || []);
    const el = $(id);
    el.textContent += (el.textContent ? "\n" : "") + e.msg.replace(/^Value error, /, "");
    const input = { "hf-error": "hf", "seq-error": "seq", "gbs-error": "gbs", "cluster-error": "nodes",
      "trials-error": "trials", "top-k-error": "top-k", "workload-error": "workload" }[id];
    if (input) $(input).classList.add("invalid");
  }
}

// ---- running a search -----------------------------------------------------------------------------------------

async function run(event) {
  if (event) event.preventDefault();
  clearErrors();
  let request;
  try { request = requestOf(); } catch (e) { $(e.field).textContent = e.message; $("hf").classList.add("invalid"); return; }
  state.request = request; state.response = null;
  const reply = await fetch("/searches", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(request) });
  const body = await reply.json().catch(() => ({ detail: `the service answered ${reply.status}` }));
  if (!reply.ok) { showErrors(body.detail); return; }
  state.job = body.id;
  $("run").disabled = true; $("cancel").disabled = false; $("progress-box").hidden = false;
  writeHash();
  poll(body.id);
}

async function poll(id) {
  while (state.job === id) {
    const reply = await fetch(`/searches/${id}`);
    const s = await reply.json();
    if (!reply.ok) { showErrors(s.detail); break; }
    $("progress").max = Math.max(s.total, 1); $("progress").value = s.done;
    $("progress-text").textContent = `${s.done} of ${s.total} trials · ${s.seconds.toFixed(1)} s`;
    if (s.state === "queued") $("progress-text").textContent = "waiting for a free slot (other searches are running)";
    if (s.state === "queued" || s.state === "running") { await new Promise((r) => setTimeout(r, 250)); continue; }
    if (s.state === "done") show(s.response, s.points, s.seconds);
    else if (s.state === "cancelled") $("progress-text").textContent = `cancelled after ${s.done} of ${s.total} trials`;
    else showErrors(s.error);
    break;
  }
  if (state.job === id) { state.job = null; $("run").disabled = false; $("cancel").disabled = true; }
}

async function cancel() {
  if (state.job) await fetch(`/searches/${state.job}`, { method: "DELETE" });
}

// ---- the answer -----------------------------------------------------------------------------------------------

function show(response, points, seconds) {
  state.response = response; state.points = points;
  $("results").hidden = false;
  const rows = response.objective === "pareto" && response.pareto.length ? response.pareto : response.best;
  state.rows = rows.map((r, i) => ({ ...r, rank: i + 1 }));
  const about = response.space_size_exact ? "" : "about ";
  const skipped = response.over_budget_plans ? `; ${about}${response.over_budget_plans.toLocaleString()} plans too ` +
    "costly to predict left out" : "";
  const stopped = response.stopped_by === "budget" ? " — stopped at its budget: the best of the plans it evaluated" : "";
  $("summary").textContent = `${response.trials} trials (${response.distinct_plans} distinct plans, ` +
    `${response.feasible_trials} that fit) of a space of ${about}${response.space_size.toLocaleString()} plans, ` +
    `${response.sampler}, ${seconds.toFixed(1)} s` + (response.precisions.length ? `; precisions ${response.precisions.join(", ")}` : "") +
    skipped + stopped;
  answer(rows, points);
  downloads(response);
  drawTable();
  drawScatter();
  if (state.selected >= state.rows.length) state.selected = 0;
  if (state.rows.length) select(state.selected); else $("detail").hidden = true;
  writeHash();
}

function answer(rows, points) {
  const box = $("answer");
  box.classList.toggle("none", rows.length === 0);
  if (!rows.length) {
    const least = points.length ? Math.min(...points.map((p) => p.peak_mem_bytes)) : NaN;
    const capacity = capacityBytes();
    const msg = `No plan fits: none of the ${points.length} evaluated plans keeps its 80% memory interval within ` +
      `${fmtGiB(capacity)} per GPU` + (isFinite(least) ? ` (the lightest needs ${fmtGiB(least)})` : "") +
      ". Add nodes, pick a GPU with more memory, or shorten the sequence.";
    box.textContent = msg;
    $("cluster-error").textContent = msg;
    return;
  }
  const r = rows[0], p = r.prediction;
  const warn = (p.extrapolation || []).length
    ? `<div class="warn">⚠ outside the measured runs, so less sure: ${escape(p.extrapolation.join("; "))}</div>` : "";
  box.innerHTML = `<b>Best plan:</b> ${escape(planText(r))} — <b>${p.iter_time_s.toFixed(2)} s</b> per step ` +
    `(80% interval ${p.iter_time_interval_s.map((x) => x.toFixed(2)).join("–")} s), ` +
    `<b>${fmtGiB(p.peak_mem_bytes)}</b> per GPU (80% interval ${p.peak_mem_interval_bytes.map(fmtGiB).join("–")}) ` +
    `of ${fmtGiB(capacityBytes())}; out-of-memory risk ${(p.oom_risk * 100).toFixed(0)}%.${warn}`;
}

function capacityBytes() {  // of the cluster searched, not of what the form shows now
  const c = state.request.cluster;
  if (c.memory_bytes) return c.memory_bytes;
  const preset = state.catalog.presets.find((p) => p.id === c.preset);
  return preset ? preset.memory_bytes : NaN;
}

function planText(r) {
  const p = r.plan;
  const parts = ["dp", "tp", "pp", "cp", "ep", "etp"].filter((k) => p[k] > 1).map((k) => `${k}${p[k]}`);
  if (p.sharding && p.sharding !== "none") parts.push(p.sharding);
  if (p.recompute && p.recompute !== "none") parts.push(`recompute ${p.recompute}`);
  if (p.pp > 1 && p.pp_schedule) parts.push(p.pp_schedule + (p.virtual_stages > 1 ? ` v${p.virtual_stages}` : ""));
  if (p.sequence_parallel) parts.push("SP");
  parts.push(`mbs ${r.micro_batch_size}`, `${p.num_microbatches} micro-batches`);
  if (r.float8 && r.float8 !== "none") parts.push(`FP8 ${r.float8}`);
  return parts.join(" · ");
}

const COLUMNS = [
  ["rank", "#", (r) => r.rank, (r) => r.rank],
  ["plan", "plan", (r) => planText(r), (r) => escape(planText(r)) + warnings(r)],
  ["time", "time (s)", (r) => r.prediction.iter_time_s, (r) => interval(r.prediction.iter_time_s,
    r.prediction.iter_time_interval_s, (x) => x.toFixed(2))],
  ["memory", "peak memory", (r) => r.prediction.peak_mem_bytes, (r) => interval(r.prediction.peak_mem_bytes,
    r.prediction.peak_mem_interval_bytes, fmtGiB)],
  ["fits", "fits", (r) => (r.prediction.fits ? 1 : 0), (r) => (r.prediction.fits ? "yes" : '<span class="no">no</span>')],
  ["risk", "OOM risk", (r) => r.prediction.oom_risk, (r) => pct(r.prediction.oom_risk)],
  ["compute", "compute", (r) => r.prediction.breakdown.compute, (r) => pct(r.prediction.breakdown.compute)],
  ["exposed", "exposed comm", (r) => r.prediction.breakdown.communication_exposed,
    (r) => pct(r.prediction.breakdown.communication_exposed)],
  ["bubble", "bubble", (r) => r.prediction.breakdown.bubble, (r) => pct(r.prediction.breakdown.bubble)],
  ["warnings", "⚠", (r) => (r.prediction.extrapolation || []).length,
    (r) => ((r.prediction.extrapolation || []).length ? `<span class="warn">⚠ ${r.prediction.extrapolation.length}</span>` : "")],
];

function drawTable() {
  const head = $("plans").tHead.rows[0];
  head.innerHTML = "";
  for (const [key, label] of COLUMNS) {
    const th = document.createElement("th");
    th.textContent = label; th.dataset.key = key;
    if (key === "plan" || key === "warnings") th.className = "plan";
    if (state.sort[0] === key) th.setAttribute("aria-sort", state.sort[1] > 0 ? "ascending" : "descending");
    th.onclick = () => { state.sort = [key, state.sort[0] === key ? -state.sort[1] : 1]; drawTable(); writeHash(); };
    head.append(th);
  }
  const [key, dir] = state.sort;
  const value = COLUMNS.find((c) => c[0] === key)[2];
  const rows = [...state.rows].sort((a, b) => (value(a) < value(b) ? -dir : value(a) > value(b) ? dir : a.rank - b.rank));
  const body = $("plans").tBodies[0];
  body.innerHTML = "";
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.dataset.rank = r.rank;
    if (r.rank - 1 === state.selected) tr.className = "selected";
    tr.innerHTML = COLUMNS.map(([k, , , cell]) => `<td class="${k}">${cell(r)}</td>`).join("");
    tr.onclick = () => select(r.rank - 1);
    body.append(tr);
  }
}

function warnings(r) {  // what of the plan lies outside the measured runs: said under it, where it is read
  return (r.prediction.extrapolation || []).map((x) => `<div class="warn">⚠ outside the training range: ${escape(x)}</div>`).join("");
}

function interval(point, [lo, hi], fmt) { return `${fmt(point)} <span class="interval">${fmt(lo)}–${fmt(hi)}</span>`; }
function pct(x) { return `${(x * 100).toFixed(0)}%`; }
function fmtGiB(b) { return `${(b / GiB).toFixed(1)} GiB`; }
function escape(s) { return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c])); }

function downloads(response) {
  const json = JSON.stringify(response, null, 1);
  $("download-json").href = URL.createObjectURL(new Blob([json], { type: "application/json" }));
  const header = ["rank", "plan", "micro_batch_size", "float8", "iter_time_s", "iter_time_lo_s", "iter_time_hi_s",
    "peak_mem_bytes", "peak_mem_lo_bytes", "peak_mem_hi_bytes", "fits", "oom_risk", "compute", "communication_exposed",
    "bubble", "extrapolation"];
  const lines = state.rows.map((r) => {
    const p = r.prediction;
    return [r.rank, JSON.stringify(r.plan), r.micro_batch_size, r.float8, p.iter_time_s, ...p.iter_time_interval_s,
      p.peak_mem_bytes, ...p.peak_mem_interval_bytes, p.fits, p.oom_risk, p.breakdown.compute,
      p.breakdown.communication_exposed, p.breakdown.bubble, (p.extrapolation || []).join("; ")].map(csvCell).join(",");
  });
  $("download-csv").href = URL.createObjectURL(new Blob([[header.join(","), ...lines].join("\n") + "\n"], { type: "text/csv" }));
}

function csvCell(v) { const s = String(v); return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s; }

// ---- pictures -------------------------------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";
function el(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function drawScatter() {
  const svg = $("scatter"); svg.innerHTML = "";
  const pts = state.points, capacity = capacityBytes();
  if (!pts.length) return;
  const W = 760, H = 360, L = 60, R = 20, T = 14, B = 40;
  const mems = pts.map((p) => p.peak_mem_bytes / GiB).concat([capacity / GiB]);
  const times = pts.map((p) => p.iter_time_s);
  // the x axis stops at 2.5x the capacity: plans far over it are drawn at its edge (they cannot run anyway)
  const x0 = 0, x1 = Math.min(Math.max(...mems), 2.5 * capacity / GiB) * 1.05;
  const ly0 = Math.log10(Math.min(...times)) - 0.05, ly1 = Math.log10(Math.max(...times)) + 0.05;
  const sx = (m) => L + (Math.min(m, x1) - x0) / (x1 - x0) * (W - L - R);
  const sy = (t) => T + (ly1 - Math.log10(t)) / (ly1 - ly0) * (H - T - B);
  const axis = el("g", { class: "axis" });
  axis.append(el("line", { x1: L, y1: H - B, x2: W - R, y2: H - B }), el("line", { x1: L, y1: T, x2: L, y2: H - B }));
  for (const m of ticks(x0, x1)) {
    axis.append(el("text", { x: sx(m), y: H - B + 14, "text-anchor": "middle" }, `${m}`));
  }
  for (let e = Math.floor(ly0); e <= Math.ceil(ly1); e++) {
    for (const f of [1, 2, 5]) {
      const t = f * 10 ** e;
      if (Math.log10(t) >= ly0 && Math.log10(t) <= ly1) axis.append(el("text", { x: L - 6, y: sy(t) + 4, "text-anchor": "end" }, fmtSeconds(t)));
    }
  }
  axis.append(el("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, "predicted peak memory per GPU (GiB)"));
  axis.append(el("text", { x: 12, y: (T + H - B) / 2, transform: `rotate(-90 12 ${(T + H - B) / 2})`, "text-anchor": "middle" },
    "predicted time per step (s, log)"));
  svg.append(axis);
  svg.append(el("line", { x1: sx(capacity / GiB), y1: T, x2: sx(capacity / GiB), y2: H - B, stroke: "#cf222e", "stroke-dasharray": "4 3" }));
  svg.append(el("text", { x: sx(capacity / GiB) + 4, y: T + 10, "text-anchor": "start", fill: "#cf222e" }, `${(capacity / GiB).toFixed(0)} GiB per GPU`));
  for (const p of pts) {
    const c = el("circle", { cx: sx(p.peak_mem_bytes / GiB), cy: sy(p.iter_time_s), r: 3,
      fill: p.feasible ? "#1f6feb" : "#9aa4ae", "fill-opacity": p.feasible ? 0.7 : 0.4 });
    c.append(el("title", {}, `${p.iter_time_s.toFixed(2)} s, ${fmtGiB(p.peak_mem_bytes)}${p.feasible ? "" : " (may not fit)"}`));
    svg.append(c);
  }
  const front = paretoFront(pts.filter((p) => p.feasible));
  if (front.length > 1) {
    svg.append(el("polyline", { points: front.map((p) => `${sx(p.peak_mem_bytes / GiB)},${sy(p.iter_time_s)}`).join(" "),
      fill: "none", stroke: "#e36209", "stroke-width": 2 }));
  }
  for (const p of front) svg.append(el("circle", { cx: sx(p.peak_mem_bytes / GiB), cy: sy(p.iter_time_s), r: 4, fill: "#e36209" }));
  const chosen = state.rows[state.selected];
  if (chosen) {
    svg.append(el("circle", { id: "scatter-selected", cx: sx(chosen.prediction.peak_mem_bytes / GiB),
      cy: sy(chosen.prediction.iter_time_s), r: 8, fill: "none", stroke: "#1b1f24", "stroke-width": 2 }));
  }
}

function paretoFront(pts) {
  const sorted = [...pts].sort((a, b) => a.peak_mem_bytes - b.peak_mem_bytes || a.iter_time_s - b.iter_time_s);
  const front = [];
  for (const p of sorted) if (!front.length || p.iter_time_s < front[front.length - 1].iter_time_s) front.push(p);
  return front;
}

function ticks(lo, hi) {
  const step = [1, 2, 5, 10, 20, 50, 100, 200, 500].find((s) => (hi - lo) / s <= 8) || 1000;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) out.push(v);
  return out;
}

function fmtSeconds(t) { return t >= 1 ? `${t}` : t.toPrecision(1); }

// ---- one plan -------------------------------------------------------------------------------------------------

async function select(index) {
  state.selected = index;
  for (const tr of $("plans").tBodies[0].rows) tr.classList.toggle("selected", Number(tr.dataset.rank) === index + 1);
  drawScatter();
  writeHash();
  const r = state.rows[index];
  $("detail").hidden = false;
  $("detail-title").textContent = `Plan ${index + 1}: ${planText(r)}`;
  $("detail-summary").textContent = "taking the plan apart…";
  state.explained = null; $("verify").disabled = true; $("verify-result").textContent = "";
  $("memory-chart").innerHTML = ""; $("timeline").removeAttribute("src");
  const workload = { ...state.request.workload, micro_batch_size: r.micro_batch_size, float8: r.float8 };
  const reply = await fetch("/explain", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ workload, cluster: state.request.cluster, plans: [r.plan] }) });
  const body = await reply.json();
  if (state.selected !== index) return;  // another plan was clicked meanwhile
  if (!reply.ok) { $("detail-summary").textContent = ""; showErrors(body.detail); return; }
  const s = body.simulated;
  $("detail-summary").textContent = `predicted ${body.prediction.iter_time_s.toFixed(2)} s and ` +
    `${fmtGiB(body.prediction.peak_mem_bytes)}; the simulator alone says ${s.iter_time_s.toFixed(2)} s ` +
    `(compute ${s.compute_s.toFixed(2)} s, exposed communication ${s.exposed_comm_s.toFixed(2)} s, ` +
    `bubble ${s.bubble_s.toFixed(2)} s) and ${fmtGiB(s.peak_mem_bytes)}`;
  drawMemory(body);
  state.explained = { workload, plan: r.plan, prediction: body.prediction };
  $("verify").disabled = false;
  $("verify-result").textContent = "";
  $("timeline-note").textContent = body.timeline;
  $("timeline").src = `data:image/png;base64,${body.timeline_png}`;
}

// the chosen plan traced under fake tensors (POST /verify): the page stays usable while it runs
async function verifyPlan() {
  const index = state.selected, chosen = state.explained;
  if (!chosen) return;
  $("verify").disabled = true;
  $("verify-result").textContent = "tracing the plan under fake tensors…";
  const reply = await fetch("/verify", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ workload: chosen.workload, cluster: state.request.cluster, plans: [chosen.plan] }) });
  const body = await reply.json();
  if (state.selected !== index) return;
  $("verify").disabled = false;
  if (!reply.ok) {
    $("verify-result").textContent = Array.isArray(body.detail) ? body.detail.map((d) => d.msg).join("; ") : String(body.detail);
    return;
  }
  const v = body.plans[0];
  if (v.status !== "ok") { $("verify-result").textContent = `not traced (${v.status}): ${v.error || ""}`; return; }
  const stages = v.traced_peak_per_stage_bytes.map(fmtGiB).join(", ");
  $("verify-result").textContent = `traced peak ${fmtGiB(v.traced_peak_bytes)} (per stage: ${stages}) in ` +
    `${v.wall_s.toFixed(0)} s; predicted ${fmtGiB(v.prediction.peak_mem_bytes)} ` +
    `(${v.within_interval ? "inside" : "outside"} its 80% interval); with what a GPU adds ` +
    `${fmtGiB(v.traced_on_gpu_bytes)}, which ${v.traced_fits ? "fits" : "does not fit"} in ` +
    `${fmtGiB(body.capacity_bytes)}, before ${body.unseen}`;
}

const PART_COLORS = { weights: "#1f6feb", gradients: "#8250df", optimizer: "#bf8700", buffers: "#57606a", activations: "#2da44e" };

function drawMemory(body) {
  const svg = $("memory-chart"); svg.innerHTML = "";
  const ranks = body.ranks, row = 22, L = 110, R = 20, T = 24;
  const H = T + ranks.length * row + 30;
  svg.setAttribute("viewBox", `0 0 760 ${H}`);
  const most = Math.max(body.capacity_bytes, body.prediction.peak_mem_interval_bytes[1], ...ranks.map((r) => r.peak_bytes));
  const sx = (b) => L + b / most * (760 - L - R);
  let x = L;
  for (const [part, color] of Object.entries(PART_COLORS)) {
    svg.append(el("rect", { x, y: 4, width: 10, height: 10, fill: color }));
    svg.append(el("text", { x: x + 14, y: 13 }, part));
    x += 24 + part.length * 7;
  }
  ranks.forEach((r, i) => {
    const y = T + i * row;
    svg.append(el("text", { x: L - 6, y: y + 14, "text-anchor": "end" }, `rank ${r.rank} (stage ${r.stages.join(", ")})`));
    let at = 0;
    for (const [part, color] of Object.entries(PART_COLORS)) {
      const bar = el("rect", { x: sx(at), y: y + 3, width: Math.max(sx(at + r[part]) - sx(at), 0), height: row - 6, fill: color,
        class: `part-${part}` });
      bar.append(el("title", {}, `${part}: ${fmtGiB(r[part])}`));
      svg.append(bar);
      at += r[part];
    }
  });
  const bottom = T + ranks.length * row;
  svg.append(el("line", { x1: sx(body.capacity_bytes), y1: T, x2: sx(body.capacity_bytes), y2: bottom, stroke: "#cf222e", "stroke-dasharray": "4 3" }));
  svg.append(el("text", { x: sx(body.capacity_bytes), y: bottom + 12, "text-anchor": "end", fill: "#cf222e" }, `capacity ${fmtGiB(body.capacity_bytes)}`));
  const p = body.prediction;
  svg.append(el("line", { x1: sx(p.peak_mem_bytes), y1: T, x2: sx(p.peak_mem_bytes), y2: bottom, stroke: "#1b1f24" }));
  svg.append(el("text", { x: Math.min(sx(p.peak_mem_bytes), 560), y: bottom + 24, "text-anchor": "middle" },
    `predicted peak ${fmtGiB(p.peak_mem_bytes)} (80%: ${p.peak_mem_interval_bytes.map(fmtGiB).join("–")})`));
}

// ---- start ----------------------------------------------------------------------------------------------------

async function main() {
  await loadCatalog();
  const params = readHash();
  $("hf-box").hidden = $("workload").value !== HF;
  fillHardware();
  $("workload").onchange = () => { fillWorkload(); writeHash(); };
  $("hf-example").onchange = () => {
    const c = state.catalog.hf_configs[$("hf-example").value];
    if (c) $("hf").value = JSON.stringify(c, null, 1);
  };
  $("hardware").onchange = () => { $("per-node").value = ""; fillHardware(); writeHash(); };
  $("nodes").oninput = fillHardware; $("per-node").oninput = fillHardware;
  $("request").onsubmit = run;
  $("cancel").onclick = cancel;
  $("verify").onclick = verifyPlan;
  if (params.get("run") === "1") run();
}

main().catch((e) => { $("general-error").textContent = `the page could not start: ${e.message || e}`; });
