"""The data of a run's page (``pvisor report``, docs/report.md): :func:`run_document`.

A JSON-able dict the page's script draws: the run (agent, mode, task, labels, attempts, its
lineage), its child runs, every exchange in arrival order (a main-loop one with its step: the
action's text, tool calls, the observation, flags, retries, timings, usage; an auxiliary one with
the chain rule's reason), each body cut to ``body_limit`` bytes (head and tail), and for a
derived run the parent's observation O against the replay's O' per tool call.

The overview (issue 43) adds, all from the journal alone:

- ``outcome``: how the run ended (:func:`run_outcome`; its ``verdict`` a :class:`RunVerdict`);
- ``totals``: counts, tokens and times of the whole run (:func:`run_totals`); each step its own
  ``model_ms``, ``tool_ms`` and ``tokens`` (defined there);
- per step, the reasoning texts (never a signature or encrypted content), each tool call's
  ``kind`` (the agent's descriptor's :class:`~pvisor.adapters.agents.effects.Effect`), ``failed``
  (:func:`failed_calls`) and ``view`` (:func:`call_view`), and the files it changed
  (:mod:`pvisor.adapters.exports.report_workspace`);
- ``system``: request 1's system prompt and tools, once; ``workspace``: whether files are shown.
"""

from __future__ import annotations

import enum
import re
import shlex
import time
from typing import Any

import orjson

from pvisor.adapters.agents import find_descriptor
from pvisor.adapters.agents.base import AgentOutcome
from pvisor.adapters.agents.effects import Effect, Role
from pvisor.adapters.exports.genai import reply_of
from pvisor.adapters.exports.report_workspace import NO_WORKSPACE_REASON, diff_lines, step_files
from pvisor.adapters.protocols import PROTOCOL_MODULES, get_protocol
from pvisor.adapters.protocols.base import TokenUsage, count_sum
from pvisor.adapters.journal_trajectory import trajectory_from_journal
from pvisor.adapters.request_diff import report_section
from pvisor.core import progress
from pvisor.core.errors import PvisorError
from pvisor.journal.model import run_lineage
from pvisor.journal.redact import has_key_shape, redact_shapes, secret_file
from pvisor.journal.reader import JournalReader

#: bytes of a body a page shows by default: its head and its tail (``--body-limit``)
DEFAULT_BODY_LIMIT = 8 * 1024
#: characters of a tool result or text shown before it is folded
_TEXT_LIMIT = 20_000
#: characters of the system prompt, of a tool's description and of its parameters' JSON
_SYSTEM_LIMIT = 40_000
_TOOL_LIMIT = 4_000
#: lines of an edit's diff shown (the rest: one ``@`` line saying it goes on)
_EDIT_DIFF_LINES = 400


class RunVerdict(str, enum.Enum):
    """How a run went, in one word (``outcome.verdict``; :func:`run_outcome` decides it)."""

    SUCCEEDED = "succeeded"  #: ended: exit 0 and the agent did not say it failed
    FAILED = "failed"  #: ended: a non-zero exit, or the agent's own account says it failed
    INTERRUPTED = "interrupted"  #: stopped by a signal (Ctrl-C)
    TIMED_OUT = "timed_out"  #: stopped at ``--timeout``
    RUNNING = "running"  #: an attempt has not ended (running, or its pvisor was killed)
    UNKNOWN = "unknown"  #: nothing says: a gateway capture, a handoff's child not started


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


#: characters either side of a cut looked at for a key-shaped token across it
_CUT_WINDOW = 1024


def _keys_cut(text: str, *cuts: int) -> bool:
    """Whether a key-shaped token may lie across one of ``cuts`` (offsets into ``text``): cut
    there, the part after its prefix would be kept with nothing left to know it by (the page's
    redaction, :func:`~pvisor.adapters.exports.shared.shared`, finds a key by its prefix)."""
    return any(has_key_shape(text[max(0, c - _CUT_WINDOW) : c + _CUT_WINDOW]) for c in cuts)


