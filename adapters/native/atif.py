"""An ATIF trajectory (Harbor's Agent Trajectory Interchange Format, ``ATIF-v1.0`` to ``1.8``)
into a Trajectory: a run recorded elsewhere (Harbor and the agents it runs write ATIF; so does
``pvisor journal export --format atif``), read like an agent's native file.

Format rules (sources: Harbor 0.26.0 ``models/trajectories/*.py`` and
``utils/trajectory_validator.py``, its RFC ``rfcs/0001-trajectory-format.md`` v1.7; v1.8 is 1.7
plus the ``audio`` content part; pvisor's own exporter, :mod:`.render`; docs/native.md, "ATIF as
a source"):

- The document is ``{schema_version, session_id?, trajectory_id?, agent{name, version,
  model_name?, tool_definitions?, extra?}, steps[], notes?, final_metrics?,
  continued_trajectory_ref?, subagent_trajectories?, extra?}``; ``schema_version``
  ``ATIF-v1.<minor>`` is the version (profile ``atif@1.8``: a newer minor warns
  ``unverified_profile``, another major is refused).
- The agent: ``agent.name`` mapped to pvisor's agent (a descriptor's name, or one of its
  ``atif_names``: Harbor's ``qwen-coder``); an agent pvisor does not know is ``atif``, the
  generic descriptor (:mod:`pvisor.adapters.agents.atif`), and the tools it reads as a shell or
  not are warned ``atif_assumed``. ``agent.tool_definitions`` (OpenAI ``{type, function}``) are
  the tools; ``agent.model_name`` the model.
- Steps, in array order (``step_id`` names them in messages): the first ``system`` step before
  any agent step is the system prompt; ``user`` steps before the first agent step are the task
  (the first) and its context (the others); each ``agent`` step (one LLM inference) is a step:
  ``message`` its text, ``reasoning_content`` one plain reasoning part, ``tool_calls`` its calls
  (``arguments`` an object; pvisor's own export keeps the exact string in
  ``extra.arguments_raw``, used when present), ``observation.results`` its results matched by
  ``source_call_id`` (a lone result without one answers the step's lone call), ``metrics`` its
  usage (pvisor's older exports, which wrote no token counts there: ``extra.usage``). A step's
  only result without ``source_call_id`` answering several calls (terminus-2: one terminal
  output for a batch of commands) is the last call's, the others get an empty result (flag
  ``shared_observation``). ``user`` steps after an agent step are messages of its observation.
- ``llm_call_count`` 0 (a deterministic dispatch, no inference) and > 1 (inferences aggregated)
  flag the step (``deterministic_dispatch``, ``aggregated_inferences``): a replay serves it as
  one reply. ``is_copied_context`` steps (copied from an earlier file across a compaction) are
  no steps of this run: left out, listed. A later ``system`` step, audio parts,
  ``subagent_trajectory_ref`` of results (their rendered content is kept),
  ``subagent_trajectories``, ``continued_trajectory_ref`` and token ids / logprobs are left out
  and listed. Image parts (``source.path``, relative to the file's directory: Harbor writes
  ``images/``) are read as Anthropic-shaped base64 image blocks when the file is there, a
  regular file below the file's directory (symbolic links resolved; an absolute path or one
  that climbs out is never read), at most :data:`MAX_IMAGE_BYTES` (and the file's images
  :data:`MAX_IMAGES_BYTES` in all), and its bytes those of its
  ``media_type`` (:data:`IMAGE_MAGIC`), else left out naming the path.
- Refused (BadInputError, exit 65, one line naming the file and the JSON path): a document that
  is not a JSON object with ``schema_version`` ``ATIF-v1.x``, ``agent.name`` and a non-empty
  ``steps`` list; a step that is not an object or has no valid ``source``; a call without a
  string ``tool_call_id`` and ``function_name``, or whose ``tool_call_id`` another call of its
  step has; a result whose ``source_call_id`` names no call of its step. Unknown fields are
  ignored (listed when they carry content pvisor drops).
"""

from __future__ import annotations

import base64
import os
import stat
from typing import TYPE_CHECKING, Any

