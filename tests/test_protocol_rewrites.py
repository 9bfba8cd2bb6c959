"""Body-level rewrites of the four wire-protocol modules (``entries``, ``insert_user_text``,
``strip_reasoning``, ``reasoning_keys``, ``with_model``, ``reasoning_refusal``; Responses
``expand_previous_response`` and ``conversation_items``), on the real requests of
tests/corpus/requests: Codex 0.171 (Responses), Gemini CLI 0.61 (Gemini), OpenCode 1.18 and Qwen
Code 0.24 (Chat Completions), mini-swe-agent 2.4 through litellm (Chat Completions and Anthropic
Messages). Claude Code traffic is not in the corpus.

The corpus's scripted server sent no reasoning, so the reasoning these tests strip is the kind
pvisor itself serves: replies rendered by the modules' own ``action_to_response`` from the
corpus's recorded replies, plus the real Gemini replies with thought signatures of
tests/corpus/wire/gemini. Rewritten bodies are read back with the module's ``parse_request`` and
validated with the official SDKs' request types (anthropic, openai, google-genai).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import orjson
import pydantic
import pytest
from anthropic.types import MessageParam
from google.genai import types as genai_types
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam
from pvisor.adapters.protocols import anthropic as A
from pvisor.adapters.protocols import gemini as G
from pvisor.adapters.protocols import openai_chat as C
from pvisor.adapters.protocols import openai_responses as R
from pvisor.adapters.protocols import protocol_for_path
from pvisor.adapters.protocols.base import IdSource
from pvisor.journal.model import Action, Conversation, Message, Reasoning, TextPart, ToolCall

MODULES = {"anthropic": A, "openai-chat": C, "openai-responses": R, "gemini": G}
#: the body key holding the conversation
LIST_KEY = {
    "anthropic": "messages",
    "openai-chat": "messages",
    "openai-responses": "input",
    "gemini": "contents",
}
#: POST requests per protocol in tests/corpus/requests
EXPECTED_REQUESTS = {"anthropic": 2, "openai-chat": 16, "openai-responses": 6, "gemini": 7}
TEXT = "pvisor: before you go on, also write a short summary of what you did."


# --------------------------------------------------------------------------- helpers


def requests_of(corpus: Path, protocol: str) -> list[tuple[str, dict]]:
    """(file:line, record) for every request of ``protocol`` in the request corpus. Lines are
    split on b"\\n" (never str.splitlines, which splits on U+2028 too)."""
    out = []
    for path in sorted((corpus / "requests").glob("*.jsonl")):
        for n, line in enumerate(path.read_bytes().split(b"\n")):
            if not line.strip():
                continue
            rec = orjson.loads(line)
            mod = protocol_for_path(rec["path"])
            if mod is not None and mod.NAME == protocol and isinstance(rec["body"], dict):
                out.append((f"{path.name}:{n}", rec))
    return out


def record(corpus: Path, name: str, n: int) -> dict:
    """Line ``n`` of ``requests/<name>``."""
    lines = [line for line in (corpus / "requests" / name).read_bytes().split(b"\n") if line.strip()]
    return orjson.loads(lines[n])


def parse(mod, rec: dict, body: dict, path: str | None = None) -> Conversation:
    """The module's own reading of ``body`` sent as compact JSON bytes."""
    return mod.parse_request(orjson.dumps(body), path=path or rec["path"], query=rec.get("query") or "")


def norm(mod, messages) -> list:
    """The chain rule's comparison form of some messages."""
    return mod.normalise(Conversation(protocol=mod.NAME, messages=list(messages)))["messages"]


def _materialise(value):
    """Pydantic validates the SDKs' ``Iterable[...]`` fields lazily: walk the result to finish."""
    if isinstance(value, dict):
        return {k: _materialise(v) for k, v in value.items()}
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        return value
    return [_materialise(v) for v in value]


_SDK_LISTS = {
    "anthropic": pydantic.TypeAdapter(list[MessageParam]),
    "openai-chat": pydantic.TypeAdapter(list[ChatCompletionMessageParam]),
    "openai-responses": pydantic.TypeAdapter(list[ResponseInputItemParam]),
}


def sdk_valid(protocol: str, body: dict) -> None:
    """Validate a body's conversation with the official SDK's request types (raises when one
    entry has a shape the SDK does not know)."""
    entries = MODULES[protocol].entries(body)
    if protocol == "gemini":
        for content in entries:
            genai_types.Content.model_validate(content)  # extra fields are forbidden there
    else:
        _materialise(_SDK_LISTS[protocol].validate_python(entries))


def gemini_final(corpus: Path, name: str) -> dict:
    """A real streamed Gemini reply (tests/corpus/wire/gemini, vercel/ai fixtures) reassembled."""
    raw = (corpus / "wire" / "gemini" / f"{name}.chunks.jsonl").read_bytes()
    data = b"".join(b"data: " + line + b"\r\n\r\n" for line in raw.split(b"\n") if line.strip())
    return G.reassemble([data]).final


# --------------------------------------------------------------------------- entries


