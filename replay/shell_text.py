"""Shell text a handoff makes changes with: the commands that write a file, replace a string in
one, apply a Codex ``apply_patch`` patch, or make a set of file changes recorded in snapshots.

Every command is one ``execve`` argument of agent B's shell tool: text goes as a quoted
here-document (a delimiter the content does not hold), data UTF-8 or a command cannot carry
(a NUL) through ``base64 -d``, and a replacement through a ``python3`` script that fails with
one line naming the file, as an edit tool does. Used by :mod:`pvisor.replay.translate`; the
patch reader also by :mod:`pvisor.replay.plan`.

Pure: builds strings, runs nothing.
"""

from __future__ import annotations

import base64
import posixpath
import re
import shlex
from typing import Any


#: the delimiter of the here-documents a reproduced write uses (another when the content holds it)
_EOF = "PVISOR_EOF"


def _delimiter(text: str) -> str:
    lines = set(text.split("\n"))
    n = 0
    while (d := _EOF if n == 0 else f"{_EOF}_{n}") in lines:
        n += 1
    return d


def _q(path: str) -> str:
    return shlex.quote(path)


def operand(path: str) -> str:
    """``path`` as a file operand of a command: ``./`` before a path starting with ``-``, which
    would be an option (``-n``; ``cd -P`` goes home) or stdin (``-``, even after ``--``; ``cd -``
    goes to ``$OLDPWD``)."""
    return _q("./" + path if path.startswith("-") else path)


def write_command(path: str, content: str, append: bool = False) -> str:
    """A shell command that writes ``content`` as the whole file ``path`` (its directory made),
    or appends it (``append``): a here-document when the content ends with a newline, else
    ``printf``; through ``base64 -d`` when it holds a NUL byte (a command is an ``execve``
    argument, which ends at a NUL)."""
    parent = posixpath.dirname(path)
    mk = f"mkdir -p -- {_q(parent)} && " if parent not in ("", ".", "/") and not append else ""
    to = ">>" if append else ">"
    if content == "":
        return f"{mk}: {to} {_q(path)}"
    if "\x00" in content:
        data = content.encode("utf-8", "surrogatepass")  # a lone surrogate of the JSON, as it came
        return f"{mk}printf '%s' {base64.b64encode(data).decode()} | base64 -d {to} {_q(path)}"
    if content.endswith("\n"):
        d = _delimiter(content)
        return f"{mk}cat {to} {_q(path)} <<'{d}'\n{content}{d}"
    return f"{mk}printf '%s' {shlex.quote(content)} {to} {_q(path)}"


#: the most characters of content one write command carries: a command is one ``execve``
#: argument, which Linux caps at 128 KiB (MAX_ARG_STRLEN), and quoting or base64 makes it longer
WRITE_PART = 16 * 1024


def write_parts(content: str) -> list[str]:
    """``content`` in parts of at most :data:`WRITE_PART` characters, cut after a newline where
    a part has one (each part then goes as a here-document); one part when it is short."""
    parts: list[str] = []
    rest = content
    while len(rest) > WRITE_PART:
        cut = rest.rfind("\n", 0, WRITE_PART) + 1 or WRITE_PART
        parts.append(rest[:cut])
        rest = rest[cut:]
    return [*parts, rest]


def _python(script: str) -> str:
    d = _delimiter(script)
    return f"python3 - <<'{d}'\n{script}\n{d}"


#: the scripts' read of the file ``p`` into ``s``: a file missing or not UTF-8 text is one line
#: naming it (as an edit tool says), never a traceback in B's observation
_READ_TEXT = (
    "try:\n"
    "    s = open(p, encoding='utf-8', newline='').read()\n"
    "except (OSError, UnicodeError) as exc:\n"
    "    sys.exit(f'{p}: cannot be read as UTF-8 text: {exc}')\n"
)


def _write_text(target: str, text: str) -> str:
    """The scripts' write of the expression ``text`` into the file ``target`` (expressions):
    encoded before the file is opened, so that text UTF-8 cannot hold (a lone surrogate of the
    recorded JSON) is one line and leaves the file as it was."""
    return (
        "try:\n"
        f"    b = ({text}).encode('utf-8')\n"
        "except UnicodeError as exc:\n"
        "    sys.exit(f'{p}: the new text is not UTF-8: {exc}')\n"
        f"open({target}, 'wb').write(b)"
    )


def edit_command(path: str, old: str, new: str, every: bool) -> str:
    """A shell command that replaces ``old`` by ``new`` in ``path`` (the first occurrence, or
    every one), failing with a message when ``old`` is not there, as an edit tool does."""
    count = "" if every else ", 1"
    return _python(
        "import sys\n"
        f"p, old, new = {path!r}, {old!r}, {new!r}\n"
        f"{_READ_TEXT}"
        "if old not in s:\n"
        "    sys.exit(f'{p}: the text to replace is not in the file')\n"
        + _write_text("p", f"s.replace(old, new{count})")
    )


