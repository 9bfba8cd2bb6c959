"""The plan before acting: what the calls a replay will serve name outside the new workspace.

Replay-only and continuation serve the recorded actions A1..AN to a live agent, which runs every
tool call for real (docs/replay.md, "Before the agent acts: the plan"). Before the agent starts,
:func:`make_plan` reads those actions as playback will serve them and lists every path argument
and every shell command that names a place outside the new workspace and the agent's private
home: an absolute path, a ``..`` that climbs out of the workspace (relative to the directory the
call runs in: the workspace, or a ``cd DIR`` earlier in the same command, followed as a best
effort), ``~`` (and ``$HOME``), the recorded workspace (outside the new one by construction), the
recorded run's home or run directory, and a path argument whose rewrite to the new workspace
would leave it (:func:`stays_below`; playback then serves it unrewritten).

Where the facts come from, per agent (its descriptor, never a branch on its name):
:attr:`~pvisor.adapters.agents.descriptor.AgentDescriptor.path_arguments` (a tool's path
arguments; for a shell tool, its working directory), ``shell_tools`` (the arguments that hold
a command: a string, or an argv list), ``text_command`` (the fenced blocks of a text-mode
agent, mini-swe-agent's) and ``read_tools`` (tools that only read the paths they are given).

What it ignores (:data:`IGNORED`, :data:`IGNORED_READS`; the heading says so): ``/dev/null``,
``/dev/std*``, ``/dev/fd/*``, ``/tmp`` (private in a sandbox), ``/proc/self`` and the private
home (a path argument naming the recorded home or run directory is served as the new one);
and what only *reads* system paths (``/usr``, ``/etc``, ``/bin``, ``/sbin``, ``/lib``,
``/lib64``, ``/dev/zero``, ``/dev/urandom``, ``/dev/random``): a read tool's path, a token of
a command, a ``cd``. A redirection (``>``, ``>>``, ``&>``, ``<>``) into them, ``tee`` into
them and the paths of commands that change files (``rm``, ``mv``, ``touch``, ``mkdir``,
``chmod``, the destination of ``cp``, ...: :data:`WRITE_COMMANDS`) are still listed.

A warning, never a guarantee: shell is read token by token (``shlex``; a command it cannot
split is split on blanks), so a path the command builds (``p=/x; echo > $p/y``), a program's
own file access (``python3 -c 'open("/x", "w")'``), a symbolic link inside the workspace,
a free-form tool input (Codex's ``apply_patch``) and a heredoc's body are not seen; arguments
that are no JSON object are read by their string literals, each as a command (an agent may
repair and run them). The sandbox
is what contains a replay; the plan says what the served calls name.

Pure: no file is read or written, no process started; paths are compared as text, normalised
with :func:`posixpath.normpath`. Shapes: :class:`PlanItem` (one named place), :class:`Plan`
(the items and what was ignored; ``to_json()`` is the result's ``plan``).
"""

from __future__ import annotations

import enum
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from pvisor.adapters.agents.effects import Effect, Role
from pvisor.journal.model import Action, ToolCall
from pvisor.journal.redact import redact_text

from .shell_text import patch_operations


class PlanReason(str, enum.Enum):
    """Why a plan item names a place outside the new workspace (the item's ``reason``)."""

    ABSOLUTE_PATH = "absolute_path"  #: an absolute path outside the workspace and the private home
    PARENT_DIRECTORY = "parent_directory"  #: a ``..`` (or a ``cd ..``) that climbs out of the workspace
    HOME = "home"  #: ``~``, ``~user``, ``$HOME``: the home of whoever runs it, not the workspace
    RECORDED_WORKSPACE = "recorded_workspace"  #: the recorded run's workspace (not rewritten here)
    RECORDED_HOME = "recorded_home"  #: the recorded run's private home or run directory (not rewritten here)
    #: a path argument below the recorded workspace or home whose rewrite would leave the new one
    #: (``OLD_WS/../x``): served unrewritten
    REWRITE_LEAVES_WORKSPACE = "rewrite_leaves_workspace"