def test_corpus_has_requests_for_every_protocol(corpus):
    assert {p: len(requests_of(corpus, p)) for p in MODULES} == EXPECTED_REQUESTS


@pytest.mark.parametrize("protocol", MODULES)
def test_entries_are_the_conversation_list_of_real_requests(corpus, protocol):
    mod = MODULES[protocol]
    for where, rec in requests_of(corpus, protocol):
        body = rec["body"]
        got = mod.entries(body)
        assert got == body[LIST_KEY[protocol]] and got is not body[LIST_KEY[protocol]], where
        conv = parse(mod, rec, body)
        if protocol == "openai-chat":  # the leading system messages are entries, not messages
            assert len(got) == len(conv.system_raw or []) + len(conv.messages), where
        elif protocol != "openai-responses":  # Responses groups items into messages
            assert len(got) == len(conv.messages), where
    assert mod.entries({}) == [] and mod.entries({LIST_KEY[protocol]: None}) == []


def test_responses_string_input_is_one_user_message_item(corpus):
    rec = record(corpus, "codex-0.171.0.jsonl", 0)
    text = rec["body"]["input"][-1]["content"][0]["text"]  # the task prompt
    as_string = {**rec["body"], "input": text}
    items = R.entries(as_string)
    assert items == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]
    # the item reads as the string does
    as_items = {**rec["body"], "input": items}
    assert R.normalise(parse(R, rec, as_items)) == R.normalise(parse(R, rec, as_string))
    sdk_valid("openai-responses", as_items)


# --------------------------------------------------------------------------- insert_user_text

#: how many real requests end with a user entry the text is appended to (Anthropic merges turns
#: of one role; Gemini CLI's last content is the user's, also for function responses)
EXPECTED_MERGED = {"anthropic": 2, "openai-chat": 0, "openai-responses": 0, "gemini": 7}


def _is_user(protocol: str, entry) -> bool:
    return (
        protocol == "anthropic"
        and entry.get("role") == "user"
        or (protocol == "gemini" and entry.get("role") in (None, "user"))
    )


@pytest.mark.parametrize("protocol", MODULES)
def test_insert_at_the_end_reads_back_as_the_last_user_text(corpus, protocol):
    mod = MODULES[protocol]
    merged = 0
    for where, rec in requests_of(corpus, protocol):
        body = rec["body"]
        before = orjson.dumps(body)
        n = len(mod.entries(body))
        new = mod.insert_user_text(body, n, TEXT)
        assert orjson.dumps(body) == before, f"{where}: the input body was changed"
        old_conv, new_conv = parse(mod, rec, body), parse(mod, rec, new)
        last = new_conv.messages[-1]
        assert last.role == "user" and isinstance(last.parts[-1], TextPart) and last.parts[-1].text == TEXT, (
            where
        )
        if len(mod.entries(new)) == n:  # appended to the last (user) entry
            merged += 1
            assert norm(mod, new_conv.messages[:-1]) == norm(mod, old_conv.messages[:-1]), where
            assert norm(mod, [Message("user", last.parts[:-1])]) == norm(mod, [old_conv.messages[-1]]), where
        else:
            assert len(mod.entries(new)) == n + 1, where
            assert norm(mod, new_conv.messages[:-1]) == norm(mod, old_conv.messages), where
            assert len(last.parts) == 1, where
        # nothing but the conversation changed
        key = LIST_KEY[protocol]
        assert list(new) == list(body) and {k: v for k, v in new.items() if k != key} == {
            k: v for k, v in body.items() if k != key
        }
        sdk_valid(protocol, new)
    assert merged == EXPECTED_MERGED[protocol]


#: the user turn each protocol inserts as a new entry
NEW_TURN = {
    "anthropic": {"role": "user", "content": [{"type": "text", "text": TEXT}]},
    "openai-chat": {"role": "user", "content": TEXT},
    "openai-responses": {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": TEXT}],
    },
    "gemini": {"role": "user", "parts": [{"text": TEXT}]},
}


@pytest.mark.parametrize("protocol", MODULES)
def test_insert_earlier_keeps_every_entry_after_it(corpus, protocol):
    mod = MODULES[protocol]
    positions = 0
    for where, rec in requests_of(corpus, protocol):
        body = rec["body"]
        old = mod.entries(body)
        for at in range(len(old)):
            new = mod.insert_user_text(body, at, TEXT)
            got = mod.entries(new)
            if at > 0 and _is_user(protocol, old[at - 1]):
                assert len(got) == len(old), f"{where} at {at}"
                assert got[: at - 1] == old[: at - 1] and got[at:] == old[at:], f"{where} at {at}"
                assert got[at - 1] != old[at - 1]
            else:
                assert len(got) == len(old) + 1, f"{where} at {at}"
                assert got[:at] == old[:at] and got[at] == NEW_TURN[protocol] and got[at + 1 :] == old[at:]
            parse(mod, rec, new)  # still a body the module reads
            sdk_valid(protocol, new)
            positions += 1
    assert positions > 0


