"use strict";
const doc = JSON.parse(document.getElementById("pvisor-data").textContent);
const el = (tag, attrs, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
};
const fmtMs = (ms) => ms == null ? "-" : (ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : ms.toFixed(1) + " ms");
const usageText = (u) => {
  if (!u || typeof u !== "object") return null;
  const inp = u.input_tokens ?? u.prompt_tokens ?? u.promptTokenCount;
  const out = u.output_tokens ?? u.completion_tokens ?? u.candidatesTokenCount;
  if (inp == null && out == null) return null;
  return `tokens in ${inp ?? "?"} / out ${out ?? "?"}`;
};
function header() {
  const r = doc.run, top = document.getElementById("top");
  top.append(el("h1", {text: `${r.agent || "run"} ${r.agent_version || ""} · ${r.id}`}));
  const m = el("div", {class: "meta"});
  const add = (k, v) => { if (v != null && v !== "") m.append(el("span", {}, k + " ", el("b", {text: String(v)}))); };
  add("mode", r.mode); add("steps", r.steps); add("exchanges", doc.exchanges.length);
  add("protocol", r.protocol); add("model", r.model);
  add("capture", [...new Set(doc.exchanges.map(e => e.capture))].join(", "));
  add("created", r.created_ms ? new Date(r.created_ms).toISOString().replace("T", " ").slice(0, 19) + " UTC" : null);
  for (const a of doc.attempts) add(`attempt ${a.n}: exit`, a.exit_code == null ? "-" : a.exit_code);
  const L = r.lineage;
  if (L && L.mode === "handoff") {
    // a handoff's child: the parent (or the native file), the pause, its snapshot, the two agents
    const span = el("span", {id: "parent"}, "handed off from ");
    if (L.workspace_snapshot) span.title = `workspace snapshot ${L.workspace_snapshot}`;
    span.append(parentRef(r));
    const k = L.pause_transition;
    span.append(` at the pause after step ${L.boundary_step}` + (k == null ? "" : ` (${k === L.boundary_step ? "before " : ""}transition ${k})`));
    if (L.workspace_snapshot) span.append(`, workspace snapshot ${L.workspace_snapshot.slice(0, 12)}`);
    if (L.handoff_from_agent || L.handoff_to_agent) span.append(`, ${L.handoff_from_agent || "?"} → ${L.handoff_to_agent || "?"}`);
    m.append(span);
  } else if (r.parent_run) {
    const span = el("span", {id: "parent"}, "replayed from ");
    span.append(parentRef(r));
    span.append(` after step ${r.boundary_step}`);
    m.append(span);
  }
  top.append(m);
  if (doc.children.length) {
    // the runs replayed or handed off from this one; a link where their page was written beside
    const list = el("ul", {id: "children"});
    for (const c of doc.children) {
      const href = doc.child_hrefs[c.id];
      const item = el("li", {}, href ? el("a", {href, "data-run": c.id, text: c.id}) : el("b", {text: c.id}));
      const k = c.pause_transition;
      item.append(` ${c.mode} · ${c.agent || "-"} · after step ${c.boundary_step}` + (k == null ? "" : ` (${k === c.boundary_step ? "before " : ""}transition ${k})`));
      list.append(item);
    }
    top.append(el("div", {class: "meta"}, `child runs (${doc.children.length}):`), list);
  }
  if (r.task) top.append(el("div", {class: "task", id: "task", text: r.task}));
}
function parentRef(r) {
  if (r.parent_run) return doc.parent_href ? el("a", {href: doc.parent_href, id: "parent-link", text: r.parent_run}) : el("b", {text: r.parent_run});
  const kind = r.labels.source_kind, src = r.labels.source;
  return el("b", {text: src ? `the ${kind || "source"} file ${src}` : "-"});
}
function bodyBlock(ex, which) {
  const b = ex[which];
  const d = el("details", {class: "body " + which, "data-exchange": ex.id});
  d.append(el("summary", {text: b ? `${which} (${b.size.toLocaleString()} bytes${b.cut ? ", cut" : ""})` : `${which}: none`}));
  if (b) d.addEventListener("toggle", () => {
    if (d.open && !d.querySelector("pre")) d.append(el("pre", {text: b.text}));
  });
  return d;
}
function comparisonFor(n) {
  const c = doc.comparison.find(x => x.n === n);
  if (!c || !c.calls.length) return null;
  const box = el("details", {class: "compare", "data-step": String(n)});
  const same = c.calls.every(k => k.diff == null);
  const alike = c.calls.every(k => k.same_normalised);
  box.append(el("summary", {text: same ? "O against O′: equal" : alike ? "O against O′: equal once normalised" : "O against O′: differs"}));
  for (const k of c.calls) {
    if (k.diff == null) { box.append(el("div", {class: "equal", text: `${k.name}: O′ equals O`})); continue; }
    if (k.same_normalised) box.append(el("div", {class: "equal", text: `${k.name}: O′ equals O once the agent's own decorations (timings, ids) are normalised; the bytes differ:`}));
    const grid = el("div", {class: "cmp"});
    grid.append(el("div", {}, el("h4", {text: `O (recorded) · ${k.name}`}), el("pre", {text: k.O})));
    grid.append(el("div", {}, el("h4", {text: "O′ (replayed)"}), el("pre", {text: k.O2})));
    box.append(grid);
    const diff = el("pre", {class: "diff"});
    for (const [kind, line] of k.diff) diff.append(el("span", {class: kind === "+" ? "d-add" : kind === "-" ? "d-del" : kind === "@" ? "d-at" : "", text: (kind === "@" ? "" : kind) + line}));
    box.append(diff);
  }
  return box;
}
function row(ex) {
  const s = ex.step;
  const r = el("div", {class: "row " + (s ? "main" : "aux"), id: "ex-" + ex.id, "data-exchange": ex.id});
  const head = el("div", {class: "head"});
  if (s) head.append(el("span", {class: "step-n", text: `step ${s.n}`}));
  head.append(el("span", {text: `#${ex.seq} ${ex.method} ${ex.path}`}));
  head.append(el("span", {class: "pill" + (ex.outcome === "ok" ? "" : " bad"), text: `${ex.status ?? "-"} ${ex.outcome}`}));
  if (ex.served_by) head.append(el("span", {class: "pill", title: "served by", text: ex.served_by}));
  head.append(el("span", {text: `at ${fmtMs(ex.at_ms)} · ${fmtMs(ex.ms)}`}));
  if (ex.attempt > 1) head.append(el("span", {class: "pill", text: `attempt ${ex.attempt}`}));
  for (const f of ex.flags) head.append(el("span", {class: "pill flag", text: f}));
  if (s) {
    const u = usageText(s.usage); if (u) head.append(el("span", {class: "usage", text: u}));
    for (const f of s.flags) head.append(el("span", {class: "pill flag", text: f}));
    if (s.retries.length) head.append(el("span", {class: "pill flag", text: `${s.retries.length} retr${s.retries.length > 1 ? "ies" : "y"}`}));
  } else if (ex.aux) {
    head.append(el("span", {text: `auxiliary${ex.aux.kind ? " [" + ex.aux.kind + "]" : ""} ${ex.aux.reason || ""}`}));
  }
  r.append(head);
  if (s) {
    if (s.text) r.append(el("div", {class: "text action", text: s.text}));
    for (const c of s.calls) r.append(el("div", {class: "call"}, el("span", {class: "name", text: c.name}), "(", el("span", {text: c.args}), ")"));
    if (s.results.length || s.messages.length) {
      const o = el("details", {class: "observation"});
      o.append(el("summary", {text: `observation: ${s.results.length} result(s)` + (s.messages.length ? `, ${s.messages.length} message(s)` : "")}));
      for (const res of s.results) o.append(el("pre", {class: res.error ? "error" : "", text: res.text}));
      for (const m of s.messages) o.append(el("pre", {text: m}));
      r.append(o);
    }
    const cmp = comparisonFor(s.n); if (cmp) r.append(cmp);
  }
  r.append(bodyBlock(ex, "request"), bodyBlock(ex, "response"));
  return r;
}
const SLICE = 200;
let next = 0;
const timeline = document.getElementById("timeline"), more = document.getElementById("more");
function renderSlice() {
  const end = Math.min(next + SLICE, doc.exchanges.length);
  const frag = document.createDocumentFragment();
  for (; next < end; next++) {
    const ex = doc.exchanges[next];
    frag.append(row(ex));
    const b = doc.run.boundary_step;
    if (b != null && ex.step && ex.step.n === b) {
      // a handoff's child re-ran the parent's actions translated into its own tools: O″, not O′
      const text = doc.run.mode === "handoff" ? `boundary: the pause after step ${b}, request ${b + 1} ends at the re-enacted observation O″${b}` : `boundary: after step ${b}, request ${b + 1} ends at the replayed observation O′${b}`;
      frag.append(el("div", {class: "boundary", id: "boundary", text}));
    }
  }
  timeline.append(frag);
  more.textContent = next < doc.exchanges.length ? `${doc.exchanges.length - next} more exchange(s) below…` : `generated ${doc.generated} by pvisor`;
}
header();
renderSlice();
// "#all" renders every exchange at once (to print, or search the whole page with the browser)
if (location.hash === "#all") while (next < doc.exchanges.length) renderSlice();
new IntersectionObserver((entries) => {
  if (entries.some(e => e.isIntersecting) && next < doc.exchanges.length) renderSlice();
}, {rootMargin: "800px"}).observe(more);
window.pvisorReadyMs = performance.now();
document.body.dataset.ready = "1";
