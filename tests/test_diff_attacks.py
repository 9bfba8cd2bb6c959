"""``pvisor diff`` against hostile and odd pairs (docs/diff.md): JSON values that compare equal
in Python but are other prompts (``true`` and ``1``, ``1.0`` and ``1``, integers past 64 bits),
bodies nested past what the JSON library writes (one line and an exit code, never a
traceback), a key-shaped token in a body (never in expected/got, also when the difference lies
inside the key), and an exchange with no request body. Journals written by the real writer,
read through the real CLI where the CLI is what is claimed."""

from __future__ import annotations

import copy
import json
import re
import sqlite3
from pathlib import Path

import orjson
from test_diff import anthropic_body, cli, conversation, write_pair

from pvisor.adapters.request_diff import bytes_diff, diff_requests
from pvisor.journal.model import Attempt, Run
from pvisor.journal.reader import JournalReader
from pvisor.journal.writer import Journal


def _tool_input(value) -> bytes:
    msgs = conversation(2)
    msgs[1]["content"][1]["input"] = {"count": value}
    return orjson.dumps(anthropic_body(msgs))


def test_true_against_1_and_1_0_against_1_are_other_prompts(tmp_path):
    """Python's ``True == 1 == 1.0`` made these pairs ``bytes_only`` (exit 0: "the prompt is
    unchanged") while the structure named the changed tool call: the provider renders each as
    it is written."""
    j = tmp_path / "j.sqlite"
    for a, b in ((1, True), (1, 1.0), (0, False)):
        xa, xb = write_pair(j, _tool_input(a), _tool_input(b))
        p = cli(j, xa, xb, "--json")
        assert p.returncode == 1, (a, b, p.stdout, p.stderr)
        doc = json.loads(p.stdout)
        assert doc["verdict"] == "differs" and doc["structure"]["field"] == "tool_call", (a, b)
    # integers past 64 bits: the JSON library reads both as one float
    big_a = b'{"model":"m","max_tokens":1,"messages":[],"metadata":{"n":123456789012345678901234567890}}'
    big_b = big_a.replace(b"890}", b"891}")
    assert diff_requests(big_a, big_b, "anthropic").verdict.value == "differs"
    assert bytes_diff(big_a, big_b).verdict.value == "differs"
    assert bytes_diff(_tool_input(1), _tool_input(True)).verdict.value == "differs"
    # still bytes_only: key order, whitespace, escapes, 1.0 written 1.00
    spaced = json.dumps(json.loads(_tool_input(1.0)), indent=1).replace("1.0", "1.00").encode()
    assert diff_requests(_tool_input(1.0), spaced, "anthropic").verdict.value == "bytes_only"


def _nested(depth: int, leaf: bytes) -> bytes:
    inner = b'{"a":' * depth + leaf + b"}" * depth
    return (
        b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result",'
        b'"tool_use_id":"t","content":[{"type":"text","text":"x","meta":' + inner + b"}]}]}]}"
    )


def test_a_deeply_nested_body_is_one_line_never_a_traceback(tmp_path):
    """A block nested 300 or 1,000 levels deep (the JSON library reads up to 1,024 and writes up
    to 255): a TypeError or a RecursionError traceback, exit 1 as if the prompts differed."""
    j = tmp_path / "j.sqlite"
    for depth in (300, 1000, 5000):
        xa, xb = write_pair(j, _nested(depth, b"1"), _nested(depth, b"2"))
        p = cli(j, xa, xb)
        assert p.returncode == 1 and "Traceback" not in p.stderr, (depth, p.stderr[-500:])
        lines = p.stdout.splitlines()
        assert lines[0].startswith("differs: bodies part at byte "), (depth, p.stdout)
        assert lines[1] == "note: body A nests deeper than 255 levels: compared as bytes only", depth
        # the report's section: the verdict of a long run's later steps
        assert bytes_diff(_nested(depth, b"1"), _nested(depth, b"2")).verdict.value == "differs"