def test_anthropic_text_goes_after_the_tool_results(corpus):
    """litellm's tool_result message (mini-swe-agent): the text block is appended, the results
    stay first; a string content becomes a text block."""
    rec = record(corpus, "mini-swe-agent-2.4.6.jsonl", 5)
    body = rec["body"]
    new = A.insert_user_text(body, 3, TEXT)
    old_content, content = body["messages"][2]["content"], new["messages"][2]["content"]
    assert content[:-1] == old_content and content[0]["type"] == "tool_result"
    assert content[-1] == {"type": "text", "text": TEXT}
    as_string = {**body, "messages": [{"role": "user", "content": "Do the task."}]}
    assert A.insert_user_text(as_string, 1, TEXT)["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Do the task."}, {"type": "text", "text": TEXT}],
        }
    ]
    # after the assistant turn: a new user message (two user turns in a row are fine, the API merges them)
    assert A.insert_user_text(body, 2, TEXT)["messages"][2] == NEW_TURN["anthropic"]


def test_gemini_text_joins_the_function_responses(corpus):
    rec = record(corpus, "gemini-cli-0.61.0.jsonl", 6)  # two parallel calls answered
    body = rec["body"]
    new = G.insert_user_text(body, 3, TEXT)
    parts = new["contents"][2]["parts"]
    assert parts[:-1] == body["contents"][2]["parts"] and parts[-1] == {"text": TEXT}
    assert [("functionResponse" in p) for p in parts] == [True, True, False]
    conv = parse(G, rec, new)
    assert [type(p).__name__ for p in conv.messages[-1].parts] == ["ToolResult", "ToolResult", "TextPart"]


@pytest.mark.parametrize("protocol", MODULES)
def test_insert_rejects_positions_out_of_range(corpus, protocol):
    mod = MODULES[protocol]
    _, rec = requests_of(corpus, protocol)[-1]
    body = rec["body"]
    before = orjson.dumps(body)
    n = len(mod.entries(body))
    for at in (-1, n + 1, 1.0, True, None):
        with pytest.raises(ValueError):
            mod.insert_user_text(body, at, TEXT)
    for text in ("", None, 5):
        with pytest.raises(ValueError):
            mod.insert_user_text(body, n, text)
    assert orjson.dumps(body) == before
    # a body without a conversation takes the text at 0
    assert mod.entries(mod.insert_user_text({"model": "m"}, 0, TEXT)) == [NEW_TURN[protocol]]


# --------------------------------------------------------------------------- Anthropic reasoning

SCRIPT_SIG = "EqQBCkYIBxgCKkDscript-signature-of-no-real-account"
LIVE_SIG = "EuYBCkQYAiJAlive-signature-the-upstream-made"


def _served_anthropic_reply(corpus) -> dict:
    """Reply 1 of the mini-swe-agent Anthropic run as pvisor's scripted model serves it, with
    reasoning: a signed thinking block, an unsigned one and a redacted one."""
    action = A.response_to_action(record(corpus, "mini-swe-agent-2.4.6.jsonl", 4)["response"])
    action.reasoning = [
        Reasoning("I will write mock.txt first.", SCRIPT_SIG),
        Reasoning("Then check it.", None),  # rendered with signature ""
        Reasoning("", None, "EmwKAhgBEgy-redacted-by-a-script"),
    ]
    return A.action_to_response(action, model="claude-mock", ids=IdSource(3))


