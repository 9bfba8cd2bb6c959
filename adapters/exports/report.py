"""``pvisor report``: one run of the journal as a self-contained HTML page (docs/report.md).

The page holds everything it shows: its CSS, its script and the run's data (a JSON document in
a ``<script type="application/json">``); it loads nothing from the network. What it shows:

- the run (agent, mode, task, labels, attempts) and, for a derived run, its parent (a link to
  the parent's page, written beside it) and its boundary step; for a handoff's child, its
  lineage (:func:`pvisor.journal.model.run_lineage`: the parent or the native file, the pause
  with both numbers, the pause's snapshot, the from and to agents);
- the runs derived or handed off from it (its child runs: id, mode, agent, pause), each linked
  to its page when that page was written beside;
- the timeline of every exchange in arrival order: each main-loop one as its step (the action's
  text, its tool calls, the observation that came back, flags, retries, timings, token usage
  where the protocol reports it), the auxiliary ones greyed with the chain rule's reason;
- each exchange expandable to its request and response bodies (the reassembled reply of a
  stream), cut to ``body_limit`` bytes (the head and the tail; ``pvisor journal body`` has the
  rest), secrets already removed as the journal removes them;
- for a derived run, per step up to the boundary, the parent's observation O against the
  replay's O' for each tool call, equal or with their line diff.

The script renders the timeline in slices as the reader scrolls, so a run of thousands of steps
opens at once (bench/report_bench.py measures it).

The export format ``report`` (:data:`FORMAT`, :mod:`pvisor.adapters.exports`): files of one
journal run, the page at the path given and the parent's beside it; ``pvisor report`` writes it.
"""

from __future__ import annotations

import difflib
import html
import time
from pathlib import Path
from typing import Any

import orjson

from pvisor.adapters.exports.base import (
    ExportFormat,
    JournalSource,
    Option,
    Output,
    Settings,
    Source,
    Written,
)
from pvisor.adapters.agents import descriptor_names, get_descriptor
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.core import progress
from pvisor.core.errors import PvisorError
from pvisor.core.outfile import replacing
from pvisor.adapters.exports.shared import shared
from pvisor.journal.model import run_lineage
from pvisor.journal.reader import JournalReader

#: bytes of a body a page shows by default: its head and its tail (``--body-limit``)
DEFAULT_BODY_LIMIT = 8 * 1024
#: characters of a tool result or text shown before it is folded
_TEXT_LIMIT = 20_000


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
            else:
                parts.append(orjson.dumps(block).decode())
        return "\n".join(parts)
    return orjson.dumps(content).decode() if content is not None else ""


def _clip_text(text: str, limit: int = _TEXT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    return text[: limit // 2] + f"\n… {len(text) - limit:,} characters left out …\n" + text[-limit // 2 :]


def _body(data: bytes | None, limit: int, exchange: str, which: str) -> dict[str, Any] | None:
    """A body for the page: text (invalid UTF-8 replaced), cut to ``limit`` bytes: half from its
    head, half from its tail (protocols put the conversation at either end: Anthropic's
    ``messages`` come first, Chat Completions' last message last)."""
    if data is None:
        return None
    size = len(data)
    if size > limit:
        head = limit // 2
        cut = (
            data[:head].decode("utf-8", "replace")
            + f"\n\n… {size - limit:,} bytes left out: pvisor journal body {exchange} --{which} …\n\n"
            + data[size - (limit - head) :].decode("utf-8", "replace")
        )
        return {"size": size, "text": cut, "cut": True}
    return {"size": size, "text": data.decode("utf-8", "replace"), "cut": False}


def _call(c: Any) -> dict[str, Any]:
    args = c.arguments if c.arguments is not None else c.arguments_raw
    return {
        "id": c.id,
        "name": c.name,
        "args": _clip_text(args if isinstance(args, str) else orjson.dumps(args).decode(), 4000),
    }


def _diff(before: str, after: str) -> list[list[str]] | None:
    """None when equal, else the unified diff as [kind, line] pairs (kind ``-``, ``+``, `` ``)."""
    if before == after:
        return None
    lines = []
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), "O", "O′", lineterm="", n=2):
        if line.startswith(("---", "+++")):
            continue
        kind = line[:1] if line[:1] in "-+@" else " "
        lines.append([kind, line[1:] if kind != "@" else line])
        if len(lines) >= 400:
            lines.append(["@", "… the diff goes on"])
            break
    return lines


