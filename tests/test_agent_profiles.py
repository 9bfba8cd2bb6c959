"""The launch profiles as data: what each plans for a run (no agent is started here; the real
agents run in test_agents.py): files only in the run directory, the base URL with the run id,
the task as one argument, the resume command, version ranges and session ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from pvisor.adapters.agents import agent_names, get_profile
from pvisor.adapters.agents.base import LaunchContext, VersionRange
from pvisor.core.errors import UsageError

VERIFIED = {
    "claude-code": "2.1.332",
    "codex": "0.171.0",
    "gemini-cli": "0.61.0",
    "opencode": "1.18.33",
    "qwen-code": "0.24.4",
    "mini-swe-agent": "2.4.6",
}
#: just outside each range, below and above
OUTSIDE = {
    "claude-code": ("2.0.99", "2.2.0"),
    "codex": ("0.169.9", "0.180.0"),
    "gemini-cli": ("0.60.9", "0.62.0"),
    "opencode": ("1.17.9", "1.19.0"),
    "qwen-code": ("0.23.9", "0.25.0"),
    "mini-swe-agent": ("2.3.9", "2.5.0"),
}
BASE = "http://127.0.0.1:4321/run/r-0123456789ab"
TASK = "fix it; don't 'break' \"anything\" $HOME"


def _ctx(tmp_path: Path, private: bool = True, **kw) -> LaunchContext:
    run_dir = tmp_path / "data" / "runs" / "r-0123456789ab"
    home = run_dir / "home"
    return LaunchContext(
        executable="/opt/agent/bin/x",
        base_url=BASE,
        run_dir=run_dir,
        home=home if private else None,
        workspace=tmp_path / "ws",
        **kw,
    )


@pytest.mark.parametrize("agent", agent_names())
def test_plans_write_only_into_the_run_directory_and_point_at_the_gateway(tmp_path, agent):
    profile = get_profile(agent)
    for private in (True, False):
        ctx = _ctx(tmp_path, private, model="m-1", api_key="k")
        plan = profile.plan(ctx, TASK)
        for path in plan.files:
            assert ctx.run_dir in path.parents, (agent, path)
        assert (
            plan.argv[0] == ctx.executable
            and sum(a == TASK or a.endswith("=" + TASK) for a in plan.argv) == 1
        )  # one argument, never through a shell
        assert plan.env["NO_PROXY"] == plan.env["no_proxy"] == "127.0.0.1,localhost,::1"
        everything = (
            " ".join(plan.argv) + " ".join(v or "" for v in plan.env.values()) + " ".join(plan.files.values())
        )
        assert BASE in everything, agent
        assert plan.env[profile.key_env] == "k"
        if private:
            assert plan.env["HOME"] == str(ctx.home) and plan.env["XDG_CONFIG_HOME"].startswith(str(ctx.home))
        else:
            assert "HOME" not in plan.env and not any(ctx.home and ctx.home in p.parents for p in plan.files)


@pytest.mark.parametrize("agent", agent_names())
def test_resume_names_the_session(tmp_path, agent):
    profile = get_profile(agent)
    if not profile.resumable:
        with pytest.raises(UsageError, match="no native resume"):
            profile.plan(_ctx(tmp_path), TASK, session_id="s-1")
        return
    argv = profile.plan(_ctx(tmp_path), TASK, session_id="s-1").argv
    assert "s-1" in argv and any(a.endswith(TASK) for a in argv)
    assert "resume" in argv or "--resume" in argv or "--session" in argv


@pytest.mark.parametrize("agent", agent_names())
def test_version_ranges_hold_the_verified_version_only(agent):
    versions = get_profile(agent).versions
    assert VERIFIED[agent] in versions
    assert all(v not in versions for v in OUTSIDE[agent]) and "nonsense" not in versions


def test_version_range_and_reading():
    r = VersionRange((0, 170, 0), (0, 180))
    assert "0.171.0" in r and "codex-cli 0.179.9" in r and "0.180.0" not in r and "0.17.0" not in r
    assert get_profile("claude-code").read_version("2.1.332 (Claude Code)\n") == "2.1.332"
    assert get_profile("codex").read_version("WARNING: ...\ncodex-cli 0.171.0\n") == "0.171.0"
    banner = (
        "This is mini-swe-agent version 2.4.6.\nCheck the v2 migration guide at https://x/v2\n"
        "Loading global config from '/x/.env'\n"
    )
    assert get_profile("mini-swe-agent").read_version(banner) == "2.4.6"
    assert get_profile("mini-swe-agent").version_argv("/x/mini") == ["/x/mini", "--help"]


@pytest.mark.parametrize(
    "agent, stdout, sid",
    [
        (
            "claude-code",
            b'{"type":"system","subtype":"init","session_id":"c-1"}\n{"type":"result","session_id":"c-1"}',
            "c-1",
        ),
        ("codex", b'WARNING: x\n{"type":"thread.started","thread_id":"t-1"}\n', "t-1"),
        ("gemini-cli", b'{"type":"init","session_id":"g-1","model":"m"}', "g-1"),
        ("opencode", b'{"type":"step_start","sessionID":"ses_1","part":{}}', "ses_1"),
        ("qwen-code", b'{"type":"system","subtype":"init","uuid":"q-1","session_id":"q-1"}', "q-1"),
        ("claude-code", b'not json\n{"type": "assistant"}', None),
    ],
)
def test_session_ids_come_from_the_agents_json_stdout(agent, stdout, sid):
    assert get_profile(agent).session_id(stdout) == sid


def test_unknown_agent():
    with pytest.raises(UsageError, match="unknown agent 'cursor'; expected one of claude-code, codex"):
        get_profile("cursor")


@pytest.mark.parametrize("agent", agent_names())
@pytest.mark.parametrize("resume", [False, True])
def test_a_task_starting_with_a_dash_can_never_be_read_as_an_option(tmp_path, agent, resume):
    """The task comes after ``--`` (the end of options) or attached to its option
    (``--prompt=TASK``); verified with each real agent (docs/agents.md)."""
    profile = get_profile(agent)
    if resume and not profile.resumable:
        return
    task = "--version"
    argv = profile.plan(_ctx(tmp_path), task, session_id="s-1" if resume else None).argv
    if task in argv:
        i = argv.index(task)
        assert argv[i - 1] == "--" and i == len(argv) - 1, argv
    else:
        [attached] = [a for a in argv if a.endswith("=" + task)]
        assert attached.startswith("--"), argv
