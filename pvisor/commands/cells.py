"""One-line cells of pvisor's tables: text made safe for a terminal, clipped, counted, and a
step's action and observation in a few words (``journal steps``, ``trajectory show``,
``journal sql``). Apart from the journal and snapshot commands, so that a command that prints a
table loads neither the journal reader nor SQLite."""

from __future__ import annotations

import click
import orjson

#: control characters shown escaped in the one-line human output (C0, DEL, C1): a recorded
#: path, run id or reply must not ring the bell, move the cursor, restyle the terminal or
#: break a table row
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), *range(0x7F, 0xA0))}
# bidirectional overrides and isolates reorder what follows them (a file name could show a
# different extension); line and paragraph separators break the row
_CONTROLS.update(
    {
        c: f"\\u{c:04x}"
        for c in (0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
    }
)


def terminal_safe(text: str) -> str:
    """``text`` with control characters escaped (``\x07``), for one line of a terminal."""
    return text.translate(_CONTROLS)


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``1 result``, ``2 results``."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def print_table(rows: list[list[str]], header: list[str]) -> None:
    rows = [[terminal_safe(str(c)) for c in r] for r in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())


def clip(text: str, n: int) -> str:
    """One line of at most ``n`` characters (whitespace runs collapsed, control characters
    escaped, ``…`` when cut)."""
    text = terminal_safe(" ".join(text.split()))
    return text if len(text) <= n else text[: n - 1] + "…"


def _preview(value) -> str:
    """``value`` as JSON for a table cell; a value nested deeper than orjson writes (255
    levels) shows as ``{…}`` / ``[…]``: the cell is clipped to 40 characters anyway."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return "{…}" if isinstance(value, dict) else "[…]"


def _short_call(call) -> str:
    args = call.arguments
    if isinstance(args, dict):
        inner = ", ".join(f"{k}={clip(_preview(v), 40)}" for k, v in args.items())
    else:
        inner = clip(call.arguments_raw, 40)
    return clip(f"{call.name}({inner})", 10_000)


def _calls_cell(calls: list[str], width: int) -> str:
    """Tool calls joined with ``; `` in at most ``width`` characters; when some call does not
    even begin within them, ``+N more`` says how many."""
    text = "; ".join(calls)
    if len(text) <= width:
        return text
    starts, pos = [], 0
    for c in calls:
        starts.append(pos)
        pos += len(c) + 2
    suffix = ""
    for _ in range(3):  # the suffix takes room, which may hide one more call
        limit = width - len(suffix)
        hidden = sum(1 for p in starts if p >= limit - 1)
        suffix = f" +{hidden} more" if hidden else ""
    limit = width - len(suffix)
    hidden = sum(1 for p in starts if p >= limit - 1)
    shown = "; ".join(calls[: len(calls) - hidden])
    return (shown if len(shown) <= limit else shown[: limit - 1] + "…") + suffix


def action_cell(step) -> str:
    a = step.action
    if a.tool_calls:
        return _calls_cell([_short_call(c) for c in a.tool_calls], 90)
    if a.text:
        return clip(f"text: {a.text!r}", 60)
    return "(no reply)" if "no_reply" in step.flags else "(empty reply)"


def _text_chars(content) -> int:
    """Characters of text in a tool result's content: a string's length; for content blocks,
    the text of the text blocks (an image counts none); for an object without a ``type`` (a
    Gemini ``response``), the strings it holds."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(_text_chars(b) for b in content)
    if isinstance(content, dict):
        if "type" in content:
            text = content.get("text")
            return len(text) if isinstance(text, str) else _text_chars(content.get("content"))
        return sum(_text_chars(v) for v in content.values())
    return 0


def observation_cell(step) -> str:
    o = step.observation
    bits = []
    if o.results:
        errors = sum(1 for r in o.results if r.is_error)
        chars = sum(_text_chars(r.content) for r in o.results)
        bits.append(
            counted(len(o.results), "result")
            + (f" ({counted(errors, 'error')})" if errors else "")
            + f", {counted(chars, 'char')}"
        )
    for m in o.messages:
        text = " ".join(p.text for p in m.parts if hasattr(p, "text") and isinstance(p.text, str))
        bits.append(f"{m.role}: {clip(repr(text), 40)}")
    return "; ".join(bits) or "-"
