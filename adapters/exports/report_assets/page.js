"use strict";
// The run page (docs/report.md): the data is the JSON above (report_document.run_document); every
// field past the run, its exchanges and attempts may be missing (an older pvisor wrote the page,
// or --no-workspace): its part is then not drawn.
const doc = JSON.parse(document.getElementById("pvisor-data").textContent);
const el = (tag, attrs, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null) continue;
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
};
const put = (parent, ...kids) => { for (const k of kids) if (k != null) parent.append(k); };
const fmtMs = (ms) => ms == null ? "-" : (ms >= 60000 ? `${Math.floor(ms / 60000)} min ${((ms % 60000) / 1000).toFixed(0)} s` : ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : ms.toFixed(1) + " ms");
const fmtN = (n) => n == null ? "-" : Number(n).toLocaleString("en");
const clip = (s, n) => s.length > n ? s.slice(0, n - 1) + "…" : s;
const usageText = (u) => {
  if (!u || typeof u !== "object") return null;
  // counts only: a usage object is the model's (or a hostile journal's) JSON, any value at all
  const num = (...vs) => vs.find(v => typeof v === "number" && isFinite(v));
  const inp = num(u.input_tokens, u.prompt_tokens, u.promptTokenCount);
  const out = num(u.output_tokens, u.completion_tokens, u.candidatesTokenCount);
  if (inp == null && out == null) return null;
  return `tokens in ${inp ?? "?"} / out ${out ?? "?"}`;
};
const EX = doc.exchanges, RUN = doc.run;
const rowIndex = new Map();   // step n -> index of its exchange in EX
EX.forEach((ex, i) => { if (ex.step) rowIndex.set(ex.step.n, i); });

// ---- what marks a step: failed calls, divergences (O' against O, the request against the parent's), retries
const resultFailed = (s, c) => s.results.some(r => r.error && r.call_id != null && r.call_id === c.id);
const callFailed = (s, c) => c.failed ?? resultFailed(s, c);
const differsAt = new Map();  // step n -> O' differs from O (not alike once normalised)
for (const c of doc.comparison || []) if (c.calls.some(k => k.diff != null && !k.same_normalised)) differsAt.set(c.n, true);
// an exchange that is no step: the chain rule's auxiliary one (its retried requests among them:
// what totals.auxiliary counts), or the replay's synthetic final reply that ended the agent
const isEnd = (ex) => !ex.step && ((ex.aux && ex.aux.kind === "synthetic_end") || (ex.flags || []).includes("synthetic_end"));
const isAux = (ex) => !ex.step && !isEnd(ex) && !(ex.aux && ex.aux.kind === "other");
// doc.diff's entry of each exchange (index in EX): by this run's exchange id (b), else the
// request after the boundary (after_boundary: the replay's synthetic end), else by step
const requestDiffOf = new Map();
{
  const byId = new Map(EX.map((ex, i) => [ex.id, i])), end = EX.findIndex(isEnd);
  for (const d of (doc.diff && doc.diff.steps) || []) {
    const i = d.b != null && byId.has(d.b) ? byId.get(d.b) : d.after_boundary && end >= 0 ? end : rowIndex.get(d.step);
    if (i != null) requestDiffOf.set(i, d);
  }
}
// a request that differs from the parent's only incidentally (adapters/request_diff.py's
// only_incidental: the runs' own paths, ids the agent makes per run, its output decorations; an
// older diff's only_run_paths) does not diverge
const INCIDENTAL = {run_paths: "the runs' own paths", agent_ids: "the agent's ids", decorations: "the agent's output decorations"};
const onlyIncidental = (rd) => rd != null && rd.verdict === "differs" && (rd.only_incidental ?? rd.only_run_paths) === true;
const differencesOf = (d) => Array.isArray(d.differences) && d.differences.length ? d.differences : d.structure ? [d.structure] : [];
// a difference is incidental by its own flag (or kind), or when the whole request's are
const isIncidental = (d, st) => st && typeof st === "object" && (st.incidental ?? (st.kind != null ? st.kind !== "real" : onlyIncidental(d))) === true;
const realOf = (d) => differencesOf(d).filter(st => !isIncidental(d, st));
const incidentalOf = (d) => differencesOf(d).filter(st => isIncidental(d, st));
// the words of a request's incidental differences: "the runs' own paths, the agent's ids"
function incidentalWords(d) {
  const kinds = [...new Set(incidentalOf(d).map(st => st.kind || (d.only_incidental == null ? "run_paths" : null)))];
  const words = kinds.map(k => INCIDENTAL[k]).filter(Boolean);
  return words.length ? words.join(", ") : "incidental parts";
}
function marksOf(ex, i) {
  const s = ex.step, m = {failed: false, divergent: false, retry: false, aux: isAux(ex), end: isEnd(ex), bytes: false, paths: false};
  const rd = requestDiffOf.get(i);
  m.paths = onlyIncidental(rd);
  m.bytes = rd != null && rd.verdict === "bytes_only";
  m.divergent = (s != null && differsAt.has(s.n)) || (rd != null && rd.verdict === "differs" && !m.paths);
  if (!s) return m;
  m.failed = s.calls.some(c => callFailed(s, c)) || s.results.some(r => r.error);
  m.retry = (s.retries || []).length > 0;
  return m;
}
const MARKS = EX.map(marksOf);
// the first exchange of each attempt after the first (a resume): its index -> the attempt
const ATTEMPT_AT = new Map();
EX.forEach((ex, i) => { if (ex.attempt > 1 && (i === 0 || EX[i - 1].attempt !== ex.attempt)) ATTEMPT_AT.set(i, (doc.attempts || []).find(a => a.n === ex.attempt) || {n: ex.attempt}); });
const attemptText = (a) => `attempt ${a.n}` + (a.command ? `: ${a.command}` : "");