def test_a_key_shaped_token_never_reaches_expected_or_got(tmp_path):
    """Expected/got start a few characters before the first difference: a difference inside a
    pasted key showed its tail without the ``sk-ant-`` prefix the redaction finds keys by (in
    the text, the JSON and the report's section, which redacts only whole keys)."""
    key = "sk-ant-api03-" + "Q" * 40 + "XYZW"
    j = tmp_path / "j.sqlite"

    def body(text: str) -> bytes:
        return orjson.dumps(anthropic_body([{"role": "user", "content": f"my key is {text} ok"}]))

    pairs = [(key, key[:-1] + "V"), (key, key + " and more"), ("no key", key)]
    for a, b in pairs:
        xa, xb = write_pair(j, body(a), body(b))
        for args in ((xa, xb), (xa, xb, "--json")):
            p = cli(j, *args)
            assert p.returncode == 1, p.stderr
            assert "QQQQQQ" not in p.stdout and "XYZ" not in p.stdout, (a, b, p.stdout)
    # a parameter and a body compared as JSON only are shown redacted too
    found = diff_requests(
        orjson.dumps({"model": "m", "metadata": {"user_id": key}}), orjson.dumps({"model": "m"}), None
    )
    assert "QQQQQQ" not in orjson.dumps(found.to_json()).decode()


def test_an_exchange_with_no_request_body_is_named_so(tmp_path):
    """A GET (no body) against a POST, and a body that did not decode from its gzip coding (the
    journal keeps the bytes as received), were each "body A is not JSON"."""
    j = tmp_path / "j.sqlite"
    _, xb = write_pair(j, orjson.dumps(anthropic_body(conversation(1))), b"{}")
    with Journal.open(j) as w:
        w.create_run(Run(id="r-get", agent="claude-code"))
        g = w.record_exchange("r-get", "GET", "/v1/models", [], protocol="anthropic", status=200)
        bad = w.record_exchange(
            "r-get", "POST", "/v1/messages", [], protocol="anthropic", status=200,
            request_body=b"\x1f\x8b not gzip", request_encoding="gzip",
        )  # fmt: skip
        w.flush()
    p = cli(j, g, xb)
    assert p.returncode == 1, p.stderr
    assert p.stdout.splitlines()[1] == "note: A (GET /v1/models) has no request body", p.stdout
    p = cli(j, xb, bad)
    assert p.returncode == 1, p.stderr
    assert p.stdout.splitlines()[1] == (
        "note: B's body did not decode from its Content-Encoding (gzip): its stored bytes are compared"
    ), p.stdout


def test_a_gemini_model_named_in_the_path_differs_though_the_bodies_are_the_same_json(tmp_path):
    """Gemini names the model in the path: the same body to another model was ``bytes_only``
    (exit 0, "the prompt is unchanged") beside "model: the model differs" and no cache."""
    j = tmp_path / "j.sqlite"
    body = orjson.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    with Journal.open(j) as w:
        ids = []
        for n, (model, data) in enumerate((("gemini-a", body), ("gemini-b", body + b" "))):
            w.create_run(Run(id=f"r-g{n}", agent="gemini-cli"))
            ids.append(
                w.record_exchange(
                    f"r-g{n}",
                    "POST",
                    f"/v1beta/models/{model}:generateContent",
                    [],
                    protocol="gemini",
                    status=200,
                    request_body=data,
                )  # fmt: skip
            )
        w.flush()
    p = cli(j, *ids, "--json")
    assert p.returncode == 1, p.stdout
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "differs" and doc["structure"]["path"] == "model"


def _marked(n: int, marker_at: tuple[int, ...], change: int | None = None) -> list:
    """``conversation(n, marker_at)`` with message ``change``'s first text block said otherwise."""
    msgs = conversation(n, marker_at=marker_at)
    if change is not None:
        msgs[change]["content"][0]["text"] = "Said otherwise."
    return msgs


