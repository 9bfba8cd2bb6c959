"""Native trajectory adapters: the files agents write themselves, read into the canonical
:class:`~pvisor.journal.model.Trajectory` (one module per format; formats and sources in
docs/native.md). What the format modules share, one job a module: :mod:`.base` (the adapter
interface, format profiles, the result), :mod:`.diagnostics` (warnings), :mod:`.jsonl` (the
JSON-lines record reader and its limits), :mod:`.assembly` (steps, tool calls, results, left-out
records), :mod:`.uuid_chain` (Claude Code's and Qwen Code's uuid chains); :mod:`.documents`
(JSON documents), :mod:`.signatures` (detection), :mod:`.spool` (pipes), :mod:`.render` (show).

:func:`read_native` is the entry point: with ``agent`` it uses that adapter, else it
detects the format from the file (each format's signature, :mod:`.signatures`); no match or several matches
is an error naming the candidates (exit 65 / exit 2). An interchange format (a row of the agent
table with ``format``: ATIF, :mod:`.atif`) is no agent's: a file in it is read by its reader
whatever ``agent`` names, and must then be that agent's run (``NativeResult.agent``); detection
tries its signature first.
"""

from __future__ import annotations

import gc
import importlib
import os
import stat
from typing import TYPE_CHECKING, Any

from pvisor.core.errors import BadInputError, UsageError

from pvisor.adapters.agents import AGENTS, format_names, native_names

from .base import NativeAdapter, NativeResult, flag_cut_off
from .diagnostics import Diagnostics

if TYPE_CHECKING:
    from pathlib import Path

#: a signature is given at least this many bytes of the file's start (64 KiB) ...
SNIFF_BYTES = 64 * 1024
#: ... extended until they hold this many complete lines ...
SNIFF_LINES = 8
#: ... but never more than this many bytes (4 MiB)
SNIFF_MAX_BYTES = 4 * 1024 * 1024


def adapter_names() -> list[str]:
    """Names ``--agent`` accepts, in documentation order (the agent table's native readers,
    :func:`pvisor.adapters.agents.native_names`)."""
    return native_names()


def adapter_module(name: str) -> str:
    """The module under this package that reads agent ``name``'s native files (its row of
    :data:`pvisor.adapters.agents.AGENTS`); UsageError listing the known names otherwise."""
    row = next((a for a in AGENTS if a.name == name and a.native), None)
    if row is None:
        raise UsageError(f"unknown native adapter {name!r}; expected one of {', '.join(adapter_names())}")
    return f"{__name__}.{row.module}"


def get_adapter(name: str) -> NativeAdapter:
    """The adapter called ``name``; UsageError listing the known names otherwise."""
    return importlib.import_module(adapter_module(name)).ADAPTER


def sniff_head(path: Path) -> bytes:
    """The start of ``path`` that detection looks at: its first :data:`SNIFF_BYTES` (64 KiB),
    read on in 64 KiB pieces until it holds :data:`SNIFF_LINES` (8) complete lines, at most
    :data:`SNIFF_MAX_BYTES` (4 MiB); the whole file when shorter. A JSONL file whose first
    line is long (a Claude Code ``file-history-snapshot`` of 200 KiB) is thus recognised by
    the records after it, and a pretty-printed JSON document (many short lines) still gives
    64 KiB as before. ``b""`` for a directory or a file that cannot be read."""
    if not os.path.isfile(path):
        return b""
    try:
        with open(path, "rb") as fh:
            head = bytearray(fh.read(SNIFF_BYTES))
            lines = head.count(b"\n")
            while lines < SNIFF_LINES and len(head) < SNIFF_MAX_BYTES:
                more = fh.read(min(SNIFF_BYTES, SNIFF_MAX_BYTES - len(head)))
                if not more:
                    break
                head += more
                lines += more.count(b"\n")
    except OSError:
        return b""
    return bytes(head[3:] if head.startswith(b"\xef\xbb\xbf") else head)


def detect(path: Path) -> list[str]:
    """Names of the adapters whose format's signature (:mod:`.signatures`) accepts ``path`` (a
    file, or a directory for the OpenCode storage tree), given :func:`sniff_head` of it. Loads
    no adapter module (the one chosen is loaded to read the file). An interchange format's
    signature (a row with ``format``: ATIF) is tried first and, when it accepts, is the only
    name: its signature is strict (a version key), and a file of it may quote another agent's
    markers in its ``extra`` fields."""
    from .signatures import signature_of

    head = sniff_head(path)
    formats = [n for n in format_names() if signature_of(n)(path, head)]
    if formats:
        return formats
    return [n for n in adapter_names() if signature_of(n)(path, head)]