from pvisor.adapters.protocols.base import TokenUsage, first_int
from pvisor.journal.model import (
    Action,
    Message,
    OtherPart,
    Reasoning,
    Step,
    TextPart,
    ToolResult,
    ToolSpec,
    Trajectory,
)

from .assembly import as_dict, as_list, as_str, compact_json, epoch_ms, left_out, order_results, string_call
from .base import FormatProfile, NativeAdapter, NativeResult
from .diagnostics import Diagnostics, require
from .documents import read_document

if TYPE_CHECKING:
    from pathlib import Path

PROFILE = FormatProfile(
    "atif",
    1,
    8,
    "`schema_version` (ATIF-v1.x)",
    "Harbor 0.26.0 (1.7 converters, 1.8 models), pvisor's export (1.7)",
)

#: the shape this adapter reads, named when it refuses a file
EXPECTED = (
    'an ATIF trajectory: a JSON object {"schema_version": "ATIF-v1.x", "agent": {"name", ...}, '
    '"steps": [...]}'
)

#: the generic descriptor's name: the agent of a file whose agent pvisor does not know
GENERIC = "atif"
#: an image part is read into the trajectory up to this size (bytes); a larger one is left out
MAX_IMAGE_BYTES = 20 * 1024 * 1024
#: the images of one file are read up to this many bytes in all; the others are left out (a
#: small file naming one 20 MiB image a thousand times would otherwise hold 27 GB of base64)
MAX_IMAGES_BYTES = 256 * 1024 * 1024
#: how the bytes of an image of each media type the providers take begin (a file of another
#: content under such a type, a text named ``.png``, is no image: a provider refuses the request)
IMAGE_MAGIC: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}

#: step flags this adapter sets, for ``meta["flags"]``
FLAGS = {
    "deterministic_dispatch": "an agent step without an LLM inference (llm_call_count 0)",
    "aggregated_inferences": "an agent step standing for several LLM inferences (llm_call_count > 1)",
    "shared_observation": (
        "one result without source_call_id answers a batch of calls (a terminal's output): it is the last "
        "call's, the others have an empty one"
    ),
    "interrupted": "a tool call without a result in the file",
}

_SOURCES = ("system", "user", "agent")

#: the token counts of an ATIF step's ``metrics`` (v1.7): ``prompt_tokens`` counts every input
#: token, the cached ones (``cached_tokens``) included; ``completion_tokens`` every output token
METRIC_COUNTS = ("prompt_tokens", "completion_tokens", "cached_tokens")


def known_agent(name: str) -> str | None:
    """pvisor's agent for ATIF ``agent.name`` ``name``: the descriptor of that name, or one whose
    ``atif_names`` holds it (the agent table's agent rows, formats excluded); None when pvisor
    does not know it."""
    from pvisor.adapters.agents import AGENTS, get_descriptor

    for row in AGENTS:
        if row.format:
            continue
        if row.name == name or name in get_descriptor(row.name).atif_names:
            return row.name
    return None


