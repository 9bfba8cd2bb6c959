"""The wire-protocol registry through its seam (issue 36): every module named in
``PROTOCOL_MODULES`` satisfies :class:`~pvisor.adapters.protocols.contract.WireProtocol`, and the
replay code reads each protocol's facts from its module: a fifth protocol registered here (a
module of its own, one line in the registry) is rendered, targeted and described by the prefix
code with no other file changed."""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping

import orjson
import pytest

from pvisor.adapters.protocols import PROTOCOL_MODULES, get_protocol, protocol_for_path
from pvisor.adapters.protocols.base import IdSource
from pvisor.adapters.protocols.contract import WIRE_PROTOCOL_MEMBERS, WireProtocol
from pvisor.journal.model import Action, Reasoning, Step, Observation, ToolCall, ToolResult
from pvisor.replay.prefix import append_action, native_conversation, native_request, render_native
from pvisor.replay.result import prefix_record

#: the type of each constant of the contract
CONSTANT_TYPES = {
    "NAME": str,
    "TITLE": str,
    "GEN_AI_PROVIDER": str,
    "GEN_AI_OPERATION": str,
    "CALL_ID_PREFIX": str,
    "PATHS": tuple,
    "DEFAULT_TARGET": tuple,
    "UNSTREAMED_TARGET": tuple,
    "MODEL_IN_PATH": bool,
    "ENTRIES_KEY": str,
    "RESULTS_ROLE": str,
    "TOOL_SCHEMA_REQUIRED": bool,
    "REQUIRED_PARAMS": Mapping,
    "SIGNED_REASONING": bool,
    "CACHE_MARKERS": bool,
    "PROMPT_CACHE": Mapping,
    "TOKEN_COUNT_FIELD": (str, type(None)),
    "CREDENTIAL_HEADERS": tuple,
    "CREDENTIAL_QUERY": tuple,
}


def test_the_contract_names_every_constant_and_function():
    assert set(CONSTANT_TYPES) <= set(WIRE_PROTOCOL_MEMBERS)
    for name in ("parse_request", "render_request", "entries", "path_for_model", "cache_breakpoints"):
        assert name in WIRE_PROTOCOL_MEMBERS


@pytest.mark.parametrize("name", sorted(PROTOCOL_MODULES))
def test_every_registered_protocol_satisfies_wire_protocol(name):
    mod = get_protocol(name)
    missing = [m for m in WIRE_PROTOCOL_MEMBERS if not hasattr(mod, m)]
    assert missing == []
    assert isinstance(mod, WireProtocol)
    assert mod.NAME == name
    for const, kind in CONSTANT_TYPES.items():
        assert isinstance(getattr(mod, const), kind), const
    for fn in set(WIRE_PROTOCOL_MEMBERS) - set(CONSTANT_TYPES):
        assert callable(getattr(mod, fn)), fn
    for target in (mod.DEFAULT_TARGET, mod.UNSTREAMED_TARGET):
        method, path, _query = target
        assert method == "POST"
        assert mod.matches(path.format(model="some-model")), target
    assert mod.RESULTS_ROLE in ("user", "tool")
    # the conventions' operation of a model call: Gemini's generateContent has its own value
    from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import GenAiOperationNameValues

    assert mod.GEN_AI_OPERATION in {v.value for v in GenAiOperationNameValues}
    assert mod.GEN_AI_OPERATION == ("generate_content" if name == "gemini" else "chat")


def test_the_facts_match_what_each_protocol_renders():
    """ENTRIES_KEY is where render_request puts the conversation; the role of the message
    carrying tool results is the one its parser reads back."""
    for name in PROTOCOL_MODULES:
        mod = get_protocol(name)
        conv = mod.parse_request(
            mod.render_request(
                native_conversation(
                    "mini-swe-agent", name, "task", [], None, None, "m", [_step()], 1, None, []
                )[0]
            ),
            path=mod.DEFAULT_TARGET[1].format(model="m"),
        )
        assert [m.role for m in conv.messages] == ["user", "assistant", mod.RESULTS_ROLE], name
        body = orjson.loads(mod.render_request(conv))
        assert isinstance(body.get(mod.ENTRIES_KEY), list), name


def _step() -> Step:
    call = ToolCall(id="call_1", name="bash", arguments={"command": "ls"}, arguments_raw='{"command": "ls"}')
    return Step(
        n=1,
        action=Action(
            text="looking", tool_calls=[call], reasoning=[Reasoning(text="think first", signature=None)]
        ),
        observation=Observation(results=[ToolResult(call_id="call_1", content="a.txt")]),
    )


@pytest.fixture
def fifth_protocol(monkeypatch):
    """A fifth protocol: the Chat Completions functions under another name, with facts of its
    own, as its own module, registered by one line of the registry."""
    chat = get_protocol("openai-chat")
    mod = types.ModuleType("fifth_wire_protocol")
    for member in WIRE_PROTOCOL_MEMBERS:
        setattr(mod, member, getattr(chat, member))
    mod.NAME = "fifth"
    mod.TITLE = "Fifth Wire"
    mod.DEFAULT_TARGET = ("POST", "/fifth/{model}/stream", "sse=1")
    mod.UNSTREAMED_TARGET = ("POST", "/fifth/{model}/once", "")
    mod.MODEL_IN_PATH = True
    mod.REQUIRED_PARAMS = {"max_tokens": 77}
    mod.SIGNED_REASONING = True
    mod.cache_breakpoints = lambda body: 3
    mod.path_for_model = lambda path, model: path.replace("/recorded/", f"/{model}/")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(PROTOCOL_MODULES, "fifth", mod.__name__)
    return mod