def _anthropic_with_served_turn(corpus) -> tuple[dict, dict, set[str]]:
    """Request 2 of the run with the served reply echoed as its assistant message (thinking on),
    the original request, and the served keys."""
    rec = record(corpus, "mini-swe-agent-2.4.6.jsonl", 5)
    final = _served_anthropic_reply(corpus)
    msgs = list(rec["body"]["messages"])
    msgs[1] = {"role": "assistant", "content": final["content"]}
    body = {**rec["body"], "messages": msgs, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    return body, rec, A.reasoning_keys(final)


def test_anthropic_reasoning_keys(corpus):
    final = _served_anthropic_reply(corpus)
    assert A.reasoning_keys(final) == {"sig:" + SCRIPT_SIG, "sig:", "data:EmwKAhgBEgy-redacted-by-a-script"}
    # the recorded replies and the SDK fixture streams carry no reasoning
    assert A.reasoning_keys(record(corpus, "mini-swe-agent-2.4.6.jsonl", 4)["response"]) == set()
    for name in ("basic_response.sse", "tool_use_response.sse"):
        assert (
            A.reasoning_keys(A.reassemble([(corpus / "wire" / "anthropic" / name).read_bytes()]).final)
            == set()
        )
    assert A.reasoning_keys(None) == set() and A.reasoning_keys({"content": None}) == set()


def test_anthropic_strip_drops_served_thinking_and_turns_thinking_off(corpus):
    body, rec, served = _anthropic_with_served_turn(corpus)
    before = orjson.dumps(body)
    new, path, rewrites = A.strip_reasoning(body, served, rec["path"])
    assert orjson.dumps(body) == before and path == rec["path"]
    # the served blocks are gone: what is left is the turn exactly as the agent echoed it
    assert new["messages"] == rec["body"]["messages"]
    assert "thinking" not in new and {k: v for k, v in new.items() if k != "messages"} == {
        k: v for k, v in body.items() if k not in ("messages", "thinking")
    }
    assert [(r["entry"], r["kind"]) for r in rewrites] == [(1, "thinking_dropped"), (None, "thinking_off")]
    assert all(isinstance(r["detail"], str) and r["detail"] for r in rewrites)
    sdk_valid("anthropic", new)
    # keys of other replies match nothing: the same object back
    same, _, none = A.strip_reasoning(body, {"sig:" + LIVE_SIG, "data:other"}, rec["path"])
    assert same is body and none == []


def test_anthropic_strip_keeps_the_live_models_thinking(corpus):
    """A served turn early in the conversation, then a live turn in the open tool loop: only the
    served blocks go, thinking stays on (the live turn still starts with its signed block)."""
    body, rec, served = _anthropic_with_served_turn(corpus)
    live_reply = record(corpus, "mini-swe-agent-2.4.6.jsonl", 5)["response"]
    live_content = [
        {"type": "thinking", "thinking": "Now submit.", "signature": LIVE_SIG},
        *live_reply["content"],
    ]
    call_id = live_reply["content"][-1]["id"]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "ok"}]}
    body = {**body, "messages": [*body["messages"], {"role": "assistant", "content": live_content}, result]}
    new, _, rewrites = A.strip_reasoning(body, served, rec["path"])
    assert [(r["entry"], r["kind"]) for r in rewrites] == [(1, "thinking_dropped")]
    assert new["thinking"] == body["thinking"]
    assert (
        new["messages"][3] is body["messages"][3]
        and new["messages"][3]["content"][0]["signature"] == LIVE_SIG
    )
    assert new["messages"][1]["content"] == rec["body"]["messages"][1]["content"]
    conv = parse(A, rec, new)
    assert [[type(p).__name__ for p in m.parts] for m in conv.messages if m.role == "assistant"] == [
        ["TextPart", "ToolCall"],
        ["Reasoning", "TextPart", "ToolCall"],
    ]
    sdk_valid("anthropic", new)


def test_anthropic_strip_never_leaves_an_assistant_message_empty(corpus):
    body, rec, served = _anthropic_with_served_turn(corpus)
    only_thinking = [
        b for b in body["messages"][1]["content"] if b["type"] in ("thinking", "redacted_thinking")
    ]
    msgs = [*body["messages"][:1], {"role": "assistant", "content": only_thinking}, *body["messages"][1:]]
    body = {**body, "messages": msgs}
    new, _, rewrites = A.strip_reasoning(body, served, rec["path"])
    # message 1 is kept as it is; message 2 (the echoed turn) loses its blocks
    assert [(r["entry"], r["kind"]) for r in rewrites] == [
        (1, "thinking_kept"),
        (2, "thinking_dropped"),
        (None, "thinking_off"),
    ]
    assert new["messages"][1] is msgs[1]
    alone = {**body, "messages": msgs[:2]}
    same, _, rewrites = A.strip_reasoning(alone, served, rec["path"])
    assert same is alone and [r["kind"] for r in rewrites] == ["thinking_kept"]


def test_anthropic_thinking_off_takes_clear_thinking_edits_with_it(corpus):
    body, rec, served = _anthropic_with_served_turn(corpus)
    edits = [{"type": "clear_thinking_20251015", "keep": "all"}, {"type": "clear_tool_uses_20250919"}]
    adaptive = {**body, "thinking": {"type": "adaptive"}, "context_management": {"edits": edits}}
    new, _, rewrites = A.strip_reasoning(adaptive, served, rec["path"])
    assert "thinking" not in new and new["context_management"] == {"edits": [edits[1]]}
    assert rewrites[-1]["kind"] == "thinking_off" and "clear_thinking" in rewrites[-1]["detail"]
    assert adaptive["context_management"]["edits"] == edits  # not changed in place
    only = {**adaptive, "context_management": {"edits": edits[:1]}}
    assert "context_management" not in A.strip_reasoning(only, served, rec["path"])[0]
    # thinking off already: nothing to turn off
    off = {**body, "thinking": {"type": "disabled"}}
    new, _, rewrites = A.strip_reasoning(off, served, rec["path"])
    assert new["thinking"] == {"type": "disabled"} and [r["kind"] for r in rewrites] == ["thinking_dropped"]


# --------------------------------------------------------------------------- Responses reasoning


def _codex_served_reply(corpus) -> tuple[dict, dict]:
    """Codex request 1 (after one function call) and the reply to request 0 as pvisor's scripted
    model serves it with reasoning: an encrypted reasoning item, then the real call."""
    rec0, rec1 = record(corpus, "codex-0.171.0.jsonl", 0), record(corpus, "codex-0.171.0.jsonl", 1)
    call = rec0["reply"]["items"][0]
    action = Action(
        reasoning=[
            Reasoning("Running the shell command first.", None, "gAAAAABscript-encrypted-reasoning==")
        ],
        tool_calls=[
            ToolCall(call["call_id"], call["name"], call["arguments"], orjson.loads(call["arguments"]))
        ],
    )
    return rec1, R.action_to_response(action, model=rec0["body"]["model"], ids=IdSource(9))


