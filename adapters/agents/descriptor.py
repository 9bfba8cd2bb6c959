"""Agent descriptors: every fact about one agent that the rest of pvisor needs, in one place.

A **descriptor** (one per agent; the subclasses live in this package, one module each) says
which wire protocols the agent speaks, how it lays its history out on the wire (the ``wire_*``
methods, markers such as Anthropic ``cache_control`` and Gemini CLI's placeholder signature),
and what playback meets when it re-runs the agent: the context parts that change from run to
run (:attr:`AgentDescriptor.volatile_patterns`), the decorations of its tool output
(:attr:`AgentDescriptor.output_decorations`), the tool arguments that hold absolute paths
(:attr:`AgentDescriptor.path_arguments`), how to recover the task from a recorded command line
(:meth:`AgentDescriptor.task_from_argv`) or from its first request
(:meth:`AgentDescriptor.task_from_request`), and the synthetic final reply that ends it
(:meth:`AgentDescriptor.final_reply`). Code elsewhere asks the descriptor; it never branches on
an agent's name.

A descriptor may have no launch profile (OpenHands, SWE-agent: pvisor reads their trajectories
but does not start them); the six agents ``pvisor run`` starts are
:class:`~pvisor.adapters.agents.base.AgentProfile` subclasses, descriptors with a launch plan.

Sources: the verified notes of this project on each agent (what they send and save, checked on
the real captures of the tests and the corpus); docs/agents.md documents the facts per agent.
Light on purpose (standard library, orjson, the canonical model): prepare-only imports it.
"""

from __future__ import annotations

from typing import Any

from pvisor.journal.model import Action, Conversation, Message, TextPart, ToolCall, ToolResult
from pvisor.core.lazyre import LazyPattern
from pvisor.core.record import FrozenRecord

from .effects import Effect, ToolEffect

#: the text of the synthetic final reply (no tool call) that ends an agent at request N+1
FINAL_TEXT = "pvisor: the replay ends here."


class ChainHint:
    """A tie-break hint of the chain rule, usable as ``prefer``: a chain is preferred when its
    first request has every tool named in ``tools`` and (if given) a system prompt starting with
    ``system_prefix``. ``subagent_tools``: the agent's tools that start a subagent (a chain
    whose first request holds such a call's prompt is never the main one: chains.py). An
    :class:`AgentDescriptor` fills them in from its :attr:`~AgentDescriptor.tool_effects`.
    (A plain class: descriptors are imported on the fast prepare-only path.)"""

    __slots__ = ("subagent_tools", "system_prefix", "tools")

    def __init__(
        self,
        tools: frozenset[str] = frozenset(),
        system_prefix: str | None = None,
        subagent_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.tools = frozenset(tools)
        self.system_prefix = system_prefix
        self.subagent_tools = frozenset(subagent_tools)

    def __call__(self, conv: Conversation) -> bool:
        from pvisor.adapters.protocols import get_protocol

        names = (
            {t.name for t in get_protocol(conv.protocol).offered_tools(conv)}
            if conv.protocol
            else {t.name for t in conv.tools}
        )
        if not self.tools <= names:
            return False
        return self.system_prefix is None or (conv.system or "").startswith(self.system_prefix)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChainHint) and (self.tools, self.system_prefix, self.subagent_tools) == (
            other.tools,
            other.system_prefix,
            other.subagent_tools,
        )

    def __hash__(self) -> int:
        return hash((self.tools, self.system_prefix, self.subagent_tools))

    def __repr__(self) -> str:
        return (
            f"ChainHint(tools={sorted(self.tools)!r}, system_prefix={self.system_prefix!r}, "
            f"subagent_tools={sorted(self.subagent_tools)!r})"
        )


class RequestTask(FrozenRecord, record=True):
    """The task read from a first main-loop request (:meth:`AgentDescriptor.task_from_request`):
    ``task``, the prompt as the agent was given it, or None with ``why``, a phrase saying why it
    cannot be told for sure (``its prompt is blank``; ``its user message holds a part that is
    no text (image) beside the prompt, ...``), None when the request holds no prompt at all.
    (A record, not a NamedTuple, whose string annotations are each compiled as a forward
    reference when the class is made: every prepare-only loads this module.)"""

    task: str | None
    why: str | None = None

    def __init__(self, task: str | None, why: str | None = None) -> None:
        object.__setattr__(self, "task", task)
        object.__setattr__(self, "why", why)


