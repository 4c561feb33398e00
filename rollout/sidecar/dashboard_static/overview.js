// The dashboard's front page: counters, live curves (hand-drawn SVG) and the recent
// episodes with client-side filters. Polls the sidecar's API every POLL_MS.
"use strict";

const POLL_MS = 3000;
const KEEP_S = 3600; // points older than this are dropped (the widest range)
const CHARTS = [
  {key: "success_rate", title: "Success rate", show: fmt.pct, lo: 0, hi: 1, fixed: true},
  {key: "mean_reward", title: "Mean reward", show: (v) => fmt.num(v, 2), lo: 0, hi: 1},
  {key: "episodes_per_s", title: "Episodes / s", show: fmt.rate, lo: 0, hi: 0},
  {key: "step_ms", title: "Step latency", show: fmt.ms, lo: 0, hi: 0},
  {key: "episode_actions", title: "Actions / episode", show: (v) => fmt.num(v, 1), lo: 0, hi: 0},
  {key: "ended_budget", title: "Ended at the budget", show: fmt.pct, lo: 0, hi: 1, fixed: true},
];
const STATUSES = ["ok", "truncated", "infra_error"];

const state = {points: [], episodes: [], rangeMin: 15, windowS: 60, since: 0};

// ----------------------------------------------------------------------------- counters

function renderCounters(c) {
  const box = document.getElementById("counters");
  const cards = [
    ["episodes", fmt.count(c.episodes)],
    ["success", c.scored ? fmt.pct(c.successes / Math.max(1, c.episodes - c.infra_errors)) : "–"],
    ["groups", fmt.count(c.groups)],
    ["groups dropped", fmt.count(c.groups_dropped), c.groups_dropped > 0],
    ["infra errors", fmt.count(c.infra_errors), c.infra_errors > 0],
    ["reruns", fmt.count(c.reruns)],
    ["buffer", fmt.count(c.buffer_depth)],
    ["policy version", fmt.count(c.policy_version)],
    ["live browsers", c.live_browsers === null ? "–" : fmt.count(c.live_browsers)],
    ["uptime", fmt.duration(c.uptime_s)],
  ];
  box.replaceChildren(
    ...cards.map(([k, v, bad]) =>
      h("div", {class: bad ? "counter bad" : "counter"}, h("div", {class: "k"}, k), h("div", {class: "v"}, v)),
    ),
  );
}

function renderErrors(errors) {
  const box = document.getElementById("errors");
  box.hidden = !errors.length;
  box.querySelector("ul").replaceChildren(...errors.map((e) => h("li", {}, e)));
}

// ----------------------------------------------------------------------------- curves

function buildCharts() {
  const box = document.getElementById("charts");
  CHARTS.forEach((def, i) => {
    const svg = s("svg", {role: "img", "aria-label": def.title});
    const tip = h("div", {class: "tip", hidden: true});
    const el = h(
      "div", {class: `chart c${i}`, id: `chart-${def.key}`},
      h("div", {class: "chart-head"}, h("span", {class: "chart-title"}, def.title), h("span", {class: "chart-value"}, "–")),
      svg, tip,
    );
    box.append(el);
    def.el = el;
    svg.addEventListener("mousemove", (ev) => hover(def, ev));
    svg.addEventListener("mouseleave", () => hover(def, null));
  });
}

/** Split [{t, v}] into runs without gaps (a null value ends a run). */
function runs(points, key) {
  const out = [];
  let cur = [];
  for (const p of points) {
    if (p[key] === null || p[key] === undefined) {
      if (cur.length) out.push(cur);
      cur = [];
    } else cur.push(p);
  }
  if (cur.length) out.push(cur);
  return out;
}