class _Read:
    """A run as read for pages: its trajectory and each exchange's request body as the page
    shows it (cut while the classification reads it: a second pass over the bodies of a long
    run cost a sixth of the time)."""

    __slots__ = ("bodies", "traj")

    def __init__(self, reader: JournalReader, run_id: str, body_limit: int) -> None:
        self.bodies: dict[str, dict[str, Any] | None] = {}

        def keep(ex: Any, body: bytes | None) -> None:
            if ex.id not in self.bodies:
                self.bodies[ex.id] = _body(body, body_limit, ex.id, "request")

        self.traj = trajectory_from_journal(reader, run_id, on_request_body=keep)


def _read(reader: JournalReader, run_id: str, parsed: dict[str, Any], body_limit: int) -> _Read:
    """``run_id`` read once per page set (a replay's page and its parent's both need the
    parent's)."""
    if run_id not in parsed:
        parsed[run_id] = _Read(reader, run_id, body_limit)
    return parsed[run_id]


def run_document(
    reader: JournalReader,
    run_id: str,
    body_limit: int = DEFAULT_BODY_LIMIT,
    parsed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The page's data for ``run_id``: ``{"run", "attempts", "exchanges", "children",
    "comparison", "generated"}`` (what they show: docs/report.md); ``run.lineage`` is
    :func:`pvisor.journal.model.run_lineage`'s (None for a run that derives from nothing),
    ``children`` the runs whose ``parent_run`` is it, in creation order, each ``{id, mode,
    agent, boundary_step, pause_transition}``. ``parsed``: runs already read, by run id (filled
    in). Raises UsageError for an unknown run, as the reader does."""
    parsed = {} if parsed is None else parsed
    run = reader.run(run_id)
    read = _read(reader, run.id, parsed, body_limit)
    traj = read.traj
    exchanges = reader.exchanges(run.id)
    first_ms = min((e.started_ms for e in exchanges), default=run.created_ms)
    step_of = {d["exchange"]: s for s, d in zip(traj.steps, traj.meta.get("steps", []))}
    details = {d["exchange"]: d for d in traj.meta.get("steps", [])}
    aux = {a["exchange"]: a for a in traj.meta.get("auxiliary", [])}
    rows = []
    with progress.task(f"page of run {run.id}", len(exchanges), progress.Unit.EXCHANGES) as task:
        for e in exchanges:
            rows.append(_row(reader, e, first_ms, body_limit, read, step_of.get(e.id), details, aux))
            task.advance()
    doc: dict[str, Any] = {
        "run": {
            "id": run.id,
            "agent": run.agent,
            "agent_version": run.agent_version,
            "mode": getattr(run.mode, "value", run.mode),
            "created_ms": run.created_ms,
            "parent_run": run.parent_run,
            "boundary_step": run.boundary_step,
            "pause_transition": run.pause_transition,
            "lineage": run_lineage(run),
            "labels": run.labels,
            "task": traj.task,
            "model": traj.model,
            "protocol": traj.meta.get("protocol"),
            "steps": len(traj.steps),
        },
        "attempts": [
            {"n": a.n, "started_ms": a.started_ms, "ended_ms": a.ended_ms, "exit_code": a.exit_code}
            for a in reader.attempts(run.id)
        ],
        "exchanges": rows,
        # the runs derived from it or handed off from it (one read of the runs table)
        "children": [
            {
                "id": c.id,
                "mode": getattr(c.mode, "value", c.mode),
                "agent": c.agent,
                "boundary_step": c.boundary_step,
                "pause_transition": c.pause_transition,
            }
            for c in reader.runs()
            if c.parent_run == run.id
        ],
        "comparison": [],
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    # a handoff's child run that no replay started (pvisor run --child-run) re-ran none of the
    # parent's steps: there is no O against O' to show
    replayed = run.mode != "handoff" or run.labels.get("started_as") in ("replay-only", "continuation")
    if run.parent_run and replayed:
        doc["comparison"] = _comparison(reader, run.parent_run, traj, run.boundary_step, parsed, body_limit)
    return doc


def _row(
    reader: JournalReader,
    e: Any,
    first_ms: float,
    body_limit: int,
    read: _Read,
    step: Any,
    details: dict[str, Any],
    aux: dict[str, Any],
) -> dict[str, Any]:
    """The page's row of exchange ``e`` (``step``: its step, None for an auxiliary one)."""
    row: dict[str, Any] = {
        "id": e.id,
        "seq": e.seq,
        "attempt": e.attempt,
        "method": e.method,
        "path": e.path + ("?" + e.query if e.query else ""),
        "status": e.status,
        "outcome": e.outcome,
        "served_by": e.served_by,
        "capture": e.capture,
        "flags": list(e.flags),
        "streamed": e.streamed,
        "at_ms": round(e.started_ms - first_ms, 1),
        "ms": round(e.ended_us / 1000, 1) if e.ended_us is not None else None,
        "first_byte_ms": round(e.first_byte_us / 1000, 1) if e.first_byte_us is not None else None,
        # cut as the classification read it; read again only if it was not (none is missed today)
        "request": read.bodies[e.id]
        if e.id in read.bodies
        else _body(reader.request_body(e) if e.request_body else None, body_limit, e.id, "request"),
        "response": _body(
            reader.blob(e.response_final or e.response_body)
            if (e.response_final or e.response_body)
            else None,
            body_limit,
            e.id,
            "response",
        ),
    }
    if step is not None:
        a, o = step.action, step.observation
        d = details[e.id]
        row["step"] = {
            "n": step.n,
            "text": _clip_text(a.text or ""),
            "reasoning": bool(a.reasoning),
            "calls": [_call(c) for c in a.tool_calls],
            "results": [
                {"call_id": r.call_id, "error": r.is_error, "text": _clip_text(_text_of(r.content))}
                for r in o.results
            ],
            "messages": [
                _clip_text(" ".join(getattr(p, "text", None) or "" for p in m.parts)) for m in o.messages
            ],
            "usage": a.usage,
            "flags": list(step.flags),
            "retries": d.get("retries", []),
        }
    elif e.id in aux:
        row["aux"] = {"kind": aux[e.id]["kind"], "reason": aux[e.id]["reason"]}
    else:
        row["aux"] = {"kind": "synthetic_end" if "synthetic_end" in e.flags else "other", "reason": ""}
    return row


