"""The shared native reader (pvisor.adapters.native.jsonl, .diagnostics, .base): damaged-input
classes, each on a small input written here; format profiles; detection and the registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import corpus_dir

from pvisor.adapters.native import adapter_names, detect, get_adapter, read_native
from pvisor.adapters.native.base import FormatProfile
from pvisor.adapters.native.diagnostics import Diagnostics, NativeWarning
from pvisor.adapters.native.jsonl import (
    REJOIN_MAX_LINES,
    JsonlSource,
    iter_json_records,
    loads_lenient,
    read_json_document,
)
from pvisor.core.errors import BadInputError, UsageError


def _lines(tmp_path: Path, data: bytes) -> tuple[list[tuple[int, dict]], Diagnostics]:
    p = tmp_path / "f.jsonl"
    p.write_bytes(data)
    diag = Diagnostics(str(p))
    return [(n, obj) for n, obj, _ref in iter_json_records(p, diag)], diag


def test_clean_lines_are_read_in_order_with_their_numbers(tmp_path):
    got, diag = _lines(tmp_path, b'{"a":1}\n\n{"a":2}\r\n{"a":3}\n')
    assert got == [(1, {"a": 1}), (3, {"a": 2}), (4, {"a": 3})]
    assert diag.warnings == []


def test_lines_split_on_newline_only_not_on_u2028_or_nel(tmp_path):
    # U+2028, U+2029 and U+0085 inside a string: str.splitlines would cut the line there
    rec = {"t": "a\u2028b\u2029c\u0085d\x1ce"}
    got, diag = _lines(tmp_path, json.dumps(rec, ensure_ascii=False).encode() + b"\n" + b'{"n":2}\n')
    assert got == [(1, rec), (2, {"n": 2})] and diag.warnings == []


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    got, diag = _lines(tmp_path, b'{"a":1}\n{"a":2}\n{"a":3, "b": "cut of')
    assert [n for n, _ in got] == [1, 2]
    [w] = diag.warnings
    assert (w.code, w.where) == ("truncated_line", "line 3")


def test_last_line_without_newline_that_parses_is_kept(tmp_path):
    got, diag = _lines(tmp_path, b'{"a":1}\n{"a":2}')
    assert [o for _, o in got] == [{"a": 1}, {"a": 2}] and diag.warnings == []


def test_nul_block_is_skipped_and_reading_goes_on(tmp_path):
    got, diag = _lines(tmp_path, b'{"a":1}\n' + b"\x00" * 4096 + b"\n" + b'{"a":2}\n')
    assert [o for _, o in got] == [{"a": 1}, {"a": 2}]
    [w] = diag.warnings
    assert (w.code, w.where) == ("nul_block", "line 2") and "4096 NUL bytes" in w.message


def test_text_after_a_nul_block_on_the_same_line_is_read(tmp_path):
    # a crash left a half-written line padded with NULs, then the writer went on
    got, diag = _lines(tmp_path, b'{"a":1}\n{"a":' + b"\x00" * 100 + b'{"a":2}\n{"a":3}\n')
    assert [o for _, o in got] == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert diag.codes() == ["nul_block"] and diag.warnings[0].where == "line 2"


def test_malformed_line_in_the_middle_is_skipped_not_the_rest(tmp_path):
    got, diag = _lines(tmp_path, b'{"a":1}\nthis is not json\n{"a":2}\n{"a": 3,,}\n{"a":4}\n')
    assert [o["a"] for _, o in got] == [1, 2, 4]
    assert [(w.code, w.where) for w in diag.warnings] == [
        ("malformed_line", "line 2"),
        ("malformed_line", "line 4"),
    ]


def test_object_split_by_raw_newlines_is_rejoined(tmp_path):
    data = b'{"a":1}\n{"text": "first\nsecond\nthird", "n": 2}\n{"a":3}\n'
    got, diag = _lines(tmp_path, data)
    assert got == [(1, {"a": 1}), (2, {"text": "first\nsecond\nthird", "n": 2}), (5, {"a": 3})]
    [w] = diag.warnings
    assert (w.code, w.where) == ("rejoined_lines", "lines 2-4")


def test_a_rejoined_object_keeps_its_blank_lines(tmp_path):
    got, diag = _lines(tmp_path, b'{"text": "para one\n\npara two"}\n{"a":2}\n')
    assert got == [(1, {"text": "para one\n\npara two"}), (4, {"a": 2})]
    assert [(w.code, w.where) for w in diag.warnings] == [("rejoined_lines", "lines 1-3")]


def test_rejoin_is_bounded_in_lines(tmp_path):
    body = b"\n".join(b"x" for _ in range(REJOIN_MAX_LINES + 5))
    got, diag = _lines(tmp_path, b'{"text": "' + body + b'"}\n{"a":2}\n')
    assert [o for _, o in got] == [{"a": 2}]
    assert diag.codes()[0] == "malformed_line" and diag.warnings[0].where.startswith("lines 1-")


def test_rejoin_is_bounded_in_bytes(tmp_path):
    big = b"y" * (600 * 1024)
    got, diag = _lines(tmp_path, b'{"text": "' + big + b"\n" + big + b"\n" + big + b'"}\n{"a":2}\n')
    assert [o for _, o in got] == [{"a": 2}]
    assert diag.codes()[0] == "malformed_line"


def test_a_bad_line_followed_by_a_good_one_is_not_swallowed_by_a_rejoin(tmp_path):
    got, diag = _lines(tmp_path, b'{"a": 1, broken\n{"a":2}\n')
    assert [o for _, o in got] == [{"a": 2}]
    assert [(w.code, w.where) for w in diag.warnings] == [("malformed_line", "line 1")]


def test_lone_surrogate_escape_is_kept_as_replacement_character_and_flagged(tmp_path):
    got, diag = _lines(tmp_path, b'{"out": "bad \\ud800 half"}\n{"ok": "\\ud83d\\ude00"}\n')
    assert got == [(1, {"out": "bad \ufffd half"}), (2, {"ok": "\U0001f600"})]
    assert [(w.code, w.where) for w in diag.warnings] == [("lone_surrogate", "line 1")]


def test_invalid_utf8_is_read_as_replacement_character_and_flagged(tmp_path):
    got, diag = _lines(tmp_path, b'{"out": "caf\xe9 \xff"}\n')
    assert got == [(1, {"out": "caf\ufffd \ufffd"})]
    assert [(w.code, w.where) for w in diag.warnings] == [("invalid_utf8", "line 1")]


def test_a_json_value_that_is_not_an_object_is_skipped(tmp_path):
    got, diag = _lines(tmp_path, b'[1,2]\n{"a":1}\n')
    assert got == [(2, {"a": 1})] and diag.codes() == ["not_an_object"]


def test_lines_longer_than_a_read_chunk_are_whole(tmp_path, monkeypatch):
    import pvisor.adapters.native.jsonl as jsonl

    monkeypatch.setattr(jsonl, "CHUNK_BYTES", 7)
    got, diag = _lines(tmp_path, b'{"text": "' + b"z" * 50 + b'"}\n{"a":2}\n')
    assert [n for n, _ in got] == [1, 2] and got[0][1]["text"] == "z" * 50 and diag.warnings == []


def test_loads_lenient_refuses_what_is_not_json():
    with pytest.raises(ValueError):
        loads_lenient(b"{nope")


# --------------------------------------------------------------------------- profiles


P = FormatProfile("demo", 2, 1, "`version`")


def test_profile_same_minor_or_older_is_silent():
    diag = Diagnostics("f")
    P.check("2.1.38", "line 3", diag)
    P.check("2.0.9", "line 3", diag)
    assert diag.warnings == [] and P.name == "demo@2.1"


def test_profile_newer_minor_warns_unverified_profile():
    diag = Diagnostics("f")
    P.check("2.7.0", "line 3", diag)
    [w] = diag.warnings
    assert (w.code, w.where) == ("unverified_profile", "line 3") and "demo@2.1" in w.message


@pytest.mark.parametrize("version", ["3.0.0", "1.9"])
def test_profile_unknown_major_is_exit_65_naming_the_line(version):
    with pytest.raises(BadInputError) as exc:
        P.check(version, "line 7", Diagnostics("/x/session.jsonl"))
    assert exc.value.exit_code == 65
    assert exc.value.message.startswith("/x/session.jsonl: line 7: ") and "demo@2.1" in exc.value.message


def test_missing_version_warns_no_version():
    diag = Diagnostics("f")
    P.check(None, "file", diag)
    assert diag.codes() == ["no_version"]


def test_claude_code_file_of_a_newer_major_is_refused_naming_the_line(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text(
        json.dumps(
            {
                "type": "user",
                "uuid": "u1",
                "parentUuid": None,
                "isSidechain": False,
                "sessionId": "s",
                "version": "3.0.1",
                "message": {"role": "user", "content": "hi"},
            }
        )
        + "\n"
    )
    with pytest.raises(BadInputError) as exc:
        read_native(p, "claude-code")
    assert "line 1" in exc.value.message and "claude-code@2.1" in exc.value.message


def test_a_record_missing_its_required_shape_is_left_out_with_a_warning_not_fatal(tmp_path):
    # issue 6 tester finding 5 (H7): one bad record among good ones is skipped, warned
    # `malformed_record`; a file with no record of the shape is refused (tests/test_native_claude_code.py)
    p = tmp_path / "s.jsonl"
    p.write_text(
        json.dumps(
            {
                "type": "user",
                "uuid": "u1",
                "parentUuid": None,
                "isSidechain": False,
                "sessionId": "s",
                "version": "2.1.0",
                "message": {"role": "user", "content": "hi"},
            }
        )
        + "\n"
        + json.dumps(
            {
                "type": "assistant",
                "uuid": "a1",
                "parentUuid": "u1",
                "isSidechain": False,
                "sessionId": "s",
                "version": "2.1.0",
            }
        )
        + "\n"
    )
    result, _ = read_native(p, "claude-code")
    assert [(w.code, w.where, w.message) for w in result.diagnostics.warnings] == [
        ("malformed_record", "line 2", "an assistant line without a `message` object; left out")
    ]
    assert len(result.trajectory.steps) == 0 and result.trajectory.task == "hi"


# --------------------------------------------------------------------------- registry


def test_registry_lists_seven_adapters_each_with_a_profile():
    # in the agent table's one order (adapters/agents/__init__.py AGENTS)
    names = adapter_names()
    assert names == [
        "claude-code",
        "codex",
        "gemini-cli",
        "qwen-code",
        "opencode",
        "mini-swe-agent",
        "openhands",
        "swe-agent",
        "atif",  # a format row: any agent's run in ATIF
    ]
    for n in names:
        a = get_adapter(n)
        assert a.name == n and a.profiles and a.profiles[0].name.startswith(n + "@")


def test_unknown_adapter_is_a_usage_error():
    with pytest.raises(UsageError) as exc:
        get_adapter("aider")
    assert "claude-code" in exc.value.message


def test_a_file_no_adapter_recognises_is_refused(tmp_path):
    p = tmp_path / "notes.jsonl"
    p.write_text('{"hello": "world"}\n')
    assert detect(p) == []
    with pytest.raises(BadInputError) as exc:
        read_native(p)
    assert "no native adapter recognises" in exc.value.message


def test_an_ambiguous_file_is_an_error_naming_the_candidates(tmp_path):
    # a line that looks like both a Claude Code and a Qwen Code record
    p = tmp_path / "both.jsonl"
    p.write_text(
        json.dumps(
            {
                "parentUuid": None,
                "sessionId": "s",
                "uuid": "u",
                "type": "user",
                "message": {"parts": [{"text": "x"}]},
            }
        )
        + "\n"
        + json.dumps({"isSidechain": False})
        + "\n"
    )
    p.write_bytes(
        b" " * 5000 + p.read_bytes()
    )  # the Qwen sniff looks for isSidechain in the first 4 KiB only
    assert set(detect(p)) == {"claude-code", "qwen-code"}
    with pytest.raises(BadInputError) as exc:
        read_native(p)
    assert (
        "ambiguous" in exc.value.message
        and "claude-code" in exc.value.message
        and "qwen-code" in exc.value.message
    )


@pytest.mark.parametrize(
    "agent", ["claude-code", "codex", "gemini-cli", "qwen-code", "mini-swe-agent", "openhands"]
)
def test_a_directory_given_to_a_file_adapter_is_refused(tmp_path, agent):
    with pytest.raises(BadInputError) as exc:
        read_native(tmp_path, agent)
    assert (
        exc.value.message == f"{tmp_path}: is a directory; the {agent} adapter reads a file, not a directory"
    )


def test_a_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        read_native(tmp_path / "nope.jsonl")


def test_a_byte_order_mark_at_the_start_is_not_part_of_the_first_line(tmp_path):
    got, diag = _lines(tmp_path, b"\xef\xbb\xbf" + b'{"a": 1}\n{"b": 2}\n')
    assert got == [(1, {"a": 1}), (2, {"b": 2})] and diag.warnings == []
    doc = tmp_path / "bom.json"
    doc.write_bytes(b"\xef\xbb\xbf" + b'{"a": 1}')
    assert read_json_document(doc, Diagnostics(str(doc))) == {"a": 1}


def test_warnings_of_one_code_are_capped_and_the_rest_counted(tmp_path):
    from pvisor.adapters.native.diagnostics import MAX_WARNINGS_PER_CODE

    got, diag = _lines(tmp_path, b'{"a":1}\n' + b"junk\n" * (MAX_WARNINGS_PER_CODE + 250) + b'{"b":2}\n')
    assert got == [(1, {"a": 1}), (MAX_WARNINGS_PER_CODE + 252, {"b": 2})]
    assert diag.counts == {"malformed_line": MAX_WARNINGS_PER_CODE + 250}
    assert len(diag.warnings) == MAX_WARNINGS_PER_CODE + 1
    assert diag.warnings[-1] == NativeWarning(
        "malformed_line",
        "file",
        f"250 more malformed_line warnings not listed (the first {MAX_WARNINGS_PER_CODE} are)",
    )
    assert [w.where for w in diag.warnings[:2]] == ["line 2", "line 3"]


#: a real session of each JSONL format (tests/corpus/native, PROVENANCE.md beside each) and the
#: line whose record is cut off mid-line with the next line's record glued onto it
GLUED = {
    "claude-code": ("claude-code/spotter_short.jsonl", 4),
    "codex": ("codex/real-0.171.0_single-then-resume.jsonl", 6),
    "gemini-cli": ("gemini-cli/real-0.61.0_single-then-resume.jsonl", 3),
    "qwen-code": ("qwen-code/real-0.24.4_single.jsonl", 3),
}


@pytest.mark.parametrize("agent", list(GLUED))
def test_a_complete_record_glued_onto_a_truncated_line_is_read_and_the_cut_named(agent, tmp_path):
    # a writer cut off mid-line, and the next write appended its record with no newline between
    name, cut = GLUED[agent]
    lines = (corpus_dir() / "native" / name).read_bytes().split(b"\n")
    glued = lines[: cut - 1] + [lines[cut - 1][: len(lines[cut - 1]) // 2] + lines[cut]] + lines[cut + 1 :]
    p = tmp_path / Path(name).name
    p.write_bytes(b"\n".join(glued))
    diag = Diagnostics(str(p))
    got = [obj for _n, obj, _ref in iter_json_records(p, diag)]
    whole = [json.loads(line) for line in lines if line.strip()]
    assert got == whole[: cut - 1] + whole[cut:]  # only the truncated record is missing
    [w] = diag.warnings
    assert (w.code, w.where) == ("glued_record", f"line {cut}") and "truncated record" in w.message
    result, _notes = read_native(p, agent)
    assert ("glued_record", f"line {cut}") in [(w.code, w.where) for w in result.diagnostics.warnings]
    assert "malformed_line" not in result.diagnostics.codes()


def test_a_glued_record_is_read_again_from_its_place_in_the_line(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_bytes(b'{"a":1}\n{"a": 2, "b": "cut of{"a": 3, "c": {"d": 4}}\n{"a":5}\n')
    diag = Diagnostics(str(p))
    got = list(iter_json_records(p, diag))
    assert [(n, o) for n, o, _ in got] == [(1, {"a": 1}), (2, {"a": 3, "c": {"d": 4}}), (3, {"a": 5})]
    assert JsonlSource(p).load(got[1][2]) == {"a": 3, "c": {"d": 4}}
    assert diag.codes() == ["glued_record"]


def test_complete_records_glued_on_one_line_are_each_read_none_lost(tmp_path):
    # a writer that left out the newline between complete records: each is a record (the glue
    # search read only the last and called the others one truncated record)
    p = tmp_path / "f.jsonl"
    p.write_bytes(b'{"n":1}{"n":2}\n{"n":3}\n {"n":4}{"n":5}{"n":6}\n{"n":7, "cut{"n":8}\n')
    diag = Diagnostics(str(p))
    got = list(iter_json_records(p, diag))
    assert [(n, o["n"]) for n, o, _ in got] == [(1, 1), (1, 2), (2, 3), (3, 4), (3, 5), (3, 6), (4, 8)]
    assert [JsonlSource(p).load(ref)["n"] for _, _, ref in got] == [1, 2, 3, 4, 5, 6, 8]
    assert diag.codes() == ["glued_record"] * 3
    assert "truncated" not in diag.warnings[0].message and "truncated" in diag.warnings[2].message


def test_a_cut_off_last_line_ending_in_a_nested_object_is_truncated_not_glued(tmp_path):
    # cut right after a nested object's brace: its rest parses, but no record was appended
    got, diag = _lines(tmp_path, b'{"a":1}\n{"a": 2, "b": {"c": 3}')
    assert [o for _, o in got] == [{"a": 1}]
    assert [(w.code, w.where) for w in diag.warnings] == [("truncated_line", "line 2")]


def test_a_line_of_nested_openings_is_searched_for_a_glued_record_within_a_byte_budget(tmp_path, monkeypatch):
    # 800 openings of a list of 5,000 ints, closed only at the end: every `{"` is a candidate
    # whose parse reads to the end of the line (one parse per candidate took 45 s)
    import orjson

    from pvisor.adapters.native import jsonl

    junk = (b'{"k":[' + b"1," * 5000) * 800 + b"1]}"
    lines = (corpus_dir() / "native" / "claude-code" / "spotter_short.jsonl").read_bytes().split(b"\n")
    p = tmp_path / "spotter_short.jsonl"
    p.write_bytes(b"\n".join(lines[:3] + [junk] + lines[3:]))
    bound = len(junk) + jsonl.glue_budget(len(junk))  # the line's own parse, then the candidates'
    assert jsonl.glue_budget(len(junk)) <= jsonl.GLUE_MAX_BYTES
    read = [0]  # bytes of the long line handed to orjson
    loads = orjson.loads

    def counting(data):
        if len(data) > 1 << 20:
            read[0] += len(data)
            assert read[0] <= bound, f"{read[0]} bytes parsed, over the budget {bound}"
        return loads(data)

    monkeypatch.setattr(orjson, "loads", counting)
    diag = Diagnostics(str(p))
    got = [obj for _n, obj, _ref in iter_json_records(p, diag)]
    monkeypatch.undo()
    assert got == [json.loads(line) for line in lines if line.strip()]
    assert [(w.code, w.where) for w in diag.warnings] == [("malformed_line", "line 4")]
    search = jsonl.glued_record(junk)
    assert search.found is None and search.parsed <= jsonl.glue_budget(len(junk)) and search.tries <= 2


def _cut_end(name: str, n: int, tmp_path: Path) -> tuple[Path, list[bytes]]:
    """The real file ``name`` with line ``n``'s last character (its closing brace) removed, the
    newline kept."""
    lines = (corpus_dir() / "native" / name).read_bytes().split(b"\n")
    assert lines[n - 1].endswith(b"}}")  # its last nested object ends the cut line
    p = tmp_path / Path(name).name
    p.write_bytes(b"\n".join(lines[: n - 1] + [lines[n - 1][:-1]] + lines[n:]))
    return p, lines


def test_a_record_missing_only_its_closing_brace_is_cut_off_not_glued(tmp_path):
    name = "codex/real-0.171.0_single-then-resume.jsonl"
    p, lines = _cut_end(name, 10, tmp_path)  # step 1's function_call, its payload object last
    diag = Diagnostics(str(p))
    got = [obj for _n, obj, _ref in iter_json_records(p, diag)]
    assert got == [json.loads(line) for i, line in enumerate(lines) if line.strip() and i != 9]
    [w] = diag.warnings
    assert (w.code, w.where) == ("malformed_line", "line 10") and "cut off before its end" in w.message
    result, _notes = read_native(p, "codex")
    assert not {"glued_record", "unknown_record"} & set(result.diagnostics.codes())


def test_a_last_record_missing_only_its_closing_brace_is_a_truncated_line(tmp_path):
    name = "codex/real-0.171.0_single-then-resume.jsonl"
    p, lines = _cut_end(name, 34, tmp_path)  # task_complete, newline kept after it
    assert lines[34:] == [b""]
    result, _notes = read_native(p, "codex")
    assert [(w.code, w.where) for w in result.diagnostics.warnings if w.code != "no_version"][:1] == [
        ("truncated_line", "line 34")
    ]
    assert "glued_record" not in result.diagnostics.codes()
    assert "truncated_line" in result.trajectory.steps[-1].flags