function drawChart(def) {
  const svg = def.el.querySelector("svg");
  const W = Math.max(200, svg.clientWidth || 300);
  const H = 150;
  const pad = {l: 44, r: 10, t: 10, b: 20};
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  // the range chosen, or less while the sidecar has not run that long
  const t1 = Date.now() / 1000;
  const first = state.points.length ? state.points[0].t : t1;
  const span = Math.min(state.rangeMin * 60, Math.max(60, t1 - first));
  const t0 = t1 - span;
  const pts = state.points.filter((p) => p.t >= t0);
  const vals = pts.map((p) => p[def.key]).filter((v) => v !== null && v !== undefined);
  let lo = Math.min(def.lo, ...vals);
  let hi = Math.max(def.hi, ...vals);
  if (!def.fixed) hi = hi > 0 ? hi * 1.15 : 1;
  if (hi - lo < 1e-9) hi = lo + 1;
  const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (W - pad.l - pad.r);
  const y = (v) => pad.t + (1 - (v - lo) / (hi - lo)) * (H - pad.t - pad.b);
  const kids = [];
  for (const f of [0, 0.5, 1]) {
    const v = lo + f * (hi - lo);
    kids.push(s("line", {class: "grid", x1: pad.l, x2: W - pad.r, y1: y(v), y2: y(v)}));
    kids.push(s("text", {class: "axis", x: pad.l - 6, y: y(v) + 3, "text-anchor": "end", text: def.show(v)}));
  }
  const ago = span >= 120 ? `−${Math.round(span / 60)} min` : `−${Math.round(span)} s`;
  kids.push(s("text", {class: "axis", x: pad.l, y: H - 5, text: ago}));
  kids.push(s("text", {class: "axis", x: W - pad.r, y: H - 5, "text-anchor": "end", text: "now"}));
  const segs = runs(pts, def.key);
  let line = "";
  let area = "";
  for (const seg of segs) {
    const xy = seg.map((p) => `${x(p.t).toFixed(1)},${y(p[def.key]).toFixed(1)}`);
    line += `M${xy.join("L")}` + (seg.length === 1 ? "l0.01,0" : "");
    area += `M${x(seg[0].t).toFixed(1)},${y(lo).toFixed(1)}L${xy.join("L")}L${x(seg[seg.length - 1].t).toFixed(1)},${y(lo).toFixed(1)}Z`;
  }
  if (segs.length) {
    kids.push(s("path", {class: "area", d: area}));
    kids.push(s("path", {class: "line", d: line}));
    const lastSeg = segs[segs.length - 1];
    const last = lastSeg[lastSeg.length - 1];
    kids.push(s("circle", {class: "dot", cx: x(last.t), cy: y(last[def.key]), r: 3.5}));
  } else {
    kids.push(s("text", {class: "nodata", x: (pad.l + W) / 2, y: H / 2, "text-anchor": "middle", text: "no episodes in this range yet"}));
  }
  kids.push(s("line", {class: "cursor", y1: pad.t, y2: H - pad.b, x1: -10, x2: -10}));
  svg.replaceChildren(...kids);
  def.geom = {x, y, pts};
  const latest = [...state.points].reverse().find((p) => p[def.key] !== null && p[def.key] !== undefined);
  def.el.querySelector(".chart-value").textContent = latest ? def.show(latest[def.key]) : "–";
}

function hover(def, ev) {
  const tip = def.el.querySelector(".tip");
  const cursor = def.el.querySelector(".cursor");
  const g = def.geom;
  const pts = g ? g.pts.filter((p) => p[def.key] !== null && p[def.key] !== undefined) : [];
  if (!ev || !pts.length) {
    tip.hidden = true;
    if (cursor) cursor.setAttribute("x1", -10), cursor.setAttribute("x2", -10);
    return;
  }
  const svg = def.el.querySelector("svg");
  const box = svg.getBoundingClientRect();
  const scale = svg.viewBox.baseVal.width / box.width;
  const mx = (ev.clientX - box.left) * scale;
  let best = pts[0];
  for (const p of pts) if (Math.abs(g.x(p.t) - mx) < Math.abs(g.x(best.t) - mx)) best = p;
  cursor.setAttribute("x1", g.x(best.t));
  cursor.setAttribute("x2", g.x(best.t));
  tip.textContent = `${def.show(best[def.key])} · ${fmt.clock(best.t)}`;
  tip.hidden = false;
  tip.style.left = `${svg.offsetLeft + g.x(best.t) / scale}px`;
  tip.style.top = `${svg.offsetTop + g.y(best[def.key]) / scale}px`;
}

function drawCharts() {
  for (const def of CHARTS) drawChart(def);
  document.getElementById("window").textContent =
    `each point: the episodes finished in the ${state.windowS} s before it`;
}

// ----------------------------------------------------------------------------- episodes

function filters() {
  return {
    template: document.getElementById("f-template").value,
    status: document.getElementById("f-status").value,
    minReward: document.getElementById("f-reward").value,
    text: document.getElementById("f-text").value.trim().toLowerCase(),
  };
}

function matches(ep, f) {
  if (f.template && ep.template !== f.template) return false;
  if (f.status && ep.status !== f.status) return false;
  if (f.minReward !== "" && !(ep.reward >= Number(f.minReward))) return false;
  if (f.text) {
    const hay = `${ep.task} ${ep.question} ${ep.answer ?? ""} ${ep.template}`.toLowerCase();
    if (!hay.includes(f.text)) return false;
  }
  return true;
}

/** Keep a select's options in step with the values seen, its choice kept. */
function syncOptions(select, values) {
  const have = new Set([...select.options].map((o) => o.value));
  for (const v of [...values].sort()) if (!have.has(v)) select.append(h("option", {value: v}, v));
}

function tokens(seqs) {
  if (seqs.length === 1) return fmt.count(seqs[0]);
  return `${seqs.length} turns`;
}

/** The reward, with its outcome and process term apart when the process reward is on. */
function rewardCell(ep) {
  const b = ep.breakdown || {};
  if (typeof b.process_term !== "number") {
    return h("td", {class: "num reward"}, rewardBar(ep.reward), fmt.num(ep.reward, 2));
  }
  const title = `outcome ${fmt.num(b.outcome, 3)} + process ${fmt.num(b.process_term, 3)} (r_process ${fmt.num(b.process, 3)})`;
  return h("td", {class: "num reward", title}, rewardBar(ep.reward), fmt.num(ep.reward, 2),
    h("span", {class: "cut"}, ` (${fmt.num(b.outcome, 2)} + ${fmt.num(b.process_term, 2)})`));
}

