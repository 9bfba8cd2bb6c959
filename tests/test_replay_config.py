"""``pvisor replay --config replay.toml`` (:mod:`pvisor.replay.config`): the file read back with
its types, relative paths resolved against the file's directory, flags over the file, and one
clear line (file, key, what was expected; never an environment value) for every bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pvisor.core.errors import BadInputError, UsageError
from pvisor.replay.config import (
    AGENT_KEYS,
    MODES,
    OPTION_KEYS,
    REASONING,
    AgentSettings,
    ReasoningPolicy,
    ReplayConfig,
    ReplayMode,
    load_config,
)
from pvisor.replay.profile import parse_profile_spec

SECRET = "sk-secret-123"

FULL = """\
agent = "claude-code"
run = "r-20261201-abc"
trajectory = "session.jsonl"
journal = "data/pvisor.db"
after_step = 2
mode = "replay-only"
output = "out"
workspace = "ws"
workspace_from = "r-20261130-start"
child_run = "child-1"
upstream = "https://api.anthropic.com"
max_steps = 20
boundary_user_prompt = "Go on."
reasoning = "strip"
live_model = "claude-sonnet-4-5"
timeout = 900
task = "Fix the failing test"
session = "ses_1"
force = true
allow_damaged = true
refuse_outside = true
allow_unrecorded = false
allow_unsupported = false
protocol = "anthropic"
profile_from = "other.db:r-1"
sandbox = "bwrap"
sandbox_network = "host"
sandbox_allow = ["cache", "/opt/tools"]
sandbox_memory = "1.5G"
sandbox_cpus = 2
no_restore = true
env_from = "none"

[agents.claude-code]
entrypoint = "bin/claude"
model = "claude-sonnet-4-5"
environment = { MAX_THINKING_TOKENS = "1024", API_KEY = "sk-secret-123" }
arguments = ["--verbose", "--max-turns", "3"]