// ---- the header: the run, its outcome at a glance, its totals, its lineage
function header() {
  const r = RUN, top = document.getElementById("top");
  // each text of the journal isolated: a right-to-left override in one turns no other
  const h1 = el("h1", {}, el("bdi", {class: "agent", text: r.agent || "run"}));
  if (r.agent_version) h1.append(" ", el("bdi", {class: "version", text: r.agent_version}));
  h1.append(" · ", el("bdi", {class: "run-id", text: r.id}));
  top.append(h1);
  outcome(top);
  const m = el("div", {class: "meta"});
  const add = (k, v) => { if (v != null && v !== "") m.append(el("span", {}, k + " ", el("b", {}, el("bdi", {text: String(v)})))); };
  add("mode", r.mode); add("steps", r.steps); add("exchanges", EX.length);
  add("protocol", r.protocol); add("model", r.model);
  add("capture", [...new Set(EX.map(e => e.capture))].join(", "));
  add("created", r.created_ms ? new Date(r.created_ms).toISOString().replace("T", " ").slice(0, 19) + " UTC" : null);
  for (const a of doc.attempts) add(`attempt ${a.n}: exit`, a.exit_code == null ? "-" : a.exit_code);
  const labels = r.labels && typeof r.labels === "object" ? r.labels : {};
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
    const span = el("span", {id: "parent"}, `${r.mode === "continuation" ? "continued" : "replayed"} from `);
    span.append(parentRef(r));
    span.append(` after step ${r.boundary_step}`);
    m.append(span);
  }
  if (doc.index_href) m.append(el("span", {}, el("a", {id: "index-link", href: doc.index_href, text: "all runs"})));
  top.append(m);
  totals(top);
  if (doc.children.length) {
    // the runs replayed, continued or handed off from this one; a link where their page was written beside
    const list = el("ul", {id: "children"});
    for (const c of doc.children) {
      const href = (doc.child_hrefs || {})[c.id];
      const item = el("li", {}, href ? el("a", {href, "data-run": c.id, text: c.id}) : el("b", {text: c.id}));
      const k = c.pause_transition;
      item.append(` ${c.mode} · ${c.agent || "-"} · after step ${c.boundary_step}` + (k == null ? "" : ` (${k === c.boundary_step ? "before " : ""}transition ${k})`));
      list.append(item);
    }
    top.append(el("div", {class: "meta"}, `child runs (${doc.children.length}):`), list);
  }
  task(top, labels);
}
// the task as the journal records it (the run's label task: the prompt pvisor run was given), the
// first user message as the agent rendered it folded below; each later attempt's command line
// (the journal keeps no prompt of a resumed attempt apart from it)
function task(top, labels) {
  const given = typeof labels.task === "string" && labels.task ? labels.task : null, rendered = RUN.task;
  const box = el("div", {class: "task", id: "task"});
  if (given) box.append(el("div", {class: "given", id: "task-given"}, el("span", {class: "k", text: "task: "}), el("bdi", {text: given})));
  if (rendered && rendered !== given) {
    if (given) box.append(el("details", {id: "task-rendered"}, el("summary", {text: `the first user message, as the agent sent it (${fmtN(rendered.length)} characters)`}), el("div", {class: "text", text: rendered})));
    else box.append(el("div", {class: "text", id: "task-rendered", text: rendered}));
  }
  for (const a of doc.attempts) {
    if (a.n > 1 && a.command) box.append(el("div", {class: "attempt-task", "data-attempt": String(a.n)}, el("span", {class: "k", text: `attempt ${a.n}'s command: `}), el("code", {text: a.command})));
  }
  if (box.childNodes.length) top.append(box);
}
function parentRef(r) {
  if (r.parent_run) return doc.parent_href ? el("a", {href: doc.parent_href, id: "parent-link"}, el("bdi", {text: r.parent_run})) : el("b", {}, el("bdi", {text: r.parent_run}));
  const kind = r.labels.source_kind, src = r.labels.source;
  return el("b", {text: src ? `the ${kind || "source"} file ${src}` : "-"});
}
const VERDICT = {succeeded: "succeeded", failed: "failed", interrupted: "interrupted", timed_out: "timed out", running: "running (or its pvisor was stopped)", unknown: "unknown"};
function outcome(top) {
  const o = doc.outcome;
  if (!o || typeof o !== "object") return;
  const v = VERDICT[o.verdict] ? o.verdict : "unknown";
  const box = el("div", {id: "outcome"}, el("span", {class: "verdict v-" + v, id: "verdict", "data-verdict": v, text: VERDICT[v]}));
  const part = (id, text) => box.append(el("span", {id, text}));
  // the agent's own account first: an agent that exited 0 but failed by its account reads as failed
  const a = o.agent_status;
  if (a && a.outcome) part("agent-status", `the agent's account: ${a.outcome}${a.detail ? ` (${a.detail})` : ""}`);
  // the agent's exit code: when pvisor stopped it, its signal's (143 for SIGTERM), not pvisor run's (124, 130)
  const stopped = o.interrupted ? `interrupted by ${o.interrupted}` : o.timed_out ? "timed out" : null;
  part("exit-code", o.exit_code == null ? "no exit code" : `exit ${o.exit_code}` + (stopped ? ` (the agent's, stopped by pvisor: ${stopped})` : ""));
  if (o.replay_status) part("replay-status", `replay: ${o.replay_status}`);
  if (o.interrupted) part("interrupted", `interrupted by ${o.interrupted}`);
  else if (o.timed_out) part("interrupted", "timed out");
  else part("interrupted", "not interrupted");
  if (o.run_status && o.run_status !== o.verdict) part("run-status", `run status: ${o.run_status}`);
  top.append(box);
}
// what the exchanges are, adding up to their count: steps, auxiliary ones (requests sent again
// among them), the replay's final replies that ended the agent, any other
function exchangeParts(t) {
  if (typeof t.exchanges !== "number" || typeof t.steps !== "number") return null;
  const parts = [[t.steps, "step", "steps"], [t.auxiliary, "auxiliary", "auxiliary"], [t.synthetic_end, "ended by the replay", "ended by the replay"]];
  const known = parts.reduce((a, [n]) => a + (typeof n === "number" ? n : 0), 0);
  if (t.exchanges > known) parts.push([t.exchanges - known, "other", "other"]);
  const text = parts.filter(([n], i) => i === 0 || (typeof n === "number" && n > 0)).map(([n, one, many]) => `${fmtN(n)} ${n === 1 ? one : many}`);
  return text.length > 1 ? el("span", {class: "parts", text: ` (${text.join(", ")})`}) : null;
}
function totals(top) {
  const t = doc.totals;
  if (!t || typeof t !== "object") return;
  const grid = el("div", {id: "totals"});
  // data-value: the figure unrounded (ms), for a reader's tools and the tests
  const cell = (key, label, value, extra, raw) => {
    if (value === undefined) return;
    grid.append(el("div", {"data-total": key, "data-value": raw == null ? null : String(raw)}, el("span", {class: "k", text: label}), el("span", {class: "v", text: value}), extra));
  };
  cell("steps", "steps", fmtN(t.steps));
  cell("exchanges", "exchanges", fmtN(t.exchanges), exchangeParts(t), t.exchanges);
  cell("tokens", "tokens in / out / cached", t.tokens_in === undefined ? undefined : `${fmtN(t.tokens_in)} / ${fmtN(t.tokens_out)} / ${fmtN(t.tokens_cached)}`);
  cell("wall", "wall time", t.wall_ms === undefined ? undefined : fmtMs(t.wall_ms), null, t.wall_ms);
  if (t.model_ms !== undefined || t.tool_ms !== undefined) {
    const mm = t.model_ms || 0, tm = t.tool_ms || 0, sum = mm + tm;
    // the ratio bar only when there are two times to set side by side: no tool time, no bar
    const bar = tm > 0 && mm > 0 ? el("div", {class: "share", title: `model ${fmtMs(t.model_ms)}, tools ${fmtMs(t.tool_ms)}`}) : null;
    if (bar && sum > 0) bar.append(el("span", {class: "m", style: `width:${(100 * mm / sum).toFixed(1)}%`}), el("span", {class: "t", style: `width:${(100 * tm / sum).toFixed(1)}%`}));
    cell("model-tool", "model / tools", `${fmtMs(t.model_ms)} / ${fmtMs(t.tool_ms)}`, bar, `${t.model_ms} ${t.tool_ms}`);
  }
  cell("tool_calls", "tool calls", t.tool_calls === undefined ? undefined : fmtN(t.tool_calls));
  cell("failed_calls", "failed calls", t.failed_calls === undefined ? undefined : fmtN(t.failed_calls));
  cell("retries", "retries", t.retries === undefined ? undefined : fmtN(t.retries));
  cell("auxiliary", "auxiliary requests", t.auxiliary === undefined ? undefined : fmtN(t.auxiliary));
  top.append(grid);
}