def _clip_text(text: str, limit: int = _TEXT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    if _keys_cut(text, limit // 2, len(text) - limit // 2):
        text = redact_shapes(text)  # then cut: no half of a key is kept
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
        head, tail = limit // 2, size - (limit - limit // 2)
        near = data[max(0, head - _CUT_WINDOW) : head + _CUT_WINDOW] + b"\n"
        near += data[max(0, tail - _CUT_WINDOW) : tail + _CUT_WINDOW]
        if has_key_shape(near.decode("utf-8", "replace")):
            # a key near a cut: redacted before cutting (_keys_cut), the left-out bytes counted after
            data = redact_shapes(data.decode("utf-8", "replace")).encode()
            if len(data) <= limit:
                return {"size": size, "text": data.decode(), "cut": False}
        cut = (
            data[:head].decode("utf-8", "replace")
            + f"\n\n… {len(data) - limit:,} bytes left out: pvisor journal body {exchange} --{which} …\n\n"
            + data[len(data) - (limit - head) :].decode("utf-8", "replace")
        )
        return {"size": size, "text": cut, "cut": True}
    return {"size": size, "text": data.decode("utf-8", "replace"), "cut": False}


def _call(c: Any, descriptor: Any, failed: set[str]) -> dict[str, Any]:
    """A tool call for the page: id, name, its arguments as JSON text (clipped), ``kind`` (the
    :class:`Effect` value the agent's ``descriptor`` gives its tool; ``other`` without one),
    ``failed`` (its id is among ``failed``: :func:`failed_calls`) and ``view``
    (:func:`call_view`)."""
    args = c.arguments if c.arguments is not None else c.arguments_raw
    effect = descriptor.effect_of(c.name) if descriptor is not None else None
    view = call_view(c, effect)
    if view is not None and view.get("secret"):
        # the file's content is what the snapshots withhold: not in the arguments either
        args = _withheld_args(c.arguments, effect) if effect.effect is not Effect.PATCH else WITHHELD
    return {
        "id": c.id,
        "name": c.name,
        "args": _clip_text(args if isinstance(args, str) else orjson.dumps(args).decode(), 4000),
        "kind": (effect.effect if effect is not None else Effect.OTHER).value,
        "failed": c.id is not None and c.id in failed,
        "view": view,
    }


#: the files a patch names: apply_patch's ``*** Add File: PATH`` (Update, Delete), a unified
#: diff's ``+++ b/PATH`` and ``--- a/PATH``
_PATCH_FILE = re.compile(r"^(?:\*\*\* (?:Add|Update|Delete) File: |\+\+\+ (?:b/)?|--- (?:a/)?)(.+)$", re.M)
#: what stands for a text a call writes into a file that looks like a secret
WITHHELD = "(withheld: the file looks like a secret)"


def _withheld_args(arguments: Any, effect: Any) -> dict[str, Any]:
    """A write's or an edit's arguments with the texts it puts into the file (its content, the
    text it replaces and the text it puts) each :data:`WITHHELD`."""
    roles = {effect.arg(role) for role in (Role.CONTENT, Role.OLD, Role.NEW)} - {None}
    return {k: WITHHELD if k in roles else v for k, v in arguments.items()}


def _secret_target(path: str, *texts: str) -> bool:
    """Whether a file at ``path`` holding ``texts`` looks like a secret, as a snapshot's walk
    decides it (:func:`~pvisor.journal.redact.secret_file`: its name, or a key in it)."""
    name = path.replace("\\", "/").rpartition("/")[2]
    return secret_file(name, "\n".join(texts).encode("utf-8", "replace")) is not None


def call_view(c: Any, effect: Any) -> dict[str, Any] | None:
    """What a call does, as the page shows it by its kind (``effect``: its tool's
    :class:`~pvisor.adapters.agents.effects.ToolEffect`, None when unknown): a shell command
    ``{"command"}`` (an argv list joined as a shell would read it), an edit ``{"path",
    "diff"}`` (the unified diff of the text it replaces against the text it puts, [kind, line]
    pairs: :func:`diff_lines`), a write ``{"path", "content"}`` (clipped), a read ``{"path"}``, a
    patch ``{"patch"}`` (clipped); None for any other kind, or when the arguments the kind needs
    are missing or not text. A write or an edit of a file that looks like a secret (its name, or a
    key in the text it puts or replaces: the snapshots' rule) is ``{"path", "secret": True}``,
    its texts never given; so is a patch that names such a file (the first it names)."""
    if effect is None:
        return None
    args = c.arguments if isinstance(c.arguments, dict) else {}

    def arg(role: Role) -> Any:
        name = effect.arg(role)
        return args.get(name) if name else None

    kind = effect.effect
    if kind is Effect.SHELL:
        command = arg(Role.COMMAND)
        if isinstance(command, list) and all(isinstance(x, str) for x in command):
            command = shlex.join(command)
        return {"command": _clip_text(command, 8000)} if isinstance(command, str) else None
    if kind is Effect.PATCH:
        # a free-form tool (Codex's apply_patch as a Responses custom tool): the whole input
        text = arg(Role.PATCH) if effect.arg(Role.PATCH) else c.arguments_raw
        if not isinstance(text, str):
            return None
        secret = next((p for p in _PATCH_FILE.findall(text) if _secret_target(p.strip())), None)
        return {"path": secret.strip(), "secret": True} if secret else {"patch": _clip_text(text, 8000)}
    path = arg(Role.PATH)
    if not isinstance(path, str) or kind not in (Effect.READ, Effect.WRITE, Effect.EDIT):
        return None
    if kind is Effect.READ:
        return {"path": path}
    if kind is Effect.WRITE:
        content = arg(Role.CONTENT)
        if not isinstance(content, str):
            return None
        if _secret_target(path, content):
            return {"path": path, "secret": True}
        return {"path": path, "content": _clip_text(content, 8000)}
    old, new = arg(Role.OLD), arg(Role.NEW)
    if not (isinstance(old, str) and isinstance(new, str)):
        return None
    if _secret_target(path, old, new):
        return {"path": path, "secret": True}
    return {"path": path, "diff": diff_lines(old, new, _EDIT_DIFF_LINES)[0]}


def _diff(before: str, after: str) -> list[list[str]] | None:
    """None when equal, else the unified diff as [kind, line] pairs (kind ``-``, ``+``, `` ``,
    ``@`` a hunk's head), cut at :data:`_EDIT_DIFF_LINES` lines (:func:`diff_lines`)."""
    if before == after:
        return None
    return diff_lines(before, after, _EDIT_DIFF_LINES)[0]


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
    workspace: bool = True,
) -> dict[str, Any]:
    """The page's data for ``run_id``: ``{"run", "attempts", "exchanges", "children",
    "comparison", "outcome", "totals", "system", "workspace", "diff", "generated"}`` (what they
    show: docs/report.md); ``run.lineage`` is :func:`pvisor.journal.model.run_lineage`'s (None
    for a run that derives from nothing), ``children`` the runs whose ``parent_run`` is it, in
    creation order, each ``{id, mode, agent, boundary_step, pause_transition}``; ``outcome``
    :func:`run_outcome`'s, ``totals`` :func:`run_totals`'s, ``system`` :func:`system_of`'s;
    ``workspace`` ``{"shown", "reason", "capped"}``: whether each step's ``files`` are given
    (``workspace`` False: not, reason ``--no-workspace``; a run without snapshots: not, with
    its reason) and whether the page's cap left files out; ``diff`` None (filled by the
    caller). ``parsed``: runs already read, by run id (filled in). Raises UsageError for an
    unknown run, as the reader does."""
    parsed = {} if parsed is None else parsed
    run = reader.run(run_id)
    read = _read(reader, run.id, parsed, body_limit)
    traj = read.traj
    exchanges = reader.exchanges(run.id)
    attempts = reader.attempts(run.id)
    first_ms = min((e.started_ms for e in exchanges), default=run.created_ms)
    step_of = {d["exchange"]: s for s, d in zip(traj.steps, traj.meta.get("steps", []))}
    details = {d["exchange"]: d for d in traj.meta.get("steps", [])}
    aux = {a["exchange"]: a for a in traj.meta.get("auxiliary", [])}
    context = _Context(find_descriptor(run.agent), aux)
    rows = []
    with progress.task(f"page of run {run.id}", len(exchanges), progress.Unit.EXCHANGES) as task:
        for e in exchanges:
            rows.append(_row(reader, e, first_ms, body_limit, read, step_of.get(e.id), details, context))
            task.advance()
    totals = run_totals(rows, exchanges, attempts, traj.meta.get("steps", []), context.aux_usage)
    shown = _attach_files(reader, run.id, rows, traj, workspace)
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
            {
                "n": a.n,
                "started_ms": a.started_ms,
                "ended_ms": a.ended_ms,
                "exit_code": a.exit_code,
                "command": _attempt_command(a),
            }
            for a in attempts
        ],
        "exchanges": rows,
        # the runs derived from it or handed off from it
        "children": [
            {
                "id": c.id,
                "mode": getattr(c.mode, "value", c.mode),
                "agent": c.agent,
                "boundary_step": c.boundary_step,
                "pause_transition": c.pause_transition,
            }
            for c in reader.child_runs(run.id)
        ],
        "comparison": [],
        "outcome": run_outcome(reader, run, attempts),
        "totals": totals,
        "system": system_of(traj),
        "workspace": shown,
        "diff": None,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    # a handoff's child run that no replay started (pvisor run --child-run) re-ran none of the
    # parent's steps: there is no O against O' to show
    replayed = run.mode != "handoff" or run.labels.get("started_as") in ("replay-only", "continuation")
    if run.parent_run and replayed:
        doc["comparison"] = _comparison(reader, run.parent_run, traj, run.boundary_step, parsed, body_limit)
    doc["diff"] = _request_diff(reader, run, traj, parsed)
    return doc