def test_a_fifth_protocol_module_is_found_by_name(fifth_protocol):
    assert get_protocol("fifth") is fifth_protocol
    assert isinstance(get_protocol("fifth"), WireProtocol)


def test_the_prefix_code_reads_a_fifth_protocols_facts_from_its_module(fifth_protocol):
    # the request target: its default targets, the model in its path
    meta, origin = native_request("mini-swe-agent", "fifth", "m-1", True, None)
    assert (meta["method"], meta["path"], meta["query"], origin) == (
        "POST",
        "/fifth/m-1/stream",
        "sse=1",
        "default",
    )
    meta, _ = native_request("mini-swe-agent", "fifth", None, False, None)
    assert (meta["path"], meta["query"]) == ("/fifth/MODEL/once", "")
    # a render without a profile: its required params, no model-not-recorded (the model is in
    # its path), its signed reasoning (another protocol's reasoning left out, said by its title)
    notes: list[tuple[str, str]] = []
    conv, origin = native_conversation(
        "mini-swe-agent", "fifth", "task", [], None, None, None, [_step()], 1, None, notes
    )
    assert conv.params == {"max_tokens": 77}
    assert conv.model is None
    assert not any(isinstance(p, Reasoning) for m in conv.messages for p in m.parts)
    assert notes == [
        (
            "reasoning_not_converted",
            "1 reasoning block(s) of the native file have no Fifth Wire signature: left out",
        )
    ]
    # its results role: the default is "tool" (Chat's); a module saying "user" is obeyed
    assert conv.messages[-1].role == "tool"
    fifth_protocol.RESULTS_ROLE = "user"
    conv, _ = native_conversation("mini-swe-agent", "fifth", "task", [], None, None, None, [_step()], 1, None)
    assert conv.messages[-1].role == "user"
    # A_N appended in its entries key; its cache breakpoints in the result's prefix record
    body = fifth_protocol.render_request(conv)
    appended = orjson.loads(append_action("fifth", body, Action(text="done")))
    assert appended["messages"][-1] == {"role": "assistant", "content": "done"}
    record = prefix_record("fifth", body, meta, "/out", 1, True, None, {})
    assert record.cache_breakpoints == 3
    assert record.protocol == "fifth"


def test_the_cache_breakpoints_are_the_protocols_own():
    body = orjson.dumps(
        {
            "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "t", "cache_control": {}}]}],
        }
    )
    assert get_protocol("anthropic").cache_breakpoints(body) == 2
    for name in ("openai-chat", "openai-responses", "gemini"):
        assert get_protocol(name).cache_breakpoints(body) is None


def test_the_cache_markers_are_the_protocols_own(fifth_protocol):
    """An agent's render gets the markers of its protocol's module (issue 36): the descriptors
    name no protocol, so a fifth protocol with cache markers gets them placed for every agent,
    and the agent's own shape of a protocol (litellm's Anthropic blocks) still comes first."""

    def place(body: dict) -> int:
        body["messages"][-1]["marked"] = True
        return 1

    fifth_protocol.CACHE_MARKERS = True
    fifth_protocol.place_cache_markers = place
    conv, _ = native_conversation("mini-swe-agent", "fifth", "task", [], None, None, None, [_step()], 1, None)
    for agent in ("codex", "mini-swe-agent", "gemini-cli"):
        body, n = render_native(agent, conv)
        assert n == 1 and orjson.loads(body)["messages"][-1]["marked"] is True, agent
    conv.protocol = "openai-chat"
    assert render_native("codex", conv)[1] is None
    anthropic = get_protocol("anthropic").parse_request(
        {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
    )
    body, n = render_native("mini-swe-agent", anthropic)
    assert n == 1
    assert orjson.loads(body)["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
    ]


@pytest.mark.parametrize("name", sorted(PROTOCOL_MODULES))
def test_every_protocol_reads_a_stream_however_it_arrives(name):
    """The stream reading every protocol shares (adapters/protocols/sse.py ``events``): a stream
    reassembles to the same result in one chunk, in chunks of five bytes, or as one bytes object."""
    mod = get_protocol(name)
    call = ToolCall("call_1", "f", '{"a":1}', {"a": 1})
    final = mod.action_to_response(Action(text="hello there", tool_calls=[call]), model="m", ids=IdSource())
    data = mod.render_stream(final)
    whole = mod.reassemble([data])
    assert whole.final == final and whole.complete and whole.problems == []
    assert mod.reassemble([data[i : i + 5] for i in range(0, len(data), 5)]) == whole
    assert mod.reassemble(data) == whole


def test_protocol_for_path_returns_the_registered_module():
    assert protocol_for_path("/v1/messages") is get_protocol("anthropic")
    assert protocol_for_path("/v1beta/models/g:generateContent") is get_protocol("gemini")
    assert protocol_for_path("/nowhere") is None