const BAR_MAX = 96;  // px: the widest bar of the chart
// ---- the overview: the timeline chart, the system prompt and tools, where the requests part from the parent's
function chart(box) {
  const steps = EX.filter(e => e.step);
  if (!steps.length) return;
  // bars as wide as the box allows (up to BAR_MAX px; a long run's as narrow as it takes, and
  // scrolls sideways)
  const n = steps.length, room = Math.floor(Math.max(300, box.clientWidth - 12) / n);
  const least = n > 300 ? 3 : n > 120 ? 5 : n > 40 ? 9 : 16;
  const H = 90, gap = Math.max(least, room) > 5 ? Math.min(4, Math.max(1, Math.floor(room / 8))) : 0;
  const w = Math.max(least, Math.min(BAR_MAX, room - gap));
  const times = steps.map(e => {
    const s = e.step, model = s.model_ms ?? e.ms ?? 0, tool = s.tool_ms ?? 0;
    return [model, tool];
  });
  const top = Math.max(1, ...times.map(([a, b]) => a + b));
  const W = steps.length * (w + gap);
  // one string for the whole chart: a thousand bars built element by element cost ten times more
  const parts = [];
  steps.forEach((e, i) => {
    const s = e.step, [model, tool] = times[i], x = i * (w + gap);
    // a resumed attempt's first step: a thin line before its bar, the attempt in its tooltip
    const at = ATTEMPT_AT.get(rowIndex.get(s.n)) || (i > 0 && e.attempt !== steps[i - 1].attempt ? {n: e.attempt} : null);
    if (at) parts.push(`<g class="attempt" data-attempt="${at.n}"><title>${attemptText((doc.attempts || []).find(a => a.n === at.n) || at).replace(/&/g, "&amp;").replace(/</g, "&lt;")}</title><rect x="${Math.max(0, x - Math.max(1, gap) / 2 - 1)}" y="0" width="2" height="${H}"/></g>`);
    const hm = Math.max(1, Math.round((H - 6) * model / top)), ht = Math.round((H - 6) * tool / top);
    const tk = s.tokens || {}, u = usageText(s.usage);
    const tokens = tk.in != null || tk.out != null ? `tokens in ${tk.in ?? "?"} / out ${tk.out ?? "?"}${tk.cached != null ? ` / cached ${tk.cached}` : ""}` : ((!s.tokens && u) || "no token usage reported");
    const mk = MARKS[rowIndex.get(s.n)];
    const title = `step ${s.n}: model ${fmtMs(s.model_ms ?? e.ms)}, tools ${fmtMs(s.tool_ms)}; ${tokens}${mk.failed ? "; a call failed" : ""}${mk.divergent ? "; diverges" : ""}`;
    parts.push(`<a href="#step-${s.n}" data-step="${s.n}"><title>${title.replace(/&/g, "&amp;").replace(/</g, "&lt;")}</title>` +
      `<rect class="m" x="${x}" y="${H - hm}" width="${w}" height="${hm}"/>` +
      (ht > 0 ? `<rect class="t" x="${x}" y="${H - hm - ht}" width="${w}" height="${ht}"/>` : "") +
      (mk.failed ? `<rect class="f" x="${x}" y="0" width="${w}" height="3"/>` : mk.divergent ? `<rect class="d" x="${x}" y="0" width="${w}" height="3"/>` : "") +
      `<rect class="hit" x="${x}" y="0" width="${w + gap}" height="${H}" fill="transparent"/></a>`);
  });
  const wrap = el("div", {id: "chart"});
  wrap.innerHTML = `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" role="img" aria-label="steps: model and tool time">${parts.join("")}</svg>`;
  const legend = el("div", {class: "legend"}, el("span", {}, el("i", {style: "background:var(--model)"}), "model time"),
    el("span", {}, el("i", {style: "background:var(--tool)"}), "tool time"),
    el("span", {}, el("i", {style: "background:var(--bad)"}), "a failed call"),
    el("span", {}, el("i", {style: "background:var(--mark)"}), "diverges"),
    ATTEMPT_AT.size ? el("span", {}, el("i", {style: "background:var(--run);width:2px"}), "a resumed attempt starts") : null,
    el("span", {text: `${steps.length} step${steps.length > 1 ? "s" : ""}; the tallest bar is ${fmtMs(top)}`}));
  box.append(el("h2", {text: "Timeline"}), legend, wrap);
}
function system(box) {
  const s = doc.system;
  if (!s || (!s.text && !(s.tools || []).length)) return;
  const tools = s.tools || [];
  const d = el("details", {id: "system"}, el("summary", {text: `system prompt${s.text ? ` (${fmtN(s.text.length)} characters)` : ": none"} and ${tools.length} tool(s)`}));
  d.addEventListener("toggle", () => {
    if (!d.open || d.dataset.drawn) return;
    d.dataset.drawn = "1";
    if (s.text) d.append(el("pre", {class: "system-text", text: s.text}));
    for (const t of tools) {
      const td = el("details", {class: "tool"}, el("summary", {}, el("b", {text: t.name}), t.description ? ` — ${clip(t.description.split("\n")[0], 160)}` : ""));
      if (t.description) td.append(el("div", {class: "text", text: t.description}));
      if (t.parameters) td.append(el("pre", {text: pretty(t.parameters)}));
      d.append(td);
    }
  });
  box.append(d);
}
// a request's difference from the parent's in one line: the real differences first (up to
// upTo of them), the incidental ones as one clause, where the bytes part last
function rdSentence(d, upTo) {
  if (d.sentence) return d.sentence;
  if (d.verdict === "same") return `same bytes${d.a_bytes != null ? ` (${fmtN(d.a_bytes)} bytes)` : ""}`;
  const at = d.first_byte != null ? `the bodies part at byte ${fmtN(d.first_byte)}` : "the bodies differ";
  if (d.verdict === "bytes_only") return `${at}, the prompt does not (key order, whitespace)`;
  if (onlyIncidental(d)) return `differs only in ${incidentalWords(d)}: not a divergence (${at})`;
  const real = realOf(d), bits = real.slice(0, upTo ?? Infinity).map(structureText);
  if (real.length > bits.length) bits.push(`${real.length - bits.length} more`);
  if (incidentalOf(d).length) bits.push(`also ${incidentalWords(d)}`);
  if (d.note) bits.push(d.note);
  return [...bits, at].join("; ");
}
function structureText(st) {
  if (st == null || typeof st !== "object") return String(st);
  const where = st.message != null ? `message ${st.message}` + (st.part != null ? ` part ${st.part}` : "") : st.path != null ? String(st.path) : st.section != null ? String(st.section) : "";
  let text = `${where}${where && st.reason != null ? ": " : ""}${st.reason ?? ""}`;
  if (st.expected != null || st.got != null) text += ` (expected ${st.expected}, got ${st.got})`;
  return text || JSON.stringify(st);
}
function cacheText(c) {
  if (!c) return "";
  const bits = [];
  if (c.reusable_bytes != null) bits.push(`${fmtN(c.reusable_bytes)} bytes reusable`);
  if (c.tokens_reused != null) bits.push(`${fmtN(c.tokens_reused)} tokens reused`);
  if (c.tokens_after != null) bits.push(`${fmtN(c.tokens_after)} tokens after`);
  return bits.join(", ") + (c.estimate ? " (estimate)" : "");
}
// the table's cell of a step's cache figures: the figures, then the rule that gave them, smaller
function cacheCell(c) {
  const td = el("td", {class: "rd-cache", text: cacheText(c)});
  if (c && c.basis) td.append(el("div", {class: "muted", text: c.basis}));
  return td;
}
// the real differences (the first, the others folded), then the incidental ones as one folded
// clause ("also the runs' own paths, the agent's ids")
function differenceList(d, box) {
  const real = realOf(d), inc = incidentalOf(d);
  if (real.length) box.append(el("div", {class: "rd-real", text: structureText(real[0])}));
  if (real.length > 1) {
    const more = el("details", {class: "rd-more"}, el("summary", {text: `${real.length - 1} more difference${real.length > 2 ? "s" : ""}`}));
    for (const st of real.slice(1)) more.append(el("div", {text: structureText(st)}));
    box.append(more);
  }
  if (inc.length) {
    const also = el("details", {class: "rd-incidental"}, el("summary", {text: `${real.length ? "also " : "only "}${incidentalWords(d)}`}));
    for (const st of inc) also.append(el("div", {text: structureText(st)}));
    box.append(also);
  }
}
// the table's cell of where a step's requests part: the real differences first, the rest folded
function whereCell(d) {
  const td = el("td", {class: "rd-where"});
  if (d.verdict !== "differs" || d.sentence || !differencesOf(d).length) td.textContent = rdSentence(d, 1);
  else differenceList(d, td);
  return td;
}
// the diff's summary, in words people read, the first step that really parts first
const SUMMARY_WORDS = {first_real_parting_step: "first step that really parts", first_parting_step: "first step that parts at all (incidental differences too)",
  aligned: "steps compared", same: "same", bytes_only: "bytes only", differs: "differ", only_incidental: "differ only incidentally",
  only_run_paths: "differ only in the runs' own paths", only_a: "steps only the parent has", only_b: "steps only this run has"};
