"""Fields of the wrong type (a list where an id belongs, a number for a message, a missing key)
never crash an adapter: the file is read, or refused with BadInputError (exit 65, no
traceback). Corpus samples are mutated with a fixed seed: each mutation replaces a value with
one of another JSON type, or drops a key or a list item."""

from __future__ import annotations

import json
import random

import pytest

from native_helpers import native_dir
from pvisor.adapters.native import read_native
from pvisor.core.errors import BadInputError

WRONG = [None, 1, "x", [], {}, [1], {"a": 1}, True]

#: adapters checked here (file samples; the OpenCode storage tree and database are not mutated)
CHECKED = [
    "claude-code",
    "codex",
    "gemini-cli",
    "qwen-code",
    "mini-swe-agent",
    "opencode",
    "openhands",
    "swe-agent",
]


def _mutate(o, rng: random.Random):
    if isinstance(o, dict):
        out = {}
        for k, v in o.items():
            r = rng.random()
            if r < 0.08:
                out[k] = rng.choice(WRONG)
            elif r >= 0.12:
                out[k] = _mutate(v, rng)
        return out
    if isinstance(o, list):
        return [_mutate(x, rng) for x in o if rng.random() > 0.05]
    return o


@pytest.mark.parametrize("agent", CHECKED)
def test_wrong_types_are_read_or_refused_never_a_crash(agent, tmp_path):
    rng = random.Random(f"pvisor-{agent}")
    files = [
        f
        for f in sorted((native_dir() / agent).iterdir())
        if f.is_file() and f.name != "PROVENANCE.md" and "db-dump" not in f.name
    ]
    assert files
    read = refused = 0
    for f in files:
        raw = f.read_bytes()
        for trial in range(12):
            g = tmp_path / f"{trial}-{f.name}"
            if f.suffix == ".jsonl":
                g.write_text(
                    "".join(
                        json.dumps(_mutate(json.loads(line), rng)) + "\n"
                        for line in raw.split(b"\n")
                        if line.strip()
                    )
                )
            else:
                g.write_text(json.dumps(_mutate(json.loads(raw), rng)))
            try:
                read_native(g, agent)
                read += 1
            except BadInputError as exc:
                assert str(g) in exc.message
                refused += 1
    assert read > 0  # mutations leave most files readable