def _request_diff(
    reader: JournalReader, run: Any, traj: Any, parsed: dict[str, Any]
) -> dict[str, Any] | None:
    """Where the derived run's requests part from its parent's, step by step (``pvisor diff``'s
    :func:`~pvisor.adapters.request_diff.report_section`), for a run of the parent's agent (a
    handoff to another agent speaks another request shape: its O'' is what compares); None for
    a run that derives from nothing, or from a run that is not in this journal."""
    if not run.parent_run or not reader.run_exists(run.parent_run):
        return None
    if reader.run(run.parent_run).agent != run.agent:
        return None
    hints = {run.id: [d["exchange"] for d in traj.meta.get("steps", [])]}
    parent = parsed.get(run.parent_run)
    if parent is not None:  # read already for O against O': its steps are not classified again
        hints[run.parent_run] = [d["exchange"] for d in parent.traj.meta.get("steps", [])]
    return report_section(reader, run.id, hints=hints)


class _Context:
    """What every row of a page reads: the agent's descriptor (None: an agent pvisor has no
    descriptor of), the auxiliary exchanges by id, and the token counts of the auxiliary
    replies (filled in as the rows are made)."""

    __slots__ = ("aux", "aux_usage", "descriptor")

    def __init__(self, descriptor: Any, aux: dict[str, Any]) -> None:
        self.descriptor = descriptor
        self.aux = aux
        self.aux_usage: list[TokenUsage] = []