[agents.codex]
entrypoint = "codex"
"""


def write(directory: Path, text: str | bytes, name: str = "replay.toml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory: not the config file's directory, so that a path resolved against
    the working directory would be wrong."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


# --------------------------------------------------------------------------- a valid file


def test_full_file_reads_back_every_key_with_its_type(tmp_path: Path, elsewhere: Path):
    cfg_dir = tmp_path / "task"
    config = load_config(write(cfg_dir, FULL))

    assert isinstance(config, ReplayConfig)
    assert config.path == cfg_dir / "replay.toml"
    assert config.options == {
        "agent": "claude-code",
        "run": "r-20261201-abc",  # not a path: kept as it is
        "trajectory": str(cfg_dir / "session.jsonl"),
        "journal": str(cfg_dir / "data" / "pvisor.db"),
        "after_step": 2,
        "mode": "replay-only",
        "output": str(cfg_dir / "out"),
        "workspace": str(cfg_dir / "ws"),
        "workspace_from": "r-20261130-start",  # a run id, not a path
        "child_run": "child-1",  # a run id too
        "upstream": "https://api.anthropic.com",
        "max_steps": 20,
        "boundary_user_prompt": "Go on.",
        "reasoning": "strip",
        "live_model": "claude-sonnet-4-5",
        "timeout": 900.0,
        "task": "Fix the failing test",
        "session": "ses_1",
        "force": True,
        "allow_damaged": True,
        "refuse_outside": True,
        "allow_unrecorded": False,
        "allow_unsupported": False,
        "protocol": "anthropic",
        "profile_from": f"{cfg_dir / 'other.db'}:r-1",
        "sandbox": "bwrap",
        "sandbox_network": "host",
        "sandbox_allow": [str(cfg_dir / "cache"), "/opt/tools"],  # relative to the file's directory
        "sandbox_memory": 1536 * 1024 * 1024,  # bytes
        "sandbox_cpus": 2.0,
        "no_restore": True,
        "env_from": "none",
    }
    assert set(config.options) == set(OPTION_KEYS)  # the fixture really sets every key
    assert type(config.options["after_step"]) is int and type(config.options["max_steps"]) is int
    assert type(config.options["timeout"]) is float
    assert type(config.options["force"]) is bool
    assert type(config.options["sandbox_memory"]) is int and type(config.options["sandbox_cpus"]) is float

    assert config.agents == {
        "claude-code": AgentSettings(
            entrypoint=str(cfg_dir / "bin" / "claude"),
            model="claude-sonnet-4-5",
            environment={"MAX_THINKING_TOKENS": "1024", "API_KEY": SECRET},
            arguments=["--verbose", "--max-turns", "3"],
        ),
        # a bare command name stays a name: looked up on PATH like --agent-entrypoint codex
        "codex": AgentSettings(entrypoint="codex", model=None, environment={}, arguments=[]),
    }
    assert config.settings("claude-code") is config.agents["claude-code"]


def test_constants_and_enums_agree():
    assert MODES == ("prepare-only", "replay-only", "continue")
    assert REASONING == ("keep", "strip")
    assert [m.value for m in ReplayMode] == list(MODES)
    assert [r.value for r in ReasoningPolicy] == list(REASONING)
    assert ReplayMode("continue") == "continue"  # str enums compare with their values
    assert AGENT_KEYS == ("entrypoint", "model", "environment", "arguments")


def test_empty_file_sets_nothing(tmp_path: Path):
    config = load_config(write(tmp_path, "# nothing\n"))
    assert config.options == {} and config.agents == {}
    assert config.option("mode", None) is None  # the command's default applies, not the file's


def test_float_timeout_and_zero_after_step(tmp_path: Path):
    config = load_config(write(tmp_path, "timeout = 0.5\nafter_step = 0\n"))
    assert config.options == {"timeout": 0.5, "after_step": 0}


def test_byte_order_mark_is_accepted(tmp_path: Path):
    config = load_config(write(tmp_path, b'\xef\xbb\xbftask = "t"\n'))
    assert config.options == {"task": "t"}


# --------------------------------------------------------------------------- paths


def test_relative_paths_resolve_against_the_files_directory_not_the_working_directory(
    tmp_path: Path, elsewhere: Path
):
    write(tmp_path / "sub", 'trajectory = "session.jsonl"\noutput = "../out"\n')
    # the file named by a relative path, from another directory
    config = load_config(Path("..") / "sub" / "replay.toml")
    assert config.path == tmp_path / "sub" / "replay.toml"
    assert config.options["trajectory"] == str(tmp_path / "sub" / "session.jsonl")
    assert os.path.normpath(config.options["output"]) == str(tmp_path / "out")
    assert not config.options["trajectory"].startswith(str(elsewhere))


def test_absolute_paths_are_kept(tmp_path: Path, elsewhere: Path):
    config = load_config(write(tmp_path / "cfg", 'workspace = "/srv/ws"\njournal = "/var/pvisor.db"\n'))
    assert config.options == {"workspace": "/srv/ws", "journal": "/var/pvisor.db"}


def test_tilde_is_expanded(tmp_path: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    text = (
        'journal = "~/pvisor.db"\nworkspace = "~"\nprofile_from = "~/o.db:r-2"\n'
        '[agents.codex]\nentrypoint = "~/bin/codex"\n'
    )
    config = load_config(write(tmp_path / "cfg", text))
    assert config.options["journal"] == str(home / "pvisor.db")
    assert config.options["workspace"] == str(home)
    assert config.options["profile_from"] == f"{home / 'o.db'}:r-2"
    assert config.settings("codex").entrypoint == str(home / "bin" / "codex")


def test_tilde_of_an_unknown_user_is_an_error(tmp_path: Path):
    path = write(tmp_path, 'journal = "~no-such-user-pvisor/pvisor.db"\n')
    with pytest.raises(BadInputError) as info:
        load_config(path)
    assert str(path) in info.value.message and "'journal'" in info.value.message
    assert "no such user" in info.value.message


@pytest.mark.parametrize(
    ("spec", "expected_path", "expected_run"),
    [
        ("other.db:r-1", "other.db", "r-1"),
        ("data/other.db:r-20261201-abc", "data/other.db", "r-20261201-abc"),
        ("other.db", "other.db", None),  # no run: the newest run of the agent
        ("other.db:", "other.db", None),  # an empty run is no run
        ("/abs/other.db:r-3", "/abs/other.db", "r-3"),
    ],
)
def test_profile_from_resolves_only_the_journal_part(
    tmp_path: Path, elsewhere: Path, spec: str, expected_path: str, expected_run: str | None
):
    cfg_dir = tmp_path / "cfg"
    config = load_config(write(cfg_dir, f"profile_from = {spec!r}\n".replace("'", '"')))
    value = config.options["profile_from"]
    journal = Path(expected_path) if expected_path.startswith("/") else cfg_dir / expected_path
    assert value == (f"{journal}:{expected_run}" if expected_run else str(journal))
    # and --profile-from reads it back into the same journal and run
    assert parse_profile_spec(value) == (journal, expected_run)


def test_profile_from_journal_whose_name_has_a_colon(tmp_path: Path, elsewhere: Path):
    cfg_dir = tmp_path / "cfg"
    (cfg_dir / "runs:v2").mkdir(parents=True)
    (cfg_dir / "runs:v2" / "pvisor.db").write_bytes(b"")
    config = load_config(write(cfg_dir, 'profile_from = "runs:v2/pvisor.db"\n'))
    # the file exists as given: the colon is part of its name, not a run separator
    assert config.options["profile_from"] == str(cfg_dir / "runs:v2" / "pvisor.db")
    assert parse_profile_spec(config.options["profile_from"]) == (cfg_dir / "runs:v2" / "pvisor.db", None)


def test_profile_from_with_no_journal_before_the_colon(tmp_path: Path):
    path = write(tmp_path, 'profile_from = ":r-1"\n')
    with pytest.raises(BadInputError) as info:
        load_config(path)
    assert str(path) in info.value.message and "'profile_from'" in info.value.message
    assert "JOURNAL[:RUN]" in info.value.message


# --------------------------------------------------------------------------- flags over file, settings


def test_flags_override_the_file(tmp_path: Path):
    config = load_config(write(tmp_path, 'max_steps = 5\nforce = true\nmode = "prepare-only"\n'))
    assert config.option("max_steps", 9) == 9  # the flag wins
    assert config.option("max_steps", None) == 5  # no flag: the file's value
    assert config.option("mode", "continue") == "continue"
    assert config.option("mode", None) == "prepare-only"
    assert config.option("force", False) is False  # a given flag, even a false one, wins
    assert config.option("force", None) is True
    assert config.option("task", None) is None  # in neither
    assert config.option("task", "t") == "t"
    assert config.option("after_step", 0) == 0  # 0 is a value, not "no flag"


def test_option_refuses_a_name_that_is_not_an_option(tmp_path: Path):
    config = load_config(write(tmp_path, ""))
    with pytest.raises(KeyError, match="max_step"):
        config.option("max_step", None)


def test_settings_of_an_agent_without_a_table_are_empty(tmp_path: Path):
    config = load_config(write(tmp_path, '[agents.codex]\nmodel = "gpt-5"\n'))
    empty = config.settings("claude-code")
    assert empty == AgentSettings(entrypoint=None, model=None, environment={}, arguments=[])
    assert config.settings("codex").model == "gpt-5"
    # empty settings are a new object each time: changing one changes nothing else
    empty.environment["X"] = "1"
    assert config.settings("claude-code").environment == {}
    assert "claude-code" not in config.agents


# --------------------------------------------------------------------------- bad content

#: a valid agent table appended to every top-level case: its value must never be printed
SECRET_TABLE = f'\n[agents.claude-code]\nenvironment = {{ API_KEY = "{SECRET}" }}\n'

BAD_TOP_LEVEL = [
    # (file text, key the message names, words it holds)
    (
        "max_stepz = 3",
        "max_stepz",
        ["unknown key", "did you mean 'max_steps'", "known keys: agent, run,", "agents"],
    ),
    ("colour = 1\nflavour = 2", "colour", ["unknown keys", "'flavour'", "known keys:"]),
    ('after_step = "2"', "after_step", ["expected an integer >= 0", "got string"]),
    ("after_step = true", "after_step", ["expected an integer >= 0", "got boolean"]),
    ("after_step = 1.5", "after_step", ["expected an integer >= 0", "got float"]),
    ("after_step = -1", "after_step", ["expected an integer >= 0", "got -1"]),
    ("max_steps = 0", "max_steps", ["expected an integer >= 1", "got 0"]),
    ("max_steps = -4", "max_steps", ["expected an integer >= 1", "got -4"]),
    ("timeout = 0", "timeout", ["> 0", "got 0"]),
    ("timeout = -1.5", "timeout", ["> 0", "got -1.5"]),
    ("timeout = nan", "timeout", ["> 0", "got nan"]),
    ("timeout = inf", "timeout", ["> 0", "got inf"]),
    ('timeout = "900"', "timeout", ["integer or float", "got string"]),
    ("timeout = 1979-05-27", "timeout", ["integer or float", "got date"]),
    ('force = "yes"', "force", ["expected a boolean", "got string"]),
    ("allow_unsupported = 1", "allow_unsupported", ["expected a boolean", "got integer"]),
    ('reasoning = "drop"', "reasoning", ["unknown value 'drop'", "expected one of keep, strip"]),
    (
        'mode = "live"',
        "mode",
        ["unknown value 'live'", "expected one of prepare-only, replay-only, continue"],
    ),
    ('protocol = "openai"', "protocol", ["unknown value 'openai'", "anthropic, openai-chat"]),
    ('agent = "claude"', "agent", ["unknown agent 'claude'", "claude-code, codex, gemini-cli"]),
    ("agent = { model = 'x' }", "agent", ["expected a string, got table", "[agents.NAME]"]),
    ("run = 7", "run", ["expected a string, got integer"]),
    ("trajectory = ['a.jsonl']", "trajectory", ["expected a string, got array"]),
    ('task = ""', "task", ["expected a non-empty string"]),
    ('output = ""', "output", ["expected a non-empty string"]),
    ('run = "   "', "run", ["expected a non-empty string"]),
    ('live_model = ""', "live_model", ["expected a non-empty string"]),
    ('boundary_user_prompt = ""', "boundary_user_prompt", ["expected a non-empty string"]),
    ('workspace = "w\\u0000s"', "workspace", ["NUL"]),
    ('upstream = "api.anthropic.com"', "upstream", ["expected an http:// or https:// URL"]),
    ('upstream = "ftp://host"', "upstream", ["expected an http:// or https:// URL"]),
    ('upstream = "https://host:99999"', "upstream", ["expected an http:// or https:// URL"]),
    ("agents = 3", "agents", ["expected a table of [agents.NAME] tables, got integer"]),
    ('sandbox = "docker"', "sandbox", ["unknown value 'docker'", "expected one of auto, bwrap, none"]),
    ('sandbox_network = "all"', "sandbox_network", ["unknown value 'all'", "expected one of gateway, host"]),
    ('sandbox_allow = "cache"', "sandbox_allow", ["expected an array of paths, got string"]),
    ("sandbox_allow = [1]", "sandbox_allow[0]", ["expected a string, got integer"]),
    ('sandbox_allow = ["a", ""]', "sandbox_allow[1]", ["expected a non-empty string"]),
    ('sandbox_memory = "lots"', "sandbox_memory", ["'lots'", "expected a size such as 512M"]),
    ("sandbox_memory = 1024", "sandbox_memory", ["'1024'", "at least 4M"]),
    ("sandbox_memory = 2.5", "sandbox_memory", ["expected a size", "got float"]),
    ("sandbox_cpus = 0", "sandbox_cpus", ["expected a number of CPUs of at least 0.01"]),
    ('sandbox_cpus = "2"', "sandbox_cpus", ["expected a number of CPUs", "got string"]),
    ("sandbox_cpus = true", "sandbox_cpus", ["expected a number of CPUs", "got boolean"]),
]


@pytest.mark.parametrize(("text", "key", "words"), BAD_TOP_LEVEL, ids=[c[0] for c in BAD_TOP_LEVEL])
def test_bad_top_level_value(tmp_path: Path, text: str, key: str, words: list[str]):
    path = write(tmp_path, text + "\n" + (SECRET_TABLE if not text.startswith("agents") else ""))
    with pytest.raises(BadInputError) as info:
        load_config(path)
    message = info.value.message
    assert info.value.exit_code == 65
    assert message.startswith(f"config file {path}: ")
    assert f"'{key}'" in message
    for word in words:
        assert word in message
    assert "\n" not in message
    assert SECRET not in message


def test_upstream_credentials_are_not_printed(tmp_path: Path):
    path = write(tmp_path, f'upstream = "ftp://user:{SECRET}@host"\n')
    with pytest.raises(BadInputError) as info:
        load_config(path)
    assert "'upstream'" in info.value.message
    assert SECRET not in info.value.message


BAD_AGENT_TABLE = [
    # (table text, dotted key the message names, words it holds)
    (
        "[agents.claude]\nmodel = 'x'",
        "agents",
        [
            "unknown agent 'claude'",
            "claude-code, codex, gemini-cli, qwen-code",
            "opencode, mini-swe-agent, openhands, swe-agent",
        ],
    ),
    (
        "[agents.codex]\nmodell = 'x'",
        "agents.codex",
        [
            "unknown key 'modell'",
            "did you mean 'model'",
            "known keys: entrypoint, model, environment, arguments",
        ],
    ),
    ("[agents]\ncodex = 'x'", "agents.codex", ["expected a table", "got string"]),
    ("[agents.codex]\nmodel = 5", "agents.codex.model", ["expected a string, got integer"]),
    ("[agents.codex]\nmodel = ''", "agents.codex.model", ["expected a non-empty string"]),
    ("[agents.codex]\nentrypoint = ''", "agents.codex.entrypoint", ["expected a non-empty string"]),
    ("[agents.codex]\nentrypoint = ['codex']", "agents.codex.entrypoint", ["expected a string, got array"]),
    (
        "[agents.codex]\narguments = '--verbose'",
        "agents.codex.arguments",
        ["expected an array of strings, got string"],
    ),
    (
        "[agents.codex]\narguments = ['--a', 3]",
        "agents.codex.arguments",
        ["item 1", "expected a string, got integer"],
    ),
    (
        f"[agents.codex]\narguments = ['--api-key', \"{SECRET}\\u0000\"]",
        "agents.codex.arguments",
        ["item 1", "NUL"],
    ),
    (
        f'[agents.codex]\nenvironment = "API_KEY={SECRET}"',
        "agents.codex.environment",
        ["expected a table", "got string"],
    ),
    (
        f"[agents.codex]\nenvironment = {{ 'MY-KEY' = \"{SECRET}\" }}",
        "agents.codex.environment",
        ["'MY-KEY' is not a valid variable name"],
    ),
    (
        f"[agents.codex]\nenvironment = {{ '1KEY' = \"{SECRET}\" }}",
        "agents.codex.environment",
        ["'1KEY' is not a valid variable name"],
    ),
    (
        "[agents.codex]\nenvironment = { MAX_THINKING_TOKENS = 1024 }",
        "agents.codex.environment",
        ["MAX_THINKING_TOKENS", "expected a string value", "got integer"],
    ),
    (
        f'[agents.codex]\nenvironment = {{ API_KEY = "{SECRET}\\u0000" }}',
        "agents.codex.environment",
        ["API_KEY", "NUL"],
    ),
    (
        f'[agents.codex]\nenvironment = {{ OPENAI_BASE_URL = "{SECRET}" }}',
        "agents.codex.environment",
        ["OPENAI_BASE_URL cannot be set", "through the gateway", "'upstream'"],
    ),
    (
        f'[agents.claude-code]\nenvironment = {{ anthropic_base_url = "{SECRET}" }}',
        "agents.claude-code.environment",
        ["anthropic_base_url cannot be set", "gateway"],
    ),
    (
        f'[agents.codex]\nenvironment = {{ HTTPS_PROXY = "http://{SECRET}@p" }}',
        "agents.codex.environment",
        ["HTTPS_PROXY cannot be set", "gateway"],
    ),
    (
        f'[agents.codex]\nenvironment = {{ http_proxy = "{SECRET}" }}',
        "agents.codex.environment",
        ["http_proxy cannot be set", "gateway"],
    ),
    (
        f'[agents.codex]\nenvironment = {{ No_Proxy = "{SECRET}" }}',
        "agents.codex.environment",
        ["No_Proxy cannot be set", "gateway"],
    ),
]


@pytest.mark.parametrize(("text", "key", "words"), BAD_AGENT_TABLE, ids=[c[0] for c in BAD_AGENT_TABLE])
def test_bad_agent_table(tmp_path: Path, text: str, key: str, words: list[str]):
    path = write(tmp_path, text + "\n")
    with pytest.raises(BadInputError) as info:
        load_config(path)
    message = info.value.message
    assert message.startswith(f"config file {path}: ")
    assert f"key '{key}'" in message
    for word in words:
        assert word in message
    assert "\n" not in message
    assert SECRET not in message


def test_allowed_environment_names_next_to_refused_ones(tmp_path: Path):
    # names that merely contain the refused words are fine
    text = '[agents.codex]\nenvironment = { BASE_URL_NOTE = "a", MY_PROXY = "b", _X1 = "" }\n'
    config = load_config(write(tmp_path, text))
    assert config.settings("codex").environment == {"BASE_URL_NOTE": "a", "MY_PROXY": "b", "_X1": ""}


# --------------------------------------------------------------------------- bad files


def test_non_utf8_file(tmp_path: Path):
    path = write(tmp_path, b'agent = "codex"\ntask = "caf\xe9"\n')
    with pytest.raises(BadInputError) as info:
        load_config(path)
    message = info.value.message
    assert message == f"config file {path}: not UTF-8 text (byte 0xe9 at line 2); TOML files are UTF-8"


def test_toml_syntax_error_keeps_line_and_column(tmp_path: Path):
    path = write(tmp_path, 'agent = "codex"\n\ntask "no equals sign"\n' + SECRET_TABLE)
    with pytest.raises(BadInputError) as info:
        load_config(path)
    message = info.value.message
    assert message.startswith(f"config file {path}: not valid TOML: ")
    assert "line 3" in message and "column" in message
    assert "\n" not in message and SECRET not in message


def test_duplicate_key_is_a_toml_error_with_its_line(tmp_path: Path):
    path = write(tmp_path, "max_steps = 1\nmax_steps = 2\n")
    with pytest.raises(BadInputError) as info:
        load_config(path)
    assert "not valid TOML" in info.value.message and "line 2" in info.value.message


def test_directory_given_as_the_file(tmp_path: Path):
    with pytest.raises(UsageError) as info:
        load_config(tmp_path)
    assert info.value.exit_code == 2
    assert info.value.message == f"config file {tmp_path}: is a directory; expected a TOML file"


def test_missing_file(tmp_path: Path):
    path = tmp_path / "nope.toml"
    with pytest.raises(UsageError) as info:
        load_config(str(path))
    assert info.value.exit_code == 2
    assert info.value.message == f"config file {path}: no such file"


def test_missing_parent_is_no_such_file(tmp_path: Path):
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "replay.toml"  # a component is a file, not a directory
    with pytest.raises(UsageError, match="no such file"):
        load_config(path)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (PermissionError(13, "Permission denied"), "cannot be read (permission denied)"),
        (OSError(5, "Input/output error"), "cannot be read (Input/output error)"),
    ],
)
def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, expected: str):
    # (raised by a stand-in: the tests may run as root, who reads a mode-000 file)
    path = write(tmp_path, "")

    def refuse(self: Path) -> bytes:
        raise error

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert info.value.message == f"config file {path}: {expected}"


def test_mode_continuation_is_continue_and_agent_keys_at_the_top_are_pointed_to_their_table(tmp_path):
    cfg = load_config(write(tmp_path, 'mode = "continuation"\n'))
    assert cfg.option("mode", None) == "continue"
    for key, hint in (
        ("model", "belongs in the agent's table"),
        ("agent_entrypoint", "[agents.NAME] entrypoint"),
    ):
        with pytest.raises(BadInputError) as err:
            load_config(write(tmp_path, f'{key} = "x"\n', name=f"{key}.toml"))
        assert hint in err.value.message and "did you mean 'mode'" not in err.value.message
