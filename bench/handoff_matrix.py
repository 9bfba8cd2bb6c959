"""All 30 ordered pairs of handoffs between the six agents, with the real CLIs, offline against
the scripted model (docs/handoff.md, "All 30 pairs with the real CLIs"); not part of the test suite.

Per source agent, one ``pvisor run --script`` is captured in a fresh workspace: a shell call, a
file write, a parallel batch of two reads, an edit and a plan call, each with the agent's own
tools where it has them (Claude Code ``Bash``/``Write``/``Read``/``Edit``/``TodoWrite``; Gemini
CLI ``run_shell_command``/``write_file``/``read_file``/``replace``/``write_todos``; OpenCode
``bash``/``write``/``read``/``edit``/``todowrite``; Qwen Code ``run_shell_command``/
``write_file``/``read_file``/``edit``, no plan tool of its own; Codex ``exec_command`` for all,
mini-swe-agent ``bash`` for all), then the end. Each capture is then handed, with ``pvisor
handoff --replay-only``, to each of the five other agents at the pause after its last step with
a call (the end left out), in a fresh empty workspace (the source's start snapshot restored).
One agent runs at a time.

Printed: a Markdown table, rows the source agent, columns the target; a cell says the status
(``ok``, or the result's error code and exit), the source calls ``translated``/``reproduced``/
``rendered_as_text`` (and any other fate), the workspace after re-enactment against the pause's
snapshot (``ws =``, or the differing paths), and of the calls B re-ran, how many gave an
observation equal to the recorded one once normalised (``O=O″ k/n``). Exit 0 when every pair is ``ok`` with a
valid boundary request, 1 otherwise.

    python bench/handoff_matrix.py [--agents-dir DIR] [--work DIR] [--sources A,B] [--targets A,B]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from agent_installs import AGENTS, ENTRYPOINTS  # noqa: E402

TASK = "Write a note, read it back, edit it and plan the rest."
SHELL = "echo alpha > a.txt && cat a.txt"
NOTE = "one\ntwo\n"
#: mini-swe-agent loops on a reply without a tool call: it ends with its submit command
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _turn(text: str, *calls: dict[str, Any]) -> dict[str, Any]:
    return {"text": text, "tool_calls": list(calls)}


def _shell(command: str) -> dict[str, Any]:
    return {"tool": "@shell", "command": command}


def _call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"tool": tool, "arguments": arguments}


def source_turns(agent: str, ws: Path) -> list[dict[str, Any]]:
    """The scripted model's turns for ``agent``'s source run in workspace ``ws`` (absolute paths:
    several agents' file tools want them): shell, write, two reads at once, edit, plan (where the
    agent has a plan tool), end."""
    note, a = str(ws / "notes.txt"), str(ws / "a.txt")
    shell = _turn("First the shell.", _shell(SHELL))
    end = _turn("The note is written, read back and edited.")
    if agent in ("codex", "mini-swe-agent"):  # the shell is the only way to touch files
        if agent == "mini-swe-agent":
            end = _turn("Submitting.", _shell(SUBMIT))
        return [
            shell,
            _turn("Now a note.", _shell("printf 'one\\ntwo\\n' > notes.txt")),
            _turn("Read both back.", _shell("cat notes.txt"), _shell("cat a.txt")),
            _turn("Edit the note.", _shell("sed -i 's/two/three/' notes.txt")),
            end,
        ]
    if agent == "claude-code":
        todo = {"content": "Check the note", "status": "completed", "activeForm": "Checking the note"}
        tools = (
            _call("Write", file_path=note, content=NOTE),
            (_call("Read", file_path=note), _call("Read", file_path=a)),
            _call("Edit", file_path=note, old_string="two", new_string="three"),
            _call("TodoWrite", todos=[todo]),
        )
    elif agent == "gemini-cli":
        tools = (
            _call("write_file", file_path=note, content=NOTE),
            (_call("read_file", file_path=note), _call("read_file", file_path=a)),
            _call(
                "replace",
                file_path=note,
                instruction="Replace the second line, two, by three.",
                old_string="two",
                new_string="three",
            ),
            _call("write_todos", todos=[{"description": "Check the note", "status": "completed"}]),
        )
    elif agent == "opencode":
        tools = (
            _call("write", filePath=note, content=NOTE),
            (_call("read", filePath=note), _call("read", filePath=a)),
            _call("edit", filePath=note, oldString="two", newString="three"),
            _call(
                "todowrite", todos=[{"content": "Check the note", "status": "completed", "priority": "low"}]
            ),
        )
    elif agent == "qwen-code":
        tools = (
            _call("write_file", file_path=note, content=NOTE),
            (_call("read_file", file_path=note), _call("read_file", file_path=a)),
            _call("edit", file_path=note, old_string="two", new_string="three"),
            None,  # Qwen Code 0.24.4 has goals, no plan tool
        )
    else:  # pragma: no cover
        raise SystemExit(f"unknown agent {agent}")
    write, reads, edit, plan = tools
    turns = [
        shell,
        _turn("Now a note.", write),
        _turn("Read both back.", *reads),
        _turn("Edit the note.", edit),
    ]
    if plan is not None:
        turns.append(_turn("Plan the rest.", plan))
    return [*turns, end]


def _env(home: Path) -> dict[str, str]:
    """The agents' environment: ``home`` as the user's home (nothing of the real one read)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "PVISOR_"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_CACHE_HOME=str(home / ".cache"))
    env.update(XDG_DATA_HOME=str(home / ".local/share"), XDG_STATE_HOME=str(home / ".local/state"))
    return env