_PATCH_FILE = re.compile(r"^\*\*\* (Add|Delete|Update) File: (.+)$")


def patch_operations(patch: str) -> list[tuple[str, str, Any]] | None:
    """The files of a Codex ``apply_patch`` patch (``*** Begin Patch`` .. ``*** End Patch``):
    (``add``, path, content), (``delete``, path, None), (``update``, path, (move_to, hunks))
    with hunks as (old text, new text) pairs of whole lines, each line ending in a newline;
    None when the text is not such a patch."""
    lines = patch.replace("\r\n", "\n").split("\n")
    if not lines or lines[0].strip() != "*** Begin Patch":
        return None
    ops: list[tuple[str, str, Any]] = []
    i = 1
    while i < len(lines):
        line = lines[i]
        if line.strip() == "*** End Patch":
            return ops
        m = _PATCH_FILE.match(line)
        if m is None:
            if line.strip() == "":
                i += 1
                continue
            return None
        kind, path = m.group(1).lower(), m.group(2).strip()
        i += 1
        if kind == "delete":
            ops.append(("delete", path, None))
            continue
        body: list[str] = []
        move: str | None = None
        while (
            i < len(lines)
            and not lines[i].startswith("*** ")
            or (i < len(lines) and lines[i].startswith("*** Move to: "))
        ):
            if lines[i].startswith("*** Move to: "):
                move = lines[i][len("*** Move to: ") :].strip()
            else:
                body.append(lines[i])
            i += 1
        if kind == "add":
            ops.append(("add", path, "".join(ln[1:] + "\n" for ln in body if ln.startswith("+"))))
            continue
        hunks: list[tuple[str, str]] = []
        old: list[str] = []
        new: list[str] = []
        for ln in body + ["@@"]:
            if ln.startswith("@@") or ln == "*** End of File":
                if old or new:
                    hunks.append(("".join(x + "\n" for x in old), "".join(x + "\n" for x in new)))
                old, new = [], []
            elif ln.startswith("-"):
                old.append(ln[1:])
            elif ln.startswith("+"):
                new.append(ln[1:])
            else:
                ctx = ln[1:] if ln.startswith(" ") else ln
                old.append(ctx)
                new.append(ctx)
        ops.append(("update", path, (move, hunks)))
    return None


def patch_command(ops: list[tuple[str, str, Any]]) -> str:
    """A shell command that makes the changes of :func:`patch_operations`' ``ops``: a hunk's
    old lines are found as whole lines (from a line's start, the first such place), as
    ``apply_patch`` matches them; a file without a final newline keeps it missing."""
    parts: list[str] = []
    for kind, path, arg in ops:
        if kind == "add":
            parts.append(write_command(path, arg))
        elif kind == "delete":
            parts.append(f"rm -f -- {_q(path)}")
        else:
            move, hunks = arg
            parts.append(
                _python(
                    "import os, re, sys\n"
                    f"p, move, hunks = {path!r}, {move!r}, {hunks!r}\n"
                    f"{_READ_TEXT}"
                    "end = s == '' or s.endswith('\\n')\n"
                    "s = s if end else s + '\\n'\n"
                    "for old, new in hunks:\n"
                    "    m = re.search('(?m)^' + re.escape(old), s)\n"
                    "    if m is None:\n"
                    "        sys.exit(f'{p}: a hunk of the patch does not apply')\n"
                    "    s = s[: m.start()] + new + s[m.end() :]\n"
                    "s = s if end or not s.endswith('\\n') else s[:-1]\n"
                    + _write_text("move or p", "s")
                    + "\nif move and move != p:\n"
                    "    os.remove(p)"
                )
            )
    return _joined(parts)


def _joined(parts: list[str]) -> str:
    """``parts`` run one after the other while each succeeds. A part of several lines ends with
    a here-document's delimiter line, which must stay alone on its line (``D && next`` is no
    delimiter: the here-document would run on, and a later part's content holding ``D`` would
    end it and run as commands), so such a part is a group: ``{ PART\n} && ...``."""
    if not parts:
        return "true"
    if len(parts) == 1:
        return parts[0]
    return " && ".join(f"{{ {p}\n}}" if "\n" in p else p for p in parts)


def files_command(changes: list[tuple[str, bytes | None]]) -> str:
    """A shell command that makes ``changes`` (path, new bytes or None for removed): text as a
    here-document, other bytes through ``base64 -d``."""
    parts: list[str] = []
    for path, data in changes:
        if data is None:
            parts.append(f"rm -rf -- {_q(path)}")
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and "\x00" not in text:
            parts.append(write_command(path, text))
            continue
        parent = posixpath.dirname(path)
        mk = f"mkdir -p -- {_q(parent)} && " if parent not in ("", ".", "/") else ""
        parts.append(f"{mk}printf '%s' {base64.b64encode(data).decode()} | base64 -d > {_q(path)}")
    return _joined(parts)
