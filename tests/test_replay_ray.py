"""Batch preparation on Ray (issue 21): ``pvisor.replay.prepare_dataset`` on a local Ray that
the test starts (two CPUs, no dashboard), and ``replay --batch --rows --ray local``. Each row
holds the prefix a one-process batch gives for the same line, byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from native_helpers import native_dir

from pvisor.replay.batch import prepare_many

pytestmark = pytest.mark.slow

PVISOR = [sys.executable, "-m", "pvisor"]
ENV = {**os.environ, "PYTHONSAFEPATH": "1"}


def requests() -> list[dict]:
    picks = [
        ("claude-code", "claude-code/spotter_tool_heavy.jsonl"),
        ("codex", "codex/real-0.171.0_single-then-resume.jsonl"),
        ("opencode", "opencode/real-1.18.33_export_single.json"),
        ("mini-swe-agent", "mini-swe-agent/real-2.4.6_single.traj.json"),
    ]
    out = [
        {"line": i, "trajectory": str(native_dir() / path), "agent": agent, "after_step": n}
        for i, (agent, path, n) in enumerate(((a, p, n) for a, p in picks for n in (0, 1, 2)), 1)
    ]
    out.append(
        {
            "line": len(out) + 1,
            "trajectory": str(native_dir() / picks[1][1]),
            "agent": "codex",
            "after_step": 99,
        }
    )
    return out


def test_prepare_dataset_on_a_local_ray_gives_the_batch_prefixes(tmp_path: Path, monkeypatch):
    import ray

    # Ray puts the driver's directory first on its workers' path: from the checkout, its
    # pvisor/ folder would shadow the installed package
    monkeypatch.chdir(tmp_path)
    from pvisor.replay import prepare_dataset

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        rows = prepare_dataset(ray.data.from_items(requests()), batch_size=4, concurrency=2).take_all()
    finally:
        ray.shutdown()
    rows.sort(key=lambda r: r["line"])
    local = list(prepare_many([(r["line"], {k: v for k, v in r.items() if k != "line"}) for r in requests()]))
    assert [r["line"] for r in rows] == [o.index for o in local]
    for r, o in zip(rows, local):
        assert r["status"] == o.status.value
        if o.prefix is not None:
            assert (
                r["prefix"].encode() == o.prefix.body and r["prefix_sha256"] == o.result["prefix"]["sha256"]
            )
            assert orjson.loads(r["request"]) == o.prefix.request
        else:
            assert r["error_code"] == "after_step_out_of_range" and r["prefix"] is None


def test_the_batch_command_on_ray_writes_the_rows_of_the_local_batch(tmp_path: Path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "line"}) + "\n" for r in requests())
    )
    manifest.write_text(manifest.read_text() + "{not json\n")
    rows = {}
    for how, extra in (("ray", ["--ray", "local"]), ("local", [])):
        out = tmp_path / f"{how}.jsonl"
        proc = subprocess.run(
            [*PVISOR, "replay", "--prepare-only", "--batch", str(manifest), "--rows", str(out), *extra],
            capture_output=True, text=True, env=ENV, timeout=300, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr[-3000:]  # line 13 (out of range) and 14 (not JSON)
        assert (
            "m.jsonl line 13: --after-step 99" in proc.stderr and "m.jsonl line 14: not JSON" in proc.stderr
        )
        rows[how] = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert len(rows["ray"]) == len(rows["local"]) == 14
    for a, b in zip(rows["ray"], rows["local"]):
        for r, name in ((a, "ray.jsonl"), (b, "local.jsonl")):
            if r["result"] is not None:
                r["result"].pop("timings_ms")
                if r["result"]["prefix"] is not None:  # each names its own rows file
                    for key in ("path", "request_path"):
                        r["result"]["prefix"][key] = r["result"]["prefix"][key].replace(name, "ROWS")
        assert a == b, a["line"]


def test_the_docs_ray_example_runs_as_written(tmp_path: Path):
    from conftest import corpus_dir

    import pyarrow.parquet as pq

    text = (Path(__file__).resolve().parent.parent / "docs" / "result-protocol.md").read_text()
    section = text[text.index("### On Ray") :]
    code = section[section.index("```python\n") + 10 :]
    code = code[: code.index("```")]
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "corpus").symlink_to(corpus_dir())
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pq.read_table(tmp_path / "prefixes").to_pylist()
    assert sorted(r["line"] for r in rows) == [1, 2, 3] and {r["status"] for r in rows} == {"ok"}