def _attempt_command(attempt: Any) -> str | None:
    """A later attempt's command line (its label ``argv``, shell-quoted, clipped): the journal
    keeps no prompt of its own for a resumed attempt, its command holds it; None for attempt 1
    (the run's ``task`` label is its prompt) or without the label."""
    try:
        argv = orjson.loads(attempt.labels.get("argv") or "null") if attempt.n > 1 else None
    except orjson.JSONDecodeError:
        return None
    if not isinstance(argv, list) or not all(isinstance(x, str) for x in argv):
        return None
    return _clip_text(shlex.join(argv), 4000)


def run_outcome(reader: JournalReader, run: Any, attempts: list[Any]) -> dict[str, Any]:
    """How the run ended: ``{"verdict", "exit_code", "agent_status", "replay_status",
    "interrupted", "timed_out", "run_status"}``, from the last attempt (its exit code and the
    labels ``pvisor run`` gives it as it ends: ``agent_outcome`` and ``agent_detail``, the
    agent's own account, as ``agent_status`` ``{"outcome", "detail"}``, None when it has none;
    ``interrupted``, the signal's name or None; ``timed_out``), the run's label
    ``replay_status`` (a replay's result ``status``, None for any other run or one replayed
    before pvisor kept it) and :meth:`JournalReader.run_status`.

    ``verdict`` (:class:`RunVerdict`): ``running`` while an attempt is open; else
    ``interrupted``, ``timed_out``; else ``failed`` when the exit code is not 0 or the agent's
    account says failed (an agent that exits 0 but failed by its own account is failed);
    ``succeeded`` when it exited 0; ``unknown`` when nothing says (no attempt: a gateway
    capture, a handoff's child not started). A replay's status is shown beside, apart: a
    diverged replay whose agent ended well succeeded as a run."""
    last = attempts[-1] if attempts else None
    labels = last.labels if last is not None else {}
    own = labels.get("agent_outcome")
    status = reader.run_status(run)
    interrupted = labels.get("interrupted")
    timed_out = labels.get("timed_out") == "true"
    exit_code = last.exit_code if last is not None else None
    if status == "open":
        verdict = RunVerdict.RUNNING
    elif interrupted:
        verdict = RunVerdict.INTERRUPTED
    elif timed_out:
        verdict = RunVerdict.TIMED_OUT
    elif (exit_code is not None and exit_code != 0) or own == AgentOutcome.FAILED.value:
        verdict = RunVerdict.FAILED
    elif exit_code == 0:
        verdict = RunVerdict.SUCCEEDED
    else:
        verdict = RunVerdict.UNKNOWN
    return {
        "verdict": verdict.value,
        "exit_code": exit_code,
        "agent_status": {"outcome": own, "detail": labels.get("agent_detail")} if own else None,
        "replay_status": run.labels.get("replay_status"),
        "interrupted": interrupted,
        "timed_out": timed_out,
        "run_status": status,
    }


