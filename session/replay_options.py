"""The arguments of one replay with the agent (replay-only and continuation): :class:`ReplayOptions`
with its defaults, filled by ``pvisor replay`` (:mod:`pvisor.commands.replay`), a replay.toml and
the Python API (:func:`pvisor.session.continue_run`), read by :mod:`pvisor.session.replay`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: seconds the agent may go on after its synthetic final reply before it is stopped
END_GRACE_S = 30.0
#: default --timeout of a replay, seconds
DEFAULT_TIMEOUT_S = 900.0


@dataclass
class ReplayOptions:
    """The arguments of one replay-only (``pvisor replay --replay-only``; docs/replay.md).

    Fields: ``agent``; ``after_step`` N; ``output`` directory; ``workspace`` (required: where
    the agent re-runs its tools); exactly one of ``trajectory`` (native file) and ``run``
    (journal run, read from ``journal``); ``journal`` (also where the derived run goes);
    ``entrypoint`` (the agent's executable; default its command on PATH); ``task`` (when the
    source holds none, or to replay with another); ``session`` (OpenCode stores);
    ``episode`` (a journal run's subagent episode to replay at its own step N, docs/steps.md
    "Episodes"; None: the main loop);
    ``timeout`` seconds for the whole agent run; ``force``; ``allow_unsupported`` (an installed
    agent version outside its profile's range); ``end_grace`` seconds after the synthetic end;
    ``model`` the agent is launched with (default: the recorded one); ``agent_env`` and
    ``agent_args`` (a config's ``environment`` and ``arguments``); ``private_env``: the names
    in ``agent_env`` that go to the agent only, never into the recorded start environment (a
    rollout's ``key_file`` variables, whatever their names and values look like).

    A continuation (:func:`continue_replay`) also reads: ``upstream`` (the live model's base URL;
    None: the agent's public API, which needs the user's key in the environment),
    ``max_steps`` (None: no budget; else >= 1), ``boundary_prompt``, ``reasoning`` (``keep`` or
    ``strip``), ``live_model`` (None: the model the agent asks for); ``allow_damaged``: play a
    damaged native file back anyway (each repair listed); ``workspace_from``: a journal run
    whose start snapshot is restored into the (empty) ``workspace`` before the agent starts;
    ``child_run``: the pending child run of a handoff the derived run is filed under (it must
    continue the replayed run after step N; :func:`pvisor.session.children.child_target`), its
    workspace compared at the boundary with the snapshot the handoff restored;
    ``child_option``: how errors name it (``--child-run``, ``child_run=``); ``refuse_outside``:
    refuse (exit 2) before the agent starts when the plan lists a place outside the workspace
    (:mod:`pvisor.replay.plan`); ``allow_unrecorded``: re-run the calls of steps 1..N that have
    no recorded result instead of refusing them (``observation_not_recorded``); ``sandbox``
    (:class:`~pvisor.session.sandbox.SandboxMode` or its value; None: ``PVISOR_SANDBOX``, else
    ``auto``), ``sandbox_network`` and ``sandbox_allow`` (docs/replay.md "The sandbox");
    ``sandbox_memory`` (a size: ``"2G"`` or bytes) and ``sandbox_cpus`` (a number, or its text):
    the limits of the run's cgroup, None for none (docs/replay.md "Limits: memory and CPU";
    read by :func:`~pvisor.session.replay_checks.limits_of`); ``no_restore``: start in
    ``workspace`` as it is (by default a journal run's start snapshot is restored into an empty
    one; docs/replay.md "The recorded start state"); ``env_from``
    (:class:`~pvisor.session.start_env.EnvFrom` or its value): the recorded start environment
    set for the agent (``recorded``) or not (``none``).

    A handoff (:mod:`pvisor.session.handover`, docs/handoff.md) also reads: ``source_agent``
    (the agent that recorded the source; ``agent`` is the one handed to, None: the same);
    ``replay_only`` (end the agent at its boundary request instead of continuing live);
    ``strict_workspace`` (a workspace that differs from the pause's snapshot makes the handoff
    ``diverged``); ``restore_start`` (restore the source run's start snapshot into an empty
    ``workspace``, when it has one); ``reset_to_pause`` (restore the pause's snapshot into the
    workspace when B's boundary request comes, before it is answered or forwarded);
    ``source_reasoning`` (:class:`~pvisor.replay.source_reasoning.SourceReasoning` or its value:
    what becomes of the source's reasoning in the history served to B).

    ``option_notes``: ``(code, message)`` warnings the caller found in the options before the
    replay (``pvisor replay --config``: the replay.toml keys the mode ignores,
    :attr:`~pvisor.replay.spec.OptionWarning.OPTIONS_IGNORED`), first in result.json's
    ``warnings``; the caller has printed them."""

    agent: str
    after_step: int
    output: Path
    workspace: Path | None
    journal: Path
    trajectory: Path | None = None
    run: str | None = None
    entrypoint: str | None = None
    task: str | None = None
    session: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    force: bool = False
    allow_unsupported: bool = False
    end_grace: float = END_GRACE_S
    model: str | None = None
    agent_env: dict[str, str] = field(default_factory=dict)
    private_env: frozenset[str] = frozenset()
    agent_args: list[str] = field(default_factory=list)
    upstream: str | None = None
    max_steps: int | None = None
    boundary_prompt: str | None = None
    reasoning: str = "keep"
    live_model: str | None = None
    allow_damaged: bool = False
    workspace_from: str | None = None
    intercept: Any = None
    child_run: str | None = None
    child_option: str = "--child-run"
    refuse_outside: bool = False
    allow_unrecorded: bool = False
    sandbox: Any = None
    sandbox_network: Any = "gateway"
    sandbox_allow: list[Path] | None = None
    sandbox_memory: Any = None
    sandbox_cpus: Any = None
    no_restore: bool = False
    env_from: Any = "recorded"
    source_agent: str | None = None
    episode: str | None = None
    replay_only: bool = False
    strict_workspace: bool = False
    restore_start: bool = True
    reset_to_pause: bool = False
    source_reasoning: Any = "drop"
    option_notes: list[tuple[str, str]] = field(default_factory=list)


#: the name of the options before continuation came
ReplayOnlyOptions = ReplayOptions