def test_responses_reasoning_keys(corpus):
    _, final = _codex_served_reply(corpus)
    item = final["output"][0]
    assert item["type"] == "reasoning"
    assert R.reasoning_keys(final) == {"id:" + item["id"], "enc:gAAAAABscript-encrypted-reasoning=="}
    for name in ("function_call", "text_two_messages", "custom_tool_call"):
        raw = (corpus / "wire" / "openai-responses" / f"{name}.chunks.jsonl").read_bytes()
        data = b"".join(b"data: " + line + b"\n\n" for line in raw.split(b"\n") if line.strip())
        assert R.reasoning_keys(R.reassemble([data]).final) == set()
    assert R.reasoning_keys({"output": [{"type": "reasoning", "summary": []}]}) == set()


def test_responses_strip_drops_served_reasoning_items(corpus):
    rec1, final = _codex_served_reply(corpus)
    served = R.reasoning_keys(final)
    item = final["output"][0]
    body = rec1["body"]
    pos = next(i for i, it in enumerate(body["input"]) if it["type"] == "function_call")
    live = {"type": "reasoning", "id": "rs_live0001", "summary": [], "encrypted_content": "gAAAAABlive=="}
    variants = {
        "whole item": item,
        "no id (store false)": {k: v for k, v in item.items() if k != "id"},
        "no encrypted content": {k: v for k, v in item.items() if k != "encrypted_content"},
    }
    for name, echoed in variants.items():
        inp = [*body["input"][:pos], live, echoed, *body["input"][pos:]]
        sent = {**body, "input": inp}
        before = orjson.dumps(sent)
        new, path, rewrites = R.strip_reasoning(sent, served, rec1["path"])
        assert orjson.dumps(sent) == before and path == rec1["path"]
        assert new["input"] == [*body["input"][:pos], live, *body["input"][pos:]], name
        assert [(r["entry"], r["kind"]) for r in rewrites] == [(pos + 1, "reasoning_item_dropped")], name
        assert new["include"] == ["reasoning.encrypted_content"]  # the live item still needs it
        assert (
            parse(R, rec1, new).messages[len(parse(R, rec1, body).messages) - 2].parts[0].encrypted
            == "gAAAAABlive=="
        )
        sdk_valid("openai-responses", new)
    # a reference to the served item goes with it (and one to an item held only by id)
    ref = {"type": "item_reference", "id": item["id"]}
    sent = {**body, "input": [*body["input"][:pos], item, *body["input"][pos:], ref, {"id": item["id"]}]}
    new, _, rewrites = R.strip_reasoning(sent, served, rec1["path"])
    assert new["input"] == body["input"]
    n = len(sent["input"])
    assert [r["entry"] for r in rewrites] == [pos, n - 2, n - 1]
    assert R.strip_reasoning(body, served, rec1["path"]) == (body, rec1["path"], [])


# --------------------------------------------------------------------------- Gemini reasoning


def _signatures_in(path: Path) -> set[str]:
    """Every thoughtSignature in a raw fixture file, read with a regular expression (not the module)."""
    return set(re.findall(rb'"thoughtSignature":\s*"([^"]+)"', path.read_bytes()))


def test_gemini_reasoning_keys_of_real_replies(corpus):
    for name in ("text", "tool_call"):
        sigs = _signatures_in(corpus / "wire" / "gemini" / f"{name}.chunks.jsonl")
        assert len(sigs) == 1
        final = gemini_final(corpus, name)
        assert G.reasoning_keys(final) == {"sig:" + s.decode() for s in sigs}
        assert G.reasoning_keys({"response": final, "traceId": "t-1"}) == G.reasoning_keys(
            final
        )  # Code Assist
    # what Gemini CLI puts on a call that had no signature is none
    model_turn = record(corpus, "gemini-cli-0.61.0.jsonl", 1)["body"]["contents"][1]
    assert model_turn["parts"][0]["thoughtSignature"] == G.SKIP_SIGNATURE
    assert G.reasoning_keys({"candidates": [{"content": model_turn}]}) == set()