def _span(e: Any) -> tuple[float, float] | None:
    """An exchange's time in flight as Unix epoch ms (start, end); None while it has not ended."""
    if e.ended_us is None:
        return None
    return e.started_ms, e.started_ms + e.ended_us / 1000


def _union_ms(spans: list[tuple[float, float]]) -> float:
    """The time covered by at least one of ``spans`` (overlaps counted once), ms."""
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def run_totals(
    rows: list[dict[str, Any]],
    exchanges: list[Any],
    attempts: list[Any],
    details: list[dict[str, Any]],
    aux_usage: list[TokenUsage],
) -> dict[str, Any]:
    """The run's totals (``aux_usage``: the token counts of each auxiliary exchange's reply),
    and each step's ``model_ms`` and ``tool_ms`` set in its row:

    - ``steps``; ``exchanges`` (every exchange of the run); ``auxiliary`` (the chain rule's
      auxiliary exchanges); ``synthetic_end`` (the replay's final replies that ended the agent:
      exchanges flagged ``synthetic_end``, neither steps nor auxiliary); ``retries`` (the
      main-loop requests sent again: each step's ``retries``); ``tool_calls``; ``failed_calls``
      (:func:`failed_calls`);
    - ``tokens_in``, ``tokens_out``, ``tokens_cached``: the sums over every reply that reported
      usage, main-loop and auxiliary, in the protocol's own fields read by its
      ``normalised_usage`` (input with cache reads and writes, output with reasoning, cache
      reads); None when no reply reported that count;
    - ``wall_ms``: each attempt from its start to its end (the agent's whole process; an
      attempt still open, to its last exchange's end), summed; without attempts (a gateway
      capture) the first exchange's start to the last one's end;
    - ``model_ms``: the time at least one request of the run was in flight (request sent to
      reply ended; parallel requests counted once);
    - ``tool_ms``: the sum of the steps' ``tool_ms``; None when no step's was measured.

    A step's ``model_ms`` is the time its request was in flight, its retries' included; its
    ``tool_ms`` the time from its reply's end to the start of the next step's first request
    (its tools ran then, and the agent's own work between), None for the last step of an
    attempt. Times in ms (float)."""
    steps = [r["step"] for r in rows if "step" in r]
    by_id = {e.id: e for e in exchanges}
    for i, (step, d) in enumerate(zip(steps, details)):
        mine = [by_id[x] for x in (d["exchange"], *d.get("retries", [])) if x in by_id]
        spans = [sp for sp in (_span(e) for e in mine) if sp is not None]
        step["model_ms"] = round(sum(b - a for a, b in spans), 1) if spans else None
        step["tool_ms"] = None
        nxt = details[i + 1] if i + 1 < len(details) else None
        end = _span(by_id[d["exchange"]]) if d["exchange"] in by_id else None
        if nxt is not None and end is not None and (nxt.get("attempt") or 1) == (d.get("attempt") or 1):
            starts = [by_id[x].started_ms for x in (nxt["exchange"], *nxt.get("retries", [])) if x in by_id]
            if starts:
                step["tool_ms"] = round(max(0.0, min(starts) - end[1]), 1)
    spans = [sp for sp in (_span(e) for e in exchanges) if sp is not None]
    usages = [s["tokens"] for s in steps]
    extra = [_tokens(u) for u in aux_usage]
    return {
        "steps": len(steps),
        "exchanges": len(exchanges),
        "auxiliary": len(aux_usage),
        "synthetic_end": sum(1 for r in rows if r.get("aux", {}).get("kind") == "synthetic_end"),
        "retries": sum(len(s["retries"]) for s in steps),
        "tool_calls": sum(len(s["calls"]) for s in steps),
        "failed_calls": sum(1 for s in steps for c in s["calls"] if c["failed"]),
        "tokens_in": count_sum(*(u["in"] for u in usages + extra)),
        "tokens_out": count_sum(*(u["out"] for u in usages + extra)),
        "tokens_cached": count_sum(*(u["cached"] for u in usages + extra)),
        "wall_ms": round(_wall_ms(exchanges, attempts), 1),
        "model_ms": round(_union_ms(spans), 1),
        "tool_ms": _measured_sum([s["tool_ms"] for s in steps]),
    }


