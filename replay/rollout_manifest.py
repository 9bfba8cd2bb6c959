"""A manifest of rollouts: ``pvisor replay --batch MANIFEST`` without ``--prepare-only``
(docs/result-protocol.md "Rollouts from a manifest").

The manifest is JSON Lines, one object per rollout. Each line is read into a
:class:`RolloutLine` (picklable: it goes to a worker process or a Ray task as it is) or into the
error that says why it is none (:func:`read_rollouts`); nothing is run, opened or written here.
A line's keys:

- ``mode``: a :class:`RolloutMode` value (default: the caller's, ``continuation`` for ``pvisor
  replay --batch``, ``replay-only`` with ``--replay-only``);
- the source: ``run`` (a journal run; ``journal`` optional) or ``trajectory`` (a native file,
  with ``agent``); ``agent`` (default: the journal run's), ``after_step`` (the boundary N);
- for a handoff: ``to_agent`` (required), ``source_reasoning``, ``strict_workspace``,
  ``reset_to_pause``, ``replay_only`` (end the next agent at its request N+1);
- ``key_file``: a file of ``NAME=VALUE`` lines on the machine that runs the rollout, read when it
  starts and added to the agent's environment (keys never travel in a line);
- ``name``: the rollout's output directory's name (default: the line number, six digits);
- every replay option a replay.toml takes (:data:`~pvisor.replay.spec.OPTIONS`, under its
  replay.toml key: ``upstream``, ``max_steps``, ``workspace``, ``timeout``,
  ``boundary_user_prompt``, ``live_model``, ``task``, ``sandbox``, ...) and ``entrypoint`` and
  ``model``, each for the modes its option is for.

Relative paths are taken from the manifest's directory. A line that is not such an object fails
alone with the code ``bad_manifest_line`` and its line number; so does a line holding a
key-shaped value anywhere (the key of the line is named, the value never shown).
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from pvisor.adapters.agents import descriptor_names
from pvisor.core.errors import PvisorError
from pvisor.gateway.routing import USERINFO_REFUSED, has_userinfo
from pvisor.journal.redact import has_key_shape

from .batch import MAX_NAME_BYTES, MAX_PATH_BYTES, MAX_VALUE_CHARS, read_manifest
from .errors import ReplayUsageError, show_path
from .spec import OPTIONS, Kind, Option, ReplayMode


class RolloutMode(str, enum.Enum):
    """What one manifest line does."""

    PREPARE_ONLY = "prepare-only"  #: the prefix alone, in the caller's process (nothing runs)
    REPLAY_ONLY = "replay-only"  #: the agent re-runs steps 1..N and is ended at request N+1
    CONTINUATION = "continuation"  #: replay through step N, then the live model
    HANDOFF = "handoff"  #: another agent (``to_agent``) takes over after step N, then the live model

    @property
    def replay_mode(self) -> ReplayMode:
        """The :class:`~pvisor.replay.spec.ReplayMode` whose options the line takes (a handoff
        continues live: a continuation's)."""
        if self is RolloutMode.PREPARE_ONLY:
            return ReplayMode.PREPARE_ONLY
        return ReplayMode.REPLAY_ONLY if self is RolloutMode.REPLAY_ONLY else ReplayMode.CONTINUE


@dataclass(frozen=True)
class RolloutLine:
    """One rollout of a manifest (module docstring). ``index``: the manifest's line number;
    ``name``: its output directory's name; paths absolute (from the manifest's directory);
    ``journal``: the line's own journal, else the caller's for a ``run`` line, else None;
    ``timeout`` seconds (None: the replay's default); ``options``: the other replay options the
    line gave, by option name (:data:`~pvisor.replay.spec.OPTIONS`: ``boundary_prompt``,
    ``live_model``, ...; a handoff's ``source_reasoning``, ``strict_workspace``,
    ``reset_to_pause``, ``replay_only``). Holds no key: ``key_file`` names where the rollout reads them."""

    index: int
    name: str
    mode: RolloutMode
    agent: str | None
    to_agent: str | None
    run: str | None
    trajectory: Path | None
    journal: Path | None
    after_step: int
    upstream: str | None = None
    max_steps: int | None = None
    workspace: Path | None = None
    key_file: Path | None = None
    timeout: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


#: the line keys that are RolloutLine's own fields or a handoff's, with their types
_OWN: dict[str, tuple[type, ...]] = {
    "mode": (str,),
    "name": (str,),
    "journal": (str,),
    "key_file": (str,),
    "to_agent": (str,),
    "source_reasoning": (str,),
    "strict_workspace": (bool,),
    "reset_to_pause": (bool,),
    "replay_only": (bool,),
}
#: the handoff's own keys (refused in another mode)
_HANDOFF_ONLY = ("to_agent", "source_reasoning", "strict_workspace", "reset_to_pause", "replay_only")
_SOURCE_REASONING = ("drop", "text", "keep")  # SourceReasoning's values (its module reads sources)
#: replay options a line never gives: the batch's own (output, journal, mode, force), one run's
#: alone (a handoff's pending child run, another run's start snapshot)
_NOT_PER_LINE = frozenset({"output", "journal", "mode", "force", "child_run", "workspace_from", "config"})
#: options without a replay.toml key that a line gives by name
_BY_NAME = ("entrypoint", "model", "episode")
#: the RolloutLine fields that are options (the rest go to ``options``)
_FIELDS = ("agent", "run", "trajectory", "after_step", "upstream", "max_steps", "workspace", "timeout")
_TYPES: dict[str, tuple[type, ...]] = {
    Kind.STEP: (int,),
    Kind.COUNT: (int,),
    Kind.SECONDS: (int, float),
    Kind.CPUS: (int, float, str),
    Kind.FLAG: (bool,),
    Kind.PATHS: (list,),
    Kind.SIZE: (str, int),
}


def line_options() -> dict[str, Option]:
    """The replay options a line may give, by their line key (replay.toml's, else the name)."""
    keys: dict[str, Option] = {}
    for o in OPTIONS:
        key = o.toml or (o.name if o.name in _BY_NAME else None)
        if key is not None and o.name not in _NOT_PER_LINE:
            keys[key] = o
    return keys


_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def in_line_keys(text: str) -> str:
    """``text`` (a replay's message, which names the command line's flags: ``--after-step 99``,
    ``give --agent-entrypoint PATH``) with each flag a line may give as its line's key
    (``after_step 99``, ``give entrypoint PATH``): how a row and the batch's stderr speak of a
    line. The flags no line gives (``--output``, ``--force``) stay as they are."""
    keys = {o.flag: key for key, o in line_options().items() if o.flag}
    keys.update({"--" + k.replace("_", "-"): k for k in _OWN})
    return _FLAG.sub(lambda m: keys.get(m.group(0), m.group(0)), text)


def read_rollouts(
    manifest: Path, *, journal: Path | None, default_mode: RolloutMode
) -> Iterator[tuple[int, RolloutLine | PvisorError]]:
    """(line number, its :class:`RolloutLine` or the ``bad_manifest_line`` error that says why
    it is none) for each non-blank line of ``manifest``, in order. ``journal``: the journal of
    the ``run`` lines that name none (None: the caller's default). Two lines of one ``name`` (one
    output directory), or whose workspaces are one directory or one inside the other (two
    agents at once in one directory): the second fails, naming the first. Raises
    ReplayUsageError when the file cannot be opened; reads nothing else."""
    keys = line_options()
    names: dict[str, int] = {}
    spaces: list[tuple[int, Path]] = []  # (line, its workspace) of the lines that give one
    for n, obj in read_manifest(manifest):
        if isinstance(obj, PvisorError):
            yield n, obj
            continue
        try:
            line = _line(obj, n, manifest, journal, default_mode, keys)
        except PvisorError as exc:
            yield n, exc
            continue
        first = names.setdefault(line.name, n)
        if first != n:
            yield n, bad_line(manifest, n, f"name {line.name!r} is line {first}'s already")
            continue
        if line.workspace is not None:
            shared = overlap(line.workspace, [(ws, f"line {m}'s workspace") for m, ws in spaces])
            if shared is not None:  # two agents at once in one directory would see each other's files
                yield n, bad_line(manifest, n, f"workspace {show_path(line.workspace)} {shared}")
                continue
            spaces.append((n, line.workspace))
        yield n, line


def overlap(path: Path, others: list[tuple[Path, str]]) -> str | None:
    """How ``path`` meets the first of ``others`` (directory, what it is) that it is, lies in or
    holds (after symbolic links): ``is line 2's workspace``, ``is inside ...``, ``holds ...``;
    None when it meets none."""
    real = Path(os.path.realpath(path))
    for other, what in others:
        there = Path(os.path.realpath(other))
        if real == there:
            return f"is {what}"
        if there in real.parents:
            return f"is inside {what} ({show_path(other)})"
        if real in there.parents:
            return f"holds {what} ({show_path(other)})"
    return None


def bad_line(manifest: Path, n: int, what: str) -> ReplayUsageError:
    """The ``bad_manifest_line`` error of line ``n``: ``MANIFEST line N: what``."""
    return ReplayUsageError("bad_manifest_line", f"{show_path(manifest)} line {n}: {what}")


def refused_value(values: Mapping[str, Any]) -> str | None:
    """Why ``values`` (a rollout line's, by key: a manifest line's object, or ``continue_many``'s
    keywords) cannot travel in a line, naming the key and never the value: a key-shaped token in
    a key or in a value (a string or path, or one of a list's), or a URL option (``upstream``)
    holding user info. None when they can. Checked before anything is sent or shown."""
    urls = {k for o in OPTIONS if o.kind == Kind.URL for k in (o.name, o.toml, o.api) if k}
    for key, value in values.items():
        if has_key_shape(key):
            return "a key of the line holds a key-shaped token (not shown)"
        items = value if isinstance(value, (list, tuple)) else [value]
        texts = [os.fspath(v) for v in items if isinstance(v, (str, os.PathLike))]
        if any(isinstance(v, str) and has_key_shape(v) for v in texts):
            return (
                f"{key} holds a key-shaped token (not shown): keys never travel in a rollout line; give "
                "key_file, a file of NAME=VALUE lines on the machine that runs the rollout"
            )
        if key in urls and any(isinstance(v, str) and has_userinfo(v) for v in texts):
            return f"{key}: {USERINFO_REFUSED} (a line's: key_file)"
    return None


def _refuse_keys(obj: Mapping[str, Any], n: int, manifest: Path) -> None:
    """A key-shaped token in a key or a value, or user info in a URL, fails the line
    (:func:`refused_value`): before any message could show a value."""
    why = refused_value(obj)
    if why is not None:
        raise bad_line(manifest, n, why)


#: a JSON value's type in words, for a message
_WORDS: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "an object",
}