class _Reading:
    """One document read step by step (:meth:`step` dispatches by ``source``)."""

    def __init__(self, path: Path, diag: Diagnostics, traj: Trajectory, meta: dict[str, Any]) -> None:
        self.base = os.path.dirname(os.path.abspath(path))
        self.diag, self.traj, self.meta = diag, traj, meta
        self.steps: list[Step] = []
        #: bytes of the images read so far (:data:`MAX_IMAGES_BYTES`)
        self.image_bytes = 0

    # ------------------------------------------------------------------ contents

    def parts(self, content: Any, where: str) -> tuple[str, list[Any]]:
        """(text, image blocks) of a ``message`` or result ``content``: a string, or ContentPart[]
        (text joined; images read, :meth:`image`; audio and unknown parts left out)."""
        if isinstance(content, str):
            return content, []
        if content is None:
            return "", []
        require(
            isinstance(content, list), self.diag, where, "content is neither a string nor a list of parts"
        )
        texts: list[str] = []
        images: list[Any] = []
        for i, p in enumerate(content):
            at = f"{where}[{i}]"
            p = as_dict(p)
            kind = p.get("type")
            if kind == "text" and isinstance(p.get("text"), str):
                texts.append(p["text"])
            elif kind == "image":
                block = self.image(as_dict(p.get("source")), at)
                if block is not None:
                    images.append(block)
            elif kind == "audio":
                src = as_dict(p.get("source"))
                left_out(
                    self.traj,
                    at,
                    "audio",
                    f"an audio part ({src.get('media_type')}, {src.get('path')}): pvisor's steps hold no "
                    "audio",
                )
            else:
                left_out(self.traj, at, str(kind), "a content part of a type ATIF 1.8 does not define")
        return "".join(texts), images

    def image(self, source: dict[str, Any], where: str) -> dict[str, Any] | None:
        """The image a part's ``source`` names as an Anthropic base64 image block, or None (left
        out): a URL, a missing or unreadable file, one over :data:`MAX_IMAGE_BYTES`."""
        path, media = as_str(source.get("path")), as_str(source.get("media_type"))
        if not path or not media:
            left_out(self.traj, where, "image", "an image part without source.path and media_type")
            return None
        if "\x00" in path:
            left_out(self.traj, where, "image", f"image {path!r}: a path holding a NUL byte names no file")
            return None
        if "://" in path:
            left_out(self.traj, where, "image", f"an image at a URL ({path}): not fetched")
            return None
        # a hostile file may name any file (``/home/u/.ssh/id_rsa``, ``images/../../x``, a symlink
        # out of images/): only a regular file below the file's own directory is read, at most
        # MAX_IMAGE_BYTES of it (a device such as /dev/zero never ends)
        base = os.path.realpath(self.base)
        full = os.path.realpath(os.path.join(base, path))
        if os.path.isabs(path) or os.path.commonpath([base, full]) != base:
            left_out(self.traj, where, "image", f"image {path} is outside the file's directory: not read")
            return None
        try:
            info = os.stat(full)
            if not stat.S_ISREG(info.st_mode):
                left_out(self.traj, where, "image", f"image {path} is not a regular file: not read")
                return None
            if info.st_size > MAX_IMAGE_BYTES:
                said = f"image {path} is {info.st_size} bytes, over {MAX_IMAGE_BYTES}"
                left_out(self.traj, where, "image", said)
                return None
            if self.image_bytes + info.st_size > MAX_IMAGES_BYTES:
                said = f"image {path}: the file's images would pass {MAX_IMAGES_BYTES} bytes in all"
                left_out(self.traj, where, "image", said)
                return None
            with open(full, "rb") as fh:
                data = fh.read(MAX_IMAGE_BYTES + 1)
        except OSError as exc:
            left_out(self.traj, where, "image", f"image {path} not readable beside the file: {exc.strerror}")
            return None
        if len(data) > MAX_IMAGE_BYTES:  # grew since its size was asked
            left_out(self.traj, where, "image", f"image {path} is over {MAX_IMAGE_BYTES} bytes")
            return None
        magic = IMAGE_MAGIC.get(media.lower())
        if magic is not None and not (
            data.startswith(magic) and (media != "image/webp" or data[8:12] == b"WEBP")
        ):
            left_out(self.traj, where, "image", f"image {path}: its bytes are not those of {media}")
            return None
        self.image_bytes += len(data)
        encoded = base64.b64encode(data).decode()
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": encoded}}

    # ------------------------------------------------------------------ steps

    def step(self, i: int, s: Any) -> None:
        """``steps[i]``: BadInputError (exit 65) unless an object with a valid ``source``."""
        where = f"steps[{i}]"
        require(isinstance(s, dict), self.diag, where, "a step that is not a JSON object")
        sid = s.get("step_id")
        if isinstance(sid, int) and not isinstance(sid, bool):
            where = f"steps[{i}] (step_id {sid})"
        source = s.get("source")
        require(
            source in _SOURCES,
            self.diag,
            where,
            f"source {str(source)[:40]!r} is not one of system, user, agent",
        )
        if s.get("is_copied_context") is True:
            left_out(
                self.traj,
                where,
                f"{source}/copied_context",
                "copied from an earlier trajectory across a compaction (is_copied_context): not a step of "
                "this run",
            )
            return
        if source == "agent":
            self.agent_step(s, where)
            return
        text, images = self.parts(s.get("message"), f"{where}.message")
        if as_dict(s.get("observation")).get("results"):
            left_out(self.traj, f"{where}.observation", "observation", f"an observation on a {source} step")
        if source == "system":
            if self.traj.system is None and not self.steps and self.traj.task is None:
                self.traj.system = text
            else:
                left_out(self.traj, where, "system", "a system step after the conversation began")
            return
        msg = Message("user", [TextPart(text), *(OtherPart("image", raw=b) for b in images)])
        if self.steps:
            self.steps[-1].observation.messages.append(msg)
        elif self.traj.task is None:
            self.traj.task = text
            for j, _ in enumerate(images):
                left_out(
                    self.traj, f"{where}.message", "image", f"image {j + 1} of the task: the task is text"
                )
        else:
            self.meta["task_context"].append(text)

    def agent_step(self, s: dict[str, Any], where: str) -> None:
        """An agent step: a pvisor step, its calls and results."""
        text, images = self.parts(s.get("message"), f"{where}.message")
        for j, _ in enumerate(images):
            left_out(self.traj, f"{where}.message", "image", f"image {j + 1} of an agent message")
        extra = as_dict(s.get("extra"))
        action = Action(
            text=text,
            model=as_str(s.get("model_name")) or self.traj.model,
            usage=self.usage(s, extra, where),
        )
        if isinstance(s.get("reasoning_content"), str) and s["reasoning_content"]:
            action.reasoning.append(Reasoning(s["reasoning_content"]))
        step = Step(n=len(self.steps) + 1, action=action, time_ms=epoch_ms(s.get("timestamp")))
        for f in as_list(extra.get("flags")):  # pvisor's own export keeps the step's flags
            if isinstance(f, str) and f not in step.flags:
                step.flags.append(f)
        count = s.get("llm_call_count")
        if not isinstance(count, int) or isinstance(count, bool):
            pass  # not tracked (null), or not a count: one inference, as before 1.7
        elif count == 0:
            step.flags.append("deterministic_dispatch")
        elif count > 1:
            step.flags.append("aggregated_inferences")
        ids = self.calls(step, s.get("tool_calls"), where)
        self.results(step, s.get("observation"), ids, where)
        order_results(step, self.diag)
        self.steps.append(step)

    def usage(self, s: dict[str, Any], extra: dict[str, Any], where: str) -> dict[str, Any] | None:
        """The step's usage: its ``metrics`` without token ids and logprobs (left out, listed)
        when they hold a token count (:data:`METRIC_COUNTS`; read by
        :meth:`AtifAdapter.normalised_usage`), else pvisor's ``extra.usage`` (the provider's
        object, all an export before ATIF metrics gave), else the metrics that are there."""
        metrics = as_dict(s.get("metrics"))
        dropped = [k for k in ("prompt_token_ids", "completion_token_ids", "logprobs") if metrics.get(k)]
        if dropped:
            left_out(self.traj, f"{where}.metrics", "metrics", f"{', '.join(dropped)}: not kept")
        kept = {k: v for k, v in metrics.items() if k not in dropped and v is not None}
        if not any(k in kept for k in METRIC_COUNTS) and isinstance(extra.get("usage"), dict):
            return extra["usage"]
        return kept or None

    def calls(self, step: Step, calls: Any, where: str) -> set[str]:
        """The step's tool calls; the ids they carry. BadInputError (exit 65) for a call without
        a string id or name."""
        ids: set[str] = set()
        for j, c in enumerate(as_list(calls)):
            at = f"{where}.tool_calls[{j}]"
            require(isinstance(c, dict), self.diag, at, "a tool call that is not a JSON object")
            cid, name = c.get("tool_call_id"), c.get("function_name")
            require(isinstance(cid, str), self.diag, at, "a tool call without a string tool_call_id")
            require(isinstance(name, str), self.diag, at, "a tool call without a string function_name")
            # two calls of one id in a step: a result cannot say which it answers (both read as
            # unanswered), and a provider refuses a request repeating a call id
            require(
                cid not in ids, self.diag, at, f"tool_call_id {cid[:80]!r} names another call of this step"
            )
            ex = as_dict(c.get("extra"))
            raw = ex.get("arguments_raw")
            args = raw if isinstance(raw, str) else compact_json(c.get("arguments", {}))
            kind = ex.get("kind") if ex.get("kind") in ("function", "custom", "server") else "function"
            # pvisor's export made up an id for a call that had none (ATIF requires one)
            call = string_call(None if ex.get("made_up_id") is True else cid, name, args, kind=kind)
            step.action.tool_calls.append(call)
            ids.add(cid)
        return ids

    def results(self, step: Step, observation: Any, ids: set[str], where: str) -> None:
        """The step's observation results. BadInputError (exit 65) for a ``source_call_id`` that
        names no call of the step."""
        results = as_list(as_dict(observation).get("results"))
        calls = step.action.tool_calls
        for j, r in enumerate(results):
            at = f"{where}.observation.results[{j}]"
            require(isinstance(r, dict), self.diag, at, "a result that is not a JSON object")
            cid = r.get("source_call_id")
            require(
                cid is None or cid in ids,
                self.diag,
                at,
                f"source_call_id {str(cid)[:80]!r} names no tool call of this step",
            )
            ex = as_dict(r.get("extra"))
            if cid is None and isinstance(ex.get("call_id"), str):
                cid = ex["call_id"]  # pvisor's export: a result whose call the file lost
            elif cid is None and len(results) == 1 and calls:
                # the batch's one output (Harbor's terminus-2 writes no id when several commands
                # share the terminal's output): it answers the last call, the others get none
                cid = calls[-1].id
                for c in calls[:-1]:
                    step.observation.results.append(ToolResult(c.id, "", raw={"shared_with": cid}))
                if len(calls) > 1:
                    step.flags.append("shared_observation")
            for k, ref in enumerate(as_list(r.get("subagent_trajectory_ref"))):
                ref = as_dict(ref)
                named = ref.get("trajectory_id") or ref.get("trajectory_path") or ref.get("session_id")
                left_out(
                    self.traj,
                    f"{at}.subagent_trajectory_ref[{k}]",
                    "subagent",
                    f"subagent trajectory {named}: not read; the result's content stands for it",
                )
            text, images = self.parts(r.get("content"), f"{at}.content")
            content: Any = text
            if "content_raw" in ex:
                content = ex["content_raw"]
            elif images:
                content = [{"type": "text", "text": text}, *images] if text else images
            is_error = ex.get("is_error") if isinstance(ex.get("is_error"), bool) else None
            raw = {"interrupted": True} if ex.get("interrupted") is True else None
            step.observation.results.append(ToolResult(cid, content, is_error=is_error, raw=raw))