def test_anthropic_reuse_needs_a_breakpoint_of_b_within_its_lookback(tmp_path):
    """A request reads the cache only at its own breakpoints, each looking back 20 blocks for an
    entry an earlier request wrote at its breakpoint: B with no breakpoint at all was told it
    reused A's prompt up to A's breakpoint on message 4 (and so was a B whose only breakpoint
    in the messages lay 60 blocks past it)."""
    j = tmp_path / "j.sqlite"
    a = anthropic_body(_marked(41, (4, 40)))

    def cache(b: dict) -> dict:
        doc = json.loads(cli(j, *write_pair(j, orjson.dumps(a), orjson.dumps(b)), "--json").stdout)
        assert doc["structure"]["path"] == "messages[31].parts[0]", doc["structure"]
        return doc["cache"]

    none = cache(anthropic_body(_marked(41, (), change=31), system_marker=False))
    assert (none["reusable_bytes"], none["reused_upto"], none["first_uncached"]) == (0, None, "model")
    assert none["basis"] == "Anthropic: B sets no cache_control breakpoint: it reads no cache"
    far = cache(anthropic_body(_marked(41, (40,), change=31)))  # 60 blocks past message 4
    assert (far["reused_upto"], far["first_uncached"]) == ("system[0]", "messages[0]"), far
    assert far["basis"] == (
        "Anthropic: up to A's breakpoint at system[0], read by B's breakpoint at system[0] "
        "(B's breakpoints look back 20 blocks)"
    )
    near = cache(anthropic_body(_marked(41, (8, 40), change=31)))  # 6 blocks past message 4
    assert near["reused_upto"] == "messages[4].parts[0]" and near["first_uncached"] == "messages[5]"
    assert near["basis"] == (
        "Anthropic: up to A's breakpoint at messages[4].parts[0], read by B's breakpoint at "
        "messages[8].parts[0] (B's breakpoints look back 20 blocks)"
    )


def test_tool_choice_thinking_and_images_cost_the_messages_cache(tmp_path):
    """Anthropic's guide ("What invalidates the cache"): a change of ``tool_choice``, of the
    thinking parameters, or images added or removed invalidate the messages' cache while tools
    and system stay cached; such pairs were "at no cache cost" (or reused up to A's breakpoint
    on message 4)."""
    j = tmp_path / "j.sqlite"
    msgs = conversation(7, marker_at=(4, 6))
    a = anthropic_body(msgs)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}}
    extended = copy.deepcopy(msgs) + [{"role": "user", "content": [image]}]
    del extended[6]["content"][-1]["cache_control"]
    extended[7]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    cases = [
        (anthropic_body(msgs, tool_choice={"type": "any"}), "tool_choice differs"),
        (anthropic_body(msgs, thinking={"type": "enabled", "budget_tokens": 2048}), "thinking differs"),
        (anthropic_body(extended), "the number of image blocks differs (A 0, B 1)"),
    ]
    for b, why in cases:
        doc = json.loads(cli(j, *write_pair(j, orjson.dumps(a), orjson.dumps(b)), "--json").stdout)
        cache = doc["cache"]
        assert (cache["reused_upto"], cache["first_uncached"]) == ("system[0]", "messages[0]"), (why, cache)
        assert cache["basis"].endswith(
            f"; {why}: the messages' cache is invalidated (tools and system stay cached)"
        ), cache["basis"]
    # another max_tokens is still at no cache cost
    b = anthropic_body(msgs, max_tokens=5)
    doc = json.loads(cli(j, *write_pair(j, orjson.dumps(a), orjson.dumps(b)), "--json").stdout)
    assert doc["cache"]["reusable_bytes"] == doc["cache"]["prompt_bytes"]


def test_anthropic_automatic_caching_is_a_breakpoint_on_the_last_block(tmp_path):
    """A top-level ``cache_control`` (automatic caching: the guide puts the breakpoint on the
    last cacheable block and moves it on as the conversation grows): A and B that mark no block
    themselves were said to reuse nothing."""
    j = tmp_path / "j.sqlite"
    a = anthropic_body(conversation(5), system_marker=False, cache_control={"type": "ephemeral"})
    b = anthropic_body(conversation(7), system_marker=False, cache_control={"type": "ephemeral"})
    doc = json.loads(cli(j, *write_pair(j, orjson.dumps(a), orjson.dumps(b)), "--json").stdout)
    assert doc["extends"] is True
    cache = doc["cache"]
    assert (cache["reused_upto"], cache["first_uncached"]) == ("messages[4].parts[0]", "messages[5]"), cache
    assert cache["basis"] == (
        "Anthropic: up to A's breakpoint at messages[4].parts[0] (automatic), read by B's breakpoint "
        "at messages[6].parts[0] (automatic) (B's breakpoints look back 20 blocks)"
    )
    # B without it reads nothing; the same prompt with it dropped is no longer at no cache cost
    plain = anthropic_body(conversation(5), system_marker=False)
    doc = json.loads(cli(j, *write_pair(j, orjson.dumps(a), orjson.dumps(plain)), "--json").stdout)
    assert doc["structure"]["path"] == "params.cache_control"
    assert (
        doc["cache"]["reusable_bytes"] == 0 and "B sets no cache_control breakpoint" in doc["cache"]["basis"]
    )