def _comparison(
    reader: JournalReader,
    parent: str,
    traj: Any,
    boundary: int | None,
    parsed: dict[str, Any],
    body_limit: int,
) -> list[dict[str, Any]]:
    """Per step up to the boundary and per tool call: the parent's observation O against the
    derived run's O', equal or with their diff. A parent that is not in this journal (a replay
    from a native file) gives nothing to compare."""
    try:
        parent_traj = _read(reader, parent, parsed, body_limit).traj
    except PvisorError:  # the parent is a native file, or unreadable: nothing to compare
        return []
    normalise = _normaliser(traj.meta.get("agent"))
    out = []
    last = boundary if boundary is not None else len(traj.steps)
    for n in range(1, min(last, len(traj.steps), len(parent_traj.steps)) + 1):
        was, now = parent_traj.steps[n - 1], traj.steps[n - 1]
        calls = []
        for i, call in enumerate(was.action.tool_calls):
            o = _text_of(was.observation.results[i].content) if i < len(was.observation.results) else ""
            o2 = _text_of(now.observation.results[i].content) if i < len(now.observation.results) else ""
            diff = _diff(o, o2)
            calls.append(
                {
                    "name": call.name,
                    "O": _clip_text(o, 8000),
                    "O2": _clip_text(o2, 8000),
                    "diff": diff,
                    # as result.json's replayed_tool_calls compare them: the agent's own
                    # decorations (Codex's "Wall time:", Gemini CLI's PGID) do not count
                    "same_normalised": diff is None or normalise(o) == normalise(o2),
                }
            )
        out.append({"n": n, "calls": calls})
    return out