#: litellm's ``provider/`` model prefix -> the protocol it speaks
_LITELLM_PROVIDERS = {"anthropic": "anthropic", "openai": "openai-chat", "gemini": "gemini"}


class AgentDescriptor:
    """The facts of one agent (class attributes; methods with the agent's own behaviour).

    Class attributes:
        name: the adapter name (``claude-code``); title: its name for people.
        protocols: the wire protocols it can speak, its default first.
        litellm: it calls the model through litellm (``provider/model`` names: the provider
            picks the protocol, the wire model drops the prefix).
        streams: its main-loop requests ask for a stream.
        request_query: the query string of its model requests (Claude Code ``beta=true``).
        chain_hint: the chain rule's tie-break hint (the main loop's tools).
        launchable: ``pvisor run`` can start it (an :class:`AgentProfile`).
        volatile_context: where its context changes from one run to the next (documentation
            and the result's ``context_differences``).
        volatile_patterns: regular expressions of those parts in texts (system prompt, context
            messages); masked before request texts of two runs are compared.
        output_decorations: (pattern, replacement) pairs that make tool output of two runs
            comparable (``Wall time: 0.0012 seconds``).
        path_arguments: tool name -> names of its arguments that hold an absolute path
            (rewritten from the recorded workspace and home to the new ones in playback); for
            one of its :attr:`shell_tools`, the command's working directory.
        read_tools: the tools of :attr:`path_arguments` that only read the paths they are given
            (the plan before a replay does not list their reads of system paths: replay/plan.py).
        finish_commands: shell commands that end its loop (mini-swe-agent's submit).
        finish_tools: tools whose call ends its loop (SWE-agent ``submit``, OpenHands ``finish``).
        text_command: in text mode, the fenced block its actions give a shell command in
            (group 1: the command), or None.
        shell_tools: its shell tools -> the arguments that hold the command (a string, or an
            argv list): where a ``git commit`` or a finish command counts.
        prompt_wrappers: patterns of a whole text part that the agent puts beside the user's
            prompt in the prompt's turn (Claude Code's ``<system-reminder>`` blocks, before or
            after the prompt; Gemini CLI's ``<session_context>``; Codex's
            ``<environment_context>``): never the prompt (:meth:`prompt_parts`).
        prompt_blocks: (first, last) texts of a run of parts the agent adds beside the prompt
            (Gemini CLI's and Qwen Code's content of the files a prompt names with ``@``).
        prompt_markers: texts that only the agent's own context holds (``<system-reminder>``):
            a prompt holding one cannot be told from that context.
        tool_effects: its tools by what they do (:mod:`.effects`): how a handoff reads its
            calls as a source and writes calls for it as the target.
    """

    name: str = ""
    title: str = ""
    protocols: tuple[str, ...] = ()
    litellm: bool = False
    streams: bool = True
    request_query: str = ""
    chain_hint: ChainHint | None = None
    launchable: bool = False
    volatile_context: tuple[str, ...] = ()
    volatile_patterns: tuple[LazyPattern, ...] = ()
    output_decorations: tuple[tuple[LazyPattern, str], ...] = ()
    #: request parameters (dotted: ``metadata.user_id``) whose value the agent makes anew in every
    #: run (a session id, a cache key named after it): two runs of one task differ there at every
    #: step though their prompts say the same (``pvisor diff``'s ``agent_ids``, docs/diff.md)
    run_params: tuple[str, ...] = ()
    path_arguments: dict[str, tuple[str, ...]] = {}
    read_tools: frozenset[str] = frozenset()
    finish_commands: tuple[str, ...] = ()
    finish_tools: tuple[str, ...] = ()
    text_command: LazyPattern | None = None
    shell_tools: dict[str, tuple[str, ...]] = {"bash": ("command",)}
    #: tool name -> what a call of it does and which argument holds what (a handoff's facts,
    #: :mod:`.effects`); a shell tool of :attr:`shell_tools` missing here counts as a shell
    tool_effects: dict[str, ToolEffect] = {}
    #: its tools that read an image file into the observation (the image part B's protocol then
    #: carries), tool -> the argument naming the file: where a handoff sends a read of an image
    image_readers: dict[str, str] = {}
    #: of those, the ones that read nothing but images (Codex's ``view_image``): never a text read
    image_only_readers: frozenset[str] = frozenset()
    #: what its shell tool answers around a command's output (group ``out``: the output), once its
    #: decorations are normalised; None: the output as it is. A handoff compares O and O″ of two
    #: agents through it (:meth:`shell_output`)
    shell_output_pattern: LazyPattern | None = None
    #: how its shell tool's output states the command's exit code (group ``code``; the last
    #: match counts: the command's own output comes before the agent's trailer), or None when
    #: its output says nothing of it (Claude Code sets ``is_error`` instead). A shell call whose
    #: result leaves ``is_error`` unset and states a non-zero code failed (the run page's
    #: failed calls, :meth:`shell_exit_code`)
    shell_exit_pattern: LazyPattern | None = None
    #: what its shell tool answers for a command without output (``(empty)``)
    empty_outputs: tuple[str, ...] = ()
    #: what its shell tool refuses to run anywhere in a command, even inside quotes (Gemini CLI's
    #: "command substitution" check), or None; a handoff's own commands holding it are encoded
    shell_refuses: LazyPattern | None = None
    #: its edit and write tools refuse to change an existing file the session has not read
    #: whole with its read tool, or one changed since that read (a handoff serves a read first:
    #: docs/handoff.md); False: they change any file
    reads_before_change: bool = False
    prompt_wrappers: tuple[LazyPattern, ...] = ()
    prompt_blocks: tuple[tuple[str, str], ...] = ()
    prompt_markers: tuple[str, ...] = ()
    #: tool name in a reply -> the name the agent echoes the call under in its next request (a
    #: legacy name it still accepts: Claude Code runs a ``Task`` call and sends it back as
    #: ``Agent``): a call echoed under its alias is the same action (:mod:`pvisor.adapters.echoes`)
    echo_aliases: dict[str, str] = {}
    #: the names an ATIF trajectory's ``agent.name`` gives this agent besides its own (Harbor's
    #: ``AgentName`` spells Qwen Code ``qwen-coder``): such a file is this agent's run
    atif_names: tuple[str, ...] = ()

    def __init_subclass__(cls, **kw: Any) -> None:
        # the chain rule's hint names the agent's subagent tools (its tool_effects): a subagent's
        # chain is never taken as the main loop, however long it is
        super().__init_subclass__(**kw)
        hint = cls.__dict__.get("chain_hint")
        spawn = frozenset(n for n, e in cls.tool_effects.items() if e.effect is Effect.SUBAGENT)
        if hint is not None and spawn and not hint.subagent_tools:
            cls.chain_hint = ChainHint(hint.tools, hint.system_prefix, spawn)

    # ------------------------------------------------------------------ protocols

    #: provider id named by its native file -> the protocol the agent speaks to that provider
    provider_protocols: dict[str, str] = {}
    #: the wire protocol whose shape the ``raw`` objects of its native file's messages and parts
    #: have (the blocks, items or contents it sent), or None: its records are its own. A render
    #: into another protocol never sends them (replay/prefix.py)
    native_raw_protocol: str | None = None

    def default_protocol(self, model: str | None = None, provider: str | None = None) -> str:
        """The protocol it speaks by default: the one of the ``provider`` its native file names
        (:attr:`provider_protocols`), for a litellm agent the one its model's provider prefix
        names (``anthropic/claude-...`` -> ``anthropic``), else its first."""
        if provider is not None and provider in self.provider_protocols:
            return self.provider_protocols[provider]
        if self.litellm and model and "/" in model:
            proto = _LITELLM_PROVIDERS.get(model.split("/", 1)[0])
            if proto is not None:
                return proto
        return self.protocols[0]

    def speaks(self, protocol: str) -> bool:
        return protocol in self.protocols

    def wire_model(self, model: str | None) -> str | None:
        """The model name as it goes on the wire (litellm drops its ``provider/`` prefix)."""
        if model and self.litellm and "/" in model:
            return model.split("/", 1)[1]
        return model

    # ------------------------------------------------------------------ history on the wire

    def wire_action(self, protocol: str, action: Action) -> Message:
        """A_i as the agent sends it back in ``protocol``: reasoning, text, tool calls."""
        return action_message(action)

    def wire_result(self, protocol: str, result: ToolResult, names: dict[str, str]) -> ToolResult:
        """A tool result of its native file as the agent sends it (``names``: call id -> tool)."""
        return result

    def wire_message(self, protocol: str, msg: Message) -> Message:
        """Other input of an observation (a later prompt) as the agent sends it."""
        return msg

    def compaction_differences(self, protocol: str) -> str | None:
        """What the agent sends after a compaction that its native file does not hold (a
        sentence for the result's warnings), or None when the render is what it sends."""
        return None

    def compaction_keeps_lead(self, protocol: str) -> int:
        """How many of the leading messages (system prompt sent as a message, task context,
        task) the agent keeps in front of the history it compacted to; 0: the history replaces
        them all (its native file holds the whole history sent)."""
        return 0

    #: what the agent itself does to a rendered body of a protocol (protocol name -> a function
    #: changing the parsed body in place) before the protocol's own prompt-cache markers are
    #: placed: litellm's Anthropic shape, Gemini CLI's signatures
    body_shapes: dict[str, Any] = {}

    def has_markers(self, protocol: str) -> bool:
        """Whether :meth:`place_markers` changes a rendered ``protocol`` body: the agent shapes
        it (:attr:`body_shapes`) or the protocol has cache markers (its ``CACHE_MARKERS``)."""
        # the protocol module is loaded already when a body of it is rendered
        from pvisor.adapters.protocols import get_protocol

        return protocol in self.body_shapes or get_protocol(protocol).CACHE_MARKERS

    def place_markers(self, protocol: str, body: dict[str, Any]) -> int | None:
        """Put the agent's own markers into a rendered request ``body`` (in place): the agent's
        shape of the protocol (:attr:`body_shapes`), then the protocol's prompt-cache markers
        the way its recorded clients place them (its ``place_cache_markers``). Returns the
        number of cache breakpoints of a protocol with cache markers, else None."""
        from pvisor.adapters.protocols import get_protocol

        shape = self.body_shapes.get(protocol)
        if shape is not None:
            shape(body)
        return get_protocol(protocol).place_cache_markers(body)

    # ------------------------------------------------------------------ playback

    def reply_action(self, protocol: str, action: Action) -> Action:
        """A_i of its native file as the model sent it, for playback to serve (the file may
        hold what the agent made of the reply, such as its own call ids)."""
        return action

    def task_from_trajectory(self, task: str | None, meta: dict[str, Any]) -> str | None:
        """The task as the agent was given it, from its native trajectory's first user text
        ``task`` and ``meta`` (an agent that renders the task into a template stores the
        rendered text)."""
        return task

    def task_from_argv(self, argv: list[str]) -> str | None:
        """The task of a run ``pvisor run`` started, from the recorded command line (for runs
        recorded before the task became a run label), or None."""
        return None

    def prompt_parts(self, conv: Conversation) -> list[Any]:
        """The parts of the user's prompt in request ``conv``: those of its last turn (the user
        messages after its last assistant message) that are not the agent's own context
        (:attr:`prompt_wrappers`, :attr:`prompt_blocks`), empty texts left out. A first request
        gives the prompt as the one text left; an image or a second text is the user's too."""
        turn: list[Any] = []
        for m in conv.messages:
            if m.role == "assistant":
                turn = []
            elif m.role == "user":
                turn.extend(m.parts)
        parts: list[Any] = []
        block: list[Any] = []  # the parts of an open block, kept if it never closes
        closing: str | None = None
        for p in turn:
            text = p.text if isinstance(p, TextPart) else None
            if closing is not None:
                block.append(p)
                if text == closing:
                    block, closing = [], None
                continue
            if text is not None:
                if not text or any(w.fullmatch(text) for w in self.prompt_wrappers):
                    continue
                closing = next((last for first, last in self.prompt_blocks if text == first), None)
                if closing is not None:
                    block = [p]
                    continue
            parts.append(p)
        return parts + [p for p in block if not isinstance(p, TextPart) or p.text]

    def read_prompt(self, conv: Conversation) -> RequestTask:
        """The user's prompt in a first request, as sent (:meth:`prompt_parts`): the one text
        part left; or None, and why when there is more than one, a part that is no text (an
        image, a document), a blank one, or one that holds the agent's own markers (no why when
        the request holds no prompt at all)."""
        parts = self.prompt_parts(conv)
        if not parts:
            return RequestTask(None)  # no prompt at all
        others = [p for p in parts if not isinstance(p, TextPart)]
        if others:
            kind = getattr(others[0], "kind", None) or type(others[0]).__name__
            return RequestTask(
                None,
                f"its user message holds a part that is no text ({kind}) beside the prompt, which a "
                "task on the command line cannot carry",
            )
        texts = [p.text for p in parts if p.text.strip()]  # type: ignore[union-attr]
        if not texts:
            return RequestTask(None, "its prompt is blank")
        if len(texts) > 1:
            return RequestTask(
                None,
                f"its user message holds {len(texts)} texts beside the agent's own context: which "
                "is the prompt cannot be told",
            )
        text = texts[0]
        marker = next((m for m in self.prompt_markers if m in text), None)
        if marker is not None:
            return RequestTask(
                None,
                f"its prompt holds {marker}, the agent's own context: where the prompt ends cannot be told",
            )
        return RequestTask(text)

    def task_from_request(self, conv: Conversation) -> RequestTask:
        """The task as the agent was given it, from its first main-loop request ``conv`` (a run
        captured by ``pvisor gateway`` holds neither a task label nor a command line): the
        prompt the request carries (:meth:`read_prompt`) read as its native file stores it
        (:meth:`task_from_trajectory`: the same wrapping, OpenCode's quotes). None with why
        when it cannot be told for sure: replay then asks for ``--task``, it never guesses."""
        read = self.read_prompt(conv)
        if read.task is None:
            return read
        task = self.task_from_trajectory(read.task, {})
        return RequestTask(task) if task and task.strip() else RequestTask(None, "its prompt is blank")

    def mask_volatile(self, text: str) -> str:
        """``text`` with its volatile parts (dates, temporary paths, directory listings) masked."""
        for pattern in self.volatile_patterns:
            text = pattern.sub("<volatile>", text)
        return text

    def normalise_output(self, text: str) -> str:
        """Tool output with the agent's decorations made comparable across runs."""
        for pattern, repl in self.output_decorations:
            text = pattern.sub(repl, text)
        return text

    def final_reply(self, conv: Conversation) -> Action:
        """The synthetic reply that ends the agent at request N+1 (``conv``: that request): a
        reply without a tool call, which ends the five CLIs cleanly."""
        return Action(text=FINAL_TEXT)

    def is_finish(self, call: ToolCall) -> bool:
        """Whether ``call`` is one of the agent's finish actions (:attr:`finish_commands`)."""
        if not self.finish_commands or not isinstance(call.arguments, dict):
            return False
        return any(isinstance(v, str) and v.strip() in self.finish_commands for v in call.arguments.values())

    def command_commitment(self, command: str) -> str | None:
        """Why the shell ``command`` commits the agent to its work, or None: one of its
        :attr:`finish_commands` (alone, or first in a list of commands), or a command line that
        runs ``git commit``."""
        text = command.strip()
        for finish in self.finish_commands:
            # mini-swe-agent 1.x submits with "echo COMPLETE_... && git add -A && git diff --cached"
            if text == finish or (text.startswith(finish) and text[len(finish)] in " \t\n;&|"):
                return "finish command"
        if GIT_COMMIT.search(command):
            return "git commit"
        return None

    def commitment(self, call: ToolCall) -> str | None:
        """Why ``call`` commits the agent to its work, or None: a finish tool
        (:attr:`finish_tools`), or a call of one of its :attr:`shell_tools` whose command
        commits (:meth:`command_commitment`; each element of an argv list on its own, as
        Codex's ``["bash", "-lc", "git commit -m x"]``). A file written or searched with
        ``git commit`` in it is no commitment."""
        if call.name in self.finish_tools:
            return f"finish tool {call.name}"
        names = self.shell_tools.get(call.name)
        if not names or not isinstance(call.arguments, dict):
            return None
        for name in names:
            value = call.arguments.get(name)
            for text in value if isinstance(value, list) else [value]:
                why = self.command_commitment(text) if isinstance(text, str) else None
                if why is not None:
                    return why
        return None

    def finish_action(self, action: Action) -> str | None:
        """What in ``action`` ends the agent's run, or None: ``finish tool NAME`` (a call of one
        of its :attr:`finish_tools`) or ``finish command`` (one of its :attr:`finish_commands`
        in a call of its :attr:`shell_tools` or in its text, :meth:`command_commitment`). The
        agent stops there: it sends no request after the action, and the observation of it
        (mini-swe-agent's "action was not executed") never reaches the model."""
        for call in action.tool_calls:
            why = self.commitment(call)
            if why is not None and why.startswith("finish "):
                return why
        for command in self.text_commands(action):
            if self.command_commitment(command) == "finish command":
                return "finish command"
        return None

    def text_commands(self, action: Action) -> list[str]:
        """The shell commands an action gives in its text (an agent in text mode writes them
        in a fenced block, :attr:`text_command`), in order; [] for an agent without one."""
        if self.text_command is None or not action.text:
            return []
        return [m.group(1) for m in self.text_command.finditer(action.text)]

    def shell_reads_first(self, command: str) -> tuple[str, ...]:
        """The files (as ``command`` names them: relative to the shell's directory, or absolute)
        this agent's shell tool refuses to change in place with ``command`` unless its session
        read them first, as its edit tool does (Qwen Code's in-place ``sed``); () for an agent
        whose shell runs any command (the default), and for a command it does not check."""
        return ()

    def shell_output(self, text: str) -> str:
        """A shell call's observation without what this agent wraps around the command's output
        (:attr:`shell_output_pattern`, :attr:`empty_outputs`), for comparing observations of
        two agents (the answer's surrounding white space trimmed); ``text`` as it is when it is
        no such answer."""
        core = text.strip()
        if core in self.empty_outputs:
            return ""
        if self.shell_output_pattern is not None:
            m = self.shell_output_pattern.fullmatch(core)
            if m is not None:
                out = m.group("out")
                return "" if out.strip() in self.empty_outputs else out
        return text

    def shell_exit_code(self, text: str) -> int | None:
        """The exit code a shell call's output ``text`` states in this agent's words
        (:attr:`shell_exit_pattern`, its last match), or None when it states none."""
        if self.shell_exit_pattern is None:
            return None
        found = None
        for found in self.shell_exit_pattern.finditer(text):
            pass
        return int(found.group("code")) if found is not None else None

    def effect_of(self, name: str) -> ToolEffect:
        """What a call of tool ``name`` does (:attr:`tool_effects`; a tool of
        :attr:`shell_tools` missing there is a shell whose first argument holds the command);
        :attr:`Effect.OTHER` for a tool the agent's facts do not name."""
        found = self.tool_effects.get(name)
        if found is not None:
            return found
        if name in self.shell_tools:
            return ToolEffect(Effect.SHELL, command=self.shell_tools[name][0])
        return ToolEffect(Effect.OTHER)

    def action_commitment(self, action: Action) -> tuple[str | None, str, str] | None:
        """(call id, tool name or ``text``, why) of the first part of ``action`` that commits
        the agent (:meth:`commitment`, then the commands of its text), or None. The pause
        kind ``before_commitment`` stops before it."""
        for call in action.tool_calls:
            why = self.commitment(call)
            if why is not None:
                return call.id, call.name, why
        for command in self.text_commands(action):
            why = self.command_commitment(command)
            if why is not None:
                return None, "text", why
        return None