def test_gemini_strip_replaces_call_signatures_and_drops_thoughts(corpus):
    """A real Gemini reply (another account's signatures) served to Gemini CLI and echoed back:
    the call keeps its place with the placeholder, the thought goes, a text keeps its text."""
    tool_final, text_final = gemini_final(corpus, "tool_call"), gemini_final(corpus, "text")
    call_turn = copy.deepcopy(tool_final["candidates"][0]["content"])
    thought = {
        "text": "I should list the weather first.",
        "thought": True,
        "thoughtSignature": "CiQBjz1rX-thought-sig",
    }
    call_turn["parts"].insert(0, thought)
    tool_final["candidates"][0]["content"] = call_turn
    served = G.reasoning_keys(tool_final) | G.reasoning_keys(text_final)
    assert len(served) == 3
    rec = record(
        corpus, "gemini-cli-0.61.0.jsonl", 4
    )  # [user, model, user, model(text), user, model(call), user]
    contents = list(rec["body"]["contents"])
    contents[3] = text_final["candidates"][0]["content"]
    contents[5] = call_turn
    body = {**rec["body"], "contents": contents}
    before = orjson.dumps(body)
    new, path, rewrites = G.strip_reasoning(body, served, rec["path"])
    assert orjson.dumps(body) == before and path == rec["path"]
    # the thought goes; the call gets the placeholder; the reply's empty closing text part stays
    assert [list(p) for p in call_turn["parts"]] == [
        ["text", "thought", "thoughtSignature"],
        ["functionCall", "thoughtSignature"],
        ["text"],
    ]
    assert new["contents"][5]["parts"] == [
        {**call_turn["parts"][1], "thoughtSignature": G.SKIP_SIGNATURE},
        call_turn["parts"][2],
    ]
    text_parts = text_final["candidates"][0]["content"]["parts"]
    assert [p.get("text") for p in new["contents"][3]["parts"]] == [p.get("text") for p in text_parts]
    assert not any("thoughtSignature" in p for p in new["contents"][3]["parts"])
    assert [(r["entry"], r["kind"]) for r in rewrites] == [
        (3, "thought_signature_removed"),
        (5, "thought_signature_replaced"),
        (5, "thought_dropped"),
    ]
    for i in (0, 1, 2, 4, 6):  # Gemini CLI's own contents (with its placeholder) are as sent
        assert new["contents"][i] is rec["body"]["contents"][i]
    assert G.reasoning_keys({"candidates": [{"content": c} for c in new["contents"]]}) == set()
    conv = parse(G, rec, new)
    assert [type(p).__name__ for p in conv.messages[5].parts] == ["ToolCall", "TextPart"]
    sdk_valid("gemini", new)
    # Gemini CLI's own requests carry only its placeholder: nothing to do
    for where, rec in requests_of(corpus, "gemini"):
        assert G.strip_reasoning(rec["body"], served, rec["path"]) == (rec["body"], rec["path"], []), where


def test_gemini_strip_keeps_a_content_that_would_be_left_empty(corpus):
    rec = record(corpus, "gemini-cli-0.61.0.jsonl", 1)
    thoughts = {
        "role": "model",
        "parts": [{"text": "Thinking.", "thought": True, "thoughtSignature": "CiQB-only"}],
    }
    body = {**rec["body"], "contents": [*rec["body"]["contents"], thoughts]}
    same, _, rewrites = G.strip_reasoning(body, {"sig:CiQB-only"}, rec["path"])
    assert same is body and [(r["entry"], r["kind"]) for r in rewrites] == [(3, "thought_kept")]


# --------------------------------------------------------------------------- Chat Completions


def test_chat_has_no_reasoning_to_strip(corpus):
    for where, rec in requests_of(corpus, "openai-chat"):
        body = rec["body"]
        assert C.strip_reasoning(body, {"sig:x", "enc:y"}, rec["path"]) == (body, rec["path"], []), where
        assert C.strip_reasoning(body, set(), rec["path"])[0] is body
    for name in ("tool_call_with_usage", "parallel_tool_calls", "finish_length_with_usage"):
        final = C.reassemble([(corpus / "wire" / "openai-chat" / f"{name}.sse").read_bytes()]).final
        assert C.reasoning_keys(final) == set()


# --------------------------------------------------------------------------- with_model


@pytest.mark.parametrize("protocol", ["anthropic", "openai-chat", "openai-responses"])
def test_with_model_sets_the_body_model(corpus, protocol):
    mod = MODULES[protocol]
    for where, rec in requests_of(corpus, protocol):
        body = rec["body"]
        before = orjson.dumps(body)
        new, path, rewrite = mod.with_model(body, rec["path"], "other-model-1")
        assert orjson.dumps(body) == before and path == rec["path"], where
        assert rewrite == {"from": body["model"], "to": "other-model-1"}
        assert list(new) == list(body) and {**new, "model": body["model"]} == body
        assert parse(mod, rec, new).model == "other-model-1"
        same = mod.with_model(body, rec["path"], body["model"])
        assert same == (body, rec["path"], None) and same[0] is body
    unnamed = {"messages": []}
    assert mod.with_model(unnamed, "/p", "m") == (
        {"messages": [], "model": "m"},
        "/p",
        {"from": None, "to": "m"},
    )
    for bad in ("", None, 3):
        with pytest.raises(ValueError):
            mod.with_model(unnamed, "/p", bad)


