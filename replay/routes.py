"""A handoff's routes to agent B's own tools: a source call's effect and arguments as a call of
the tool B declared for that effect in its request 1, or None (then :mod:`pvisor.replay.
translate` reproduces it through B's shell, or renders it as text).

- **read** -> B's read tool, a line range converted between ``offset``/``limit`` (each tool's
  ``offset_base``: Claude Code and OpenCode count from 1, Qwen Code from 0) and
  ``start_line``/``end_line`` (Gemini CLI, 1-based, the last included); None when B's tool cannot
  say the range (Qwen Code takes an offset only with a limit);
- **write** -> B's write tool with the whole content (a tool argument is not an ``execve``
  argument: the 128 KiB cap that makes the shell write go in parts does not apply);
- **edit** -> B's edit tool (Gemini CLI's ``replace`` with its required ``instruction`` from the
  source's own words for the step, else a sentence naming the file and the change); an edit with
  no old text creates the file: B's write tool; replace-all only where B's tool takes it;
- **plan** -> a todo list to B's todo tool (:class:`~pvisor.adapters.agents.effects.TodoShape`:
  the task, its status mapped into the statuses B's tool takes, what B's items need more); a
  goal call only to B's goal tool of the same name, with the arguments B's tool declares;
- a patch is not routed (no pinned agent declares ``apply_patch`` through pvisor's provider);
  a subagent's own steps are not re-enacted (:data:`SUBAGENT_REASON`).

:class:`SessionFiles` keeps what B's translated session has read and changed so far, for the
agents whose edit and write tools refuse a file not read first (``reads_before_change`` of the
descriptor): a read is served first when the file was not read whole, or may have changed since.

Pure: no file, process or socket (whether a file exists at the start is asked of the
``exists`` the caller gives).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Mapping
from typing import Any

from pvisor.adapters.agents.effects import Effect, PlanKind, Role, TodoShape, ToolEffect
from pvisor.journal.model import ToolSpec

#: why a subagent call is rendered, not re-enacted (the account's reason)
SUBAGENT_REASON = (
    "a subagent call is rendered with its recorded result; re-enacting the subagent's own steps in "
    "the next agent's subagent tool is not part of this handoff"
)
#: the account's reason of a call routed to B's own tool of the same kind starts with this
NATIVE = "native"
#: the largest line number a read tool's schema takes (JavaScript's largest exact integer)
_MAX_LINE = 2**53 - 1


@dataclass(frozen=True)
class Route:
    """B's call of its own tool: ``tool``, ``args``, the ``effect`` it has, the absolute
    ``path`` it reads or changes in B's workspace (None for a plan), ``whole`` (a read of the
    whole file), ``how`` (the account's reason, starting with :data:`NATIVE`)."""

    tool: str
    args: dict[str, Any]
    effect: Effect
    path: str | None
    whole: bool
    how: str


def _declared(spec: ToolSpec | None) -> set[str] | None:
    """The argument names B's tool declares (None: its schema names none it could check)."""
    params = spec.parameters if spec is not None else None
    props = params.get("properties") if isinstance(params, dict) else None
    return set(props) if isinstance(props, dict) else None


def _short(text: str) -> str:
    line = text.strip().split("\n", 1)[0]
    return repr(line if len(line) <= 60 else line[:57] + "...")


class Routes:
    """B's tools by effect among those it declared (``specs``: name -> spec; ``tool_kind``: the
    protocol's ``function`` or other kind of a spec), read through B's ``descriptor``."""

    def __init__(
        self, descriptor: Any, specs: Mapping[str, ToolSpec], tool_kind: Callable[[ToolSpec], str]
    ) -> None:
        self.d, self.specs, self.kind = descriptor, specs, tool_kind
        # a reader of images only (Codex ``view_image``) never reads text: replay/source_images.py
        self.reader = self._pick(lambda fx: fx.effect is Effect.READ, descriptor.image_only_readers)
        self.writer = self._pick(lambda fx: fx.effect is Effect.WRITE)
        self.editor = self._pick(lambda fx: fx.effect is Effect.EDIT)
        self.todo = self._pick(lambda fx: fx.plan is PlanKind.TODO and fx.todo is not None)

    def _pick(self, want: Callable[[ToolEffect], bool], never: frozenset[str] = frozenset()) -> str | None:
        """B's first declared function tool (in its facts' order) whose effect is wanted, not
        one of ``never``."""
        for name, fx in self.d.tool_effects.items():
            if name in never or name not in self.specs:
                continue
            if want(fx) and self.kind(self.specs[name]) == "function":
                return name
        return None

    def _takes(self, tool: str, *names: str | None) -> bool:
        """Whether B's ``tool`` declares every argument of ``names`` (a None name: not)."""
        have = _declared(self.specs.get(tool))
        return all(n is not None and (have is None or n in have) for n in names)

    # -- read

    def read(self, path: str, first: int | None, last: int | None) -> Route | None:
        """B's read of ``path`` (absolute in B's workspace), lines ``first``..``last`` (1-based,
        included; None: from the start, to the end), or None when B has no read tool or its
        tool cannot say the range."""
        tool = self.reader
        if tool is None:
            return None
        fx = self.d.effect_of(tool)
        args: dict[str, Any] = {fx.arg(Role.PATH) or "path": path}
        whole = first is None and last is None
        if not whole:
            start = first or 1
            if not 1 <= start <= (last if last is not None else _MAX_LINE) <= _MAX_LINE:
                return None  # no line range of a file (negative, reversed, past a JSON integer)
            if not self._range(fx, tool, args, start, last):
                return None
        how = f"{NATIVE} read" + ("" if whole else f" of lines {first or 1}..{'' if last is None else last}")
        return Route(tool, args, Effect.READ, path, whole, how)

    def _range(self, fx: ToolEffect, tool: str, args: dict[str, Any], first: int, last: int | None) -> bool:
        """Lines ``first``..``last`` as B's read tool's arguments, put in ``args``; False when
        the tool cannot say them."""
        start, end = fx.arg(Role.START), fx.arg(Role.END)
        if start is not None:
            if not self._takes(tool, start) or (last is not None and not self._takes(tool, end)):
                return False
            args[start] = first
            if last is not None:
                args[end or ""] = last
            return True
        offset, limit = fx.arg(Role.OFFSET), fx.arg(Role.LIMIT)
        if not self._takes(tool, offset) or (last is None and fx.needs_limit):
            return False
        if last is not None and not self._takes(tool, limit):
            return False
        args[offset or ""] = first - 1 + fx.offset_base
        if last is not None:
            args[limit or ""] = last - first + 1
        return True

    # -- write and edit

    def write(self, path: str, content: str, how: str = f"{NATIVE} write") -> Route | None:
        """B's write of ``content`` as the whole file ``path``, or None."""
        tool = self.writer
        if tool is None:
            return None
        fx = self.d.effect_of(tool)
        if not self._takes(tool, fx.arg(Role.PATH), fx.arg(Role.CONTENT)):
            return None
        args = {fx.arg(Role.PATH) or "": path, fx.arg(Role.CONTENT) or "": content}
        return Route(tool, args, Effect.WRITE, path, True, how)

    def edit(self, path: str, rel: str, old: str, new: str, every: bool, words: str | None) -> Route | None:
        """B's replacement of ``old`` by ``new`` in ``path`` (``rel``: as the workspace names it;
        ``every``: each occurrence; ``words``: the source's own words for the step), or None."""
        if old == "":  # an edit with no old text creates the file (each agent's edit tool)
            return self.write(path, new, f"{NATIVE} write (an edit with no old text creates the file)")
        tool = self.editor
        if tool is None:
            return None
        fx = self.d.effect_of(tool)
        if not self._takes(tool, fx.arg(Role.PATH), fx.arg(Role.OLD), fx.arg(Role.NEW)):
            return None
        args: dict[str, Any] = {
            fx.arg(Role.PATH) or "": path,
            fx.arg(Role.OLD) or "": old,
            fx.arg(Role.NEW) or "": new,
        }
        if every:
            if not self._takes(tool, fx.arg(Role.ALL)):
                return None
            args[fx.arg(Role.ALL) or ""] = True
        said = fx.arg(Role.INSTRUCTION)
        if said is not None and self._takes(tool, said):
            args[said] = words or f"In {rel}, replace {_short(old)} with {_short(new)}."
        return Route(tool, args, Effect.EDIT, path, True, f"{NATIVE} edit")

    # -- plan

    def plan(self, fx: ToolEffect, name: str, args: dict[str, Any]) -> Route | None:
        """B's todo tool for a todo list, B's goal tool of the same name for a goal call; None."""
        if fx.plan is PlanKind.TODO and fx.todo is not None and self.todo is not None:
            items = _todo_items(fx, args)
            if items is None:
                return None
            tfx = self.d.effect_of(self.todo)
            shape = tfx.todo
            key = tfx.arg(Role.TODOS)
            if shape is None or key is None or not self._takes(self.todo, key):
                return None
            todos = [_todo_item(shape, *item) for item in items]
            return Route(self.todo, {key: todos}, Effect.PLAN, None, True, f"{NATIVE} todo list")
        if fx.plan is PlanKind.GOAL and name in self.specs and self.d.effect_of(name).plan is PlanKind.GOAL:
            if self.kind(self.specs[name]) != "function":
                return None
            have = _declared(self.specs[name])
            kept = {k: v for k, v in args.items() if have is None or k in have}
            return Route(name, kept, Effect.PLAN, None, True, f"{NATIVE} goal")
        return None

    def plan_reason(self, fx: ToolEffect, name: str) -> str:
        """Why a plan call of the source stays text (no route, or B's schema refuses it)."""
        b = self.d.name
        if fx.plan is PlanKind.TODO:
            goals = sorted(
                n for n, f in self.d.tool_effects.items() if f.plan is PlanKind.GOAL and n in self.specs
            )
            if self.todo is None and goals:
                only = ", ".join(goals)
                return f"a todo list is not a goal: {b} declared no todo tool, only goal tools ({only})"
            if self.todo is None:
                return f"{b} declared no todo tool in its request 1"
            return f"the todo list does not convert into {b}'s {self.todo}"
        if fx.plan is PlanKind.GOAL:
            return f"a goal goes only to a goal tool of the same name: {b} declared no usable {name}"
        return "a call of kind plan is not re-run"


def _todo_items(fx: ToolEffect, args: dict[str, Any]) -> list[tuple[str, str, str | None]] | None:
    """A source todo call's items: (task, status, task as being done or None); None when the
    list is not one of items its shape reads."""
    shape, key = fx.todo, fx.arg(Role.TODOS)
    items = args.get(key or "")
    if shape is None or not isinstance(items, list):
        return None
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get(shape.text), str):
            return None
        status = item.get(shape.status)
        active = item.get(shape.active) if shape.active else None
        out.append(
            (
                item[shape.text],
                status if isinstance(status, str) else "pending",
                active if isinstance(active, str) else None,
            )
        )
    return out