# --------------------------------------------------------------------------- shared helpers

#: ``git commit`` in a shell command, options between (``git -C repo commit -m ...``)
GIT_COMMIT = LazyPattern(
    r"(?:^|[;&|(\n]|\$\()\s*(?:sudo\s+)?git(?:\s+-{1,2}[\w-]+(?:[= ](?!commit\b)\S+)?)*\s+commit(?![\w-])"
)


def action_message(action: Action) -> Message:
    """A_i as the assistant message that carries it: reasoning, text, tool calls."""
    parts: list[Any] = list(action.reasoning)
    if action.text:
        parts.append(TextPart(action.text))
    parts.extend(action.tool_calls)
    return Message("assistant", parts)


#: Claude Code's and Qwen Code's reminders: one or more ``<system-reminder>`` blocks, a whole part
SYSTEM_REMINDERS = LazyPattern(r"\s*(?:<system-reminder>[\s\S]*?</system-reminder>\s*)+")

#: Gemini CLI's and Qwen Code's content of the files a prompt names with ``@path``: the parts
#: from this first text to this last one follow the prompt (their ``atCommandProcessor``)
REFERENCED_FILES = ("\n--- Content from referenced files ---", "\n--- End of content ---")


def after_separator(argv: list[str]) -> str | None:
    """The argument after ``--`` (the task of agents started as ``... -- TASK``), or None."""
    if "--" in argv:
        i = len(argv) - 1 - argv[::-1].index("--")
        if i + 1 < len(argv):
            return argv[i + 1]
    return None


