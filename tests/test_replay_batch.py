"""``pvisor replay --prepare-only --batch`` and ``pvisor.replay.batch.prepare_many`` (issue 21):
every prefix a batch writes is what a single prepare-only writes with the same arguments (the
three files byte for byte, the result document but for its timings and the paths that name the
output), for every native trajectory of the corpus at several boundaries and every recorded
journal run, in a shuffled order, so that a source shared between lines (read once) is shown
to give each line its own prefix; a bad line fails alone, named by its line number.

The command runs in this process (tests/cli_helpers.py) where a test reads what it wrote; as the
``pvisor`` process for the exit codes of bad batches, the docs' console and Ctrl-C."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from cli_helpers import pvisor_main
from conftest import corpus_dir
from corpus_runs import RUNS, record_corpus_runs
from native_helpers import native_dir

from pvisor.core.errors import PvisorError
from pvisor.replay.batch import Status, prepare_many
from pvisor.replay.prepare import PrepareOptions, prepare
from pvisor.replay.output import OUTPUT_FILES

PVISOR = [sys.executable, "-m", "pvisor"]
ENV = {**os.environ, "PYTHONSAFEPATH": "1"}
BOUNDARIES = (0, 1, 2, 3, 50)  # 50: past the end of most, a failure to compare too


def native_sources() -> list[tuple[str, Path]]:
    """(agent, file) of every native sample of the corpus (a directory of an OpenCode store too)."""
    out = []
    for agent_dir in sorted(p for p in native_dir().iterdir() if p.is_dir()):
        for f in sorted(agent_dir.iterdir()):
            if f.name != "PROVENANCE.md":
                out.append((agent_dir.name, f))
    return out


def single(opts: PrepareOptions) -> tuple[str, dict[str, bytes] | str]:
    """What one prepare-only gives: ("ok", its files) or ("failed", error code and message)."""
    try:
        outcome = prepare(opts)
    except PvisorError as exc:  # refused before a result document
        return "failed", f"-: {exc}"
    if outcome.error is not None:  # the failed document is returned beside the error
        err = outcome.result["errors"][0]
        return "failed", f"{err['code']}: {err['message']}"
    return "ok", {name: (opts.output / name).read_bytes() for name in OUTPUT_FILES}


def comparable(files: dict[str, bytes], out: Path) -> dict[str, object]:
    """The files with the result's timings dropped and its output paths made relative."""
    result = orjson.loads(files["result.json"])
    result.pop("timings_ms")
    text = orjson.dumps(result).decode().replace(str(out.resolve()), "OUT").replace(str(out), "OUT")
    return {
        "prefix.json": files["prefix.json"],
        "prefix.request.json": files["prefix.request.json"],
        "result": text,
    }


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("batch-journal") / "journal.sqlite"
    record_corpus_runs(corpus_dir(), path)
    return path


def test_a_batch_gives_what_single_prepares_give(tmp_path: Path, journal: Path):
    lines = [
        {"trajectory": str(f), "agent": agent, "after_step": n, "name": f"n{i}"}
        for i, (agent, f, n) in enumerate((a, f, n) for a, f in native_sources() for n in BOUNDARIES)
    ]
    lines += [
        {"run": run, "journal": str(journal), "agent": RUNS[run][0], "after_step": n, "name": f"j{run}-{n}"}
        for run in RUNS
        for n in (0, 1, 2)
    ]
    random.Random(21).shuffle(lines)  # lines of one file far apart and in any boundary order
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    out = tmp_path / "batch"
    proc = pvisor_main(
        ["replay", "--prepare-only", "--batch", str(manifest), "--output", str(out)], env=ENV, text=True
    )
    singles = {}
    for line in lines:
        opts = PrepareOptions(
            agent=line["agent"],
            after_step=line["after_step"],
            output=tmp_path / "single" / line["name"],
            trajectory=Path(line["trajectory"]) if "trajectory" in line else None,
            run=line.get("run"),
            journal=Path(line["journal"]) if "journal" in line else None,
        )
        singles[line["name"]] = single(opts)
    ok = [name for name, (status, _) in singles.items() if status == "ok"]
    failed = [name for name, (status, _) in singles.items() if status == "failed"]
    assert len(ok) > 100 and failed, (len(ok), len(failed))  # both kinds compared
    assert proc.returncode == 1, proc.stderr[-2000:]  # some boundaries are past the end
    for line_no, line in enumerate(lines, 1):
        name = line["name"]
        status, what = singles[name]
        written = {p.name: p.read_bytes() for p in (out / name).iterdir()}
        if status == "ok":
            assert comparable(written, out / name) == comparable(what, tmp_path / "single" / name), name
        else:
            # the same failure: a result.json that says so, no prefix files, the line named on stderr
            assert set(written) == {"result.json"}, name
            err = orjson.loads(written["result.json"])["errors"][0]
            assert f"{err['code']}: {err['message']}" == what, name
            assert f"manifest.jsonl line {line_no}: {err['message']}" in proc.stderr, name
    assert proc.stderr.splitlines()[-1].startswith(f"prepared {len(ok)} of {len(lines)} prefixes from ")