def _pvisor(pvisor: str, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [pvisor, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=900,
    )


def capture(pvisor: str, exe: Path, agent: str, work: Path, journal: Path, env: dict) -> dict[str, Any]:
    """``pvisor run --script`` of ``agent``: {run, steps, pause, error}."""
    root = work / f"source-{agent}"
    ws = root / "ws"
    ws.mkdir(parents=True)
    turns = source_turns(agent, ws)
    script = root / "script.json"
    script.write_text(json.dumps({"model": "mock-model", "seed": 38, "turns": turns}))
    proc = _pvisor(
        pvisor,
        ["--journal", str(journal), "run", "--agent", agent, "--agent-entrypoint", str(exe), "--script",
         str(script), "--workspace", str(ws), "--timeout", "300", "--json", "--", TASK],
        env, root,
    )  # fmt: skip
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"run": None, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-500:]}"}
    # the pause: after the last step with a call, the end left out
    pause = len(turns) - 1
    error = None
    if proc.returncode != 0 or report.get("steps") != len(turns):
        error = f"exit {proc.returncode}, {report.get('steps')} step(s) of {len(turns)} scripted"
    return {"run": report.get("run"), "steps": report.get("steps"), "pause": pause, "error": error}


def hand(
    pvisor: str, exe: Path, src: dict, b: str, name: str, work: Path, journal: Path, env: dict
) -> dict[str, Any]:
    """``pvisor handoff --replay-only`` of the source to ``b``: the cell's facts."""
    ws, out = work / f"ws-{name}", work / f"out-{name}"
    ws.mkdir()
    started = time.monotonic()
    proc = _pvisor(
        pvisor,
        ["--journal", str(journal), "handoff", "--run", src["run"], "--after-step", str(src["pause"]),
         "--to-agent", b, "--agent-entrypoint", str(exe), "--workspace", str(ws), "--output", str(out),
         "--timeout", "300", "--replay-only", *(["--model", "mock-model"] if b == "mini-swe-agent" else [])],
        env, work,
    )  # fmt: skip
    cell: dict[str, Any] = {"exit": proc.returncode, "seconds": round(time.monotonic() - started, 1)}
    try:
        result = json.loads((out / "result.json").read_text())
    except (OSError, json.JSONDecodeError):
        cell.update(status="no result", error=proc.stderr.strip()[-500:])
        return cell
    h = result.get("handoff") or {}
    ws_rec = h.get("workspace") or {}
    br = h.get("boundary_request") or {}
    cell.update(
        status=result["status"],
        error=(result["errors"][0]["code"] + ": " + result["errors"][0]["message"])
        if result["errors"]
        else None,
        fates=dict(Counter(c["fate"] for c in h.get("calls") or [])),
        calls=h.get("calls"),
        not_reenactable=h.get("not_reenactable"),
        boundary_valid=br.get("valid"),
        boundary_problems=br.get("problems"),
        boundary_protocol=br.get("protocol"),
        target_steps=h.get("target_steps"),
        workspace_equal=ws_rec.get("equal"),
        workspace_compared=ws_rec.get("compared"),
        differences=ws_rec.get("differences"),
        child_run=result.get("derived_run"),
        stderr=proc.stderr.strip()[-500:] if proc.returncode else None,
    )
    return cell


