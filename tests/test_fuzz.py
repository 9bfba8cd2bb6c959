"""Hostile input (issue 17; docs/reliability.md, "Hostile input"): property-based mutation
fuzzing, seeded from the corpus, of every native adapter (through ``trajectory show`` and
``replay --prepare-only``), the four protocols' request parsers and stream reassemblers, and the
journal reader (through ``journal verify``, ``ls``, ``steps`` and ``export``) on damaged files.

Each example runs in a worker process of its own (tests/fuzz_worker.py) under a 2 GiB memory
limit and a time limit: a crash, a hang or a runaway allocation is that example's failure. What
may happen: a documented exit code with one error line (the commands), a ``PvisorError`` (the
library calls); nothing written outside the command's output; never a traceback.

The run is deterministic (hypothesis ``derandomize``, no example database). CI runs the budget
below (about a minute); ``PVISOR_FUZZ_SCALE=20`` runs twenty times as many examples (the figures
of docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import corpus_dir

SCALE = int(os.environ.get("PVISOR_FUZZ_SCALE", "1"))
WORKER = Path(__file__).with_name("fuzz_worker.py")
EXAMPLE_TIMEOUT_S = 30.0

# bytes that break parsers: invalid UTF-8, NUL, JSON punctuation, a lone surrogate escape, an
# unknown record type, huge numbers, deep nesting
TOKENS = [
    b"\xff\xfe",
    b"\x00",
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b"\n",
    b"\r\n",
    b"\\",
    b'"\\ud800"',
    b"null",
    b"1e999",
    b"-0",
    b'{"type": "pvisor-unknown-record", "x": 1}\n',
    b"[" * 2000,
    b" " * 200,
    b"\xe2\x82",
]
MUTATION = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("delete"), st.floats(0, 1), st.integers(1, 4096)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.sampled_from(TOKENS) | st.binary(max_size=32)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
    st.tuples(st.just("dup_line"), st.floats(0, 1)),
    st.tuples(st.just("swap_lines"), st.floats(0, 1), st.floats(0, 1)),
    st.tuples(st.just("huge_line"), st.floats(0, 1)),
)


def fuzz(examples: int) -> settings:
    """Settings of one fuzz target: ``examples`` times PVISOR_FUZZ_SCALE examples, fixed seed."""
    return settings(
        max_examples=examples * SCALE,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )


def mutate(data: bytes, mutations: list[tuple]) -> bytes:
    for m in mutations:
        at = int(m[1] * len(data))
        if m[0] == "truncate":
            data = data[:at]
        elif m[0] == "delete":
            data = data[:at] + data[at + m[2] :]
        elif m[0] == "insert":
            data = data[:at] + m[2] + data[at:]
        elif m[0] == "flip" and data:
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([data[at] ^ m[2]]) + data[at + 1 :]
        elif m[0] in ("dup_line", "swap_lines"):
            lines = data.split(b"\n")
            i = min(int(m[1] * len(lines)), len(lines) - 1)
            if m[0] == "dup_line":
                lines.insert(i, lines[i])
            else:
                j = min(int(m[2] * len(lines)), len(lines) - 1)
                lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
        elif m[0] == "huge_line":
            data = data[:at] + b'\n{"type": "user", "message": "' + b"A" * 3_000_000 + b'"}\n' + data[at:]
    return data


class Worker:
    """tests/fuzz_worker.py, restarted after an example that killed it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        read, self._results = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(self._results)],
            stdin=subprocess.PIPE,
            pass_fds=(self._results,),
            env={**os.environ, "PYTHONSAFEPATH": "1"},
        )
        os.close(self._results)
        self._reader = os.fdopen(read, "rb")

    def run(self, target: str, args: list[str], data: bytes) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        head = json.dumps({"target": target, "args": args, "size": len(data)}).encode()
        self.proc.stdin.write(struct.pack("<I", len(head)) + head + data)
        self.proc.stdin.flush()
        import select

        ready, _, _ = select.select([self._reader], [], [], EXAMPLE_TIMEOUT_S)
        if not ready:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return {"outcome": "crash", "detail": f"no answer within {EXAMPLE_TIMEOUT_S} s (a hang)"}
        line = self._reader.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            return {
                "outcome": "crash",
                "detail": f"the worker died (exit {code}): a crash or the memory limit",
            }
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()
            self.proc.wait(30)


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


#: target -> exit code or error class -> examples: what the fuzzing reached (checked last)
REACHED: dict[str, dict] = {}


def _check(result: dict, what: str, target: str) -> None:
    assert result["outcome"] == "ok", f"{what}: {result['detail']}"
    seen = REACHED.setdefault(target, {})
    key = result["exit"] if result["exit"] is not None else (result["detail"] or "accepted")
    seen[key] = seen.get(key, 0) + 1


def _native_seeds() -> list[tuple[str, Path]]:
    seeds = []
    for agent_dir in sorted((corpus_dir() / "native").iterdir()):
        for f in sorted(agent_dir.iterdir()):
            if f.is_file() and f.suffix in (".jsonl", ".json", ".traj") and f.stat().st_size < 400_000:
                seeds.append((agent_dir.name, f))
    return seeds


NATIVE = _native_seeds()
WIRE = [
    (d.name, f)
    for d in sorted((corpus_dir() / "wire").iterdir())
    if d.is_dir()
    for f in sorted(d.glob("*.sse"))
]


def test_the_seeds_cover_every_adapter_and_protocol():
    from pvisor.adapters.native import adapter_names

    assert {a for a, _ in NATIVE} == set(adapter_names())
    assert {p for p, _ in WIRE} == {"anthropic", "openai-chat", "openai-responses", "gemini"}