def _measured_sum(values: list[float | None]) -> float | None:
    """The sum of the ``values`` measured (ms, rounded to 0.1), None when none was."""
    measured = [v for v in values if v is not None]
    return round(sum(measured), 1) if measured else None


def _wall_ms(exchanges: list[Any], attempts: list[Any]) -> float:
    """``wall_ms`` of :func:`run_totals`."""
    ends: dict[int, float] = {}
    for e in exchanges:
        sp = _span(e)
        end = sp[1] if sp is not None else e.started_ms
        ends[e.attempt] = max(ends.get(e.attempt, end), end)
    if attempts:
        total = 0.0
        for a in attempts:
            end = a.ended_ms if a.ended_ms is not None else ends.get(a.n, a.started_ms)
            total += max(0.0, end - a.started_ms)
        return total
    if not exchanges:
        return 0.0
    return max(ends.values()) - min(e.started_ms for e in exchanges)


def system_of(traj: Any) -> dict[str, Any]:
    """Request 1's system prompt and tools, shown once: ``{"text": str | None, "tools":
    [{"name", "description", "parameters"}]}``, the text clipped to :data:`_SYSTEM_LIMIT`
    characters, each description and each parameters' JSON text to :data:`_TOOL_LIMIT`."""
    return {
        "text": _clip_text(traj.system, _SYSTEM_LIMIT) if traj.system else None,
        "tools": [
            {
                "name": t.name,
                "description": _clip_text(t.description or "", _TOOL_LIMIT),
                "parameters": _clip_text(orjson.dumps(t.parameters).decode(), _TOOL_LIMIT)
                if t.parameters is not None
                else None,
            }
            for t in traj.tools or []
        ],
    }


def _attach_files(
    reader: JournalReader, run_id: str, rows: list[dict[str, Any]], traj: Any, shown: bool
) -> dict[str, Any]:
    """Each step's ``files`` and ``files_more`` (:func:`~.report_workspace.step_files`), or None
    and 0 when not shown; returns ``doc["workspace"]`` (``unread``: the steps whose snapshots
    could not be read, :attr:`~.report_workspace.StepFiles.unread`)."""
    steps = [r["step"] for r in rows if "step" in r]
    for step in steps:
        step["files"], step["files_more"] = None, 0
    if not shown:
        return {"shown": False, "reason": NO_WORKSPACE_REASON, "capped": False, "unread": 0}
    found = step_files(reader, run_id, traj.meta)
    for step in steps:
        if step["n"] in found.files:
            step["files"], step["files_more"] = found.files[step["n"]], found.more.get(step["n"], 0)
    return {
        "shown": found.reason is None,
        "reason": found.reason,
        "capped": found.capped,
        "unread": found.unread,
    }


