"""Issue 39 items 3 and 4, in process: what a handoff's translation does with agent A's reasoning
(``--source-reasoning drop|text|keep``: :mod:`pvisor.replay.source_reasoning`) and with the
image parts of A's tool results and observations (:mod:`pvisor.replay.source_images`).

The targets' tools are those each real CLI declared in its request 1 (the session's captures,
tests/agent_captures.py); B's request after the pause is rendered in B's own protocol
(tests/handoff_helpers.py) and read as bytes: a signature or encrypted content never reaches it
under ``text``; under ``keep`` the signed blocks reach it unchanged. The real CLIs with an
image: tests/test_handoff_images.py."""

from __future__ import annotations

import base64
import hashlib
import json

from pathlib import Path

import orjson
import pytest

from handoff_helpers import first_request, request_after
from pvisor.adapters.agents import get_descriptor
from pvisor.adapters.agents.descriptor import action_message
from pvisor.adapters.protocols import get_protocol
from pvisor.core.errors import UsageError
from pvisor.journal.model import (
    Action,
    Conversation,
    Message,
    Observation,
    OtherPart,
    Reasoning,
    Step,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from pvisor.replay.continuation import LivePolicy
from pvisor.replay.handoff_playback import HandoffContinuation
from pvisor.replay.playback import PathRewrites
from pvisor.replay.recording import Recording
from pvisor.replay.source_images import account_images, verify_kept
from pvisor.replay.source_reasoning import (
    NOTE_LABEL,
    SourceReasoning,
    keep_problem,
    model_family,
    signed_throughout,
)
from pvisor.replay.translate import CallFate, Target, translate
from pvisor.session.handover import handoff_options

RECORDED = "/recorded/ws"
SIGNATURE = "SIG-Ek0xQ2RzZWNyZXQtc2lnbmF0dXJl"
ENCRYPTED = "ENC-gAAAAABnZW5jcnlwdGVkLXJlYXNvbmluZw"
#: the thinking blocks of the source's step 2, as Anthropic sent them
SIGNED = {"type": "thinking", "thinking": "The summary of my signed thinking.", "signature": SIGNATURE}
REDACTED = {"type": "redacted_thinking", "data": ENCRYPTED}
#: a 1x1 PNG
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg=="
)
PNG_B64 = base64.b64encode(PNG).decode()
PNG_SHA = hashlib.sha256(PNG).hexdigest()