function requestDiff(box) {
  const D = doc.diff;
  if (!D || !Array.isArray(D.steps)) return;
  const sec = el("section", {id: "diff"}, el("h2", {text: `Requests against ${D.against || "the parent"}'s`}));
  const S = D.summary && typeof D.summary === "object" ? D.summary : {};
  // the first step that really parts first; an older diff's only_run_paths beside only_incidental is a part of it
  const keys = [...Object.keys(SUMMARY_WORDS), ...Object.keys(S)].filter((k, i, all) => k in S && all.indexOf(k) === i && !(k === "only_run_paths" && "only_incidental" in S));
  const sum = keys.map(k => [k, S[k]]).filter(([, v]) => v == null || typeof v !== "object");
  if (sum.length) sec.append(el("div", {class: "meta", id: "diff-summary"}, ...sum.map(([k, v]) => el("span", {"data-key": k}, (SUMMARY_WORDS[k] || k.replace(/_/g, " ")) + ": ", el("b", {text: v == null ? "none" : String(v)})))));
  const table = el("table", {class: "rd"}, el("tr", {}, el("th", {text: "step"}), el("th", {text: "verdict"}), el("th", {text: "where"}), el("th", {text: "cache"})));
  const endIx = EX.findIndex(isEnd);
  for (const d of D.steps) {
    const quiet = onlyIncidental(d);
    const cls = quiet ? "pill flag" : d.verdict === "differs" ? "pill bad" : d.verdict === "bytes_only" ? "pill flag" : "pill";
    // the request after the boundary is the replay's synthetic end: its row links that exchange
    const end = d.after_boundary || (d.b != null && endIx >= 0 && EX[endIx].id === d.b);
    const where = whereCell(d);
    if (end) where.prepend(el("div", {class: "muted", text: "(the request after the boundary)"}));
    table.append(el("tr", {"data-step": String(d.step), "data-verdict": quiet ? "only_incidental" : d.verdict, "data-after-boundary": end ? "1" : null},
      el("td", {}, el("a", {href: end && endIx >= 0 ? `#ex-${EX[endIx].id}` : `#step-${d.step}`, text: String(d.step)})),
      el("td", {}, el("span", {class: cls, title: quiet ? "not a divergence" : null, text: quiet ? "incidental only" : d.verdict})), where, cacheCell(d.cache)));
  }
  sec.append(table);
  box.append(sec);
}
function overview() {
  const box = document.getElementById("overview");
  chart(box); system(box); requestDiff(box);
  const w = doc.workspace;
  if (w && !w.shown && w.reason) box.append(el("p", {class: "note", id: "workspace-note", text: `workspace changes not shown: ${w.reason}`}));
  else if (w && w.capped) box.append(el("p", {class: "note", id: "workspace-note", text: "workspace changes: the page's cap was reached, later steps' files are named only"}));
  if (w && w.shown && w.unread) box.append(el("p", {class: "note", id: "workspace-unread", text: `workspace changes of ${fmtN(w.unread)} step(s) not shown: a snapshot could not be read`}));
}