def cell_text(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "–"
    if cell.get("status") != "ok" or not cell.get("boundary_valid"):
        why = cell.get("error") or "boundary request invalid: " + "; ".join(
            cell.get("boundary_problems") or []
        )
        return f"**{cell.get('status')}** (exit {cell['exit']}): {why[:120]}"
    f = dict(cell["fates"])
    parts = [str(f.pop(k, 0)) for k in ("translated", "reproduced", "rendered_as_text")]
    extra = "".join(f", {n} {k}" for k, n in sorted(f.items()))
    if cell["workspace_equal"]:
        ws = "ws ="
    elif cell["workspace_compared"]:
        ws = "ws ≠ " + ", ".join(f"{d['path']} ({d['change']})" for d in cell["differences"])
    else:
        ws = "ws not compared"
    obs = [c["observation"] for c in cell["calls"] if c.get("observation")]
    same = sum(1 for o in obs if o["equal_normalised"])
    return f"ok · {'/'.join(parts)}{extra} · {ws} · O=O″ {same}/{len(obs)}"


def table(sources: list[str], targets: list[str], cells: dict[tuple[str, str], dict]) -> str:
    head = "| source \\ target | " + " | ".join(targets) + " |"
    rows = [head, "|" + "---|" * (len(targets) + 1)]
    for a in sources:
        rows.append(f"| {a} | " + " | ".join(cell_text(cells.get((a, b))) for b in targets) + " |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--agents-dir", type=Path, default=Path(os.environ.get("PVISOR_AGENTS_DIR") or REPO / ".agents")
    )
    ap.add_argument(
        "--pvisor", default=shutil.which("pvisor") or str(Path(sys.executable).with_name("pvisor"))
    )
    ap.add_argument("--work", type=Path, default=None, help="where runs, workspaces and the journal go")
    ap.add_argument("--sources", default=",".join(AGENTS))
    ap.add_argument("--targets", default=",".join(AGENTS))
    ap.add_argument("--json", type=Path, default=None, help="write every cell's facts here")
    args = ap.parse_args()
    sources, targets = args.sources.split(","), args.targets.split(",")
    for agent in {*sources, *targets}:
        if agent not in ENTRYPOINTS:
            ap.error(f"unknown agent {agent!r}: one of {', '.join(AGENTS)}")
        if not os.access(args.agents_dir / ENTRYPOINTS[agent], os.X_OK):
            ap.error(f"{agent} is not installed under {args.agents_dir} (scripts/install-agents)")
    work = args.work or Path(tempfile.mkdtemp(prefix="pvisor-handoff-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    home = work / "home"
    home.mkdir(exist_ok=True)
    env = _env(home)
    journal = work / "journal.sqlite"
    exe = {a: args.agents_dir / ENTRYPOINTS[a] for a in AGENTS}
    started = time.monotonic()
    captured: dict[str, dict] = {}
    cells: dict[tuple[str, str], dict] = {}
    for a in sources:
        captured[a] = src = capture(args.pvisor, exe[a], a, work, journal, env)
        print(f"captured {a}: {src}", file=sys.stderr)
        for b in targets:
            if b == a:
                continue
            if src["run"] is None or src["error"]:
                cells[(a, b)] = {"status": "no source", "exit": None, "error": src["error"]}
                continue
            cells[(a, b)] = cell = hand(args.pvisor, exe[b], src, b, f"{a}-to-{b}", work, journal, env)
            print(f"{a} -> {b}: {cell_text(cell)} ({cell['seconds']} s)", file=sys.stderr)
    print(table(sources, targets, cells))
    print(
        f"\n{sum(1 for c in cells.values() if c.get('status') == 'ok')} of {len(cells)} pairs ok; "
        f"{time.monotonic() - started:.0f} s; work directory {work}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"sources": captured, "cells": {f"{a}->{b}": c for (a, b), c in cells.items()}}, indent=1
            )
        )
    ok = all(c.get("status") == "ok" and c.get("boundary_valid") for c in cells.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