@pytest.fixture(scope="module")
def tools(captured):
    """Each target's request 1 as its real CLI sent it: (protocol, body, tools)."""
    out = {}
    for agent in ("claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "mini-swe-agent"):
        cap = captured(agent)
        assert cap.proc.returncode == 0, f"{agent}: {cap.proc.stderr}"
        out[agent] = first_request(cap)
    return out


def _call(n: int, name: str, args: dict) -> ToolCall:
    return ToolCall(f"toolu_src{n}", name, json.dumps(args), args)


def reasoning_steps() -> list[Step]:
    """Claude Code's steps: 1 plain thinking and a shell call; 2 signed thinking with its text and
    redacted thinking (no text) and a shell call; 3 plain thinking and no call (left out)."""
    return [
        Step(
            1,
            Action(
                "First the log.",
                [Reasoning("A plain thought.")],
                [_call(1, "Bash", {"command": "echo one > log.txt"})],
                model="claude-sonnet-4-5-20250929",
            ),
            Observation([ToolResult("toolu_src1", "")]),
        ),
        Step(
            2,
            Action(
                "Then the rest.",
                [
                    Reasoning(SIGNED["thinking"], SIGNATURE, raw=SIGNED),
                    Reasoning("", None, ENCRYPTED, raw=REDACTED),
                ],
                [_call(2, "Bash", {"command": "echo two >> log.txt"})],
                model="claude-sonnet-4-5-20250929",
            ),
            Observation([ToolResult("toolu_src2", "")]),
        ),
        Step(3, Action("Done.", [Reasoning("A last thought.")], [])),
    ]


def target(tools, agent: str, mode: SourceReasoning, protocol: str | None = None) -> Target:
    req = tools[agent]
    return Target(
        get_descriptor(agent), protocol or req.protocol, req.tools, "/new/ws", RECORDED, source_reasoning=mode
    )


def served_bytes(tools, agent: str, steps: list[Step]) -> bytes:
    req = tools[agent]
    return orjson.dumps(request_after(req.protocol, req.body, steps))


def test_drop_leaves_every_item_out_and_counts_it(tools):
    tr = translate(
        reasoning_steps(), get_descriptor("claude-code"), target(tools, "codex", SourceReasoning.DROP)
    )
    assert tr.reasoning.to_json() == {
        "mode": "drop",
        "kept": 0,
        "rendered": 0,
        "dropped": {"provider_bound": 2, "plain": 2},
    }
    assert tr.reasoning_dropped == {"provider_bound": 2, "plain": 2}
    assert all(not s.action.reasoning for s in tr.steps)
    assert not any("My reasoning" in s.action.text for s in tr.steps)


@pytest.mark.parametrize("b", ["codex", "gemini-cli", "opencode", "qwen-code", "mini-swe-agent"])
def test_text_writes_a_labelled_note_and_never_a_signature(tools, b):
    tr = translate(reasoning_steps(), get_descriptor("claude-code"), target(tools, b, SourceReasoning.TEXT))
    # the plain thought and the signed item's text are rendered; the redacted item (no text) and
    # step 3's thought (its step has no call: left out) are dropped
    assert tr.reasoning.to_json() == {
        "mode": "text",
        "kept": 0,
        "rendered": 2,
        "dropped": {"provider_bound": 1, "plain": 1},
    }
    first, second = tr.steps[0].action.text, tr.steps[1].action.text
    assert NOTE_LABEL.format(text="A plain thought.") in first
    assert first.index("(My reasoning at this step: A plain thought.)") < first.index("First the log.")
    assert "(My reasoning at this step: The summary of my signed thinking.)" in second
    assert all(not s.action.reasoning for s in tr.steps)
    body = served_bytes(tools, b, tr.steps)
    assert b"My reasoning at this step: The summary of my signed thinking." in body
    assert SIGNATURE.encode() not in body and ENCRYPTED.encode() not in body


def test_keep_serves_the_signed_blocks_unchanged_over_the_same_protocol(tools):
    # OpenCode on Anthropic (its anthropic provider) with the tools its CLI declares
    tr = translate(
        reasoning_steps(),
        get_descriptor("claude-code"),
        target(tools, "opencode", SourceReasoning.KEEP, protocol="anthropic"),
    )
    assert tr.reasoning.to_json() == {
        "mode": "keep",
        "kept": 3,
        "rendered": 0,
        "dropped": {"provider_bound": 0, "plain": 1},
    }
    assert tr.steps[1].action.reasoning == reasoning_steps()[1].action.reasoning
    mod = get_protocol("anthropic")
    messages = [action_message(s.action) for s in tr.steps]
    body = orjson.loads(mod.render_request(Conversation(protocol="anthropic", messages=messages)))
    blocks = body["messages"][1]["content"]
    assert blocks[:2] == [SIGNED, REDACTED]  # first in the reply, byte for byte as A's provider sent them
    # every served reply holds signed thinking only when step 1's plain one is signed too: not here
    assert not signed_throughout(tr.steps) and signed_throughout(tr.steps[1:])


def test_keep_is_refused_across_protocols_model_families_and_bound_parts():
    steps = reasoning_steps()
    across = keep_problem(steps, "anthropic", None, "openai-responses", "claude-sonnet-4-5")
    assert across is not None and "anthropic" in across and "openai-responses" in across
    family = keep_problem(steps, "anthropic", None, "anthropic", "claude-opus-4-1")
    assert family is not None and "claude-sonnet-4-5" in family and "claude-opus-4-1" in family
    gemini = [Step(1, Action("x", [Reasoning("", "c2ln")], [_call(1, "run_shell_command", {})]))]
    bound = keep_problem(gemini, "gemini", None, "gemini", None)
    assert bound is not None and "call parts" in bound
    assert keep_problem(steps, "anthropic", None, "anthropic", "claude-sonnet-4-5-20250929") is None
    assert keep_problem([], "anthropic", None, "gemini", None) is None  # nothing to keep
    assert model_family("anthropic/claude-sonnet-4-5-20250929") == "claude-sonnet-4-5"


def image_block(data: str = PNG_B64) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def image_steps() -> list[Step]:
    """Claude Code's steps: 1 a Read of a PNG (its result an image block) and a Read of a text
    file; 2 a subagent call (rendered as text) whose result holds an image; its observation also
    holds a later user message with an image."""
    user = Message("user", [TextPart("And this one?"), OtherPart("image", raw=image_block())])
    return [
        Step(
            1,
            Action(
                "Look.",
                tool_calls=[
                    _call(1, "Read", {"file_path": f"{RECORDED}/shot.png"}),
                    ToolCall(
                        "toolu_src1b",
                        "Read",
                        '{"file_path": "/recorded/ws/a.txt"}',
                        {"file_path": f"{RECORDED}/a.txt"},
                    ),
                ],
            ),
            Observation([ToolResult("toolu_src1", [image_block()]), ToolResult("toolu_src1b", "alpha")]),
        ),
        Step(
            2,
            Action("Ask.", tool_calls=[_call(2, "Agent", {"prompt": "draw"})]),
            Observation(
                [ToolResult("toolu_src2", [{"type": "text", "text": "drawn"}, image_block()])], [user]
            ),
        ),
    ]


def test_an_image_read_goes_to_the_targets_reader_of_images_and_the_rest_is_named_dropped(tools):
    steps = image_steps()
    tr = translate(steps, get_descriptor("claude-code"), target(tools, "gemini-cli", SourceReasoning.DROP))
    reads = tr.steps[0].action.tool_calls
    assert [c.name for c in reads] == ["read_file", "read_file"]
    assert reads[0].arguments == {"file_path": "/new/ws/shot.png"}
    # the subagent's result is written as text: the image as a placeholder, never its bytes
    note = tr.steps[1].action.text
    assert "[image image/png, 70 bytes: not carried as text]" in note and PNG_B64 not in note
    images = account_images(steps, tr.calls, get_descriptor("gemini-cli"), "gemini")
    kept = [(r["step"], r["call_id"], r["target_tool"]) for r in images["kept"]]
    assert kept == [(1, "toolu_src1", "read_file")]
    why = [(r["step"], r["call_id"], r["why"]) for r in images["dropped"]]
    assert why == [
        (2, "toolu_src2", "its call is rendered_as_text (not re-run)"),
        (2, None, "in an observation holding more than tool results, which is not sent again"),
    ]
    assert all(r["sha256"] == PNG_SHA and r["media_type"] == "image/png" for r in images["dropped"])
    # B's request M+1 holding the bytes (Gemini CLI sends them as inlineData beside its result)
    boundary = orjson.dumps(
        {
            "contents": [
                {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": PNG_B64}}]}
            ]
        }
    )
    checked = verify_kept(images, boundary)
    assert checked["kept_total"] == 1 and checked["kept"][0]["in_boundary_request"] is True
    assert verify_kept(images, orjson.dumps({"contents": []}))["kept_total"] == 0


def test_an_image_read_into_an_agent_without_a_reader_of_images_is_its_size_and_dropped(tools):
    steps = image_steps()
    tr = translate(
        steps, get_descriptor("claude-code"), target(tools, "mini-swe-agent", SourceReasoning.DROP)
    )
    assert tr.steps[0].action.tool_calls[0].arguments == {"command": "wc -c shot.png"}
    images = verify_kept(
        account_images(steps, tr.calls, get_descriptor("mini-swe-agent"), "openai-chat"), None
    )
    assert images["kept"] == [] and images["dropped_total"] == 3
    assert images["dropped"][0]["why"].endswith("which reads no images")


def test_codex_reads_images_with_view_image_and_text_with_its_shell(tools):
    if tools["codex"].tool("view_image") is None:
        pytest.fail("the pinned Codex declares no view_image in its request 1", pytrace=False)
    steps = image_steps()[:1]
    tr = translate(steps, get_descriptor("claude-code"), target(tools, "codex", SourceReasoning.DROP))
    image, text = tr.steps[0].action.tool_calls
    assert (image.name, image.arguments) == ("view_image", {"path": "/new/ws/shot.png"})
    assert text.name == "exec_command" and "cat a.txt" in text.arguments["cmd"]
    # and Codex's view_image as a source is a read of an image: Gemini CLI's read_file
    src = [
        Step(
            1,
            Action(
                "",
                tool_calls=[
                    ToolCall(
                        "call_v", "view_image", '{"path":"/recorded/ws/p.png"}', {"path": f"{RECORDED}/p.png"}
                    )
                ],
            ),
            Observation(
                [
                    ToolResult(
                        "call_v", [{"type": "input_image", "image_url": f"data:image/png;base64,{PNG_B64}"}]
                    )
                ]
            ),
        )
    ]
    tr = translate(src, get_descriptor("codex"), target(tools, "gemini-cli", SourceReasoning.DROP))
    assert tr.steps[0].action.tool_calls[0].name == "read_file"
    assert tr.calls[0].fate is CallFate.TRANSLATED
    assert (
        account_images(src, tr.calls, get_descriptor("gemini-cli"), "gemini")["kept"][0]["sha256"] == PNG_SHA
    )


def test_an_image_gemini_cli_sent_beside_its_result_is_its_reads(tools):
    # Gemini CLI sends a read image as inlineData after the functionResponse, in one content
    fr = {"functionResponse": {"id": "read_file_1", "name": "read_file", "response": {"output": "Binary"}}}
    inline = {"inlineData": {"mimeType": "image/png", "data": PNG_B64}}
    user = Message("user", [OtherPart("inlineData", raw=inline)], raw={"role": "user", "parts": [fr, inline]})
    call = ToolCall(
        "read_file_1", "read_file", '{"file_path":"/recorded/ws/p.png"}', {"file_path": f"{RECORDED}/p.png"}
    )
    src = [
        Step(
            1,
            Action("", tool_calls=[call]),
            Observation([ToolResult("read_file_1", {"output": "Binary"})], [user]),
        )
    ]
    tr = translate(src, get_descriptor("gemini-cli"), target(tools, "claude-code", SourceReasoning.DROP))
    assert tr.steps[0].action.tool_calls[0].name == "Read"
    images = account_images(src, tr.calls, get_descriptor("claude-code"), "anthropic")
    assert [(r["call_id"], r["target_tool"], r["sha256"]) for r in images["kept"]] == [
        ("read_file_1", "Read", PNG_SHA)
    ]
    assert images["dropped"] == []


def test_an_unknown_source_reasoning_is_a_usage_error_in_the_callers_words(tmp_path):
    with pytest.raises(UsageError) as err:
        handoff_options(
            to_agent="codex",
            journal=tmp_path / "j.sqlite",
            run="r-1",
            trajectory=None,
            agent="claude-code",
            after_step=1,
            workspace=tmp_path,
            output=tmp_path / "out",
            source_reasoning="summary",
            reasoning_option="source_reasoning=",
        )
    assert err.value.exit_code == 2
    assert err.value.message == "source_reasoning= 'summary': expected one of drop, text, keep"


def signed_steps() -> list[Step]:
    """Claude Code's steps, each reply starting with signed thinking."""
    return [
        Step(
            n,
            Action(
                f"Step {n}.",
                [Reasoning(SIGNED["thinking"], SIGNATURE, raw=SIGNED)],
                [_call(n, "Bash", {"command": f"echo {n} >> log.txt"})],
            ),
            Observation([ToolResult(f"toolu_src{n}", "")]),
        )
        for n in (1, 2)
    ]


def continuation(tools, mode: SourceReasoning, model: str) -> HandoffContinuation:
    """OpenCode on Anthropic taking over Claude Code's :func:`signed_steps`, at its request 1."""
    source = Recording(
        "journal", Path("j.sqlite"), "claude-code", "2.1", "anthropic", "claude-sonnet-4-5-20250929", "r-1",
        "Log it.", None, signed_steps(), [], [], [], [], workspace=RECORDED,
    )  # fmt: skip
    d = get_descriptor("opencode")
    p = HandoffContinuation(
        source,
        get_descriptor("claude-code"),
        2,
        d,
        "anthropic",
        PathRewrites([]),
        "/new/ws",
        LivePolicy(),
        None,
        mode,
    )
    specs = [ToolSpec(t.name, t.description, t.parameters) for t in tools["opencode"].tools]
    p._translate(
        Conversation("anthropic", model, tools=specs, messages=[Message("user", [TextPart("Log it.")])])
    )
    return p


def test_keep_leaves_thinking_on_when_every_served_reply_is_signed_and_refuses_another_family(tools):
    kept = continuation(tools, SourceReasoning.KEEP, "claude-sonnet-4-5")
    assert kept.refused is None and kept.translation is not None
    assert kept.translation.reasoning.kept == 2 and not kept.policy.reasoning_off
    text = continuation(tools, SourceReasoning.TEXT, "claude-sonnet-4-5")
    assert text.translation is not None and text.policy.reasoning_off
    other = continuation(tools, SourceReasoning.KEEP, "claude-opus-4-1")
    assert other.translation is None and other.refused is not None
    assert "claude-opus-4-1" in other.refused.message and "model family" in other.refused.message