#: a status B's todo tool does not take -> the nearest it does (the item's text then names the
#: source's status): a cancelled task is no longer to be done, a blocked one still is
_NEAREST = {"cancelled": "completed", "blocked": "pending"}


def _todo_item(shape: TodoShape, text: str, status: str, active: str | None) -> dict[str, Any]:
    """One item in B's todo tool's shape, its status one B's tool takes."""
    mine = status if status in shape.statuses else _NEAREST.get(status, "pending")
    if mine != status:
        text = f"{text} ({status})"
    item: dict[str, Any] = {shape.text: text, shape.status: mine}
    if shape.active:
        item[shape.active] = active or text
    for key, default in shape.fill:
        item[key] = default
    return item


class SessionFiles:
    """What B's translated session has done to files so far (absolute paths in B's workspace),
    for an agent whose edit and write tools want a read first: ``fresh`` (read whole, or written
    by B's own tool, and not possibly changed since), what the translation knows exists or not,
    and whether a call of unknown effect (a shell command) ran. ``exists``: whether a path
    exists in B's workspace at the start (None: unknown)."""

    def __init__(self, exists: Callable[[str], bool] | None) -> None:
        self.exists = exists
        self.fresh: set[str] = set()
        self.present: dict[str, bool] = {}
        self.opaque = False
        #: in the source step being translated: a call of unknown effect, paths changed by shell
        self.step_opaque = False
        self.step_changed: set[str] = set()

    def read(self, path: str, whole: bool) -> None:
        if whole:  # a partial view does not count (Claude Code; Qwen Code for an overwrite)
            self.fresh.add(path)

    def native_change(self, path: str) -> None:
        """B's own edit or write tool changed ``path``: it knows the content it left."""
        self.fresh.add(path)
        self.present[path] = True

    def shell_change(self, path: str, present: bool = True) -> None:
        """A shell call of the translation's own changed ``path``."""
        self.fresh.discard(path)
        self.present[path] = present
        self.step_changed.add(path)

    def shell(self) -> None:
        """A call of unknown effect ran: any file may have changed, appeared or gone."""
        self.opaque = self.step_opaque = True
        self.fresh.clear()

    def next_step(self) -> None:
        self.step_opaque = False
        self.step_changed = set()

    def absent(self, path: str, before: bool | None = None) -> bool:
        """Whether ``path`` surely does not exist in B's workspace at this point: what the
        translation made of it, else ``before`` (whether it existed in the source's workspace
        before the source step, from its snapshots; None: unknown), else whether B's workspace
        held it at the start and no call of unknown effect ran since."""
        if path in self.present:
            return not self.present[path]
        if before is not None:
            return not before
        if self.opaque or self.exists is None:
            return False
        return not self.exists(path)

    def needs_read(self, path: str, before: bool | None = None) -> bool:
        """Whether B must read ``path`` before its own tool changes it (``before``: as for
        :meth:`absent`)."""
        return path not in self.fresh and not self.absent(path, before)

    def can_read_first(self, path: str) -> bool:
        """Whether a read served before the step keeps ``path`` fresh up to the change: no
        call earlier in the step may have changed it."""
        return not self.step_opaque and path not in self.step_changed
