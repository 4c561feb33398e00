// One episode, step by step: the action and its arguments, the model's text, the
// observation it got back (in som mode the numbered view), the reward's breakdown and
// the last marked screenshot.
"use strict";

const ID = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());

function fact(dl, k, v) {
  if (v === null || v === undefined || v === "") return;
  dl.append(h("dt", {}, k), h("dd", {}, v));
}

function renderTop(ep) {
  document.title = `${ep.task} · episode · rollout sidecar`;
  document.getElementById("title").textContent = ep.task;
  document.getElementById("badge").replaceChildren(badge(ep.status));
  const dl = document.getElementById("facts");
  fact(dl, "question", ep.question);
  fact(dl, "expected", ep.expected);
  fact(dl, "answer", ep.answer ?? "(none)");
  fact(dl, "template", ep.template);
  fact(dl, "mode", ep.mode);
  fact(dl, "episode", ep.id);
  fact(dl, "finished", `${fmt.clock(ep.ended)} (${fmt.ago(ep.ended)})`);
  const seqs = ep.sequences;
  fact(dl, "tokens", seqs.length === 1 ? fmt.count(seqs[0]) : `${seqs.length} turns, longest ${fmt.count(Math.max(...seqs))}`);
  const t = ep.timings || {};
  if (t.wall_s !== undefined) {
    fact(dl, "time", `${fmt.num(t.wall_s, 1)} s (model ${fmt.num(t.gen_s ?? 0, 1)} s, environment ${fmt.num(t.env_s ?? 0, 1)} s)`);
  }
  fact(dl, "error", ep.error);
  document.getElementById("prompt").textContent = ep.prompt || "";
  document.getElementById("prompt-box").hidden = !ep.prompt;
}

function renderReward(ep) {
  const big = document.getElementById("reward");
  big.replaceChildren(fmt.num(ep.reward, 3), " ", ep.reward >= 1 ? badge("success") : null);
  const split = processSplit(ep.breakdown);
  if (split) big.append(h("div", {class: "reward-split muted"}, split));
  const rows = Object.entries(ep.breakdown || {}).map(([k, v]) => {
    let cell;
    if (typeof v === "boolean") cell = h("td", {}, h("span", {class: v ? "badge ok" : "badge"}, v ? "yes" : "no"));
    else if (typeof v === "number") cell = h("td", {class: "num"}, fmt.num(v, 3));
    else cell = h("td", {}, String(v));
    return h("tr", {}, h("td", {}, k), cell);
  });
  if (!rows.length) rows.push(h("tr", {}, h("td", {class: "muted"}, "no breakdown recorded")));
  document.querySelector("#breakdown tbody").replaceChildren(...rows);
}

/** The reward's outcome and process term apart (rollout.verifiers.process); null when the
 * process reward is off. */
function processSplit(b) {
  if (!b || typeof b.process_term !== "number") return null;
  const why = b.process_error || b.process_note;
  return `outcome ${fmt.num(b.outcome, 3)} + process ${fmt.num(b.process_term, 3)} ` +
    `(r_process ${fmt.num(b.process, 3)} from ${b.process_source}${why ? `: ${why}` : ""})`;
}

function renderShot(ep) {
  const box = document.getElementById("shot-box");
  box.hidden = !ep.has_screenshot;
  if (!ep.has_screenshot) return;
  const src = `${encodeURIComponent(ID)}/screenshot.png`;
  document.getElementById("screenshot").src = src;
  document.getElementById("shot-link").href = src;
}

function cut(kept, total) {
  return total > kept ? h("span", {class: "cut"}, ` (first ${fmt.count(kept)} of ${fmt.count(total)} chars)`) : null;
}

function step(st, i) {
  const n = st.index ?? i + 1;
  const kind = st.error ? "err" : st.action === "answer" ? "answer" : "";
  const head = h(
    "div", {class: "step-head"},
    h("span", {class: "n"}, `${n}.`),
    h("span", {class: "call"}, callText(st.action, st.args)),
    st.error ? h("span", {class: "badge error"}, st.error.replace("_", " ")) : null,
    h("span", {class: "summary"}, st.summary || ""),
    h("span", {class: "ms"}, fmt.ms(st.ms)),
  );
  const raw = h("div", {}, h("h3", {}, "model text", cut(st.raw.length, st.raw_chars ?? st.raw.length)),
    h("pre", {class: "raw"}, st.raw));
  const view = h("div", {}, h("h3", {}, "observation", cut(st.view.length, st.view_chars ?? st.view.length)),
    st.view ? h("pre", {class: "view"}, st.view) : h("p", {class: "muted"}, st.action === "answer" ? "(the episode ended)" : "(none)"));
  const src = `${encodeURIComponent(ID)}/step/${n}/screenshot.png`;
  const shot = st.screenshot
    ? h("div", {class: "step-shot"}, h("h3", {}, "marked view"),
        h("a", {href: src, target: "_blank"}, h("img", {src, alt: `step ${n}, marked view`, loading: "lazy"})))
    : null;
  return h(
    "li", {class: `step ${kind}`, id: `step-${n}`},
    head,
    st.url ? h("div", {class: "url"}, st.url) : null,
    st.note ? h("div", {class: "note"}, st.note) : null,
    h("div", {class: shot ? "step-body with-shot" : "step-body"}, raw, view, shot),
  );
}

function renderSteps(ep) {
  const strip = document.getElementById("strip");
  strip.replaceChildren(...ep.steps.map((st, i) => {
    const n = st.index ?? i + 1;
    const kind = st.error ? "err" : st.action === "answer" ? "answer" : "";
    return h("a", {href: `#step-${n}`, class: kind, title: callText(st.action, st.args)}, n);
  }));
  document.getElementById("steps").replaceChildren(...ep.steps.map(step));
  if (!ep.steps.length) document.getElementById("steps").append(h("li", {class: "muted"}, "no steps"));
}

async function main() {
  let ep;
  try {
    ep = await getJSON(`../api/episode/${encodeURIComponent(ID)}`);
  } catch (e) {
    const box = document.getElementById("missing");
    box.textContent = e.status === 404
      ? `Episode ${ID} is not among the episodes the sidecar keeps (the last 50).`
      : `Could not load episode ${ID}: ${e.message}`;
    box.hidden = false;
    return;
  }
  renderTop(ep);
  renderReward(ep);
  renderShot(ep);
  renderSteps(ep);
  document.getElementById("content").hidden = false;
  if (location.hash) document.getElementById(location.hash.slice(1))?.scrollIntoView();
}

main();