@fuzz(400)
@given(
    seed=st.sampled_from(NATIVE), mutations=st.lists(MUTATION, min_size=1, max_size=4), detect=st.booleans()
)
def test_native_adapters_on_mutated_trajectories(worker, seed, mutations, detect):
    agent, path = seed
    data = mutate(path.read_bytes(), mutations)
    args = [path.name, "trajectory", "show", "{input}", "--json", *([] if detect else ["--agent", agent])]
    _check(worker.run("cli", args, data), f"trajectory show of {path.name} mutated by {mutations}", "show")


@fuzz(200)
@given(
    seed=st.sampled_from(NATIVE), mutations=st.lists(MUTATION, min_size=1, max_size=3), step=st.integers(0, 6)
)
def test_prepare_only_on_mutated_trajectories_writes_only_its_output(worker, seed, mutations, step):
    agent, path = seed
    data = mutate(path.read_bytes(), mutations)
    args = [
        path.name,
        "replay",
        "--prepare-only",
        "--trajectory",
        "{input}",
        "--agent",
        agent,
        "--after-step",
        str(step),
        "--output",
        "{out}",
    ]
    _check(
        worker.run("cli", args, data),
        f"replay --prepare-only of {path.name} mutated by {mutations}",
        "prepare",
    )


@fuzz(500)
@given(seed=st.sampled_from(WIRE), mutations=st.lists(MUTATION, min_size=1, max_size=4))
def test_stream_reassembly_of_mutated_streams(worker, seed, mutations):
    protocol, path = seed
    data = mutate(path.read_bytes(), mutations)
    _check(worker.run("reassemble", [protocol], data), f"{path.name} {mutations}", "reassemble")


def _request_seeds() -> list[tuple[str, str, object]]:
    from pvisor.adapters.protocols import UPSTREAMS, get_protocol

    seeds = []
    for f in sorted((corpus_dir() / "requests").glob("*.jsonl")):
        for line in f.read_text().splitlines()[:3]:
            rec = json.loads(line)
            body = rec["body"]
            if isinstance(body, str):
                try:
                    body = json.loads(body)
                except ValueError:
                    continue
            for _, (_, protocols) in UPSTREAMS.items():
                for proto in protocols:
                    if get_protocol(proto).matches(rec["path"]):
                        seeds.append((proto, rec["path"], body))
    return seeds


REQUESTS = _request_seeds()
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=8,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _replace(node, path, value):
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {**node, head: _replace(node[head], rest, value)}
    copy = list(node)
    copy[head] = _replace(node[head], rest, value)
    return copy


@fuzz(500)
@given(
    seed=st.sampled_from(REQUESTS), edits=st.lists(st.tuples(st.floats(0, 1), JSON), min_size=1, max_size=4)
)
def test_request_parsers_on_structurally_mutated_bodies(worker, seed, edits):
    protocol, path, body = seed
    for where, value in edits:
        paths = list(_paths(body))
        body = _replace(body, paths[min(int(where * len(paths)), len(paths) - 1)], value)
    data = json.dumps(body, allow_nan=True).encode()
    _check(worker.run("parse", [protocol, path], data), f"{protocol} request with {edits}", "parse")


@pytest.fixture(scope="module")
def journal_seed(tmp_path_factory) -> bytes:
    """A small real journal: a run with a stream, a whole body, one in flight at close."""
    from pvisor.gateway.finalize import finalize_response
    from pvisor.journal.writer import Journal

    path = tmp_path_factory.mktemp("seed") / "journal.sqlite"
    stream = (corpus_dir() / "wire" / "anthropic" / "basic_response.sse").read_bytes()
    with Journal.open(path, finalize=finalize_response) as j:
        for i in range(4):
            j.record_exchange(
                "r-fuzz",
                "POST",
                "/v1/messages",
                [("content-type", "application/json")],
                protocol="anthropic",
                status=200,
                request_body=b'{"messages": [{"role": "user", "content": "hi %d"}]}' % i,
                response_body=stream,
                streamed=True,
            )
        j.begin_exchange("r-fuzz", "POST", "/v1/messages", [])
    return path.read_bytes()


@fuzz(150)
@given(
    mutations=st.lists(
        MUTATION.filter(lambda m: m[0] in ("flip", "truncate", "delete", "insert")), min_size=1, max_size=6
    ),
    command=st.sampled_from(
        [
            ["journal", "verify"],
            ["journal", "ls"],
            ["journal", "steps", "r-fuzz"],
            ["journal", "export", "r-fuzz", "-o", "{out}/export.jsonl"],
        ]
    ),
)
def test_the_journal_reader_on_damaged_journals(worker, journal_seed, mutations, command):
    data = mutate(journal_seed, mutations)
    args = ["journal.sqlite", "--journal", "{input}", *command]
    _check(
        worker.run("cli", args, data), f"{' '.join(command)} of a journal damaged by {mutations}", "journal"
    )


def test_the_fuzzing_reached_both_what_reads_and_what_is_refused():
    """Runs last: a fuzzer whose every example fails the same way early tests nothing."""
    assert set(REACHED) == {"show", "prepare", "reassemble", "parse", "journal"}, REACHED
    for target in ("show", "prepare", "journal"):
        codes = REACHED[target]
        assert 0 in codes and any(c not in (0,) for c in codes), (target, codes)
    assert "accepted" in REACHED["parse"] and "BadInputError" in REACHED["parse"], REACHED["parse"]
    assert "accepted" in REACHED["reassemble"], REACHED["reassemble"]