def test_rows_hold_each_prefix_and_its_result(tmp_path: Path):
    sources = [(a, f) for a, f in native_sources() if f.is_file()][:12]
    lines = [{"trajectory": str(f), "agent": a, "after_step": 1} for a, f in sources]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows_file = tmp_path / "rows.jsonl"
    proc = pvisor_main(
        ["replay", "--prepare-only", "--batch", str(manifest), "--rows", str(rows_file)], env=ENV, text=True
    )
    rows = [orjson.loads(line) for line in rows_file.read_bytes().splitlines()]
    assert [r["line"] for r in rows] == list(range(1, len(lines) + 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl", "rows.jsonl"]  # rows only
    for line, r in zip(lines, rows):
        status, files = single(
            PrepareOptions(
                line["agent"], 1, tmp_path / "single" / str(r["line"]), trajectory=Path(line["trajectory"])
            )
        )
        assert r["status"] == status, (line, r["error"])
        if status == "ok":
            assert r["prefix"] == orjson.loads(files["prefix.json"])
            assert r["request"] == orjson.loads(files["prefix.request.json"])
            assert (
                r["prefix_sha256"]
                == r["result"]["prefix"]["sha256"]
                == orjson.loads(files["result.json"])["prefix"]["sha256"]
            )
            assert r["result"]["prefix"]["path"] == f"{rows_file}#{r['line']}/prefix"
        else:
            assert r["prefix"] is None and r["error"]["code"] == r["result"]["errors"][0]["code"]
    assert proc.returncode == (1 if any(r["status"] == "failed" for r in rows) else 0), proc.stderr


def test_parquet_rows_read_back_with_pyarrow(tmp_path: Path):
    import pyarrow.parquet as pq  # the extra pvisor-replay[parquet], installed by .ci/run

    agent, f = next((a, f) for a, f in native_sources() if a == "codex" and f.name.startswith("real-"))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(json.dumps({"trajectory": str(f), "agent": agent, "after_step": n}) + "\n" for n in (0, 1, 2))
    )
    rows_file = tmp_path / "rows.parquet"
    proc = pvisor_main(
        ["replay", "--prepare-only", "--batch", str(manifest), "--rows", str(rows_file)], env=ENV, text=True
    )
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(rows_file).to_pylist()
    assert [r["line"] for r in table] == [1, 2, 3] and {r["status"] for r in table} == {"ok"}
    for n, r in zip((0, 1, 2), table):
        _, files = single(PrepareOptions(agent, n, tmp_path / f"s{n}", trajectory=f))
        assert r["prefix"].encode() == files["prefix.json"]  # the exact bytes, as text
        assert orjson.loads(r["result"])["boundary"]["after_step"] == n


def test_bad_lines_fail_alone_and_bad_batches_get_one_line(tmp_path: Path):
    agent, f = next((a, f) for a, f in native_sources() if a == "codex" and f.name.startswith("real-"))
    good = json.dumps(
        {"trajectory": f.name, "agent": agent, "after_step": 1}
    )  # relative: beside the manifest
    (tmp_path / f.name).write_bytes(f.read_bytes())
    manifest = tmp_path / "m.jsonl"
    bad = [
        ("{not json", "not JSON"),
        ("[1, 2]", "a JSON list, expected an object"),
        (json.dumps({"trajectory": f.name, "agent": agent}), "no after_step"),
        (json.dumps({"trajectory": f.name, "agent": agent, "after_step": "1"}), "after_step: expected int"),
        (json.dumps({"trajectory": f.name, "agent": agent, "after_step": True}), "after_step: expected int"),
        (json.dumps({"trajectory": f.name, "run": "r", "agent": agent, "after_step": 1}), "exactly one of"),
        (
            json.dumps({"trajectory": f.name, "agent": agent, "after_step": 1, "colour": 1}),
            "unknown key 'colour'",
        ),
        (json.dumps({"trajectory": "missing.jsonl", "agent": agent, "after_step": 1}), "no such file"),
        (json.dumps({"trajectory": f.name, "agent": "nobody", "after_step": 1}), "nobody"),
        (
            json.dumps({"trajectory": f.name, "agent": agent, "after_step": 1, "name": "../x"}),
            "one directory name",
        ),
        (
            json.dumps({"trajectory": f.name, "agent": agent, "after_step": 2, "name": "000001"}),
            "is line 1's already",
        ),
    ]
    body = [good] + [text for text, _ in bad] + ["", good]
    manifest.write_bytes("\n".join(body).encode() + b"\n\xff\xfe not utf-8\n")
    out = tmp_path / "out"
    proc = subprocess.run(
        [*PVISOR, "replay", "--prepare-only", "--batch", str(manifest), "--output", str(out)],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = proc.stderr.splitlines()[:-1]
    assert len(errors) == len(bad) + 1 and all(e.startswith("pvisor: error: ") for e in errors)
    for i, (_, said) in enumerate(bad, 2):
        assert f"m.jsonl line {i}: " in errors[i - 2] and said in errors[i - 2], (said, errors[i - 2])
    assert "line 15: not JSON" in errors[-1]
    # the good lines were prepared (line 1 and line 14: a blank line counts), line 1 not replaced
    assert sorted(p.name for p in out.iterdir() if (p / "prefix.json").exists()) == ["000001", "000014"]
    assert orjson.loads((out / "000001" / "result.json").read_bytes())["boundary"]["after_step"] == 1
    assert proc.stderr.splitlines()[-1].startswith("prepared 2 of 14 prefixes")
    for args, said in [
        (["--batch", str(manifest)], "needs one of --output OUT"),
        (["--batch", str(manifest), "--output", str(out)], "not empty; give --force"),
        (["--batch", str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "o2")], "no such file"),
        (["--batch", str(manifest), "--rows", str(manifest)], "is the manifest"),
        (["--batch", str(manifest), "--rows", str(tmp_path / "no" / "r.jsonl")], "no such directory"),
        (
            ["--batch", str(manifest), "--output", str(tmp_path / "o3"), "--agent", "codex"],
            "comes from each line",
        ),
        (["--rows", str(tmp_path / "r.jsonl")], "--rows is for --batch"),
    ]:
        mode = [] if "--rows is for" in said else ["--prepare-only"]
        p = subprocess.run(
            [*PVISOR, "replay", *mode, *args], capture_output=True, text=True, env=ENV, timeout=60
        )
        assert p.returncode == 2 and said in p.stderr and p.stderr.count("\n") == 1, (args, p.stderr)
    # a batch without --prepare-only runs rollouts (tests/test_rollouts_batch.py): not --concurrency
    # with --prepare-only, and a rollout's options come from its line
    for args, said in [
        (["--prepare-only", "--concurrency", "2"], "--concurrency is for a --batch of rollouts"),
        (["--upstream", "http://127.0.0.1:9"], "--upstream comes from each line of --batch"),
    ]:
        p = subprocess.run(
            [*PVISOR, "replay", "--batch", str(manifest), "--output", str(tmp_path / "o4"), *args],
            capture_output=True, text=True, env=ENV, timeout=60,
        )  # fmt: skip
        assert p.returncode == 2 and said in p.stderr and not (tmp_path / "o4").exists(), p.stderr


def test_prepare_many_in_memory_shares_a_file_and_leaves_each_prefix_its_own(tmp_path: Path):
    agent, f = next((a, f) for a, f in native_sources() if a == "claude-code" and "tool_heavy" in f.name)
    requests = [
        PrepareOptions(agent, n, None, trajectory=f)  # type: ignore[arg-type]
        for n in (3, 1, 2, 1, 0, 3)
    ]
    outcomes = list(prepare_many(requests))
    assert [o.index for o in outcomes] == [1, 2, 3, 4, 5, 6]
    assert all(o.status is Status.OK and o.output is None for o in outcomes)
    bodies = {n: o.prefix.body for n, o in zip((3, 1, 2, 1, 0, 3), outcomes)}
    for n, body in bodies.items():
        _, files = single(PrepareOptions(agent, n, tmp_path / f"s{n}", trajectory=f))
        assert body == files["prefix.json"], n
    assert (
        outcomes[1].prefix.body == outcomes[3].prefix.body
        and outcomes[0].prefix.body == outcomes[5].prefix.body
    )
    assert len({o.prefix.body for o in outcomes}) == 4


DOCS = Path(__file__).resolve().parent.parent / "docs" / "result-protocol.md"


def doc_section(title: str, until: str) -> str:
    text = DOCS.read_text()
    return text[text.index(title) : text.index(until, text.index(title))]


def blocks(text: str, lang: str) -> list[str]:
    out, rest = [], text
    while f"```{lang}\n" in rest:
        rest = rest[rest.index(f"```{lang}\n") + len(lang) + 4 :]
        out.append(rest[: rest.index("```")])
    return out


@pytest.fixture
def beside_the_corpus(tmp_path: Path, monkeypatch) -> Path:
    """A directory where the docs' relative paths (tests/corpus/...) name the corpus."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "corpus").symlink_to(corpus_dir())
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_docs_batch_examples_run_as_written(beside_the_corpus: Path):
    import shlex

    section = doc_section("## Many prefixes in one process", "### On Ray")
    [manifest] = blocks(section, "json")
    (beside_the_corpus / "manifest.jsonl").write_text(manifest)
    [console] = blocks(section, "console")
    for line in console.splitlines():
        command, _, comment = line.removeprefix("$ ").partition("#")
        want = int(comment.split("exit")[1].split(":")[0]) if "exit" in comment else 0
        args = shlex.split(command)
        assert args[0] == "pvisor"
        proc = subprocess.run([*PVISOR, *args[1:]], capture_output=True, text=True, env=ENV, timeout=120)
        assert proc.returncode == want, (line, proc.stderr)
        assert "manifest.jsonl line 4: --after-step 40" in proc.stderr
    assert (beside_the_corpus / "out-batch" / "codex-3" / "prefix.json").is_file()
    rows = [orjson.loads(x) for x in (beside_the_corpus / "rows.jsonl").read_bytes().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "failed"]
    [code] = blocks(section, "python")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[:2] for line in proc.stdout.splitlines()] == [[str(i), "ok"] for i in range(1, 5)]


def test_a_batch_never_destroys_its_inputs_and_odd_requests_fail_alone(tmp_path: Path):
    agent, f = next((a, f) for a, f in native_sources() if a == "codex" and f.name.startswith("real-"))
    original = f.read_bytes()
    # a line whose source is a file its own output directory would hold: refused, the file kept
    out = tmp_path / "out"
    (out / "000001").mkdir(parents=True)
    inside = out / "000001" / "prefix.json"
    inside.write_bytes(original)
    manifest = tmp_path / "m.jsonl"
    lines = [
        {"trajectory": str(inside), "agent": agent, "after_step": 1},
        {"trajectory": str(f), "agent": agent, "after_step": 1, "name": "n" * 300},
        {"trajectory": "a\u0000b", "agent": agent, "after_step": 1},
        {"trajectory": str(f), "agent": "z" * 5000, "after_step": 1},
        {"trajectory": str(f), "agent": agent, "after_step": 2**64 - 1},
        {"trajectory": str(f), "agent": agent, "after_step": 1, "name": "fine"},
    ]
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = pvisor_main(
        ["replay", "--prepare-only", "--batch", str(manifest), "--output", str(out), "--force"],
        env=ENV,
        text=True,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert inside.read_bytes() == original  # not removed by the refused line
    errors = proc.stderr.splitlines()
    assert "line 1: --trajectory" in errors[0] and "a file prepare-only writes" in errors[0]
    assert (
        "line 2: name: 300 bytes" in errors[1]
        and "line 3: trajectory: holds a control character" in errors[2]
    )
    assert "line 4: agent: 5000 characters" in errors[3] and len(errors[3]) < 300
    assert "line 5: " in errors[4] and (out / "fine" / "prefix.json").is_file()
    # rows: the manifest through a hard link, an existing file, a line reading the rows file
    link = tmp_path / "m-link.jsonl"
    os.link(manifest, link)
    rows = tmp_path / "rows.parquet"
    for args, said in [
        (["--rows", str(link)], "is the manifest"),
        (["--output", str(tmp_path)], "holds the manifest"),
    ]:
        p = pvisor_main(
            ["replay", "--prepare-only", "--batch", str(manifest), *args, "--force"], env=ENV, text=True
        )
        assert p.returncode == 2 and said in p.stderr, (args, p.stderr)
    assert manifest.read_bytes() == link.read_bytes() and manifest.stat().st_size > 0
    victim = tmp_path / "victim.jsonl"
    victim.write_bytes(original)
    m2 = tmp_path / "m2.jsonl"
    m2.write_text(json.dumps({"trajectory": str(victim), "agent": agent, "after_step": 1}) + "\n"
                  + json.dumps({"trajectory": str(f), "agent": agent, "after_step": 2**64 - 1})
                  + "\n")  # fmt: skip
    p = pvisor_main(
        ["replay", "--prepare-only", "--batch", str(m2), "--rows", str(victim)], env=ENV, text=True
    )
    assert p.returncode == 2 and "exists; give --force" in p.stderr
    p = pvisor_main(
        ["replay", "--prepare-only", "--batch", str(m2), "--rows", str(victim), "--force"], env=ENV, text=True
    )
    assert p.returncode == 2 and "line 1: trajectory is the --rows file" in p.stderr, p.stderr
    assert "is a source of line 1: it is kept, and no rows were written" in p.stderr
    assert victim.read_bytes() == original
    # the Parquet rows of a step number past int64 (out of range for any source) still write
    p = pvisor_main(["replay", "--prepare-only", "--batch", str(m2), "--rows", str(rows)], env=ENV, text=True)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    import pyarrow.parquet as pq

    [r1, r2] = pq.read_table(rows).to_pylist()
    assert r1["status"] == "ok" and r2["status"] == "failed" and r2["after_step"] is None
    assert orjson.loads(r2["result"])["boundary"]["after_step"] == 2**64 - 1
    # the API: a request of a wrong type, or holding one, is a failed outcome, not an exception
    odd = [
        PrepareOptions(agent, "1", None, trajectory=f),  # type: ignore[arg-type]
        PrepareOptions(agent, True, None, trajectory=f),  # type: ignore[arg-type]
        PrepareOptions(agent, 1, None, trajectory=str(f)),  # type: ignore[arg-type]
        None,
        PrepareOptions(agent, 1, None, trajectory=Path("a\0b")),  # type: ignore[arg-type]
        PrepareOptions(agent, 1, None, trajectory=f),  # type: ignore[arg-type]
    ]
    outcomes = list(prepare_many(odd))  # type: ignore[arg-type]
    assert [o.status for o in outcomes] == [Status.FAILED] * 5 + [Status.OK]
    assert all(o.error is not None and o.error.code for o in outcomes[:5])


def test_ctrl_c_removes_the_directory_of_the_line_in_progress_and_keeps_the_finished_ones(tmp_path: Path):
    """Ctrl-C during ``--batch --output`` left an empty directory for the line in progress
    (issue 35 item 14). Line 2's source is a sparse file of 64 GiB whose digest takes seconds:
    the interrupt comes once its directory exists, while the line is in progress. Exit 130 with
    the line that says how far it got; line 1's three files stay, line 2 leaves nothing."""
    agent, small = "claude-code", native_dir() / "claude-code" / "spotter_short.jsonl"
    slow = tmp_path / "slow.jsonl"
    with open(slow, "wb") as f:
        f.truncate(64 << 30)  # no block written: the digest reads zeros
    manifest = tmp_path / "m.jsonl"
    lines = [{"trajectory": str(small), "agent": agent, "after_step": 1, "name": "done"},
             {"trajectory": str(slow), "agent": agent, "after_step": 0, "name": "slow"}]  # fmt: skip
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*PVISOR, "replay", "--prepare-only", "--batch", str(manifest), "--output", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=ENV,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (out / "slow").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "line 2 never started"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert b"interrupted after 1 of 2 lines" in err and b"Traceback" not in err, err
    assert sorted(p.name for p in out.iterdir()) == ["done"]
    assert sorted(p.name for p in (out / "done").iterdir()) == sorted(OUTPUT_FILES)
    assert json.loads((out / "done" / "result.json").read_bytes())["status"] == "ok"