def test_gemini_with_model_changes_the_path(corpus):
    methods = set()
    for where, rec in requests_of(corpus, "gemini"):
        body, path = rec["body"], rec["path"]
        old_model, method = G.parse_path(path)
        same_body, new_path, rewrite = G.with_model(body, path, "gemini-3-pro-preview")
        assert same_body is body and rewrite == {"from": old_model, "to": "gemini-3-pro-preview"}
        assert G.parse_path(new_path) == ("gemini-3-pro-preview", method) and new_path.startswith(
            "/v1beta/models/"
        )
        conv = parse(G, rec, body, path=new_path)
        assert conv.model == "gemini-3-pro-preview" and conv.stream == (method == "streamGenerateContent")
        assert G.with_model(body, path, old_model) == (body, path, None)
        methods.add(method)
    assert methods == {"generateContent", "streamGenerateContent"}
    # the query and the API version stay
    assert G.with_model({}, "/v1/models/gemini-2.5-pro:streamGenerateContent?alt=sse", "gemini-2.5-flash")[
        1
    ] == ("/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse")
    with pytest.raises(ValueError):
        G.with_model({}, "/v1/chat/completions", "gemini-2.5-flash")
    for bad in ("", "models/gemini-2.5-pro", "a:b", None):
        with pytest.raises(ValueError):
            G.with_model({}, "/v1beta/models/gemini-2.5-pro:generateContent", bad)


# --------------------------------------------------------------------------- reasoning_refusal

#: Real error messages (quoted in public issue threads, see the ``_REFUSALS`` comments of each
#: module) that say reasoning was refused, with the status they came with.
GEMINI_MISSING = (
    "Function call is missing a thought_signature in functionCall parts. This is required for tools "
    "to work correctly, and missing thought_signature may lead to degraded model performance. "
    "Additional data, function call `default_api:{}` , position 2. Please refer to "
    "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
)
REFUSALS = {
    "anthropic": [
        (400, "messages.1.content.0: Invalid `signature` in `thinking` block"),
        (400, "messages.23.content.2: Invalid `data` in `redacted_thinking` block"),
        (
            400,
            (
                "messages.5.content.1: `thinking` or `redacted_thinking` blocks in the latest assistant "
                "message cannot be modified. These blocks must remain as they were in the original response."
            ),
        ),
        (
            400,
            (
                "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
                "`tool_use`. When `thinking` is enabled, a final `assistant` message must start with a "
                "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
                "recommend you include thinking blocks from previous turns. To avoid this requirement, "
                "disable `thinking`. Please consult our documentation at "
                "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
            ),
        ),
        (
            400,
            (
                "messages.3.content.10: When providing `thinking` or `redacted_thinking` blocks, the blocks "
                "must match the parameters during the original request."
            ),
        ),
        (400, "messages.7.content.0.thinking.signature: Field required"),
        (400, "messages.2.content.0: Invalid signature in thinking block"),  # as kaitranntt/ccs#415 quotes it
    ],
    "openai-chat": [
        (400, "The `reasoning_content` in the thinking mode must be passed back to the API."),
        (400, GEMINI_MISSING.format("shell")),  # Gemini's OpenAI-compatible endpoint
    ],
    "openai-responses": [
        (400, "The encrypted content gAAA...Rg== could not be verified."),
        (
            400,
            (
                "The encrypted content for item rs_0a18166210d72b5e0069fd938e69a08193a992a58d690a224b could "
                "not be verified. Reason: Encrypted content could not be decrypted or parsed."
            ),
        ),
        (
            404,
            (
                "Item with id 'rs_04962823ecde01b901698e138042688193a657e07614b238c3' not found. Items are "
                "not persisted when `store` is set to false. Try again with `store` set to true, or remove "
                "this item from your input."
            ),
        ),
        (
            400,
            (
                "Item 'rs_0c3876fcd4da19ef00692a14046bc8819eba6941c05c5ab7e7' of type 'reasoning' was "
                "provided without its required following item."
            ),
        ),
    ],
    "gemini": [
        (400, GEMINI_MISSING.format("Task")),
        (400, "Corrupted thought signature."),
        (400, "Unable to submit request because Thought signature is not valid.."),
    ],
}

#: Real 400 messages of the same providers that are about something else.
UNRELATED = {
    # lbjlaq/Antigravity-Manager#89; anthropics/claude-code#11388
    "anthropic": [
        (
            "messages.4: `tool_use` ids were found without `tool_result` blocks immediately after: "
            "toolu_vrtx_01XxRk8fsYFxxSt9zHP4GDE9. Each `tool_use` block must have a corresponding "
            "`tool_result` block in the next message."
        ),
        "'claude-3-5-haiku-20241022' does not support thinking.",
    ],
    # QwenLM/qwen-code#315
    "openai-chat": [
        (
            '<400> InternalError.Algo.InvalidParameter: An assistant message with "tool_calls" must be '
            'followed by tool messages responding to each "tool_call_id".'
        )
    ],
    # continuedev/continue#10092; a message item id (not reasoning) the server does not hold
    "openai-responses": [
        "No tool call found for function call output with call_id call_uelfkqtHfJDC4Btqeoozq82e.",
        "Item with id 'msg_04962823ecde01b901698e1380' not found.",
    ],
    # google-gemini/gemini-cli#4504
    "gemini": [
        (
            "Please ensure that the number of function response parts is equal to the number of function "
            "call parts of the function call turn."
        )
    ],
}