def _check_value(key: str, value: Any, types: tuple[type, ...], n: int, manifest: Path) -> None:
    if value is None:
        return
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        wanted = " or ".join(_WORDS[t] for t in types if not (t is int and float in types))
        raise bad_line(manifest, n, f"{key}: expected {wanted}, got {_WORDS.get(type(value), 'an object')}")
    strings = value if isinstance(value, list) else [value]
    for v in strings:
        if isinstance(value, list) and not isinstance(v, str):
            raise bad_line(manifest, n, f"{key}: expected a list of strings")
        if isinstance(v, str):
            limit = MAX_PATH_BYTES if key in _PATHS else MAX_VALUE_CHARS
            if len(v.encode("utf-8", "surrogatepass")) > limit:
                raise bad_line(manifest, n, f"{key}: {len(v)} characters, at most {limit} bytes")
            if "\0" in v or (key not in _PATHS and any(ord(c) < 0x20 or ord(c) == 0x7F for c in v)):
                raise bad_line(manifest, n, f"{key}: holds a control character")


#: keys whose values are paths (from the manifest's directory when relative)
_PATHS = frozenset({"trajectory", "journal", "workspace", "key_file", "entrypoint", "sandbox_allow"})


def _check_option(key: str, o: Option, value: Any, n: int, manifest: Path) -> None:
    """A value of the replay option ``o`` checked as its kind says (module docstring)."""
    _check_value(key, value, _TYPES.get(o.kind, (str,)), n, manifest)
    if value is None:
        return
    if o.kind == Kind.CHOICE and value not in o.choices:
        raise bad_line(manifest, n, f"{key}: expected one of {', '.join(o.choices)}")
    if o.kind == Kind.AGENT and value not in descriptor_names():
        raise bad_line(manifest, n, f"{key}: not an agent pvisor knows ({', '.join(descriptor_names())})")
    if o.kind == Kind.STEP and (isinstance(value, float) or value < 0):
        raise bad_line(manifest, n, f"{key}: expected a step number >= 0")
    if o.kind == Kind.COUNT and value < 1:
        raise bad_line(manifest, n, f"{key}: expected a count >= 1")
    if o.kind == Kind.SECONDS and not value > 0:
        raise bad_line(manifest, n, f"{key}: expected a number of seconds > 0")
    if o.kind == Kind.URL and not value.startswith(("http://", "https://")):
        raise bad_line(manifest, n, f"{key}: expected an http:// or https:// URL")
    if o.kind == Kind.URL and has_userinfo(value):
        raise bad_line(manifest, n, f"{key}: {USERINFO_REFUSED} (a line's: key_file)")