def failed_calls(action: Any, observation: Any, descriptor: Any) -> set[str]:
    """The ids of ``action``'s calls that failed: their result says ``is_error``, or (no
    ``is_error`` at all) the call is a shell call whose output states a non-zero exit code in
    the agent's words (``descriptor.shell_exit_code``: Codex's ``Process exited with code 1``)."""
    kinds = {c.id: descriptor.effect_of(c.name).effect for c in action.tool_calls} if descriptor else {}
    failed = set()
    for r in observation.results:
        if r.call_id is None:
            continue
        if r.is_error is True:
            failed.add(r.call_id)
        elif r.is_error is None and kinds.get(r.call_id) is Effect.SHELL:
            code = descriptor.shell_exit_code(_text_of(r.content))
            if code is not None and code != 0:
                failed.add(r.call_id)
    return failed


def _row(
    reader: JournalReader,
    e: Any,
    first_ms: float,
    body_limit: int,
    read: _Read,
    step: Any,
    details: dict[str, Any],
    context: _Context,
) -> dict[str, Any]:
    """The page's row of exchange ``e`` (``step``: its step, None for an auxiliary one)."""
    aux = context.aux
    kept = e.response_final or e.response_body
    reply = reader.blob(kept) if kept else None
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
        "response": _body(reply, body_limit, e.id, "response"),
    }
    if step is not None:
        a, o = step.action, step.observation
        d = details[e.id]
        failed = failed_calls(a, o, context.descriptor)
        usage = _usage_of(e.protocol, a.usage)
        row["step"] = {
            "n": step.n,
            "text": _clip_text(a.text or ""),
            # the visible texts only: a signature or encrypted content says nothing to a reader
            "reasoning": [_clip_text(r.text) for r in a.reasoning if r.text],
            "calls": [_call(c, context.descriptor, failed) for c in a.tool_calls],
            "results": [
                {"call_id": r.call_id, "error": r.is_error, "text": _clip_text(_text_of(r.content))}
                for r in o.results
            ],
            "messages": [
                _clip_text(" ".join(getattr(p, "text", None) or "" for p in m.parts)) for m in o.messages
            ],
            "usage": a.usage,
            "tokens": _tokens(usage),
            "flags": list(step.flags),
            "retries": d.get("retries", []),
        }
    elif e.id in aux:
        row["aux"] = {"kind": aux[e.id]["kind"], "reason": aux[e.id]["reason"]}
        context.aux_usage.append(_reply_usage(e.protocol, reply))
    else:
        row["aux"] = {"kind": "synthetic_end" if "synthetic_end" in e.flags else "other", "reason": ""}
    return row


def _tokens(u: TokenUsage) -> dict[str, int | None]:
    """A step's ``tokens``: ``{"in", "out", "cached"}`` (input with the cache's, output with
    reasoning, cache reads), each None when the reply did not report it."""
    return {"in": u.input_tokens, "out": u.output_tokens, "cached": u.cached_input_tokens}


def _usage_of(protocol: str | None, usage: Any) -> TokenUsage:
    """A reply's usage object read by its protocol's ``normalised_usage`` (none for an unknown
    protocol)."""
    if protocol not in PROTOCOL_MODULES or usage is None:
        return TokenUsage()
    return get_protocol(protocol).normalised_usage(usage)


def _reply_usage(protocol: str | None, reply: bytes | None) -> TokenUsage:
    """The token counts of an auxiliary exchange's reply (its final body), as
    :func:`~pvisor.adapters.exports.genai.reply_of` reads them; none when it has no reply that
    reads as one."""
    if protocol not in PROTOCOL_MODULES or not reply:
        return TokenUsage()
    try:
        final = orjson.loads(reply)
    except orjson.JSONDecodeError:
        return TokenUsage()
    return reply_of(get_protocol(protocol), final)[1]


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
    descriptor = find_descriptor(agent)
    return descriptor.normalise_output if descriptor is not None else lambda text: text