def _format_of(path: Path) -> str | None:
    """The interchange format ``path`` is written in (a row with ``format``), or None."""
    from .signatures import signature_of

    names = format_names()
    if not names:
        return None
    head = sniff_head(path)
    return next((n for n in names if signature_of(n)(path, head)), None)


def _check_path(path: Path) -> None:
    """UsageError (exit 2) when ``path`` cannot be opened at all: missing, a symlink loop, no
    permission (the reason as the system gives it)."""
    if str(path) in ("", "."):
        raise UsageError("no file given (an empty path)")
    try:
        os.stat(path)
        if not os.path.isdir(path):
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        if exc.errno == 2:
            raise UsageError(f"{path}: no such file") from None
        raise UsageError(f"{path}: cannot open: {exc.strerror or exc}") from None


def check_source_file(path: Path, shown: str) -> None:
    """UsageError (exit 2) unless ``path`` is a regular file or a directory (an OpenCode
    store): a FIFO or a device cannot be digested and read again (a pipe is read once,
    /dev/zero never ends, a FIFO without a writer blocks). ``shown``: how the message names it
    (``--trajectory PATH``). For commands that read a source twice; ``trajectory show`` spools
    a pipe instead (:mod:`.spool`)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"{shown}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{shown}: {exc.strerror or exc}") from None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise UsageError(f"{shown}: not a regular file (nor an OpenCode storage directory)")


def read_native(
    path: Path,
    agent: str | None = None,
    session: str | None = None,
    *,
    max_input: int | None = None,
    input_timeout: float | None = None,
    sidechain: str | None = None,
) -> tuple[NativeResult, list[str]]:
    """Read ``path`` with the adapter ``agent`` (or the one detected). Returns (result, notes)
    where notes say how the adapter was chosen (for stderr). ``session`` picks one session of
    a store holding several (OpenCode's ``opencode.db`` or storage tree; the id ``opencode
    session list`` prints). ``path`` may also be ``-`` (stdin) or a pipe (``<(zcat f.gz)``):
    it is copied to a temporary file first, removed when the process exits (the steps are read
    from it as they are iterated; :mod:`.spool`: at most ``max_input`` bytes, default 1 GiB; at
    most ``input_timeout`` s without a byte, default 30; devices and sockets refused). Raises
    UsageError when ``path`` cannot be opened (missing, a symlink loop, no permission: the system's reason) or
    ``session`` is given for an adapter that reads one session per file, BadInputError (65)
    when no adapter recognises it or several do, naming the candidates, or the session is not
    in the store. ``sidechain``: read the inline subagent of that ``agentId`` instead of the
    main loop (adapters with ``reads_sidechains``: Claude Code; UsageError for another)."""
    if str(path) != "-":
        _check_path(path)
    from . import spool

    if not spool.needs_spool(path):
        return _read_native(path, path, agent, session, sidechain)
    limits = {"max_input": max_input, "timeout": input_timeout}
    copy = spool.spool(path, **{k: v for k, v in limits.items() if v is not None})
    try:
        return _read_native(path, copy, agent, session, sidechain)
    except BadInputError as exc:
        # the temporary copy is an implementation detail: errors name what the user gave
        raise BadInputError(exc.message.replace(str(copy), str(path)), exit_code=exc.exit_code) from None


def _reading(original: Path, path: Path) -> Any:
    """The progress task of reading ``path`` (bytes; the lines' reader reports to it)."""
    from pvisor.core import progress

    try:
        total = 0 if os.path.isdir(path) else os.stat(path).st_size
    except OSError:
        total = 0
    shown = "stdin" if str(original) == "-" else os.path.basename(original) or str(original)
    return progress.task(f"reading {shown}", total, progress.Unit.BYTES)


#: how much of a file :func:`unreadable_reason` reads to judge it whole (a larger one is judged
#: by its first line only)
WHOLE_JUDGED = 4 << 20


def unreadable_reason(path: Path) -> str:
    """Why no adapter could recognise the file ``path``, when that is knowable without one: it
    is empty, holds only blank lines, is UTF-16 or not UTF-8 text, its first line (or, for a
    file that does not look like JSON Lines, its document) is not JSON, or the JSON is cut
    off before its end. ``""`` when none of these holds (the file is JSON another agent wrote)
    or it cannot be read. Reads at most :data:`WHOLE_JUDGED` bytes."""
    import orjson

    try:
        with open(path, "rb") as f:
            head = f.read(WHOLE_JUDGED + 1)
    except OSError:
        return ""
    whole = len(head) <= WHOLE_JUDGED
    if not head:
        return "it is empty"
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "it is UTF-16 text; adapters read UTF-8"
    try:
        text = head.decode("utf-8") if whole else head[:WHOLE_JUDGED].decode("utf-8", "ignore")
    except UnicodeDecodeError as exc:
        return f"it is not UTF-8 text, from byte {exc.start}"
    if "\x00" in text:
        return "it holds NUL bytes: not text"
    stripped = text.lstrip("\ufeff \t\r\n")
    if not stripped:
        return "it holds only blank lines"
    first = stripped.split("\n", 1)[0]
    try:
        orjson.loads(first)
        return ""  # JSON Lines (or a one-line document) that no adapter knows
    except orjson.JSONDecodeError:
        pass
    if first[:1] not in ("{", "["):
        return "its first line is not JSON"
    if not whole:
        return "its first line is not JSON"
    try:
        orjson.loads(stripped)
    except orjson.JSONDecodeError as exc:
        if "end of" in str(exc) or "EOF" in str(exc):
            return "its JSON is cut off before the document ends"
        return f"it is not JSON: {str(exc).split(':', 1)[0]}"
    return ""


def _read_native(
    original: Path, path: Path, agent: str | None, session: str | None, sidechain: str | None = None
) -> tuple[NativeResult, list[str]]:
    notes: list[str] = []
    if agent is None:
        found = detect(path)
        if not found:
            # of the adapters only OpenCode reads a directory (its storage/ tree)
            what = "directory" if os.path.isdir(path) else "file"
            why = "" if os.path.isdir(path) else unreadable_reason(path)
            raise BadInputError(
                f"{original}: no native adapter recognises this {what}{f' ({why})' if why else ''}; "
                f"give --agent (one of {', '.join(adapter_names())})"
            )
        if len(found) > 1:
            raise BadInputError(
                f"{original}: ambiguous native format, candidates: {', '.join(found)}; give --agent"
            )
        agent = found[0]
        notes.append(f"detected format: {agent}")
        wanted = None
    else:
        # a file in an interchange format is read by the format's reader whatever agent wrote it
        # (--agent names the agent, which the file must say); --agent FORMAT reads it as such
        wanted = agent
        fmt = None if agent in format_names() else _format_of(path)
        if fmt is not None:
            notes.append(f"format: {fmt} (read as {agent}'s run)")
            agent = fmt
    adapter = get_adapter(agent)
    if os.path.isdir(path) and not adapter.reads_directories:
        raise BadInputError(f"{original}: is a directory; the {agent} adapter reads a file, not a directory")
    if session is not None and not adapter.selects_sessions:
        raise UsageError(f"--session applies to stores of several sessions (opencode), not to a {agent} file")
    diag = Diagnostics(str(original))
    # reading allocates millions of parsed JSON values and no reference cycle: the cyclic
    # collector would only rescan them (a third of the time on a 50 MB file)
    collecting = gc.isenabled()
    gc.disable()
    try:
        with _reading(original, path):
            if session is not None:
                result = adapter.read(path, diag, session=session)
            elif sidechain is not None:
                if not adapter.reads_sidechains:
                    raise UsageError(f"{original}: the {agent} adapter reads no inline subagent")
                result = adapter.read(path, diag, sidechain=sidechain)
            else:
                result = adapter.read(path, diag)
        flag_cut_off(result)  # the step a cut-off last line may belong to
        _check_agent(original, result, agent, wanted)
        return result, notes
    finally:
        if collecting:
            gc.enable()


def _check_agent(original: Path, result: NativeResult, adapter: str, wanted: str | None) -> None:
    """Set ``result.agent`` (an agent's own adapter: its name) and, when ``--agent`` named an
    agent and the file is in an interchange format, check that the file is that agent's run:
    BadInputError (exit 65) naming the agent it says and the ``--agent`` to give otherwise."""
    if result.agent is None:
        result.agent = adapter
    if wanted is None or wanted == adapter or wanted == result.agent:
        return
    said = result.trajectory.meta.get("agent_name", result.agent)
    known = (
        f"--agent {result.agent} (or --agent {adapter})" if result.agent != adapter else f"--agent {adapter}"
    )
    raise BadInputError(
        f"{original}: an {adapter} trajectory of agent {said!r}, not of {wanted}; give {known}"
    )


__all__ = [
    "adapter_module",
    "adapter_names",
    "check_source_file",
    "detect",
    "get_adapter",
    "read_native",
    "sniff_head",
]
