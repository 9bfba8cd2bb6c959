"""Every native corpus sample (tests/corpus/native, or $PVISOR_CORPUS/native) is read by the
adapter its format names, or refused with the reason asserted here. The table names every
sample of the shared corpus; a sample missing from it fails, so a new one must be described."""

from __future__ import annotations

import pytest

from native_helpers import native_dir, opencode_db_from_dump
from pvisor.adapters.native import read_native
from pvisor.core.errors import BadInputError

#: sample -> (adapter detected, tool calls per step, warning codes), or a refusal:
#: ("refused", text in the error)
EXPECTED: dict[str, tuple] = {
    # written by Harbor 0.26.0 (tests/harbor_atif_write.py): its converter's ATIF-v1.7 of the
    # mini-swe-agent sample real-2.4.6_single, and an ATIF-v1.8 terminus-2 file (an agent pvisor does
    # not know: the generic descriptor's assumptions are warned; the copied-context step is no step)
    "atif/harbor-mini-swe-agent.json": ("atif", [1, 1], []),
    "atif/harbor-terminus-2-v1.8.json": ("atif", [1, 2, 1, 1], ["atif_assumed"]),
    "claude-code/agent-sessions_schema_coverage.jsonl": (
        "claude-code",
        [1],
        ["broken_chain", "duplicate_record"],
    ),  # "[trimmed for fixture]" uuids: one chain from the leaf
    "claude-code/real-2.1.197_single-then-resume.jsonl": ("claude-code", [1, 0, 1, 0], []),
    "claude-code/spotter_short.jsonl": ("claude-code", [2], []),
    "claude-code/spotter_subagent.jsonl": ("claude-code", [4, 2, 1, 1, 1, 1, 1, 1, 1, 2, 1, 0], []),
    "claude-code/spotter_tool_heavy.jsonl": ("claude-code", [1, 1, 2, 2], []),
    # line 21 answers call-1 of step 1 after later actions' lines: it belongs to step 1, no call is
    # left unanswered
    # three calls share the "[trimmed for fixture]" id; an output whose trimmed id answers no call is
    # a gap step (lost_action)
    "codex/agent-sessions_schema_coverage.jsonl": (
        "codex",
        [2, 1, 1, 0, 0, 1, 1, 1, 1],
        ["duplicate_call_id", "lost_action", "unknown_record"],
    ),
    "codex/claude-code-log_synthetic_rollout-2026-01-02T03-04-05-"
    "11111111-1111-4111-8111-111111111111.jsonl": (
        "codex",
        [1, 1, 1, 0],
        ["unknown_record"],
    ),
    "codex/real-0.171.0_single-then-resume.jsonl": ("codex", [1, 0, 1, 0], []),
    "gemini-cli/agent-history_gemini_with_tool_error.jsonl": ("gemini-cli", [1, 1, 1, 1, 0], []),
    "gemini-cli/agent-sessions_jsonl_v040.jsonl": ("gemini-cli", [1, 0], []),
    "gemini-cli/agent-sessions_legacy_session.json": ("gemini-cli", [1, 1, 0, 0], []),
    "gemini-cli/agent-sessions_legacy_small.json": ("gemini-cli", [0], []),
    "gemini-cli/harbor_rfc_gemini-cli-trajectory.json": ("gemini-cli", [0], []),
    "gemini-cli/real-0.61.0_single-then-resume.jsonl": ("gemini-cli", [1, 0, 1, 0], []),
    "mini-swe-agent/harbor_rfc_mini-swe-agent-trajectory.json": ("mini-swe-agent", [0, 0, 0], []),
    "mini-swe-agent/real-2.4.6_anthropic.traj.json": ("mini-swe-agent", [1, 1], []),
    "mini-swe-agent/real-2.4.6_parallel.traj.json": ("mini-swe-agent", [2, 1], []),
    "mini-swe-agent/real-2.4.6_single.traj.json": ("mini-swe-agent", [1, 1], []),
    "mini-swe-agent/real-2.4.6_textbased.traj.json": ("mini-swe-agent", [0, 0], []),
    "mini-swe-agent/upstream_test_data_github_issue.traj.json": ("mini-swe-agent", [0] * 10, ["no_version"]),
    "mini-swe-agent/upstream_test_data_local.traj.json": ("mini-swe-agent", [0, 0], ["no_version"]),
    "mini-swe-agent/v1_gemini-3-pro_django__django-13590.traj.json": ("mini-swe-agent", [0] * 28, []),
    "mini-swe-agent/v1_gemini-3-pro_django__django-16255.traj.json": ("mini-swe-agent", [0] * 17, []),
    "opencode/agent-sessions_storage_v2": ("opencode", [1, 0], []),  # tree read in file-name order (N2)
    "opencode/real-1.18.33_export_resume.json": ("opencode", [1, 0, 0], []),
    "opencode/real-1.18.33_export_single.json": ("opencode", [2, 0], []),
    "opencode/real-1.18.33_opencode-db-dump.json": ("opencode", [1, 0], []),  # rebuilt as opencode.db
    "openhands/harbor_rfc_openhands_trajectory.json": ("openhands", [1, 1], []),
    "openhands/tests_runtime_trajs_basic.json": ("openhands", [1, 1], []),
    "openhands/tests_runtime_trajs_basic_gui_mode.json": ("openhands", [1, 1, 1, 1, 0], []),
    "openhands/tests_runtime_trajs_basic_interactions.json": ("openhands", [0, 0, 1], []),
    "openhands/tests_runtime_trajs_wrong_initial_state.json": ("openhands", [1, 1, 1, 1], []),
    "qwen-code/agent-sessions_019f0000-0000-7000-8000-000000000001.jsonl": ("qwen-code", [1, 0], []),
    "qwen-code/agent-sessions_019f0000-0000-7000-8000-000000000004.jsonl": (
        "qwen-code",
        [1],
        ["duplicate_record", "interrupted"],
    ),
    # a fixture whose version and uuids were all trimmed to "[trimmed for fixture]": read by shape;
    # every record replaces the one before (one uuid) and the last is a system record: no step, the
    # duplicates warned
    "qwen-code/agent-sessions_system_telemetry.jsonl": (
        "qwen-code",
        [],
        ["duplicate_record", "unreadable_version"],
    ),
    "qwen-code/real-0.24.4_single-offline.jsonl": ("qwen-code", [1, 0], []),
    "qwen-code/real-0.24.4_single.jsonl": ("qwen-code", [1, 0, 0], []),
    # SWE-agent (optional in issue 6): adapters/native/swe_agent.py, history read by shape
    "swe-agent/demo_function_calling_replace_marshmallow-1867.traj": ("swe-agent", [1] * 11, []),
    "swe-agent/demo_function_calling_simple.traj": ("swe-agent", [1] * 5, []),
    "swe-agent/test_data_gpt4_pydicom__pydicom-1458.traj": ("swe-agent", [0] * 12, []),
    "swe-agent/test_data_gpt4_swe-agent__test-repo-i1.traj": ("swe-agent", [0] * 5, []),
}