def _line(
    obj: Mapping[str, Any],
    n: int,
    manifest: Path,
    journal: Path | None,
    default_mode: RolloutMode,
    keys: dict[str, Option],
) -> RolloutLine:
    """The :class:`RolloutLine` of the object ``obj`` of line ``n`` (module docstring)."""
    _refuse_keys(obj, n, manifest)
    for key, value in obj.items():
        if key in _OWN:
            _check_value(key, value, _OWN[key], n, manifest)
        elif key in keys:
            _check_option(key, keys[key], value, n, manifest)
        else:
            raise bad_line(manifest, n, f"unknown key {key!r}; expected some of {', '.join([*_OWN, *keys])}")
    try:
        mode = RolloutMode(obj["mode"]) if obj.get("mode") is not None else default_mode
    except ValueError:
        raise bad_line(
            manifest, n, f"mode: expected one of {', '.join(m.value for m in RolloutMode)}"
        ) from None
    given = {k: v for k, v in obj.items() if v is not None and v is not False}
    # a handoff's replay_only ends the next agent at its request N+1: a replay-only's options
    options_mode = ReplayMode.REPLAY_ONLY if obj.get("replay_only") is True else mode.replay_mode
    for key in given:
        o = keys.get(key)
        if o is not None and options_mode not in o.modes:
            what = "replay-only handoff" if options_mode is not mode.replay_mode else mode.value
            raise bad_line(manifest, n, f"{key} is not for a {what} line")
        if key in _HANDOFF_ONLY and mode is not RolloutMode.HANDOFF:
            raise bad_line(manifest, n, f"{key} is for a handoff line (mode handoff)")
    if obj.get("after_step") is None:
        raise bad_line(manifest, n, "no after_step")
    if (obj.get("trajectory") is None) == (obj.get("run") is None):
        raise bad_line(manifest, n, "give exactly one of trajectory and run")
    if mode is RolloutMode.HANDOFF and obj.get("to_agent") is None:
        raise bad_line(manifest, n, "a handoff line needs to_agent (the agent that takes over)")
    if obj.get("to_agent") is not None and obj["to_agent"] not in descriptor_names():
        raise bad_line(manifest, n, f"to_agent: not an agent pvisor knows ({', '.join(descriptor_names())})")
    if obj.get("source_reasoning") is not None and obj["source_reasoning"] not in _SOURCE_REASONING:
        raise bad_line(manifest, n, f"source_reasoning: expected one of {', '.join(_SOURCE_REASONING)}")
    if mode is RolloutMode.PREPARE_ONLY and obj.get("agent") is None:
        raise bad_line(manifest, n, "no agent (a prepare-only line names the agent whose request it writes)")
    if obj.get("name") == "":
        raise bad_line(
            manifest, n, "name is empty: give a directory name, or leave the key out (the line number)"
        )
    name = obj.get("name") or f"{n:06d}"
    if name in (".", "..") or "/" in name or "\\" in name:
        raise bad_line(manifest, n, f"name {name!r}: one directory name, not a path")
    if len(os.fsencode(name)) > MAX_NAME_BYTES:
        raise bad_line(manifest, n, f"name: a directory name has at most {MAX_NAME_BYTES} bytes")
    base = manifest.parent.absolute()

    def path(value: Any) -> Any:
        if value is None:
            return None
        p = Path(value)
        return p if p.is_absolute() else base / p

    options: dict[str, Any] = {}
    for key, value in obj.items():
        o = keys.get(key)
        if value is None or key in _FIELDS or o is None:
            continue
        if key == "entrypoint" and "/" in value:  # a bare name is looked up on PATH
            value = str(path(value))
        elif key == "sandbox_allow":
            value = [str(path(v)) for v in value]
        options[o.name] = value
    options.update({k: obj[k] for k in _HANDOFF_ONLY[1:] if obj.get(k) is not None})
    return RolloutLine(
        index=n,
        name=name,
        mode=mode,
        agent=obj.get("agent"),
        to_agent=obj.get("to_agent"),
        run=obj.get("run"),
        trajectory=path(obj.get("trajectory")),
        journal=path(obj.get("journal")) or (journal if obj.get("run") is not None else None),
        after_step=obj["after_step"],
        upstream=obj.get("upstream"),
        max_steps=obj.get("max_steps"),
        workspace=path(obj.get("workspace")),
        key_file=path(obj.get("key_file")),
        timeout=float(obj["timeout"]) if obj.get("timeout") is not None else None,
        options=options,
    )


__all__ = [
    "RolloutLine",
    "RolloutMode",
    "bad_line",
    "in_line_keys",
    "line_options",
    "overlap",
    "read_rollouts",
    "refused_value",
]
