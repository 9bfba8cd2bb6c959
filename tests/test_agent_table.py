"""The agent table (adapters/agents/__init__.py ``AGENTS``): every list of agents is derived from
it, and a new agent is its modules plus one row. Entered through the seam: the table is read as
the CLI and the readers read it, and a fake agent is added to it (one descriptor module, one
native reader module, one row) in a child interpreter, where the CLI's help texts, built when
the commands are imported, are made after the row was added."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from pvisor.adapters.agents import (
    AGENTS,
    agent_names,
    descriptor_names,
    executables,
    get_descriptor,
    get_profile,
    native_names,
)
from pvisor.adapters.native import adapter_module, adapter_names, get_adapter
from pvisor.adapters.native.signatures import signature_of
from pvisor.core.errors import UsageError


def _option(command: click.Command, name: str) -> click.Parameter:
    return next(p for p in command.params if p.name == name)


def test_every_derived_list_is_what_the_table_yields():
    assert descriptor_names() == [a.name for a in AGENTS]
    assert agent_names() == [a.name for a in AGENTS if a.executable is not None]
    assert executables() == [a.executable for a in AGENTS if a.executable is not None]
    assert native_names() == adapter_names() == [a.name for a in AGENTS if a.native]
    for row in AGENTS:
        d = get_descriptor(row.name)
        assert d.name == row.name and type(d).__module__ == f"pvisor.adapters.agents.{row.module}"
        assert d.launchable == (row.executable is not None)
        if row.executable is not None:
            assert get_profile(row.name).executable == row.executable
        else:
            with pytest.raises(UsageError, match=f"cannot start {row.name} .no launch profile."):
                get_profile(row.name)
        if row.native:
            adapter = get_adapter(row.name)
            assert adapter.name == row.name and type(adapter).__module__ == adapter_module(row.name)
            assert adapter_module(row.name) == f"pvisor.adapters.native.{row.module}"
            assert signature_of(row.name).__name__ == row.module  # the signature named after it


def test_the_cli_lists_what_the_table_yields():
    from pvisor.commands.env import env
    from pvisor.commands.replay import replay
    from pvisor.commands.run import run

    assert list(_option(run, "agent").type.choices) == agent_names()
    assert list(_option(env, "agent").type.choices) == agent_names()
    assert f"its command on PATH: {', '.join(executables())})" in _option(run, "entrypoint").help
    assert _option(replay, "agent").help == f"The agent: {', '.join(descriptor_names())}."


def test_an_unknown_name_is_refused_naming_the_table():
    with pytest.raises(UsageError, match="expected one of " + ", ".join(descriptor_names())):
        get_descriptor("cursor")
    with pytest.raises(UsageError, match="expected one of " + ", ".join(agent_names())):
        get_profile("cursor")
    with pytest.raises(UsageError, match="expected one of " + ", ".join(adapter_names())):
        get_adapter("cursor")


#: the fake agent's descriptor and launch profile: one module
FAKE_AGENT = """
from pvisor.adapters.agents.base import AgentProfile


class FakeAgent(AgentProfile):
    name = "fake-agent"
    title = "Fake Agent"
    protocols = ("anthropic",)
    protocol = "anthropic"
    upstream = "anthropic"


PROFILE = DESCRIPTOR = FakeAgent()
"""

#: the fake agent's native reader, with its own signature: one module
FAKE_READER = """
from pvisor.adapters.native.base import FormatProfile, NativeAdapter

PROFILE = FormatProfile("fake-agent", 1, 0, "by shape", "1.0", by_shape=True)


def SIGNATURE(path, head):
    return b'"fake_agent_trajectory"' in head


class FakeAdapter(NativeAdapter):
    name = "fake-agent"
    description = "Fake Agent trajectory JSON"
    profiles = (PROFILE,)


ADAPTER = FakeAdapter()
"""

#: the child: the two modules made findable, one row added to the table, then the CLI asked
CHILD = """
import json, sys
import pvisor.adapters.agents as agents
import pvisor.adapters.native as native

agents.__path__.append(sys.argv[1])
native.__path__.append(sys.argv[2])
agents.AGENTS.append(agents.Agent("fake-agent", "fake_agent", "fakeagent"))

if sys.argv[3] == "lists":
    profile = agents.get_profile("fake-agent")
    print(json.dumps({
        "launchers": agents.agent_names(),
        "executables": agents.executables(),
        "descriptors": agents.descriptor_names(),
        "native": native.adapter_names(),
        "profile": [type(profile).__name__, profile.executable],
        "descriptor": agents.get_descriptor("fake-agent").title,
        "adapter": type(native.get_adapter("fake-agent")).__name__,
        "detected": native.detect(sys.argv[4]),
    }))
else:
    from pvisor.cli import main

    main(sys.argv[3:])
"""


@pytest.fixture
def fake_agent(tmp_path):
    (tmp_path / "agents").mkdir()
    (tmp_path / "native").mkdir()
    (tmp_path / "agents" / "fake_agent.py").write_text(FAKE_AGENT)
    (tmp_path / "native" / "fake_agent.py").write_text(FAKE_READER)
    trajectory = tmp_path / "t.json"
    trajectory.write_text(json.dumps({"fake_agent_trajectory": []}, indent=1))

    def child(*args: str) -> str:
        argv = [sys.executable, "-c", CHILD, str(tmp_path / "agents"), str(tmp_path / "native"), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    child.trajectory = str(trajectory)  # type: ignore[attr-defined]
    return child


def test_a_fake_agent_added_to_the_table_is_in_every_derived_list(fake_agent):
    lists = json.loads(fake_agent("lists", fake_agent.trajectory))
    assert lists["launchers"] == [*agent_names(), "fake-agent"]
    assert lists["executables"] == [*executables(), "fakeagent"]
    assert lists["descriptors"] == [*descriptor_names(), "fake-agent"]
    assert lists["native"] == [*adapter_names(), "fake-agent"]
    assert lists["profile"] == ["FakeAgent", "fakeagent"]
    assert lists["descriptor"] == "Fake Agent"
    assert lists["adapter"] == "FakeAdapter"
    assert lists["detected"] == ["fake-agent"]


def test_a_fake_agent_added_to_the_table_is_in_the_help_texts(fake_agent):
    run_help = " ".join(fake_agent("run", "--help").split())
    assert "|mini-swe-agent|fake-agent]" in run_help
    assert "its command on PATH: claude, codex, gemini, qwen, opencode, mini, fakeagent)" in run_help
    assert "|fake-agent]" in " ".join(fake_agent("env", "--help").split())
    replay_help = " ".join(fake_agent("replay", "--help").split())
    known = "claude-code, codex, gemini-cli, qwen-code, opencode, mini-swe-agent, openhands, swe-agent, atif"
    assert f"The agent: {known}, fake-agent." in replay_help
    listed = json.loads(fake_agent("adapters", "--json"))
    assert listed[-1]["adapter"] == "fake-agent" and listed[-1]["description"] == "Fake Agent trajectory JSON"