def _normaliser(agent: str | None) -> Any:
    """The agent's tool-output normalisation (its descriptor's decorations), or the identity
    for an agent pvisor has no descriptor of."""
    if agent in descriptor_names():
        return get_descriptor(agent).normalise_output
    return lambda text: text


def render(
    doc: dict[str, Any], parent_href: str | None = None, child_hrefs: dict[str, str] | None = None
) -> str:
    """The HTML page of a :func:`run_document` (``parent_href``: the parent's page, relative;
    ``child_hrefs``: the pages of child runs written beside it, by run id)."""
    data = (
        orjson.dumps(shared({**doc, "parent_href": parent_href, "child_hrefs": child_hrefs or {}}))
        .replace(b"</", b"<\\/")
        .decode()
    )
    run = doc["run"]
    title = html.escape(f"pvisor · {run['id']} · {run['agent'] or 'run'}")
    return _PAGE.replace("%TITLE%", title).replace("%DATA%", data)


def write_report(
    reader: JournalReader,
    run_id: str,
    output: Path,
    body_limit: int = DEFAULT_BODY_LIMIT,
    with_parent: bool = True,
) -> list[Path]:
    """Write the page of ``run_id`` to ``output`` and, for a derived run whose parent is in the
    journal, the parent's page beside it (``<parent>.html``, linked from the first). Returns the
    files written. Raises UsageError for an unknown run; OSError as the file system gives it."""
    parsed: dict[str, Any] = {}
    doc = run_document(reader, run_id, body_limit, parsed)
    written = []
    parent = doc["run"]["parent_run"]
    href = None
    if parent and with_parent:
        try:
            parent_doc = run_document(reader, parent, body_limit, parsed)
        except PvisorError:  # a parent that is not in this journal: no link
            parent_doc = None
        if parent_doc is not None:
            target = output.with_name(f"{parent_doc['run']['id']}.html")
            if target != output:
                # the parent's list of its children links back to the page written here
                _write(target, render(parent_doc, child_hrefs={doc["run"]["id"]: output.name}))
                written.append(target)
                href = target.name
    _write(output, render(doc, href))
    return [output, *written]


def _write(path: Path, text: str) -> None:
    """``text`` into ``path``: a file beside it renamed over it when whole, a device or a FIFO in
    place (core/outfile.py)."""
    with replacing(str(path)) as out:
        out.write(text.encode("utf-8"))


def write(source: JournalSource, output: Path, settings: Settings) -> Written:
    """:func:`write_report` of ``source``'s run to ``output`` (``settings.body_limit``, default
    :data:`DEFAULT_BODY_LIMIT`; the parent's page unless ``settings.with_parent`` is False);
    counts the pages, the files written in :attr:`Written.paths`."""
    limit = DEFAULT_BODY_LIMIT if settings.body_limit is None else settings.body_limit
    written = write_report(source.reader, source.run_id, output, limit, with_parent=settings.with_parent)
    return Written(len(written), tuple(written))


FORMAT = ExportFormat(
    name="report",
    describe={Source.RUN: "one self-contained HTML page of RUN (and its parent run's page beside it)"},
    write=write,
    unit="pages",
    extension="html",
    reads=frozenset({Option.BODY_LIMIT, Option.NO_PARENT}),
    output=Output.FILES,
)


