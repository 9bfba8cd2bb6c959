"""Helpers for journal tests: synthetic sessions that grow like real agent conversations, and a
snapshot recorded with the real writer."""

from __future__ import annotations

import hashlib
import random

import orjson

from pvisor.journal.snapshots import Entry, EntryKind, Manifest, SnapshotKind, SnapshotRecord
from pvisor.journal.writer import Journal

_WORDS = None


def _vocab(rng: random.Random) -> list[str]:
    global _WORDS
    if _WORDS is None:
        letters = "etaoinshrdlcumwfgypbvkjxqz"
        _WORDS = [
            "".join(rng.choice(letters[: rng.randint(8, 26)]) for _ in range(rng.randint(2, 10)))
            for _ in range(4000)
        ]
    return _WORDS


def text(rng: random.Random, nbytes: int) -> str:
    """Pseudo-prose of about ``nbytes`` bytes: words from a 4,000-word vocabulary, some code-like lines."""
    words = _vocab(rng)
    out: list[str] = []
    size = 0
    while size < nbytes:
        if rng.random() < 0.1:
            w = f"\n    {rng.choice(words)}({rng.choice(words)}, {rng.randint(0, 9999)})"
        else:
            w = " " + rng.choice(words)
        out.append(w)
        size += len(w)
    return "".join(out)[:nbytes]


def anthropic_session_bodies(
    steps: int, *, seed: int = 7, system_bytes: int = 12_000, tool_bytes: int = 10_000
):
    """Request bodies 1..steps+1 of a synthetic Anthropic Messages session: a system prompt and
    tool definitions of ``system_bytes`` + ``tool_bytes``, each step appending an assistant
    tool_use and a user tool_result of 300..2,000 bytes, the ``cache_control`` marker moved to
    the newest message each time (as Claude Code does)."""
    rng = random.Random(seed)
    system = text(rng, system_bytes)
    tools = [
        {
            "name": f"tool_{i}",
            "description": text(rng, tool_bytes // 8 - 120),
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
        for i in range(8)
    ]
    messages: list[dict] = [
        {"role": "user", "content": [{"type": "text", "text": "Task: " + text(rng, 400)}]}
    ]
    bodies = []
    for i in range(steps + 1):
        for m in messages:
            for block in m["content"]:
                block.pop("cache_control", None)
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        body = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 32000,
            "system": [{"type": "text", "text": system}],
            "tools": tools,
            "messages": messages,
            "stream": True,
        }
        bodies.append(orjson.dumps(body))
        if i == steps:
            break
        call_id = f"toolu_{i:06d}"
        n = rng.randint(300, 2000)
        cmd = text(rng, rng.randint(20, 120))
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call_id, "name": "tool_0", "input": {"command": cmd}}],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call_id,
                        "content": text(rng, max(50, n - len(cmd) - 150)),
                    }
                ],
            }
        )
    return bodies


def snapshot(j: Journal, run: str, sid: str, files: dict[str, bytes]) -> None:
    """Record a start snapshot ``sid`` of ``run`` whose workspace holds ``files`` (name: bytes):
    the file blobs, then the manifest listing them, as the filesystem driver stores them."""
    entries = [
        Entry(name, EntryKind.FILE, 0o644, len(data), hashlib.sha256(data).hexdigest())
        for name, data in sorted(files.items())
    ]
    manifest = Manifest(entries=entries).encode()
    j.put_blobs([(hashlib.sha256(d).hexdigest(), d) for d in files.values()])
    j.record_snapshot(
        SnapshotRecord(id=sid, run=run, attempt=1, kind=SnapshotKind.START, driver="filesystem",
                       taken_ms=1.0, manifest=manifest, digest=hashlib.sha256(manifest).hexdigest())
    )  # fmt: skip
