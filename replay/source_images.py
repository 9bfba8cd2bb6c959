"""Images in a handoff (docs/handoff.md "Images"): where agent A's image parts go, and the
report's ``handoff.images``.

B re-runs A's calls and sends its own observations, so an image in a tool result survives when
B's re-run produces it: a read of an image file goes to B's tool that reads images into its
observation (:func:`image_read`; the descriptors' ``image_readers``: Claude Code ``Read``,
Gemini CLI and Qwen Code ``read_file``, OpenCode ``read``, Codex ``view_image``), and B's
protocol must take images in tool results (its module's ``TOOL_RESULT_IMAGES``: Anthropic
``image`` blocks, Gemini ``inlineData``, Responses ``input_image``; Chat takes ``image_url``
in user content only). Everything else is named as dropped (:func:`account_images`): an image
of a call rendered as text (not re-run), of a call re-run by a tool that reads no images, and
of an observation holding more than tool results (not sent again). After B ran, each image
expected kept is looked for, by the sha256 of its bytes, in B's request M+1
(:func:`verify_kept`); one it does not hold is dropped too. Never silently lost.

Image parts are read in the four wire shapes (:func:`image_of`). Pure: no file, process or
socket.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import orjson

from pvisor.adapters.protocols import get_protocol
from pvisor.journal.model import Message, OtherPart, Step, ToolResult

from .shell_text import operand

#: file name suffixes read as images (the formats the agents' read tools send as image parts)
IMAGE_SUFFIXES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}

_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)$", re.S)


@dataclass(frozen=True)
class Image:
    """One image part: ``media_type`` and its bytes' ``sha256`` and ``size``."""

    media_type: str
    sha256: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"media_type": self.media_type, "bytes": self.size, "sha256": self.sha256}


def _decoded(media_type: Any, data: Any) -> Image | None:
    if not isinstance(data, str) or not isinstance(media_type, str):
        return None
    try:
        raw = base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return None
    return Image(media_type, hashlib.sha256(raw).hexdigest(), len(raw))


def image_of(part: Any) -> Image | None:
    """The image of one wire part (a dict), or None: Anthropic ``{"type": "image", "source":
    {"type": "base64", ...}}``, Gemini ``{"inlineData": {"mimeType", "data"}}``, Responses
    ``{"type": "input_image", "image_url": "data:..."}``, Chat ``{"type": "image_url",
    "image_url": {"url": "data:..."}}``."""
    if isinstance(part, OtherPart):
        part = part.raw
    if not isinstance(part, dict):
        return None
    src = part.get("source")
    if part.get("type") == "image" and isinstance(src, dict) and src.get("type") == "base64":
        return _decoded(src.get("media_type"), src.get("data"))
    inline = part.get("inlineData", part.get("inline_data"))
    if isinstance(inline, dict):
        return _decoded(inline.get("mimeType", inline.get("mime_type")), inline.get("data"))
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if part.get("type") in ("input_image", "image_url") and isinstance(url, str):
        m = _DATA_URL.match(url)
        return _decoded(m.group("type"), m.group("data")) if m else None
    return None


def images_in(value: Any) -> list[Image]:
    """Every image part in ``value`` (a tool result's content, a message's parts, a request body),
    depth first, in order."""
    found: list[Image] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (ToolResult,)):
            stack.append(v.content)
            continue
        if isinstance(v, Message):
            stack.extend(reversed(v.parts))
            continue
        img = image_of(v)
        if img is not None:
            found.append(img)
        elif isinstance(v, OtherPart):
            stack.append(v.raw)
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        elif isinstance(v, list):
            stack.extend(reversed(v))
    return found


def placeholder(part: Any) -> str | None:
    """The text an image part is written as in a rendered note (never its bytes), or None for a
    part that is no image."""
    img = image_of(part)
    if img is None:
        return None
    return f"[image {img.media_type}, {img.size} bytes: not carried as text]"


def is_image_path(path: str) -> bool:
    return posixpath.splitext(path)[1].lower() in IMAGE_SUFFIXES


def image_read(
    descriptor: Any,
    declared: Mapping[str, Any],
    rel: str,
    absolute: str,
    shell_call: Callable[[str, str], tuple[str, dict[str, Any]]],
) -> tuple[str, dict[str, Any], str] | None:
    """(tool, arguments, how) of a source read of the image file ``rel`` (``absolute`` in B's
    workspace): B's first declared tool that reads images (its descriptor's ``image_readers``,
    tool -> path argument), else B's shell saying the file's size (a shell read of an image
    would put its bytes in B's observation as text). None for a path that is no image."""
    if not is_image_path(rel):
        return None
    for tool, arg in descriptor.image_readers.items():
        if tool in declared:
            return tool, {arg: absolute}, "an image: read by the next agent's own reader of images"
    # operand: a path starting with ``-`` (``--files0-from=x.png``) is a file, not an option of wc
    tool, args = shell_call(f"wc -c {operand(rel)}", f"Size of the image {rel}")
    return tool, args, "an image the next agent has no tool to read: its size by shell"


