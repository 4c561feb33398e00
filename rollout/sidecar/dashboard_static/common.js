// Helpers shared by the dashboard's pages. Text from the model or the web is only ever
// set as text (never as HTML).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

/** An element: h("td", {class: "num"}, "0.50", child, ...). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  for (const c of children) {
    if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

/** An SVG element with its attributes. */
function s(tag, attrs) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
}

async function getJSON(url) {
  const r = await fetch(url, {cache: "no-store"});
  if (!r.ok) {
    const err = new Error(`${url}: HTTP ${r.status}`);
    err.status = r.status;
    throw err;
  }
  return r.json();
}

const fmt = {
  num(v, digits = 2) {
    return v === null || v === undefined || !isFinite(v) ? "–" : Number(v).toFixed(digits);
  },
  pct(v) {
    return v === null || v === undefined ? "–" : `${(100 * v).toFixed(0)}%`;
  },
  ms(v) {
    if (v === null || v === undefined) return "–";
    return v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${Math.round(v)} ms`;
  },
  rate(v) {
    return v === null || v === undefined ? "–" : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  },
  count(v) {
    return v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US");
  },
  ago(unix) {
    const d = Math.max(0, Date.now() / 1000 - unix);
    if (d < 60) return `${Math.round(d)} s ago`;
    if (d < 3600) return `${Math.round(d / 60)} min ago`;
    return `${(d / 3600).toFixed(1)} h ago`;
  },
  duration(sec) {
    if (sec < 60) return `${Math.round(sec)} s`;
    if (sec < 3600) return `${Math.floor(sec / 60)} min ${Math.round(sec % 60)} s`;
    return `${Math.floor(sec / 3600)} h ${Math.round((sec % 3600) / 60)} min`;
  },
  clock(unix) {
    return new Date(unix * 1000).toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", second: "2-digit"});
  },
};

function badge(status) {
  return h("span", {class: `badge ${status}`}, status.replace("_", " "));
}

/** A bar for a reward: its share of [0, 1], clamped. */
function rewardBar(r) {
  const bar = h("span", {class: "rbar"}, h("i"));
  bar.firstChild.style.width = `${Math.max(0, Math.min(1, r)) * 100}%`;
  return bar;
}

/** 'search(query="x")' for a step; "(no action)" when the text did not parse. */
function callText(action, args) {
  if (!action) return "(no action)";
  const parts = Object.entries(args || {}).map(([k, v]) => {
    const j = JSON.stringify(v);
    return `${k}=${j.length > 200 ? j.slice(0, 200) + "…" : j}`;
  });
  return `${action}(${parts.join(", ")})`;
}