def _samples() -> list[str]:
    root = native_dir()
    return sorted(f"{p.parent.name}/{p.name}" for p in root.glob("*/*") if p.name != "PROVENANCE.md")


def test_the_native_corpus_is_there():
    assert len(_samples()) >= 30, f"native corpus missing or thin at {native_dir()}"


@pytest.mark.parametrize("sample", _samples())
def test_corpus_sample_is_read_or_refused_with_its_reason(sample, tmp_path):
    assert sample in EXPECTED, f"{sample} is not described in EXPECTED"
    path = native_dir() / sample
    if sample.endswith("opencode-db-dump.json"):
        path = opencode_db_from_dump(path, tmp_path / "opencode.db")
    want = EXPECTED[sample]
    if want[0] == "refused":
        with pytest.raises(BadInputError) as exc:
            read_native(path)
        assert want[1] in exc.value.message and exc.value.exit_code == 65
        return
    agent, calls, codes = want
    result, notes = read_native(path)
    assert notes == [f"detected format: {agent}"]
    t = result.trajectory
    assert [len(s.action.tool_calls) for s in t.steps] == calls
    assert sorted(set(result.diagnostics.codes())) == codes
    # the same trajectory when the adapter is named
    again, notes2 = read_native(path, agent)
    assert notes2 == [] and [s.action.text for s in again.trajectory.steps] == [
        s.action.text for s in t.steps
    ]
    for s in t.steps:
        # every tool call has a result (or is flagged interrupted), in call order
        expect_results = [c.id for c in s.action.tool_calls if c.kind != "server" and c.name != "finish"]
        assert [r.call_id for r in s.observation.results][
            : len(expect_results)
        ] == expect_results or "interrupted" in s.flags
        for c in s.action.tool_calls:
            assert isinstance(c.arguments_raw, str)
