"""Issue 39 items 3 and 4 with the real CLIs (pinned under .agents/), offline against the scripted
model: a Claude Code run (captured at test time, never committed) thinks, Reads a small PNG made
here, then runs a shell call; it is handed over after step 2, replay-only.

- to Gemini CLI with ``--source-reasoning text``: Gemini CLI re-runs the read with its own
  ``read_file``, and its request after the pause holds the image (``inlineData``) with the PNG's
  bytes; the thinking is a labelled note in Gemini CLI's own message; the report names the
  image kept and counts the reasoning rendered;
- to Codex: its ``view_image`` re-runs the read and its request holds the image (``input_image``);
- to mini-swe-agent (Chat, no reader of images): the image is named dropped, with why;
- with ``--source-reasoning keep`` to Gemini CLI (another protocol): refused before anything
  runs, exit 65 ``handoff_refused``, the reason named;
- to Claude Code itself (served as recorded): the image and the thinking are kept.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from agent_helpers import capture_scripted, entrypoint, pvisor

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "result-schema.json").read_text())
THOUGHT = "I should look at the picture first."


def png(width: int = 4, height: int = 3) -> bytes:
    """A small RGB PNG, its pixels a gradient."""
    rows = b"".join(
        b"\x00" + b"".join(bytes([(x * 40) % 256, (y * 60) % 256, 120]) for x in range(width))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Any, Path, bytes]:
    root = tmp_path_factory.mktemp("handoff-image")
    (root / "ws").mkdir()
    data = png()
    (root / "ws" / "dot.png").write_bytes(data)
    script = {
        "model": "mock-model",
        "turns": [
            {
                "reasoning": THOUGHT,
                "text": "Look at it.",
                "tool_calls": [{"tool": "Read", "arguments": {"file_path": str(root / "ws" / "dot.png")}}],
            },
            {"text": "A shell call.", "tool_calls": [{"tool": "@shell", "command": "echo hi > a.txt"}]},
            {"text": "Done."},
        ],
    }
    return capture_scripted("claude-code", root, script, "Look at the picture."), root, data


def hand(source, agent: str, name: str, *extra: str) -> tuple[Any, dict[str, Any] | None, Path]:
    cap, root, _ = source
    ws, out = root / f"ws-{name}", root / f"out-{name}"
    ws.mkdir()
    args = [
        "--journal", str(cap.journal), "handoff", "--run", cap.run, "--after-step", "2",
        "--to-agent", agent, "--agent-entrypoint", str(entrypoint(agent)), "--workspace", str(ws),
        "--output", str(out), "--timeout", "240", "--replay-only",
        *(["--model", "mock-model"] if agent == "mini-swe-agent" else []), *extra,
    ]  # fmt: skip
    proc = pvisor(args, env=cap.env, cwd=root, timeout=400)
    assert "Traceback" not in proc.stderr, proc.stderr
    path = out / "result.json"
    return proc, (json.loads(path.read_text()) if path.exists() else None), out


def ok(proc: Any, result: dict[str, Any] | None) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    assert result is not None and result["status"] == "ok", result
    jsonschema.validate(result, SCHEMA)
    return result["handoff"]


def the_image(h: dict[str, Any], data: bytes, tool: str) -> None:
    """The report names the PNG of source step 1 kept, re-run by ``tool``, found in B's request."""
    (kept,) = h["images"]["kept"]
    assert kept["step"] == 1 and kept["target_tool"] == tool and kept["in_boundary_request"] is True
    assert (kept["media_type"], kept["bytes"]) == ("image/png", len(data))
    assert kept["sha256"] == hashlib.sha256(data).hexdigest()
    assert h["images"]["dropped"] == [] and h["images"]["kept_total"] == 1


def test_an_image_read_reaches_gemini_cli_with_the_same_bytes_and_the_thinking_as_a_note(source):
    _, _, data = source
    proc, result, out = hand(source, "gemini-cli", "gemini", "--source-reasoning", "text")
    h = ok(proc, result)
    the_image(h, data, "read_file")
    assert h["reasoning"] == {
        "mode": "text",
        "kept": 0,
        "rendered": 1,
        "dropped": {"provider_bound": 0, "plain": 0},
    }
    body = json.loads((out / "prefix.json").read_text())
    parts = [p for c in body["contents"] for p in c.get("parts", [])]
    inline = [p["inlineData"] for p in parts if "inlineData" in p]
    assert [(i["mimeType"], i["data"]) for i in inline] == [("image/png", base64.b64encode(data).decode())]
    said = [p["text"] for c in body["contents"] if c["role"] == "model" for p in c["parts"] if "text" in p]
    assert f"(My reasoning at this step: {THOUGHT})" in said[0]


def test_an_image_read_reaches_codex_through_view_image(source):
    _, _, data = source
    proc, result, out = hand(source, "codex", "codex")
    h = ok(proc, result)
    the_image(h, data, "view_image")
    assert h["reasoning"]["mode"] == "drop" and h["reasoning"]["dropped"]["plain"] == 1
    assert f"data:image/png;base64,{base64.b64encode(data).decode()}" in (out / "prefix.json").read_text()


def test_an_image_read_handed_to_mini_swe_agent_is_named_dropped(source):
    cap, _, data = source
    proc, result, out = hand(source, "mini-swe-agent", "mini")
    h = ok(proc, result)
    assert h["images"]["kept"] == [] and h["images"]["dropped_total"] == 1
    (dropped,) = h["images"]["dropped"]
    assert dropped["step"] == 1 and dropped["call_id"] == h["calls"][0]["call_id"]
    assert (dropped["media_type"], dropped["sha256"]) == ("image/png", hashlib.sha256(data).hexdigest())
    assert dropped["why"] == "re-run by bash, which reads no images"
    assert base64.b64encode(data).decode() not in (out / "prefix.json").read_text()


def test_keep_to_another_protocol_is_refused_before_anything_runs(source):
    proc, result, out = hand(source, "gemini-cli", "keep", "--source-reasoning", "keep")
    assert proc.returncode == 65, proc.stderr
    assert result is not None and result["status"] == "failed" and not result["agent_started"]
    (error,) = result["errors"]
    assert error["code"] == "handoff_refused"
    assert "anthropic" in error["message"] and "gemini" in error["message"], error
    assert "handoff_refused" in proc.stderr or "anthropic" in proc.stderr


def test_to_claude_code_itself_the_image_and_the_thinking_are_kept(source):
    _, _, data = source
    proc, result, _ = hand(source, "claude-code", "same")
    h = ok(proc, result)
    the_image(h, data, "Read")
    assert h["reasoning"] == {
        "mode": "drop",
        "kept": 1,
        "rendered": 0,
        "dropped": {"provider_bound": 0, "plain": 0},
    }