#: places named anywhere (read or written) that the plan never lists: ``*`` ends a prefix
IGNORED: tuple[str, ...] = (
    "/dev/null",
    "/dev/stdin",
    "/dev/stdout",
    "/dev/stderr",
    "/dev/fd/*",
    "/tmp/*",
    "/proc/self/*",
)
#: system places the plan does not list when they are only read
IGNORED_READS: tuple[str, ...] = (
    "/usr/*",
    "/etc/*",
    "/bin/*",
    "/sbin/*",
    "/lib/*",
    "/lib64/*",
    "/dev/zero",
    "/dev/urandom",
    "/dev/random",
)

#: the plan's heading (stderr), with the number of items
HEADING = (
    "the plan (a warning, never a guarantee: shell is read token by token): {count} place(s) the "
    "recorded calls name outside the new workspace and the agent's private home; ignored: "
    "/dev/null, /dev/std*, /dev/fd/*, /tmp, /proc/self, the private home, and reads of /usr, /etc, "
    "/bin, /sbin, /lib, /lib64 (a redirection or tee into them is listed)"
)

#: the longest ``text`` of an item (characters); a longer one ends with ``…``
TEXT_CHARS = 160

#: commands whose path operands they change: all of them (``*``) or the last one (``last``)
WRITE_COMMANDS: dict[str, str] = {
    "rm": "*",
    "rmdir": "*",
    "mv": "*",
    "touch": "*",
    "mkdir": "*",
    "chmod": "*",
    "chown": "*",
    "chgrp": "*",
    "truncate": "*",
    "tee": "*",
    "shred": "*",
    "unlink": "*",
    "cp": "last",
    "install": "last",
    "ln": "last",
    "rsync": "last",
}
#: shells whose ``-c SCRIPT`` is read as a command too
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
#: words that run the command after them (their own options skipped)
PREFIX_COMMANDS = frozenset({"sudo", "env", "nohup", "time", "command", "exec", "nice", "builtin", "xargs"})
#: operators that end a simple command
_SEPARATORS = frozenset({";", "&", "&&", "|", "||", "|&", "\n", "(", ")", ";;"})
#: operators whose next word is a file written (``>&`` too, unless a descriptor number follows)
_WRITES = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&"})
#: operators whose next word is a file read
_READS = frozenset({"<"})
#: operators whose next word is no file (a heredoc's delimiter, a here string)
_NOT_FILES = frozenset({"<<", "<<-", "<<<"})
_OPERATOR_CHARS = frozenset(";&|<>()\n")
_HOME_VAR = re.compile(r"^(?:\$HOME|\$\{HOME\})(?=/|$)")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


@dataclass(frozen=True, slots=True)
class PlanItem:
    """One place a served call names outside the new workspace: ``step`` (1-based), ``call_id``
    (None for a command in an action's text), ``tool`` (``text`` for such a command),
    ``argument`` (the argument's name; ``command`` for a text block), ``text`` (the path or
    token as written, control characters escaped, keys redacted, at most
    :data:`TEXT_CHARS`), ``reason`` (:class:`PlanReason`)."""

    step: int
    call_id: str | None
    tool: str
    argument: str
    text: str
    reason: PlanReason

    def line(self) -> str:
        """``step K, call ID (TOOL ARG): TEXT: REASON``, one line."""
        return (
            f"step {self.step}, call {_shown(self.call_id) if self.call_id is not None else '-'} "
            f"({_shown(self.tool)} {_shown(self.argument)}): {self.text}: {self.reason.value}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "call_id": self.call_id,
            "tool": self.tool,
            "argument": self.argument,
            "text": self.text,
            "reason": self.reason.value,
        }


@dataclass(slots=True)
class Plan:
    """The plan of a replay: ``items`` in the order of the served calls, ``steps`` (how many
    served actions were read: N), ``ignored`` (the places never listed, :data:`IGNORED`) and
    ``ignored_reads`` (those listed only when written, :data:`IGNORED_READS`)."""

    steps: int
    items: list[PlanItem] = field(default_factory=list)
    ignored: tuple[str, ...] = IGNORED
    ignored_reads: tuple[str, ...] = IGNORED_READS

    def heading(self) -> str:
        return HEADING.format(count=len(self.items))

    def lines(self) -> list[str]:
        """The heading and one line per item, for stderr; [] when there is no item."""
        if not self.items:
            return []
        return [self.heading(), *(i.line() for i in self.items)]

    def to_json(self) -> dict[str, Any]:
        """The result's ``plan``: ``{steps, items, ignored, ignored_reads}``."""
        return {
            "steps": self.steps,
            "items": [i.to_json() for i in self.items],
            "ignored": list(self.ignored),
            "ignored_reads": list(self.ignored_reads),
        }