# one text; the raw literals are cut only to keep the source lines within 110 characters
_PAGE = (
    r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; """
    r"""script-src 'unsafe-inline'; img-src data:">
<title>%TITLE%</title>
<style>
:root { --fg:#1d2330; --muted:#6b7280; --line:#e5e7eb; --bg:#fff; --main:#eef4ff; --aux:#f6f6f6;
        --ok:#15803d; --bad:#b91c1c; --add:#e6ffec; --del:#ffebe9; --mark:#b45309; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); margin: 0; """
    r"""background: var(--bg); }
header { padding: 16px 24px; border-bottom: 1px solid var(--line); }
h1 { font-size: 18px; margin: 0 0 6px; }
.meta { color: var(--muted); display: flex; flex-wrap: wrap; gap: 4px 18px; }
.meta b { color: var(--fg); font-weight: 600; }
main { padding: 8px 24px 48px; }
.task { white-space: pre-wrap; background: #fafafa; border: 1px solid var(--line); padding: 8px 10px; """
    r"""margin: 10px 0; max-height: 12em; overflow: auto; }
.row { border: 1px solid var(--line); border-radius: 6px; margin: 8px 0; padding: 8px 12px; }
.row.main { background: var(--main); }
.row.aux { background: var(--aux); color: var(--muted); font-size: 13px; padding: 4px 12px; }
.row .head { display: flex; gap: 12px; flex-wrap: wrap; align-items: baseline; }
.step-n { font-weight: 700; }
.pill { font-size: 12px; border: 1px solid var(--line); border-radius: 10px; padding: 0 6px; """
    r"""background: #fff; color: var(--fg); }
.pill.bad { color: var(--bad); border-color: var(--bad); }
.pill.flag { color: var(--mark); border-color: var(--mark); }
.text { white-space: pre-wrap; margin: 6px 0; }
.call { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; margin: 4px 0; }
.call .name { font-weight: 700; }
pre { white-space: pre-wrap; word-break: break-word; """
    r"""font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; background: #fff; """
    r"""border: 1px solid var(--line); padding: 6px 8px; margin: 4px 0; max-height: 30em; overflow: auto; }
details > summary { cursor: pointer; color: var(--muted); }
.boundary { border-top: 3px dashed var(--mark); margin: 18px 0; padding-top: 6px; """
    r"""color: var(--mark); font-weight: 700; }
.cmp { display: grid; grid-template-columns: 1fr 1fr; gap: 8px; }
.cmp h4 { margin: 2px 0; font-size: 12px; color: var(--muted); }
.equal { color: var(--ok); font-weight: 600; }
.diff .d-add { background: var(--add); } .diff .d-del { background: var(--del); } """
    r""".diff .d-at { color: var(--muted); }
.diff span { display: block; }
#more { padding: 12px; color: var(--muted); text-align: center; }
a { color: #1d4ed8; }
</style></head>
<body>
<header id="top"></header>
<main><div id="timeline"></div><div id="more"></div></main>
<script type="application/json" id="pvisor-data">%DATA%</script>
<script>
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
  const add = (k, v) => { if (v != null && v !== "") m.append(el("span", {}, k + " ", """
    r"""el("b", {text: String(v)}))); };
  add("mode", r.mode); add("steps", r.steps); add("exchanges", doc.exchanges.length);
  add("protocol", r.protocol); add("model", r.model);
  add("capture", [...new Set(doc.exchanges.map(e => e.capture))].join(", "));
  add("created", r.created_ms ? new Date(r.created_ms).toISOString().replace("T", " ").slice(0, 19) """
    r"""+ " UTC" : null);
  for (const a of doc.attempts) add(`attempt ${a.n}: exit`, a.exit_code == null ? "-" : a.exit_code);
  const L = r.lineage;
  if (L && L.mode === "handoff") {
    // a handoff's child: the parent (or the native file), the pause, its snapshot, the two agents
    const span = el("span", {id: "parent"}, "handed off from ");
    if (L.workspace_snapshot) span.title = `workspace snapshot ${L.workspace_snapshot}`;
    span.append(parentRef(r));
    const k = L.pause_transition;
    span.append(` at the pause after step ${L.boundary_step}` + (k == null ? "" """
    r""": ` (${k === L.boundary_step ? "before " : ""}transition ${k})`));
    if (L.workspace_snapshot) span.append(`, workspace snapshot ${L.workspace_snapshot.slice(0, 12)}`);
    if (L.handoff_from_agent || L.handoff_to_agent) """
    r"""span.append(`, ${L.handoff_from_agent || "?"} → ${L.handoff_to_agent || "?"}`);
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
      item.append(` ${c.mode} · ${c.agent || "-"} · after step ${c.boundary_step}` + (k == null ? "" """
    r""": ` (${k === c.boundary_step ? "before " : ""}transition ${k})`));
      list.append(item);
    }
    top.append(el("div", {class: "meta"}, `child runs (${doc.children.length}):`), list);
  }
  if (r.task) top.append(el("div", {class: "task", id: "task", text: r.task}));
}
function parentRef(r) {
  if (r.parent_run) return doc.parent_href """
    r"""? el("a", {href: doc.parent_href, id: "parent-link", text: r.parent_run}) """
    r""": el("b", {text: r.parent_run});
  const kind = r.labels.source_kind, src = r.labels.source;
  return el("b", {text: src ? `the ${kind || "source"} file ${src}` : "-"});
}
function bodyBlock(ex, which) {
  const b = ex[which];
  const d = el("details", {class: "body " + which, "data-exchange": ex.id});
  d.append(el("summary", {text: b ? `${which} (${b.size.toLocaleString()} bytes${b.cut ? ", cut" : ""})` """
    r""": `${which}: none`}));
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
  box.append(el("summary", {text: same ? "O against O′: equal" """
    r""": alike ? "O against O′: equal once normalised" : "O against O′: differs"}));
  for (const k of c.calls) {
    if (k.diff == null) { box.append(el("div", {class: "equal", text: `${k.name}: O′ equals O`})); continue; }
    if (k.same_normalised) box.append(el("div", {class: "equal", """
    r"""text: `${k.name}: O′ equals O once the agent's own decorations (timings, ids) """
    r"""are normalised; the bytes differ:`}));
    const grid = el("div", {class: "cmp"});
    grid.append(el("div", {}, el("h4", {text: `O (recorded) · ${k.name}`}), el("pre", {text: k.O})));
    grid.append(el("div", {}, el("h4", {text: "O′ (replayed)"}), el("pre", {text: k.O2})));
    box.append(grid);
    const diff = el("pre", {class: "diff"});
    for (const [kind, line] of k.diff) diff.append(el("span", """
    r"""{class: kind === "+" ? "d-add" : kind === "-" ? "d-del" : kind === "@" ? "d-at" : "", """
    r"""text: (kind === "@" ? "" : kind) + line}));
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
  head.append(el("span", {class: "pill" + (ex.outcome === "ok" ? "" : " bad"), """
    r"""text: `${ex.status ?? "-"} ${ex.outcome}`}));
  if (ex.served_by) head.append(el("span", {class: "pill", title: "served by", text: ex.served_by}));
  head.append(el("span", {text: `at ${fmtMs(ex.at_ms)} · ${fmtMs(ex.ms)}`}));
  if (ex.attempt > 1) head.append(el("span", {class: "pill", text: `attempt ${ex.attempt}`}));
  for (const f of ex.flags) head.append(el("span", {class: "pill flag", text: f}));
  if (s) {
    const u = usageText(s.usage); if (u) head.append(el("span", {class: "usage", text: u}));
    for (const f of s.flags) head.append(el("span", {class: "pill flag", text: f}));
    if (s.retries.length) head.append(el("span", {class: "pill flag", """
    r"""text: `${s.retries.length} retr${s.retries.length > 1 ? "ies" : "y"}`}));
  } else if (ex.aux) {
    head.append(el("span", {text: `auxiliary${ex.aux.kind ? " [" + ex.aux.kind + "]" : ""} """
    r"""${ex.aux.reason || ""}`}));
  }
  r.append(head);
  if (s) {
    if (s.text) r.append(el("div", {class: "text action", text: s.text}));
    for (const c of s.calls) r.append(el("div", {class: "call"}, """
    r"""el("span", {class: "name", text: c.name}), "(", el("span", {text: c.args}), ")"));
    if (s.results.length || s.messages.length) {
      const o = el("details", {class: "observation"});
      o.append(el("summary", {text: `observation: ${s.results.length} result(s)` """
    r"""+ (s.messages.length ? `, ${s.messages.length} message(s)` : "")}));
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
      const text = doc.run.mode === "handoff" """
    r"""? `boundary: the pause after step ${b}, request ${b + 1} ends at the re-enacted """
    r"""observation O″${b}` """
    r""": `boundary: after step ${b}, request ${b + 1} ends at the replayed observation O′${b}`;
      frag.append(el("div", {class: "boundary", id: "boundary", text}));
    }
  }
  timeline.append(frag);
  more.textContent = next < doc.exchanges.length """
    r"""? `${doc.exchanges.length - next} more exchange(s) below…` : `generated ${doc.generated} by pvisor`;
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
</script>
</body></html>
"""
)