def account_images(
    steps: Sequence[Step], calls: Sequence[Any], descriptor: Any, protocol: str
) -> dict[str, Any]:
    """``handoff.images`` as the translation leaves it: per image of the source's tool results
    and observation messages (steps 1..N), ``kept`` (expected in B's re-run observation: B's
    tool that reads images re-runs the read, and B's protocol takes images in tool results) or
    ``dropped`` with ``why``. ``calls``: the translation's
    :class:`~pvisor.replay.translate.CallAccount` list."""
    takes = bool(getattr(get_protocol(protocol), "TOOL_RESULT_IMAGES", False))
    by_call = {(a.step, a.call_id): a for a in calls if a.call_id is not None}
    kept: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for step in steps:
        listed = [c.id for c in step.action.tool_calls]
        said = [(res.call_id, i, images_in(res.content)) for i, res in enumerate(step.observation.results)]
        messages = []
        for m in step.observation.messages:
            beside = _beside_results(m)
            if beside is None:
                messages.append(m)
            else:
                said += beside
        for call_id, i, imgs in said:
            if not imgs:
                continue
            cid = call_id if call_id is not None else (listed[i] if 0 <= i < len(listed) else None)
            acc = by_call.get((step.n, cid))
            why = _why_dropped(acc, descriptor)
            for img in imgs:
                row = {"step": step.n, "call_id": cid, **img.to_json()}
                if why is None:
                    # re-run by B's reader of images: B's observation holds it where B's protocol
                    # takes it (or where B puts it beside its results: OpenCode's user message)
                    unless = None if takes else f"{protocol} takes no images in tool results"
                    kept.append(
                        {
                            **row,
                            "target_step": acc.target_step,
                            "target_tool": acc.target_tool,
                            "unless": unless,
                        }
                    )
                else:
                    dropped.append({**row, "why": why})
        for img in images_in(messages):
            dropped.append(
                {
                    "step": step.n,
                    "call_id": None,
                    **img.to_json(),
                    "why": "in an observation holding more than tool results, which is not sent again",
                }
            )
    return {"kept": kept, "dropped": dropped}


def _beside_results(message: Message) -> list[tuple[str | None, int, list[Image]]] | None:
    """The images a message of the observation holds beside tool results, each with the result it
    follows (call id, its place among the message's results): Gemini CLI sends a read image as
    ``inlineData`` after its ``functionResponse`` in the same content, which the journal's model
    keeps as a message of its own. None for a message that holds no tool result."""
    raw = message.raw.get("parts") if isinstance(message.raw, dict) else None
    if not isinstance(raw, list):
        return None
    out: list[tuple[str | None, int, list[Image]]] = []
    place, last = -1, None
    for part in raw:
        fr = part.get("functionResponse", part.get("function_response")) if isinstance(part, dict) else None
        if isinstance(fr, dict):
            place, last = place + 1, fr.get("id") if isinstance(fr.get("id"), str) else None
            continue
        img = image_of(part)
        if img is not None and place >= 0:
            out.append((last, place, [img]))
    return out if place >= 0 else None


def _why_dropped(acc: Any, descriptor: Any) -> str | None:
    """Why an image of the source call ``acc`` accounts for cannot reach B, or None: B's reader
    of images re-runs the call."""
    if acc is None:
        return "its call is not carried by the next agent"
    if acc.fate.value != "translated":
        return f"its call is {acc.fate.value} (not re-run)"
    if acc.target_tool not in descriptor.image_readers:
        return f"re-run by {acc.target_tool}, which reads no images"
    return None


def verify_kept(images: Mapping[str, Any], boundary: bytes | None) -> dict[str, Any]:
    """``images`` (:func:`account_images`) checked against B's request M+1 (its body; None when B
    never sent one): an image re-run by B's reader of images is ``kept`` when that request holds
    its bytes, else moved to ``dropped`` (``why``: B's protocol takes no images in tool results,
    or B's observation does not hold it); not checked (no request), it is kept only where B's
    protocol takes images in tool results. Each kept one has ``in_boundary_request`` (True, or
    None: not checked). Adds the counts."""
    kept, dropped = list(images.get("kept") or ()), list(images.get("dropped") or ())
    found: set[str] | None = None
    if boundary is not None:
        try:
            found = {i.sha256 for i in images_in(orjson.loads(boundary))}
        except orjson.JSONDecodeError:
            found = set()
    still = []
    for row in kept:
        unless = row.get("unless")
        row = {k: v for k, v in row.items() if k != "unless"}
        if (found is None and unless is None) or (found is not None and row["sha256"] in found):
            still.append({**row, "in_boundary_request": None if found is None else True})
        else:
            rest = {k: v for k, v in row.items() if k not in ("target_step", "target_tool")}
            why = unless or f"{row['target_tool']}'s re-run observation does not hold it"
            dropped.append({**rest, "why": why})
    return {"kept": still, "dropped": dropped, "kept_total": len(still), "dropped_total": len(dropped)}