function row(ep) {
  const href = `episode/${encodeURIComponent(ep.id)}`;
  const tr = h(
    "tr", {"data-id": ep.id, "data-template": ep.template, "data-status": ep.status, "data-reward": ep.reward},
    h("td", {class: "muted", title: fmt.clock(ep.ended)}, fmt.ago(ep.ended)),
    h("td", {class: "task"}, h("a", {href}, ep.task)),
    h("td", {}, ep.template),
    h("td", {}, badge(ep.status)),
    rewardCell(ep),
    h("td", {class: "num", title: ep.step_errors ? `${ep.step_errors} step errors` : null},
      ep.num_steps, ep.step_errors ? h("span", {class: "cut"}, ` (${ep.step_errors}!)`) : null),
    h("td", {class: "num", title: `longest sequence ${Math.max(0, ...ep.sequences)}`}, tokens(ep.sequences)),
    h("td", {class: "q", title: ep.question}, ep.question),
  );
  tr.addEventListener("click", (ev) => {
    if (ev.target.closest("a")) return;
    location.href = href;
  });
  return tr;
}

function renderEpisodes() {
  const eps = state.episodes;
  syncOptions(document.getElementById("f-template"), new Set(eps.map((e) => e.template)));
  syncOptions(document.getElementById("f-status"), new Set([...STATUSES, ...eps.map((e) => e.status)]));
  const f = filters();
  const shown = eps.filter((e) => matches(e, f));
  document.querySelector("#episodes tbody").replaceChildren(...shown.map(row));
  document.getElementById("empty").hidden = shown.length > 0;
  document.getElementById("shown").textContent =
    `${shown.length} of ${eps.length} shown (the sidecar keeps the last 50)`;
}

// Filters live in the URL's hash, so a reload or a shared link keeps them.
function saveFilters() {
  const f = filters();
  const q = new URLSearchParams();
  if (f.template) q.set("template", f.template);
  if (f.status) q.set("status", f.status);
  if (f.minReward !== "") q.set("min_reward", f.minReward);
  if (f.text) q.set("q", document.getElementById("f-text").value.trim());
  history.replaceState(null, "", q.toString() ? `#${q}` : location.pathname + location.search);
}

function loadFilters() {
  const q = new URLSearchParams(location.hash.slice(1));
  for (const [id, key] of [["f-template", "template"], ["f-status", "status"]]) {
    const v = q.get(key);
    if (v) {
      const sel = document.getElementById(id);
      if (![...sel.options].some((o) => o.value === v)) sel.append(h("option", {value: v}, v));
      sel.value = v;
    }
  }
  document.getElementById("f-reward").value = q.get("min_reward") ?? "";
  document.getElementById("f-text").value = q.get("q") ?? "";
}

// ----------------------------------------------------------------------------- polling

function setLive(ok, why) {
  const el = document.getElementById("live");
  el.className = ok ? "live on" : "live off";
  el.textContent = ok ? `live · ${fmt.clock(Date.now() / 1000)}` : `disconnected (${why}), retrying`;
}

async function poll() {
  try {
    const [sum, eps] = await Promise.all([
      getJSON(`api/summary?since=${state.since}`),
      getJSON("api/episodes"),
    ]);
    state.windowS = sum.window_s;
    state.points.push(...sum.points);
    if (state.points.length) state.since = state.points[state.points.length - 1].t;
    const oldest = Date.now() / 1000 - KEEP_S;
    state.points = state.points.filter((p) => p.t >= oldest);
    state.episodes = eps.episodes;
    const r = sum.run;
    document.getElementById("run").textContent =
      `${r.mode} mode · ${r.policy} policy · G=${r.group_size} · ${r.trajectory}`;
    renderCounters(sum.counters);
    renderErrors(sum.errors);
    drawCharts();
    renderEpisodes();
    setLive(true);
  } catch (e) {
    setLive(false, e.status ? `HTTP ${e.status}` : "no answer");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function main() {
  buildCharts();
  loadFilters();
  const form = document.getElementById("filters");
  form.addEventListener("input", () => (saveFilters(), renderEpisodes()));
  form.addEventListener("submit", (ev) => ev.preventDefault());
  form.addEventListener("reset", () => setTimeout(() => (saveFilters(), renderEpisodes())));
  for (const b of document.querySelectorAll("#range button")) {
    b.addEventListener("click", () => {
      state.rangeMin = Number(b.dataset.min);
      for (const o of document.querySelectorAll("#range button")) o.classList.toggle("on", o === b);
      drawCharts();
    });
  }
  let resizing = 0;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(drawCharts, 100);
  });
  poll();
}

main();