def test_runs_with_no_main_loop_request_are_named_so(tmp_path):
    """Two runs that sent no main-loop request printed "the 0 aligned step(s) send the same
    prompts"; neither has one to compare (exit 0: nothing differs, as diff(1) of two empty
    files), and a run with none against one with steps says which has none (exit 1)."""
    j = tmp_path / "j.sqlite"
    with Journal.open(j) as w:
        w.create_run(Run(id="r-empty-a", agent="claude-code"))
        w.create_run(Run(id="r-empty-b", agent="claude-code"))
        w.flush()
    write_pair(
        j, orjson.dumps(anthropic_body(conversation(1))), orjson.dumps(anthropic_body(conversation(1)))
    )
    p = cli(j, "r-empty-a", "r-empty-b")
    assert (p.returncode, p.stdout.splitlines()) == (0, ["neither run has a main-loop request"]), p
    doc = json.loads(cli(j, "r-empty-a", "r-empty-b", "--json").stdout)
    assert doc["summary"]["aligned"] == 0 and doc["steps"] == []
    with JournalReader(j) as r:
        full = next(run.id for run in r.runs() if run.id.startswith("pair-a-"))
    p = cli(j, full, "r-empty-b")
    assert p.returncode == 1 and p.stdout.splitlines() == [
        "step 1 only in A",
        "run B has no main-loop request",
    ], p.stdout
    # an attempt that sent nothing, against the attempt it resumes: no request where A has one
    with Journal.open(j) as w:
        w.start_attempt(Attempt(run=full, n=1))
        w.start_attempt(Attempt(run=full, n=2))
        w.flush()
    p = cli(j, f"{full}@1", f"{full}@2")
    assert (p.returncode, p.stdout.splitlines()) == (1, ["run B has no main-loop request"]), p


def test_a_journal_of_a_newer_schema_exits_65_as_docs_diff_says(tmp_path):
    """The command refuses a journal a newer pvisor wrote with exit 65; docs/diff.md's exit code
    table named 65 only for a file that is no pvisor journal."""
    j = tmp_path / "j.sqlite"
    xa, xb = write_pair(j, orjson.dumps(anthropic_body(conversation(1))), b"{}")
    with sqlite3.connect(j) as c:
        c.execute("INSERT INTO _sqlite_migrations(migration_set, name, applied_at) "
                  "VALUES ('pvisor.journal', 'm999_future', '2030-01-01')")  # fmt: skip
    p = cli(j, xa, xb)
    assert p.returncode == 65 and len(p.stderr.splitlines()) == 1 and "newer pvisor" in p.stderr, p
    codes = (Path(__file__).resolve().parents[1] / "docs" / "diff.md").read_text().split("## Exit codes")[1]
    assert re.search(r"`65` [^`]*a newer pvisor", codes.split("## ")[0]), codes


def test_a_key_shaped_argument_is_refused_without_showing_it(tmp_path):
    """A key pasted as A or B (or inside A's journal path) is named as key-shaped, never echoed,
    with the reason it is refused (its characters are an id's)."""
    j = tmp_path / "j.sqlite"
    xa, _ = write_pair(j, b"{}", b"[]")
    key = "sk-ant-api03-" + "A" * 90 + "-AAAAAAAA"
    for args, which in (
        ([key, xa], "A"),
        ([xa, key], "B"),
        ([xa, f"{key}@2"], "B"),
        ([f"{tmp_path}/{key}.sqlite:{xa}", xa], "A"),
        ([xa, f"{j}:{key}"], "B"),
    ):
        p = cli(j, *args)
        assert p.returncode == 2, (args, p.stderr)
        assert key not in p.stderr and "AAAAAAAA" not in p.stderr, p.stderr
        said = f"{which} holds a key-shaped token (not shown): a key is never an exchange or run id"
        assert p.stderr.strip() == f"pvisor: error: {said}", p.stderr