def attached_value(argv: list[str], option: str) -> str | None:
    """The value of ``--option=VALUE`` (the last one), or None."""
    prefix = option + "="
    found = None
    for a in argv:
        if a.startswith(prefix):
            found = a[len(prefix) :]
    return found


def litellm_anthropic_shape(body: dict[str, Any]) -> None:
    """How litellm sends a conversation in Anthropic Messages (a real mini-swe-agent 2.4.6
    capture): a user message's string content as one text block, a ``tool_result``'s string
    content as one text block, and no ``is_error: false``."""
    for m in body.get("messages") or []:
        if not isinstance(m, dict) or m.get("role") != "user":
            continue
        if isinstance(m.get("content"), str):
            m["content"] = [{"type": "text", "text": m["content"]}]
        for b in m.get("content") or []:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                if isinstance(b.get("content"), str):
                    b["content"] = [{"type": "text", "text": b["content"]}]
                if b.get("is_error") is False:
                    del b["is_error"]


def litellm_message(raw: Any) -> Any:
    """A stored litellm message as litellm sends it: without its null keys (``content``,
    ``function_call``, ``provider_specific_fields``, or ``provider_specific_fields`` holding
    only nulls: ``{"citations": null, "thinking_blocks": null}`` of an Anthropic reply) and
    without mini-swe-agent's ``extra``."""
    if not isinstance(raw, dict):
        return raw
    return {
        k: v
        for k, v in raw.items()
        if k != "extra"
        and v is not None
        and not (
            k == "provider_specific_fields" and isinstance(v, dict) and all(x is None for x in v.values())
        )
    }


class LitellmAgent(AgentDescriptor):
    """What every agent calling the model through litellm shares (mini-swe-agent, SWE-agent,
    OpenHands): several protocols, the provider prefix, no stream, litellm's Anthropic shape."""

    protocols = ("openai-chat", "anthropic", "gemini")
    litellm = True
    streams = False

    body_shapes = {"anthropic": litellm_anthropic_shape}


def rx(pattern: str, flags: int = 0) -> LazyPattern:
    """A pattern of a descriptor, compiled when a replay first uses it (core/lazyre.py)."""
    return LazyPattern(pattern, flags)


#: ISO dates and times (``2026-11-29``, ``2026-11-29T10:00:00Z``): context of every agent
ISO_DATE = rx(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b")