@pytest.mark.parametrize("protocol", MODULES)
def test_reasoning_refusal_reads_real_messages(protocol):
    mod = MODULES[protocol]
    for status, message in REFUSALS[protocol]:
        body = mod.error_body(status, message)
        assert mod.reasoning_refusal(status, body) == message[:500], message
        assert mod.reasoning_refusal(status, body.decode()) == message[:500]
        assert mod.reasoning_refusal(500, body) is None and mod.reasoning_refusal(200, body) is None
    for message in UNRELATED[protocol]:
        assert mod.reasoning_refusal(400, mod.error_body(400, message)) is None, message
    # the other protocols' refusals are not this one's (but for the shared Gemini phrase on Chat)
    for other, cases in REFUSALS.items():
        for status, message in cases:
            if other != protocol and {protocol, other} != {"openai-chat", "gemini"}:
                assert mod.reasoning_refusal(status, mod.error_body(status, message)) is None, (
                    other,
                    message,
                )
    assert mod.reasoning_refusal(400, b"<html>Bad Request</html>") is None
    assert mod.reasoning_refusal(400, b'{"error": "Invalid `signature` in `thinking` block"}') is None
    assert mod.reasoning_refusal(400, b"") is None


def test_reasoning_refusal_shapes():
    # streamGenerateContent answers with the error object inside an array (google-gemini/gemini-cli#4504)
    arrayed = orjson.dumps(
        [{"error": {"code": 400, "message": "Corrupted thought signature.", "status": "INVALID_ARGUMENT"}}]
    )
    assert G.reasoning_refusal(400, arrayed) == "Corrupted thought signature."
    # code invalid_encrypted_content alone is enough (openai/codex#8132)
    body = orjson.dumps(
        {
            "error": {
                "message": "Bad request.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_encrypted_content",
            }
        }
    )
    assert R.reasoning_refusal(400, body) == "Bad request."
    assert C.reasoning_refusal(400, body) is None
    long = "messages.1.content.0: Invalid `signature` in `thinking` block. " + "x" * 900
    assert A.reasoning_refusal(400, A.error_body(400, long)) == long[:500]
    assert len(A.reasoning_refusal(400, A.error_body(400, long))) == 500


# --------------------------------------------------------------------------- previous_response_id


def _codex_sessions(corpus) -> list[list[dict]]:
    """The Codex runs' requests grouped by session (a new session starts over from the
    developer prompt)."""
    sessions: list[list[dict]] = []
    for _, rec in requests_of(corpus, "openai-responses"):
        if not sessions or rec["body"]["input"][0] != sessions[-1][0]["body"]["input"][0]:
            sessions.append([])
        sessions[-1].append(rec)
    return sessions


def test_expand_previous_response_round_trip(corpus):
    """Build ``history`` from each real request and the output items the scripted server sent,
    then send the next real request as its ``previous_response_id`` form: expanded, it is the
    request Codex sent (equal JSON values and top-level key order; Codex re-orders the keys of
    the items it echoes, so the bytes of those items differ)."""
    sessions = _codex_sessions(corpus)
    assert [len(s) for s in sessions] == [4, 2]
    expanded = 0
    for session in sessions:
        history: dict[str, list] = {}
        for k, rec in enumerate(session):
            body = rec["body"]
            if k > 0:
                prev_id = f"resp_{k - 1:04d}"
                held = history[prev_id]
                assert body["input"][: len(held)] == held  # the agent echoes the conversation
                short = {**body, "input": body["input"][len(held) :], "previous_response_id": prev_id}
                before = orjson.dumps(short)
                full, note = R.expand_previous_response(short, history)
                assert orjson.dumps(short) == before
                assert full == body and list(full) == list(body)
                assert "previous_response_id" not in full and "previous_response_id" in short
                assert note == {"previous_response_id": prev_id, "items_added": len(held)}
                assert R.server_held_prefix(parse(R, rec, full)) is None
                expanded += 1
            final = {"id": f"resp_{k:04d}", "object": "response", "output": rec["reply"]["items"]}
            history[final["id"]] = R.conversation_items(body, final)
            assert history[final["id"]] == body["input"] + rec["reply"]["items"]
    assert expanded == 4


def test_expand_previous_response_leaves_other_requests(corpus):
    rec = record(corpus, "codex-0.171.0.jsonl", 1)
    body = rec["body"]
    history = {
        "resp_known": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    }
    assert R.expand_previous_response(body, history) == (body, None)
    unknown = {**body, "previous_response_id": "resp_unknown"}
    same, note = R.expand_previous_response(unknown, history)
    assert same is unknown and note is None
    # a string input joins the history as its item
    full, note = R.expand_previous_response(
        {"model": "m", "input": "go on", "previous_response_id": "resp_known"}, history
    )
    assert full == {"model": "m", "input": [*history["resp_known"], R.entries({"input": "go on"})[0]]}
    assert note == {"previous_response_id": "resp_known", "items_added": 1}
    assert R.conversation_items(body, {"output": None}) == body["input"]
    assert R.conversation_items({"input": "x"}, {"output": [{"type": "message"}]}) == [
        *R.entries({"input": "x"}),
        {"type": "message"},
    ]
