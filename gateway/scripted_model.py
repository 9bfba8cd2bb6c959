"""The scripted model: answers model API requests from a script, in any of the four protocols.

It stands in for a model offline (tests, the demo). Its replies are made in the request's
protocol by :mod:`pvisor.adapters.protocols.replies` (:class:`Reply`), as playback's are. The
script format is documented in docs/scripted-model.md. In short::

    {"model": "mock-model", "seed": 1,
     "turns": [
        {"text": "Listing files.", "tool_calls": [{"tool": "@shell", "command": "ls"}]},
        {"text": "Done."}
     ]}

A turn is chosen by the state of the conversation, never by arrival order: turn *k* answers a
main-chain request that already holds *k* assistant messages, so auxiliary requests racing the
main loop (OpenCode's title request, Qwen Code's background request) cannot shift it. A request
whose system prompt or tools differ from the main chain's gets ``aux_reply``, or, when it offers
tools and the script has ``subagent_turns``, the subagent turn its conversation state picks (a
subagent's own loop: the same rule as the main turns, ``aux_reply`` past the last). Ids come from a
counter seeded by (seed, turn) and timestamps are fixed, so the same request gets the same bytes.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from pvisor.adapters.protocols import protocol_for_path
from pvisor.adapters.protocols.base import IdSource, compact_json, loads_object
from pvisor.adapters.protocols.replies import Reply, local_reply, split_events, token_count_reply
from pvisor.core.errors import BadInputError
from pvisor.journal.paths import absolute
from pvisor.journal.model import Action, Conversation, Reasoning, TextPart, ToolCall

#: tool names taken as "the agent's shell tool" by ``"tool": "@shell"``, in order of preference
SHELL_TOOL_NAMES = ("bash", "shell", "exec_command", "run_shell_command", "shell_command", "local_shell")


@dataclass(slots=True)
class ScriptedCall:
    """One tool call of a turn: ``tool`` (a name, or ``@shell``), ``command`` (for ``@shell``:
    the value of the shell tool's first required string property), ``arguments`` (more fields)."""

    tool: str
    command: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Turn:
    """One scripted reply: ``text``, ``reasoning``, ``tool_calls`` (several = parallel calls),
    or an ``error`` (``{"status": int, "body": object|str}``); ``delay_ms`` before answering;
    ``repeat`` how many consecutive conversation states it answers; ``usage`` the token counts
    the reply reports (``{"input_tokens": int, "output_tokens": int}``, written in the
    protocol's own usage shape), which is what makes an agent compact its context."""

    text: str = ""
    reasoning: str | None = None
    tool_calls: list[ScriptedCall] = field(default_factory=list)
    error: dict[str, Any] | None = None
    delay_ms: int = 0
    repeat: int = 1
    usage: dict[str, int] | None = None


@dataclass(slots=True)
class Compaction:
    """How the script answers an agent's request to summarise its context (docs/scripted-model.md,
    "Compaction"): a request whose last user message holds one of the ``when`` texts gets
    ``summary`` followed by a marker naming the conversation state it summarised (so that the
    turns go on after the agent replaced its history by the summary); ``usage`` is reported
    with it; assistant messages whose whole text is one of ``agent_messages`` are the agent's
    own (an acknowledgement it puts after the summary) and are not counted as turns;
    ``serialized_assistant``: for an agent that writes the history into its summary request as
    text (OpenCode), the text each serialised assistant message starts with, counted as one."""

    when: list[str]
    summary: str = "Summary of the work so far."
    usage: dict[str, int] | None = None
    agent_messages: list[str] = field(default_factory=list)
    serialized_assistant: str | None = None


@dataclass(slots=True)
class Script:
    """A parsed script (see docs/scripted-model.md for every field)."""

    turns: list[Turn]
    model: str = "mock-model"
    seed: int = 1
    aux_reply: str = "OK"
    after_end: str = "Done."
    # "tools": the first request with tools defines it; "first": the first request; "any-tools":
    # every request with tools (several sessions at once, e.g. k rollouts against one server)
    main_chain: str = "tools"
    chunk_events: int = 1  # events per written chunk when streaming
    compaction: Compaction | None = None
    #: the turns of a subagent's loop: requests off the main chain that offer tools, chosen by
    #: conversation state as the main turns are (empty: every such request gets ``aux_reply``)
    subagent_turns: list[Turn] = field(default_factory=list)


_TURN_KEYS = {"text", "reasoning", "tool_calls", "error", "delay_ms", "repeat", "usage"}
_SCRIPT_KEYS = {
    "turns",
    "model",
    "seed",
    "aux_reply",
    "after_end",
    "main_chain",
    "chunk_events",
    "compaction",
    "subagent_turns",
}
_COMPACTION_KEYS = {"when", "summary", "usage", "agent_messages", "serialized_assistant"}
_USAGE_KEYS = ("input_tokens", "output_tokens")

#: the marker a summary reply ends with: the number of turns (conversation state) it summarises.
#: Plain ASCII in brackets, so that it survives the agents' re-wording of the summary message
SUMMARY_MARKER = "[pvisor scripted summary of {} turns]"
_MARKER_RX = re.compile(r"\[pvisor scripted summary of (\d+) turns\]")


def load_script(path: str | Path) -> Script:
    """Read a script from a ``.json`` or ``.toml`` file.

    Raises BadInputError naming the file and the field for anything malformed.
    """
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        raise BadInputError(
            f"script {path}: YAML is not supported; write the script as JSON (.json) or TOML (.toml), "
            "docs/scripted-model.md"
        )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        absolute(path, f"--script {path}")  # a relative path in a deleted directory: say so
        raise BadInputError(f"cannot read script {path}: {exc.strerror}") from None
    try:
        if path.suffix.lower() == ".toml":
            data = tomllib.loads(raw.decode("utf-8"))
        else:
            data = orjson.loads(raw)
    except Exception as exc:  # tomllib, orjson and UnicodeDecodeError all describe the position
        raise BadInputError(
            f"script {path} is not valid {'TOML' if path.suffix.lower() == '.toml' else 'JSON'}: {exc}"
        ) from None
    return parse_script(data, str(path))


def parse_script(data: Any, where: str = "script") -> Script:
    """Validate a script object (already parsed). Raises BadInputError naming the bad field."""
    if not isinstance(data, dict):
        raise BadInputError(f"{where}: expected an object with a 'turns' list")
    unknown = set(data) - _SCRIPT_KEYS
    if unknown:
        raise BadInputError(
            f"{where}: unknown field(s) {', '.join(sorted(unknown))}; "
            f"expected {', '.join(sorted(_SCRIPT_KEYS))}"
        )
    turns_raw = data.get("turns")
    if not isinstance(turns_raw, list):
        raise BadInputError(f"{where}: 'turns' must be a list of turns")
    turns = [_parse_turn(t, f"{where}: turns[{i}]") for i, t in enumerate(turns_raw)]
    main_chain = data.get("main_chain", "tools")
    if main_chain not in ("tools", "first", "any-tools"):
        raise BadInputError(
            f"{where}: main_chain must be 'tools', 'first' or 'any-tools', not {main_chain!r}"
        )
    script = Script(turns=turns, main_chain=main_chain)
    for key, typ in (
        ("model", str),
        ("seed", int),
        ("aux_reply", str),
        ("after_end", str),
        ("chunk_events", int),
    ):
        if key in data:
            if not isinstance(data[key], typ) or isinstance(data[key], bool):
                raise BadInputError(f"{where}: '{key}' must be {'a string' if typ is str else 'an integer'}")
            setattr(script, key, data[key])
    if script.chunk_events < 1:
        raise BadInputError(f"{where}: 'chunk_events' must be at least 1")
    if "compaction" in data:
        script.compaction = _parse_compaction(data["compaction"], f"{where}: compaction")
    subs = data.get("subagent_turns", [])
    if not isinstance(subs, list):
        raise BadInputError(f"{where}: 'subagent_turns' must be a list of turns")
    script.subagent_turns = [_parse_turn(t, f"{where}: subagent_turns[{i}]") for i, t in enumerate(subs)]
    if any(t.error is not None or t.repeat != 1 for t in script.subagent_turns):
        raise BadInputError(f"{where}: 'subagent_turns' take no 'error' and no 'repeat'")
    return script


def _parse_usage(u: Any, where: str) -> dict[str, int]:
    expected = '{"input_tokens": int >= 0, "output_tokens": int >= 0}'
    if not isinstance(u, dict):
        raise BadInputError(f"{where}: expected {expected}")
    missing = [k for k in _USAGE_KEYS if k not in u]
    unknown = sorted(k for k in u if k not in _USAGE_KEYS)
    bad = [
        k for k in _USAGE_KEYS if k in u and (not isinstance(u[k], int) or isinstance(u[k], bool) or u[k] < 0)
    ]
    if missing or unknown or bad:
        said = "; ".join(
            x
            for x in (
                f"missing {', '.join(missing)}" if missing else "",
                f"unknown field(s) {', '.join(unknown)}" if unknown else "",
                f"{', '.join(bad)} not an integer >= 0" if bad else "",
            )
            if x
        )
        raise BadInputError(f"{where}: {said}; expected {expected}")
    return {k: u[k] for k in _USAGE_KEYS}


def _parse_compaction(c: Any, where: str) -> Compaction:
    if not isinstance(c, dict):
        raise BadInputError(f"{where}: expected an object with a 'when' list of texts")
    unknown = set(c) - _COMPACTION_KEYS
    if unknown:
        raise BadInputError(
            f"{where}: unknown field(s) {', '.join(sorted(unknown))}; "
            f"expected {', '.join(sorted(_COMPACTION_KEYS))}"
        )
    for key in ("when", "agent_messages"):
        v = c.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise BadInputError(f"{where}.{key}: expected a list of non-empty texts")
    if not c.get("when"):
        raise BadInputError(
            f"{where}.when: expected at least one text that marks the agent's summary request"
        )
    out = Compaction(when=list(c["when"]), agent_messages=list(c.get("agent_messages", [])))
    if "summary" in c:
        if not isinstance(c["summary"], str):
            raise BadInputError(f"{where}.summary: expected a string")
        out.summary = c["summary"]
    if "usage" in c:
        out.usage = _parse_usage(c["usage"], f"{where}.usage")
    if "serialized_assistant" in c:
        if not isinstance(c["serialized_assistant"], str) or not c["serialized_assistant"]:
            raise BadInputError(f"{where}.serialized_assistant: expected a non-empty text")
        out.serialized_assistant = c["serialized_assistant"]
    return out


def _parse_turn(t: Any, where: str) -> Turn:
    if not isinstance(t, dict):
        raise BadInputError(f"{where}: expected an object")
    unknown = set(t) - _TURN_KEYS
    if unknown:
        raise BadInputError(
            f"{where}: unknown field(s) {', '.join(sorted(unknown))}; "
            f"expected {', '.join(sorted(_TURN_KEYS))}"
        )
    turn = Turn()
    if "text" in t:
        if not isinstance(t["text"], str):
            raise BadInputError(f"{where}.text: expected a string")
        turn.text = t["text"]
    if "reasoning" in t:
        if not isinstance(t["reasoning"], str):
            raise BadInputError(f"{where}.reasoning: expected a string")
        turn.reasoning = t["reasoning"]
    for key in ("delay_ms", "repeat"):
        if key in t:
            v = t[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if key == "repeat" else 0):
                raise BadInputError(f"{where}.{key}: expected an integer >= {1 if key == 'repeat' else 0}")
            setattr(turn, key, v)
    if "usage" in t:
        turn.usage = _parse_usage(t["usage"], f"{where}.usage")
    if "error" in t:
        err = t["error"]
        if (
            not isinstance(err, dict)
            or not isinstance(err.get("status"), int)
            or isinstance(err["status"], bool)
            or not 400 <= err["status"] <= 599
            or not isinstance(err.get("body", {}), (dict, str))
        ):
            raise BadInputError(f'{where}.error: expected {{"status": 400..599, "body": object or string}}')
        extra = set(err) - {"status", "body"}
        if extra:
            raise BadInputError(
                f"{where}.error: unknown field(s) {', '.join(sorted(extra))}; expected body, status"
            )
        turn.error = err
    calls = t.get("tool_calls", [])
    if not isinstance(calls, list):
        raise BadInputError(f"{where}.tool_calls: expected a list")
    for j, c in enumerate(calls):
        cw = f"{where}.tool_calls[{j}]"
        if not isinstance(c, dict) or not isinstance(c.get("tool"), str):
            raise BadInputError(f"{cw}: expected an object with a 'tool' name (or \"@shell\")")
        args = c.get("arguments", {})
        if not isinstance(args, dict):
            raise BadInputError(f"{cw}.arguments: expected an object")
        command = c.get("command")
        if command is not None and not isinstance(command, str):
            raise BadInputError(f"{cw}.command: expected a string")
        if c["tool"] == "@shell" and command is None:
            raise BadInputError(f"{cw}: '@shell' needs a 'command'")
        extra = set(c) - {"tool", "command", "arguments"}
        if extra:
            raise BadInputError(f"{cw}: unknown field(s) {', '.join(sorted(extra))}")
        turn.tool_calls.append(ScriptedCall(tool=c["tool"], command=command, arguments=dict(args)))
    return turn


def _signature(system: str, tools: list[Any]) -> str:
    h = hashlib.sha256()
    h.update(system.encode("utf-8", "surrogatepass"))
    for t in tools:
        h.update(b"\0" + t.name.encode())
    return h.hexdigest()


def _shell_tool(conv: Conversation, tools: list[Any] | None = None) -> tuple[str, str]:
    """(tool name, argument name) of the agent's shell tool, from the tools the request offers."""
    tools = conv.tools if tools is None else tools
    by_name = {t.name.lower(): t for t in tools}
    for candidate in SHELL_TOOL_NAMES:
        tool = by_name.get(candidate)
        if tool is not None:
            params = tool.parameters if isinstance(tool.parameters, dict) else {}
            props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
            strings = [k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"]
            listed = params.get("required")
            required = [k for k in listed if k in strings] if isinstance(listed, list) else []
            return tool.name, (required or strings or ["command"])[0]
    names = ", ".join(t.name for t in tools) or "none"
    raise BadInputError(
        f"the script asks for '@shell' but the request has no shell tool ({'|'.join(SHELL_TOOL_NAMES)}); "
        f"its tools: {names}"
    )


def count_assistant_turns(conv: Conversation) -> int:
    """Number of assistant messages in the request."""
    return sum(1 for m in conv.messages if m.role == "assistant")


def _text(m: Any) -> str:
    return "".join(p.text for p in m.parts if isinstance(p, TextPart))


def conversation_state(
    conv: Conversation, agent_messages: frozenset[str] = frozenset(), serialized: str | None = None
) -> int:
    """The conversation state that picks a turn: the number of assistant messages in the
    request; after a compaction (a message holding :data:`SUMMARY_MARKER`), the number of turns
    the last marker names plus the assistant messages after the message holding it, those
    whose whole text is in ``agent_messages`` left out. With ``serialized`` (a summary request
    holding the history as text), each occurrence of it in the message holding the last marker
    and in the messages after it (in every message, without a marker) counts as one more
    assistant message: such an agent serialises only what came after its previous summary,
    which it quotes beside it."""
    start, base = 0, 0
    texts = [_text(m) for m in conv.messages]
    for i, text in enumerate(texts):
        found = _MARKER_RX.findall(text)
        if found:
            start, base = i + 1, int(found[-1])
    serial = sum(t.count(serialized) for t in texts[max(start - 1, 0) :]) if serialized is not None else 0
    return (
        base
        + serial
        + sum(
            1
            for m, t in zip(conv.messages[start:], texts[start:])
            if m.role == "assistant" and t.strip() not in agent_messages
        )
    )


def is_summary_request(conv: Conversation, when: list[str]) -> bool:
    """True when the request's last user message holds one of the ``when`` texts."""
    last = next((m for m in reversed(conv.messages) if m.role == "user"), None)
    text = _text(last) if last is not None else ""
    return any(w in text for w in when)


class ScriptedModel:
    """Answer requests from a :class:`Script`. Stateless except for the main chain's signature,
    which the first qualifying request fixes, and the count of error turns served per
    conversation state."""

    def __init__(self, script: Script):
        self.script = script
        # Replies and errors apart: an error adds no assistant message, so it cannot own a
        # conversation state; the errors written before a reply are answered, in order, to the
        # first requests of that reply's first state (retries), then the reply.
        self._replies: list[Turn] = []
        self._errors_before: list[list[Turn]] = [[]]
        for t in script.turns:
            if t.error is not None:
                self._errors_before[-1].append(t)
            else:
                self._replies.append(t)
                self._errors_before.append([])
        # reply k is _replies[i] for the first i whose cumulative repeat count exceeds k;
        # repeats are never expanded into a list (a repeat may be 10**12)
        self._ends: list[int] = list(itertools.accumulate(t.repeat for t in self._replies))
        self._errors_served: dict[int, int] = {}  # conversation state -> errors answered to it
        self.main_signature: str | None = None

    def turn_at(self, k: int) -> Turn | None:
        """The scripted reply answering conversation state ``k`` (``repeat`` counted, error
        turns left out), or None past the last one."""
        i = bisect.bisect_right(self._ends, k)
        return self._replies[i] if i < len(self._replies) else None

    def error_for(self, k: int) -> Turn | None:
        """The error turn owed to this request at conversation state ``k``, or None. The error
        turns written before reply *i* belong to the first state of reply *i* (errors after the
        last reply to the state past it); each answers ``repeat`` requests, in script order.
        Counts what it served: this is the one piece of state besides the main chain."""
        i = bisect.bisect_right(self._ends, k)
        first_state = self._ends[i - 1] if i > 0 else 0
        if k != first_state or i >= len(self._errors_before):
            return None
        served = self._errors_served.get(k, 0)
        for t in self._errors_before[i]:
            if served < t.repeat:
                self._errors_served[k] = self._errors_served.get(k, 0) + 1
                return t
            served -= t.repeat
        return None

    def action_for(self, turn: Turn, conv: Conversation, mod: Any = None) -> Action:
        calls: list[ToolCall] = []
        tools = mod.offered_tools(conv) if mod is not None else conv.tools
        by_name = {t.name: t for t in tools}
        for c in turn.tool_calls:
            args = dict(c.arguments)
            name = c.tool
            if c.tool == "@shell":
                name, arg = _shell_tool(conv, tools)
                args = {arg: c.command, **args}
            elif mod is not None and name in by_name and mod.tool_kind(by_name[name]) == "custom":
                # a free-form tool (Responses custom): its input is the command, or arguments.input
                text = c.command if c.command is not None else str(args.get("input", ""))
                calls.append(ToolCall(id=None, name=name, arguments_raw=text, arguments={}, kind="custom"))
                continue
            elif c.command is not None:
                args.setdefault("command", c.command)
            raw = compact_json(args)
            calls.append(ToolCall(id=None, name=name, arguments_raw=raw, arguments=args))
        reasoning = [Reasoning(text=turn.reasoning)] if turn.reasoning else []
        usage = dict(turn.usage) if turn.usage is not None else None
        return Action(
            text=turn.text,
            reasoning=reasoning,
            tool_calls=calls,
            model=conv.model or self.script.model,
            stop_reason=None,
            usage=usage,
        )

    def classify(self, conv: Conversation, tools: list[Any] | None = None, system: str | None = None) -> str:
        """``main`` or ``aux`` for a parsed request (fixing the main chain on first sight);
        ``tools``: the tools it offers (its protocol's ``offered_tools``; default its definitions);
        ``system``: its system prompt as the chain rule compares it (its protocol's
        ``normalise``; default the text as sent)."""
        tools = conv.tools if tools is None else tools
        if self.script.main_chain == "any-tools":
            return "main" if tools else "aux"
        sig = _signature(conv.system or "" if system is None else system, tools)
        if self.main_signature is None:
            if self.script.main_chain == "first" or tools:
                self.main_signature = sig
            else:
                return "aux"
        return "main" if sig == self.main_signature else "aux"

    def answer(self, method: str, path: str, query: str, body: bytes) -> Reply:
        """The reply to one request. Raises BadInputError for a body the protocol cannot parse
        or a script that cannot be applied (the server turns it into a 400)."""
        mod = protocol_for_path(path)
        if mod is None:
            return self._local(method, path)
        if mod.counts_tokens(path):
            return token_count_reply(mod, body)
        obj = loads_object(body) if body else {}
        conv = mod.parse_request(obj, path=path, query=query)
        stream = mod.wants_stream(path, query, obj)
        comp = self.script.compaction
        acks = frozenset(comp.agent_messages) if comp is not None else frozenset()
        if comp is not None and is_summary_request(conv, comp.when):
            # checked before the main chain: an agent may ask for its summary with the main
            # loop's own system prompt and tools
            k = conversation_state(conv, acks, comp.serialized_assistant)
            text = (
                f"{comp.summary}\n\n{SUMMARY_MARKER.format(k)}" if comp.summary else SUMMARY_MARKER.format(k)
            )
            turn, kind = Turn(text=text, usage=comp.usage), "summary"
            k += 20_000_000
        elif (
            self.classify(
                conv,
                mod.offered_tools(conv),
                mod.normalise(Conversation(protocol=conv.protocol, system=conv.system))["system"],
            )
            == "aux"
        ):
            turn, k, kind = self._off_main(conv, mod)
        else:
            k = conversation_state(conv, acks)
            scripted = self.error_for(k) or self.turn_at(k)
            if scripted is not None:
                turn, kind = scripted, "turn"
            else:
                turn, kind = Turn(text=self.script.after_end), "after_end"
        delay = turn.delay_ms / 1000.0
        if turn.error is not None:
            err_body = turn.error.get(
                "body", {"error": {"type": "scripted_error", "message": "scripted error"}}
            )
            payload = err_body.encode() if isinstance(err_body, str) else orjson.dumps(err_body)
            return Reply(
                turn.error["status"], {"Content-Type": "application/json"}, [payload], delay, "error"
            )
        ids = IdSource(self.script.seed * 1_000_003 + k)
        action = self.action_for(turn, conv, mod)
        final = mod.action_to_response(action, model=action.model or self.script.model, ids=ids)
        if stream:
            data = mod.render_stream(final)
            return Reply(
                200,
                {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
                split_events(data, self.script.chunk_events),
                delay,
                kind,
            )
        return Reply(200, {"Content-Type": "application/json"}, [orjson.dumps(final)], delay, kind)

    def _off_main(self, conv: Conversation, mod: Any) -> tuple[Turn, int, str]:
        """(turn, id seed offset, kind) of a request off the main chain: the subagent turn of its
        conversation state when it offers tools and the script has ``subagent_turns`` (kind
        ``subagent``; ``aux_reply`` past the last one), else ``aux_reply`` (kind ``aux``)."""
        subs = self.script.subagent_turns
        if subs and mod.offered_tools(conv):
            k = count_assistant_turns(conv)
            turn = subs[k] if k < len(subs) else Turn(text=self.script.aux_reply)
            return turn, 30_000_000 + k, "subagent"
        return Turn(text=self.script.aux_reply), 10_000_000, "aux"

    def _local(self, method: str, path: str) -> Reply:
        return local_reply(method, path, self.script.model)