def _header(doc: Any, traj: Trajectory, meta: dict[str, Any], diag: Diagnostics) -> list[Any]:
    """The document's steps, its version checked and its agent, tools and ids read."""
    require(isinstance(doc, dict), diag, "document", f"not a JSON object; expected {EXPECTED}")
    version = doc.get("schema_version")
    require(
        isinstance(version, str) and version.startswith("ATIF-v"),
        diag,
        "schema_version",
        f"{str(version)[:40]!r} is not an ATIF version (ATIF-v1.x); expected {EXPECTED}",
    )
    PROFILE.check(version[len("ATIF-v") :], "schema_version", diag)
    agent = doc.get("agent")
    require(
        isinstance(agent, dict) and isinstance(agent.get("name"), str) and agent["name"],
        diag,
        "agent.name",
        "no agent name (agent.name is required)",
    )
    steps = doc.get("steps")
    require(isinstance(steps, list) and steps, diag, "steps", "no steps (a non-empty list is required)")
    traj.model = as_str(agent.get("model_name"))
    tools = agent.get("tool_definitions")
    if isinstance(tools, list):
        specs = []
        for t in tools:
            # OpenAI {type, function} as the spec says; pvisor's journal export keeps the tool as
            # the agent sent it (Anthropic {name, description, input_schema})
            fn = as_dict(as_dict(t).get("function")) or as_dict(t)
            params = fn.get("parameters", fn.get("input_schema"))
            specs.append(ToolSpec(as_str(fn.get("name")) or "", as_str(fn.get("description")), params, raw=t))
        traj.tools = specs
    meta.update(
        {
            "schema_version": version,
            "agent_name": agent["name"],
            "agent_version": as_str(agent.get("version")),
            "session": as_str(doc.get("session_id")),
            "trajectory_id": as_str(doc.get("trajectory_id")),
        }
    )
    for key in ("notes", "final_metrics", "continued_trajectory_ref"):
        if doc.get(key) is not None:
            meta[key] = doc[key]
    if doc.get("continued_trajectory_ref"):
        left_out(
            traj,
            "continued_trajectory_ref",
            "continuation",
            f"the run goes on in {doc['continued_trajectory_ref']}: not read",
        )
    for k, sub in enumerate(as_list(doc.get("subagent_trajectories"))):
        sub = as_dict(sub)
        left_out(
            traj,
            f"subagent_trajectories[{k}]",
            "subagent",
            f"embedded subagent trajectory {sub.get('trajectory_id')} "
            f"({len(as_list(sub.get('steps')))} steps): "
            "not read; the parent's result for its call stands for it",
        )
    return steps