// ---- a step's card
function pretty(text) {
  if (typeof text !== "string") return JSON.stringify(text, null, 2);
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (_) { return text; }
}
function compact(text) {
  try { return JSON.stringify(JSON.parse(text)); } catch (_) { return String(text); }
}
function diffPre(lines, cls) {
  const pre = el("pre", {class: "diff" + (cls ? " " + cls : "")});
  for (const [kind, line] of lines) pre.append(el("span", {class: kind === "+" ? "d-add" : kind === "-" ? "d-del" : kind === "@" ? "d-at" : "", text: (kind === "@" ? "" : kind) + line}));
  return pre;
}
function patchPre(text) {
  return diffPre(text.split("\n").map(l => {
    const k = l[0];
    return k === "+" || k === "-" ? [k, l.slice(1)] : l.startsWith("@@") || l.startsWith("***") ? ["@", l] : [" ", l.slice(l[0] === " " ? 1 : 0)];
  }), "patch");
}
function call(s, c) {
  const failed = callFailed(s, c), v = c.view;
  const box = el("div", {class: "call" + (failed ? " failed" : ""), "data-kind": c.kind || null, "data-call": c.id || null});
  box.append(el("span", {class: "name", text: c.name}), "(");
  let below = null;
  if (v && typeof v.command === "string") {
    if (v.command.includes("\n")) { box.append(")"); below = el("pre", {class: "code", text: v.command}); }
    else box.append(el("code", {class: "cmd", text: v.command}), ")");
  } else if (v && typeof v.path === "string") {
    box.append(el("span", {class: "path", text: v.path}), ")");
    if (v.secret) below = el("div", {class: "note secret", text: "🔒 the file looks like a secret: its content is not shown"});
    else if (Array.isArray(v.diff)) below = diffPre(v.diff, "edit");
    else if (typeof v.content === "string") below = el("pre", {class: "file", text: v.content});
  } else if (v && typeof v.patch === "string") {
    box.append(")"); below = patchPre(v.patch);
  } else {
    const short = compact(c.args);
    if (short.length <= 80) box.append(el("span", {class: "args", text: short}), ")");
    else { box.append(")"); below = el("pre", {class: "args", text: pretty(c.args)}); }
  }
  if (c.kind) box.append(el("span", {class: "kind", text: c.kind}));
  if (failed) box.append(el("span", {class: "fail", text: "✗ failed"}));
  if (below) box.append(below);
  return box;
}
function reasoning(s) {
  if (!Array.isArray(s.reasoning) || !s.reasoning.length) return null;
  const box = el("div", {class: "reasoning"});
  for (const t of s.reasoning) {
    if (!t) continue;
    if (t.length <= 400) box.append(el("div", {class: "text", text: t}));
    else box.append(el("details", {}, el("summary", {text: `reasoning: ${clip(t.split("\n")[0], 100)} (${fmtN(t.length)} characters)`}), el("div", {class: "text", text: t})));
  }
  return box;
}
function files(s) {
  if (!Array.isArray(s.files) || !s.files.length) return null;
  const count = (k) => s.files.filter(f => f.change === k).length;
  const d = el("details", {class: "files"}, el("summary", {text: `files changed: ${s.files.length} (${count("added")} added, ${count("changed")} changed, ${count("removed")} removed)`}));
  const ul = el("ul");
  for (const f of s.files) {
    const sign = f.change === "added" ? "+" : f.change === "removed" ? "-" : "~";
    const li = el("li", {"data-path": f.path}, el("span", {class: "ch ch-" + f.change, title: f.change, text: sign}), el("code", {text: f.path}));
    if (f.secret) li.append(el("span", {class: "note secret", text: " 🔒 looks like a secret: not shown"}));
    else if (f.binary) li.append(el("span", {class: "note", text: " binary: named only"}));
    else if (Array.isArray(f.diff)) li.append(diffPre(f.diff));
    if (f.more) li.append(el("div", {class: "note", text: `… ${fmtN(f.more)} more line(s) not shown`}));
    ul.append(li);
  }
  d.append(ul);
  if (s.files_more) d.append(el("div", {class: "note", text: `… ${fmtN(s.files_more)} more file(s) not shown (the page's cap)`}));
  return d;
}
// a body as shown when unfolded (parsed then, not before): indented when it is whole and JSON; a
// cut one (its head and tail) as it is
function bodyText(b) {
  if (b.cut || !/^\s*[[{]/.test(b.text)) return b.text;
  try { return JSON.stringify(JSON.parse(b.text), null, 2); } catch (_) { return b.text; }
}
function bodyBlock(ex, which) {
  const b = ex[which];
  const d = el("details", {class: "body " + which, "data-exchange": ex.id});
  d.append(el("summary", {text: b ? `${which} (${b.size.toLocaleString()} bytes${b.cut ? ", cut" : ""})` : `${which}: none`}));
  if (b) d.addEventListener("toggle", () => {
    if (d.open && !d.querySelector("pre")) d.append(el("pre", {text: bodyText(b)}));
  });
  return d;
}
function comparisonFor(n) {
  const c = (doc.comparison || []).find(x => x.n === n);
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
    box.append(grid, diffPre(k.diff));
  }
  return box;
}
// the card's pill of its request against the parent's: quiet (not a divergence) when it
// differs only incidentally or in bytes only
function requestPill(rd, mk) {
  if (!rd || rd.verdict === "same") return null;
  const text = mk.paths ? `request: only ${incidentalWords(rd)}` : rd.verdict === "differs" ? "request differs" : "request bytes only";
  return el("span", {class: "pill " + (rd.verdict === "differs" && !mk.paths ? "bad" : "flag"), title: rdSentence(rd), text});
}
// the card's note of its request against the parent's: one line when it differs only
// incidentally or in bytes; else its real differences, the incidental ones folded, the cache
function requestNote(rd) {
  if (!rd || rd.verdict === "same") return null;
  const cache = rd.cache ? " · " + cacheText(rd.cache) + (rd.cache.basis ? " · " + rd.cache.basis : "") : "";
  if (rd.verdict !== "differs" || onlyIncidental(rd) || rd.sentence) return el("div", {class: "reqdiff quiet", text: `request against the parent's: ${rdSentence(rd)}${cache}`});
  const at = rd.first_byte != null ? `the bodies part at byte ${fmtN(rd.first_byte)}` : "the bodies differ";
  const box = el("div", {class: "reqdiff", text: `request against the parent's: differs (${at})${cache}`});
  differenceList(rd, box);
  if (rd.note) box.append(el("div", {class: "note", text: rd.note}));
  return box;
}
function row(ex, i) {
  const s = ex.step, mk = MARKS[i];
  const r = el("div", {class: "row " + (s ? "main" : mk.end ? "aux end" : "aux"), id: "ex-" + ex.id, "data-exchange": ex.id, "data-i": String(i)});
  if (s) r.dataset.step = String(s.n);
  const head = el("div", {class: "head"});
  if (s) head.append(el("span", {class: "step-n", id: `step-${s.n}`, text: `step ${s.n}`}));
  head.append(el("span", {text: `#${ex.seq} ${ex.method} ${ex.path}`}));
  head.append(el("span", {class: "pill" + (ex.outcome === "ok" ? "" : " bad"), text: `${ex.status ?? "-"} ${ex.outcome}`}));
  if (ex.served_by) head.append(el("span", {class: "pill", title: "served by", text: ex.served_by}));
  head.append(el("span", {text: `at ${fmtMs(ex.at_ms)} · ${fmtMs(ex.ms)}`}));
  if (ex.attempt > 1) head.append(el("span", {class: "pill", text: `attempt ${ex.attempt}`}));
  for (const f of ex.flags) head.append(el("span", {class: "pill flag", text: f}));
  if (s) {
    if (s.model_ms != null || s.tool_ms != null) head.append(el("span", {class: "timing", text: `model ${fmtMs(s.model_ms)} · tools ${fmtMs(s.tool_ms)}`}));
    const tk = s.tokens;
    // the raw usage only on a page of an older pvisor (no tokens): else its counts are these
    const u = tk && (tk.in != null || tk.out != null) ? `tokens in ${tk.in ?? "?"} / out ${tk.out ?? "?"}${tk.cached != null ? ` / cached ${tk.cached}` : ""}` : tk ? null : usageText(s.usage);
    if (u) head.append(el("span", {class: "usage", text: u}));
    for (const f of s.flags) head.append(el("span", {class: "pill flag", text: f}));
    if (s.retries.length) head.append(el("span", {class: "pill flag", text: `${s.retries.length} retr${s.retries.length > 1 ? "ies" : "y"}`}));
    if (mk.failed) head.append(el("span", {class: "pill bad", text: "failed call"}));
    if (differsAt.has(s.n)) head.append(el("span", {class: "pill flag", text: "O′ differs"}));
    put(head, requestPill(requestDiffOf.get(i), mk));
  } else if (mk.end) {
    head.append(el("span", {class: "end-note", text: `ended by the replay: its reply to the request after the boundary${RUN.boundary_step != null ? ` (step ${RUN.boundary_step})` : ""} ended the agent`}));
    put(head, requestPill(requestDiffOf.get(i), mk));
  } else if (ex.aux) {
    head.append(el("span", {text: `auxiliary${ex.aux.kind ? " [" + ex.aux.kind + "]" : ""} ${ex.aux.reason || ""}`}));
  }
  r.append(head);
  if (s) {
    put(r, reasoning(s));
    if (s.text) r.append(el("div", {class: "text action", text: s.text}));
    for (const c of s.calls) r.append(call(s, c));
    if (s.results.length || s.messages.length) {
      const o = el("details", {class: "observation"});
      const bad = s.results.filter(x => x.error).length;
      o.append(el("summary", {text: `observation: ${s.results.length} result(s)` + (bad ? `, ${bad} failed` : "") + (s.messages.length ? `, ${s.messages.length} message(s)` : "")}));
      const failedIds = new Set(s.calls.filter(c => callFailed(s, c)).map(c => c.id));
      for (const res of s.results) {
        const f = res.error || (res.call_id != null && failedIds.has(res.call_id));
        o.append(el("pre", {class: f ? "error failed" : "", text: res.text}));
      }
      for (const m of s.messages) o.append(el("pre", {text: m}));
      if (bad) o.open = true;
      r.append(o);
    }
    put(r, files(s));
  }
  put(r, requestNote(requestDiffOf.get(i)));
  if (s) put(r, comparisonFor(s.n));
  r.append(bodyBlock(ex, "request"), bodyBlock(ex, "response"));
  applyShown(r, i);
  return r;
}

// ---- the cards, rendered in slices as the reader scrolls (or jumps)
const SLICE = 200;
let next = 0;
const timeline = document.getElementById("timeline"), more = document.getElementById("more");
function renderSlice(upTo) {
  const end = Math.min(Math.max(next + SLICE, upTo == null ? 0 : upTo + 1), EX.length);
  const frag = document.createDocumentFragment();
  for (; next < end; next++) {
    const ex = EX[next], a = ATTEMPT_AT.get(next);
    // where a resumed attempt starts: its command (the journal keeps its prompt there)
    if (a) frag.append(el("div", {class: "attempt-start", id: `attempt-${a.n}`, "data-attempt": String(a.n)}, el("b", {text: `attempt ${a.n} starts here`}), a.command ? el("code", {text: a.command}) : null));
    frag.append(row(ex, next));
    const b = RUN.boundary_step;
    if (b != null && ex.step && ex.step.n === b) {
      // a handoff's child re-ran the parent's actions translated into its own tools: O″, not O′
      const text = RUN.mode === "handoff" ? `boundary: the pause after step ${b}, request ${b + 1} ends at the re-enacted observation O″${b}` : `boundary: after step ${b}, request ${b + 1} ends at the replayed observation O′${b}`;
      frag.append(el("div", {class: "boundary", id: "boundary", text}));
    }
  }
  timeline.append(frag);
  more.textContent = next < EX.length ? `${EX.length - next} more exchange(s) below…` : `generated ${doc.generated} by pvisor`;
}
// with filters on, a slice may show nothing: render on while the end is near the viewport
function fill() {
  while (next < EX.length && more.getBoundingClientRect().top < innerHeight + 800) renderSlice();
}

// ---- the step index: one entry per exchange, jump, search, filters
const FILTERS = [["failed", "failed calls"], ["divergent", "divergences"], ["retry", "retries"], ["aux", "auxiliary"]];
const state = {filters: new Set(), query: "", found: null};
let haystacks = null;
function haystack(i) {
  haystacks = haystacks || [];
  if (haystacks[i] == null) {
    const ex = EX[i], s = ex.step;
    haystacks[i] = (s ? [s.text, ...(Array.isArray(s.reasoning) ? s.reasoning : []), ...s.calls.map(c => `${c.name} ${c.args} ${c.view ? JSON.stringify(c.view) : ""}`),
      ...s.results.map(r => r.text), ...s.messages] : [ex.path, ex.aux ? `${ex.aux.kind} ${ex.aux.reason}` : ""]).join("\n").toLowerCase();
  }
  return haystacks[i];
}
function shown(i) {
  const mk = MARKS[i];
  if (state.filters.size && ![...state.filters].some(f => mk[f])) return false;
  return state.found == null || state.found.has(i);
}
function applyShown(node, i) { node.classList.toggle("hidden", !shown(i)); }
function indexLabel(ex) {
  const s = ex.step;
  if (!s && isEnd(ex)) return `ended by the replay · ${ex.method} ${ex.path}`;
  if (!s) return `${ex.aux ? ex.aux.kind || "auxiliary" : "auxiliary"} · ${ex.method} ${ex.path}`;
  const c = s.calls[0];
  if (!c) return s.text ? clip(s.text.split("\n")[0], 80) : "(no tool call)";
  const v = c.view || {};
  const what = typeof v.command === "string" ? v.command : typeof v.path === "string" ? `${c.name} ${v.path}` : `${c.name} ${c.args}`;
  return clip(what.replace(/\s+/g, " "), 90) + (s.calls.length > 1 ? ` (+${s.calls.length - 1})` : "");
}
function buildIndex() {
  const finder = document.getElementById("finder"), list = document.getElementById("index");
  const search = el("input", {type: "search", id: "search", placeholder: "search actions and observations", "aria-label": "search"});
  const filters = el("div", {id: "filters"});
  for (const [k, label] of FILTERS) {
    const n = MARKS.filter(m => m[k]).length;
    const box = el("input", {type: "checkbox", "data-filter": k});
    if (!n) box.disabled = true;
    filters.append(el("label", {}, box, ` ${label} (${n})`));
  }
  finder.append(search, filters, el("div", {id: "found"}));
  const frag = document.createDocumentFragment();
  EX.forEach((ex, i) => {
    const mk = MARKS[i], s = ex.step;
    const a = el("a", {href: s ? `#step-${s.n}` : `#ex-${ex.id}`, "data-i": String(i), title: indexLabel(ex)},
      el("span", {class: "ix-n", text: s ? String(s.n) : "·"}), el("span", {class: "ix-what", text: indexLabel(ex)}));
    if (mk.failed) a.append(el("span", {class: "mk failed", title: "a failed call", text: "✗"}));
    // each mark a symbol, its meaning in its tooltip: the entry's text keeps the room
    if (mk.divergent) a.append(el("span", {class: "mk divergent", title: "diverges from the parent", text: "≠"}));
    else if (mk.bytes) a.append(el("span", {class: "mk bytes", title: "request bytes differ, the prompt does not", text: "≈"}));
    else if (mk.paths) a.append(el("span", {class: "mk paths", title: `the request differs from the parent's only in ${incidentalWords(requestDiffOf.get(i))}: not a divergence`, text: "≃"}));
    if (mk.end) a.append(el("span", {class: "mk end", title: "the replay's final reply, which ended the agent", text: "∎"}));
    if (mk.retry) a.append(el("span", {class: "mk retry", title: "retried", text: "↻"}));
    const at = ATTEMPT_AT.get(i);
    if (at) frag.append(el("li", {class: "attempt-divider", "data-attempt": String(at.n), title: attemptText(at)}, el("a", {href: `#attempt-${at.n}`, "data-attempt-link": String(i), text: attemptText(at)})));
    frag.append(el("li", {class: s ? "ix step" : mk.end ? "ix aux end" : "ix aux", "data-i": String(i), "data-step": s ? String(s.n) : null}, a));
  });
  list.append(frag);
  let timer = null;
  search.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => { state.query = search.value.trim().toLowerCase(); refilter(); }, 120); });
  filters.addEventListener("change", (e) => {
    const k = e.target.dataset.filter;
    if (e.target.checked) state.filters.add(k); else state.filters.delete(k);
    refilter();
  });
}
function refilter() {
  if (state.query) {
    state.found = new Set();
    for (let i = 0; i < EX.length; i++) if (haystack(i).includes(state.query)) state.found.add(i);
  } else state.found = null;
  let count = 0;
  for (const li of document.getElementById("index").children) {
    if (li.dataset.i == null) { li.classList.toggle("hidden", state.filters.size > 0 || state.found != null); continue; }
    const on = shown(+li.dataset.i); li.classList.toggle("hidden", !on); if (on) count++;
  }
  for (const r of timeline.querySelectorAll(".row")) applyShown(r, +r.dataset.i);
  const boundary = document.getElementById("boundary");
  if (boundary) boundary.classList.toggle("hidden", state.filters.size > 0 || state.found != null);
  for (const d of timeline.querySelectorAll(".attempt-start")) d.classList.toggle("hidden", state.filters.size > 0 || state.found != null);
  document.getElementById("found").textContent = state.filters.size || state.found ? `${count} of ${EX.length} exchanges shown` : "";
  fill();
}
// a jump: render the cards up to the target (the slices may not have reached it), show it if a
// filter hid it, scroll it into view
function jump(i) {
  if (i == null || i < 0 || i >= EX.length) return;
  if (i >= next) renderSlice(i);
  const card = timeline.querySelector(`.row[data-i="${i}"]`);
  if (!card) return;
  card.classList.remove("hidden");
  for (const t of timeline.querySelectorAll(".row.target")) t.classList.remove("target");
  card.classList.add("target");
  // a resumed attempt's first card: its divider above it in view too
  const lead = card.previousElementSibling;
  (lead && lead.classList.contains("attempt-start") ? lead : card).scrollIntoView({block: "start"});
  for (const a of document.querySelectorAll("#index a.here")) a.classList.remove("here");
  const entry = document.querySelector(`#index a[data-i="${i}"]`);
  if (entry) { entry.classList.add("here"); entry.scrollIntoView({block: "nearest"}); }
}
function targetOf(hash) {
  let m = /^#step-(\d+)$/.exec(hash);
  if (m) return rowIndex.get(+m[1]);
  m = /^#attempt-(\d+)$/.exec(hash);
  if (m) { const i = [...ATTEMPT_AT].find(([, a]) => a.n === +m[1]); return i ? i[0] : null; }
  m = /^#ex-(.+)$/.exec(hash);
  if (m) { const i = EX.findIndex(e => e.id === m[1]); return i < 0 ? null : i; }
  return null;
}
document.addEventListener("click", (e) => {
  const a = e.target.closest && e.target.closest("a");
  if (!a) return;
  const href = a.getAttribute("href") || "";
  const i = targetOf(href);
  if (i == null) return;
  e.preventDefault();
  history.replaceState(null, "", href);
  jump(i);
});
addEventListener("hashchange", () => jump(targetOf(location.hash)));

header();
overview();
buildIndex();
renderSlice();
// "#all" renders every exchange at once (to print, or search the whole page with the browser)
if (location.hash === "#all") while (next < EX.length) renderSlice();
else if (targetOf(location.hash) != null) jump(targetOf(location.hash));
new IntersectionObserver((entries) => {
  if (entries.some(e => e.isIntersecting) && next < EX.length) { renderSlice(); fill(); }
}, {rootMargin: "800px"}).observe(more);
window.pvisorReadyMs = performance.now();
document.body.dataset.ready = "1";