@dataclass(frozen=True, slots=True)
class Places:
    """The places a plan judges by: the new ``workspace`` (absolute) and the recorded run's
    ``recorded_workspace``, ``recorded_home`` and ``recorded_run_dir`` (None when unknown)."""

    workspace: str
    recorded_workspace: str | None = None
    recorded_home: str | None = None
    recorded_run_dir: str | None = None


def stays_below(rest: str) -> bool:
    """Whether a path ``ROOT + rest`` (``rest`` empty or starting with ``/``) stays at or below
    ROOT once normalised: ``/a/../b`` does, ``/..`` and ``/a/../../x`` do not. Playback's
    rewrite of a recorded path uses it (:class:`~pvisor.replay.playback.PathRewrites`)."""
    return _below(posixpath.normpath("/r" + rest), "/r")


def _below(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies below it (both normalised, absolute)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _matches(path: str, patterns: Iterable[str]) -> bool:
    for p in patterns:
        if p.endswith("/*"):
            if _below(path, p[:-2]):
                return True
        elif path == p:
            return True
    return False


def _shown(text: str) -> str:
    """``text`` as one printable line: control and format characters escaped (``\\n``,
    ``\\x1b``), a lone surrogate as its escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _item_text(text: str) -> str:
    text = _shown(redact_text(text))
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"


# --------------------------------------------------------------------------- judging one path


class _Judge:
    """Judges paths against :class:`Places`; collects the items of one call."""

    def __init__(self, places: Places):
        self.places = places
        self.ws = posixpath.normpath(places.workspace)
        self.recorded = [
            (posixpath.normpath(p), reason)
            for p, reason in (
                (places.recorded_workspace, PlanReason.RECORDED_WORKSPACE),
                (places.recorded_home, PlanReason.RECORDED_HOME),
                (places.recorded_run_dir, PlanReason.RECORDED_HOME),
            )
            if p and p.startswith("/")
        ]
        # the longest first: a home inside a run directory is named as the home
        self.recorded.sort(key=lambda x: -len(x[0]))

    def absolute(self, path: str, write: bool) -> PlanReason | None:
        """Why the normalised absolute ``path`` is outside, or None."""
        if _below(path, self.ws):
            return None
        for root, reason in self.recorded:
            if _below(path, root):
                return reason
        if _matches(path, IGNORED):
            return None
        if not write and _matches(path, IGNORED_READS):
            return None
        return PlanReason.ABSOLUTE_PATH

    def token(self, text: str, cwd: str | None, write: bool, climbed: bool = False) -> PlanReason | None:
        """Why a path word of a command (or a path argument) ``text``, relative to ``cwd`` (None:
        unknown; ``climbed``: it left the workspace by a ``..``), names a place outside; None
        when it does not or cannot be told."""
        if text.startswith("~") or _HOME_VAR.match(text):
            return PlanReason.HOME
        if "$" in text or "`" in text:
            return None  # built by the shell: not seen
        if text.startswith("/"):
            return self.absolute(posixpath.normpath(text), write)
        if cwd is None:
            return None
        if not (write or ".." in text.split("/")):
            return None  # a word, or a path below where it runs: not told apart
        path = posixpath.normpath(posixpath.join(cwd, text))
        if _below(path, self.ws):
            return None
        if _below(cwd, self.ws) or climbed:
            return PlanReason.PARENT_DIRECTORY
        return self.absolute(path, write)

    def rewritten(self, text: str) -> PlanReason | None:
        """A path argument below a recorded workspace or home (playback rewrites it to the new
        one, :class:`~pvisor.replay.playback.PathRewrites`): None when the rewrite stays below
        the new one, :attr:`PlanReason.REWRITE_LEAVES_WORKSPACE` when it would leave it. Raises
        LookupError when ``text`` lies below none (it is not rewritten)."""
        for root, _ in self.recorded:
            if text == root or text.startswith(root + "/"):
                return None if stays_below(text[len(root) :]) else PlanReason.REWRITE_LEAVES_WORKSPACE
        raise LookupError(text)

    def served(self, text: str) -> str | None:
        """What playback serves for ``text``, a path below the recorded workspace that stays
        below it: the same path below the new workspace; None below the recorded home or run
        directory (the new ones are made when the agent starts)."""
        ws = self.places.recorded_workspace
        if ws and ws.startswith("/"):
            root = posixpath.normpath(ws)
            if text == root or text.startswith(root + "/"):
                return self.ws + text[len(root) :]
        return None


# --------------------------------------------------------------------------- shell commands


def _words(command: str) -> list[str]:
    """The words and operators of ``command`` (shlex, POSIX rules; operators as their own words,
    a newline as ``\\n``; comments and heredoc bodies dropped); a command shlex cannot split
    (an unclosed quote) is split on blanks and operators, quotes dropped."""
    command = _without_comments(_without_heredocs(command))
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|<>()\n")
        lexer.whitespace = " \t\r"
        lexer.whitespace_split = True
        lexer.commenters = ""
        words = list(lexer)
    except ValueError:
        words = [w.strip("'\"") for w in re.findall(r"[;&|<>()\n]+|[^\s;&|<>()]+", command)]
    return words


def _without_comments(command: str) -> str:
    """``command`` without its comments: a ``#`` that starts a word outside quotes, to the end
    of its line (shlex would also end a word at a ``#`` inside it, which the shell does not)."""
    if "#" not in command:
        return command
    out: list[str] = []
    quote = None
    i = 0
    while i < len(command):
        c = command[i]
        if quote is None and c == "#" and (i == 0 or command[i - 1] in " \t\n;&|()"):
            end = command.find("\n", i)
            i = len(command) if end < 0 else end
            continue
        if c == "\\" and quote != "'":
            out.append(command[i : i + 2])
            i += 2
            continue
        if c in "'\"" and quote in (None, c):
            quote = None if quote == c else c
        out.append(c)
        i += 1
    return "".join(out)


def _without_heredocs(command: str) -> str:
    """``command`` without the bodies of its heredocs (their lines up to the delimiter): data
    for a program, not words of the shell."""
    if "<<" not in command:
        return command
    lines = command.split("\n")
    out: list[str] = []
    ending: list[str] = []
    for line in lines:
        if ending:
            if line.strip() == ending[0]:
                ending.pop(0)
            continue
        out.append(line)
        ending = [m.group(2) for m in _HEREDOC.finditer(line) if "<<<" not in line[m.start() : m.start() + 3]]
    return "\n".join(out)


def _is_operator(word: str) -> bool:
    return bool(word) and all(c in _OPERATOR_CHARS for c in word)


def _split_commands(words: list[str]) -> Iterator[tuple[list[str], list[tuple[str, bool]]]]:
    """Simple commands of ``words``: (its words, its redirections as (target, written))."""
    current: list[str] = []
    redirects: list[tuple[str, bool]] = []
    i = 0
    while i < len(words):
        w = words[i]
        if _is_operator(w):
            if w in _SEPARATORS or not (w in _WRITES or w in _READS or w in _NOT_FILES):
                if current or redirects:
                    yield current, redirects
                current, redirects = [], []
            elif i + 1 < len(words) and not _is_operator(words[i + 1]):
                target = words[i + 1]
                i += 1
                if w in _NOT_FILES or (w == ">&" and target.isdigit()) or target == "-":
                    pass
                else:
                    redirects.append((target, w in _WRITES))
            i += 1
            continue
        current.append(w)
        i += 1
    if current or redirects:
        yield current, redirects


def _command_words(words: list[str]) -> tuple[str | None, list[str]]:
    """(the command's name, its operands) past assignments (``X=1 cmd``) and prefix commands
    (``sudo``, ``env X=1``)."""
    rest = list(words)
    while rest:
        head = rest[0]
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", head):
            rest.pop(0)
        elif posixpath.basename(head) in PREFIX_COMMANDS and len(rest) > 1:
            rest.pop(0)
            while rest and rest[0].startswith("-"):
                rest.pop(0)
        else:
            break
    if not rest:
        return None, []
    return rest[0], rest[1:]


class _Shell:
    """Reads the commands of one argument, following ``cd``."""

    def __init__(self, judge: _Judge, found: list[tuple[str, PlanReason]], cwd: str | None):
        self.judge = judge
        self.found = found
        self.cwd = cwd
        #: the working directory left the workspace by a ``cd ..``
        self.climbed = False

    def judge_word(self, text: str, write: bool) -> PlanReason | None:
        return self.judge.token(text, self.cwd, write, self.climbed)

    def note(self, text: str, reason: PlanReason | None) -> None:
        if reason is not None:
            self.found.append((text, reason))

    def script(self, command: str) -> None:
        for words, redirects in _split_commands(_words(command)):
            self.simple(words)
            for target, written in redirects:
                self.note(target, self.judge_word(target, written))

    def argv(self, argv: list[str]) -> None:
        self.simple([a for a in argv if isinstance(a, str)])

    def simple(self, words: list[str]) -> None:
        name, operands = _command_words(words)
        if name is None:
            return
        base = posixpath.basename(name)
        if name.startswith(("/", "~", "$HOME", "${HOME}")) or ".." in name.split("/"):
            self.note(name, self.judge_word(name, False))
        if base in ("cd", "pushd"):
            self.cd([o for o in operands if not o.startswith("-") or o == "-"])
            return
        if base in SHELLS:
            script = _shell_script(operands)
            if script is not None:
                self.script(script)
                return
        paths = [o for o in operands if not (o.startswith("-") and "=" not in o)]
        paths = [o.split("=", 1)[1] if o.startswith("-") else o for o in paths]
        mode = WRITE_COMMANDS.get(base)
        for i, text in enumerate(paths):
            write = mode == "*" or (mode == "last" and i == len(paths) - 1 and len(paths) > 1)
            self.note(text, self.judge_word(text, write))

    def cd(self, operands: list[str]) -> None:
        if not operands or operands[0] == "-":
            self.cwd = None  # home, or where it was: not followed
            return
        target = operands[0]
        reason = self.judge_word(target, False)
        self.note(target, reason)
        if reason is PlanReason.PARENT_DIRECTORY:
            self.climbed = True
        if target.startswith("/") and "$" not in target:
            self.cwd = posixpath.normpath(target)
        elif self.cwd is not None and not target.startswith("~") and "$" not in target and "`" not in target:
            self.cwd = posixpath.normpath(posixpath.join(self.cwd, target))
        else:
            self.cwd = None
        if self.cwd is not None and _below(self.cwd, self.judge.ws):
            self.climbed = False


def _shell_script(operands: list[str]) -> str | None:
    """The SCRIPT of ``sh -c SCRIPT`` (``-lc``, ``-ec`` ...), or None."""
    for i, o in enumerate(operands):
        if re.fullmatch(r"-[a-z]*c[a-z]*", o) and i + 1 < len(operands):
            return operands[i + 1]
        if not o.startswith("-"):
            return None
    return None


# --------------------------------------------------------------------------- the plan


def make_plan(descriptor: Any, actions: Sequence[Action], places: Places) -> Plan:
    """The plan of serving ``actions`` (A1..AN as playback serves them, step i = ``actions[i-1]``)
    to the agent of ``descriptor`` in ``places.workspace`` (module docstring)."""
    judge = _Judge(places)
    plan = Plan(steps=len(actions))
    for n, action in enumerate(actions, start=1):
        for call in action.tool_calls:
            # a server call (``kind`` server) is judged too: a protocol without server calls
            # (Chat Completions) serves it as a function call the agent runs, and a native file
            # (an ATIF ``extra.kind``) may mark any call so; a provider's own tool (web search)
            # names no path argument or shell command of the descriptor: no item
            for argument, text, reason in _call_items(descriptor, judge, call):
                _add(plan, PlanItem(n, call.id, call.name, argument, _item_text(text), reason))
        for command in descriptor.text_commands(action):
            found: list[tuple[str, PlanReason]] = []
            _Shell(judge, found, judge.ws).script(command)
            for text, reason in found:
                _add(plan, PlanItem(n, None, "text", "command", _item_text(text), reason))
    return plan


def _add(plan: Plan, item: PlanItem) -> None:
    if item not in plan.items:  # a word named twice in one call is one item
        plan.items.append(item)


def _call_items(d: Any, judge: _Judge, call: ToolCall) -> Iterator[tuple[str, str, PlanReason]]:
    """(argument, text, reason) of what ``call`` names outside: its path arguments (a shell
    tool's is its working directory, where the relative paths of its command start), then the
    words of its command."""
    args = call.arguments
    yield from _patch_items(d, judge, call, args if isinstance(args, dict) else {})
    if not isinstance(args, dict):
        yield from _unparsed_items(d, judge, call)
        return
    shell_args = d.shell_tools.get(call.name, ())
    read_only = call.name in d.read_tools or bool(shell_args)
    cwd: str | None = judge.ws
    for name in d.path_arguments.get(call.name, ()):
        value = args.get(name)
        if not isinstance(value, str) or not value:
            continue
        try:
            reason = judge.rewritten(value)
            served = judge.served(value) if reason is None else value
        except LookupError:
            reason = judge.token(value, judge.ws, not read_only)
            served = value
        if reason is not None:
            yield name, value, reason
        if shell_args:
            cwd = _directory(judge.ws, served)
    for name in shell_args:
        value = args.get(name)
        found: list[tuple[str, PlanReason]] = []
        shell = _Shell(judge, found, cwd)
        if isinstance(value, str):
            shell.script(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            shell.argv(value)
        for text, reason in found:
            yield name, text, reason


#: a string literal of arguments that are not JSON (double or single quotes)
_LITERAL = re.compile(r""""((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'""")


def _unparsed_items(d: Any, judge: _Judge, call: ToolCall) -> Iterator[tuple[str, str, PlanReason]]:
    """What the arguments of a shell or path tool's call name outside when they are no JSON
    object (a trailing comma, single quotes): an agent may repair and run them (Qwen Code's
    ``jsonrepair``), so each string literal of the text is read as a command, best effort
    (argument ``arguments``)."""
    if call.name not in d.shell_tools and call.name not in d.path_arguments:
        return
    for m in _LITERAL.finditer(call.arguments_raw or ""):
        found: list[tuple[str, PlanReason]] = []
        _Shell(judge, found, judge.ws).script(m.group(1) if m.group(1) is not None else m.group(2))
        for text, reason in found:
            yield "arguments", text, reason


def _patch_items(d: Any, judge: _Judge, call: ToolCall, args: dict) -> Iterator[tuple[str, str, PlanReason]]:
    """What a patch call (the descriptor's ``patch`` effect: Codex's and OpenCode's
    ``apply_patch``) names outside: every file it adds, deletes, updates or moves to, read from
    the patch text (its argument, or a free-form call's whole input)."""
    fx = d.effect_of(call.name)
    if fx.effect is not Effect.PATCH:
        return
    key = fx.arg(Role.PATCH)
    text = args.get(key) if key else (args.get("input") if args else call.arguments_raw)
    ops = patch_operations(text) if isinstance(text, str) else None
    for _kind, path, arg in ops or ():
        paths = [path] + ([arg[0]] if isinstance(arg, tuple) and arg[0] else [])
        for p in paths:
            reason = judge.token(p, judge.ws, True)
            if reason is not None:
                yield "patch", p, reason


def _directory(ws: str, path: str | None) -> str | None:
    """The working directory ``path`` names (relative to the workspace ``ws``), or None when
    it cannot be told (``~``, a variable, a place whose new name is not known yet)."""
    if path is None or path.startswith("~") or "$" in path or "`" in path:
        return None
    return posixpath.normpath(posixpath.join(ws, path))


def plan_for(rec: Any, after_step: int, descriptor: Any, workspace: str) -> Plan:
    """The plan of replaying recording ``rec`` (:class:`~pvisor.replay.recording.Recording`)
    through step ``after_step`` in ``workspace``: its actions as playback serves them (the
    descriptor's ``reply_action``), the recorded workspace, home and run directory."""
    actions = [descriptor.reply_action(rec.protocol, s.action) for s in rec.steps[:after_step]]
    places = Places(workspace, rec.workspace, rec.home, rec.run_dir)
    return make_plan(descriptor, actions, places)