def _assumed(traj: Trajectory, diag: Diagnostics) -> None:
    """For the generic descriptor: each tool (of ``tool_definitions`` and of the calls) it reads
    as a shell, and those it renders as text, one ``atif_assumed`` warning each."""
    from pvisor.adapters.agents import get_descriptor
    from pvisor.adapters.agents.effects import Effect, Role

    d = get_descriptor(GENERIC)
    names = [t.name for t in traj.tools or ()]
    for s in traj.steps:
        names += [c.name for c in s.action.tool_calls if c.name not in names]
    for name in dict.fromkeys(names):
        fx = d.effect_of(name)
        if fx.effect is Effect.SHELL:
            said = f"tool {name} is assumed a shell (its argument {fx.arg(Role.COMMAND)} the command)"
        else:
            said = f"tool {name} has no effect pvisor knows: a handoff renders its calls as text"
        diag.warn("atif_assumed", f"tool {name}", said)


class AtifAdapter(NativeAdapter):
    name = "atif"
    description = "ATIF trajectory (Harbor's Agent Trajectory Interchange Format 1.0-1.8), any agent's run"
    profiles = (PROFILE,)

    def normalised_usage(self, usage: Any) -> TokenUsage:
        """A step's ``metrics`` (:data:`METRIC_COUNTS`; ``extra.cache_creation_input_tokens`` and
        ``extra.reasoning_tokens`` as pvisor's export writes them): ATIF counts as the
        conventions do. A usage of another shape (``extra.usage`` of an export older than ATIF
        metrics: whose protocol the file does not say) gives no counts."""
        if not isinstance(usage, dict) or not any(k in usage for k in METRIC_COUNTS):
            return TokenUsage()
        extra = as_dict(usage.get("extra"))
        return TokenUsage(
            input_tokens=first_int(usage.get("prompt_tokens")),
            cached_input_tokens=first_int(usage.get("cached_tokens")),
            cache_creation_input_tokens=first_int(extra.get("cache_creation_input_tokens")),
            output_tokens=first_int(usage.get("completion_tokens")),
            reasoning_tokens=first_int(extra.get("reasoning_tokens")),
        )

    def read(self, path: Path, diag: Diagnostics) -> NativeResult:
        """Read ``path``; raises BadInputError (65) naming the JSON path of what is malformed."""
        doc = read_document(path, diag, EXPECTED, arrays=("steps",))
        traj = Trajectory()
        meta: dict[str, Any] = {"format": "atif", "task_context": [], "flags": {}}
        steps = _header(doc, traj, meta, diag)
        reading = _Reading(path, diag, traj, meta)
        for i, s in enumerate(steps):
            reading.step(i, s)
        traj.steps = reading.steps
        meta["flags"] = {f: FLAGS[f] for f in FLAGS if any(f in s.flags for s in traj.steps)}
        traj.meta = meta
        agent = known_agent(meta["agent_name"])
        if agent is None:
            agent = GENERIC
            _assumed(traj, diag)
        return NativeResult(traj, PROFILE, diag, agent=agent)


ADAPTER = AtifAdapter()
