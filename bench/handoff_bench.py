"""What a handoff costs (docs/benchmarks.md, "Handoff: the run handed over, and the translation").

**The run.** A run of ``--agent`` A (default Claude Code) of ``--steps`` steps (each one shell
call, ``echo I >> log.txt && tail -1 log.txt``), captured once with ``pvisor run --script``
against the scripted model. Then, interleaved for ``--rounds`` rounds (the order of the first
two alternates from round to round):

- **replay-only**: ``pvisor replay --agent A --run RUN --after-step S --replay-only``;
- **handoff A->A**: ``pvisor handoff --run RUN --after-step S --to-agent A --replay-only``
  (the source's own agent: a continuation from the pause with a handoff's lineage);
- **handoff A->B** (``--to-agent``, default Codex), for context: B re-runs A's history
  translated into its own tools.

Each in a fresh empty workspace, sandboxed as replays are by default (bwrap where it runs);
reported per kind the wall time of the ``pvisor`` process (median, fastest, slowest) and the
median of result.json's ``timings_ms.agent`` and ``timings_ms.total``, and the ratio of the
handoff A->A to the replay-only (the aim: within 1.2x).

**The translation.** :func:`pvisor.replay.translate.translate` in this process for the 30
ordered pairs of the six agents: a source run of each agent built as journal steps with the
agent's own tools (a shell call, a file write, an edit, a parallel batch of two reads, a plan
call; each made through the agent's shell where its request 1 declares no tool for it), into
the tools each target declared in its real request 1: tests/corpus/requests/*.jsonl for Codex,
Gemini CLI, OpenCode, Qwen Code and mini-swe-agent; Claude Code's request 1 is read from the
run captured above (its traffic is never committed). Reported: the median over ``--repeat``
translations per pair, in ms, as a 6x6 table (row: the source, column: the target).

    python bench/handoff_bench.py [--agents-dir DIR] [--agent claude-code] [--to-agent codex]
        [--steps 50] [--rounds 5] [--repeat 200] [--json FILE]

The agents are the pinned installs (``scripts/install-agents``; ``--agents-dir``, default
``$PVISOR_AGENTS_DIR`` or ``.agents/`` of the checkout). ``pvisor`` is the one beside this
interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import orjson
from pvisor.adapters.agents import get_descriptor
from pvisor.adapters.agents.effects import Effect, Role
from pvisor.adapters.chains import classify_run
from pvisor.adapters.protocols import get_protocol, protocol_for_path
from pvisor.journal.model import Action, Observation, Step, ToolCall, ToolResult, ToolSpec
from pvisor.journal.reader import JournalReader
from pvisor.replay.translate import Target, translate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from agent_installs import AGENTS, ENTRYPOINTS  # noqa: E402

PVISOR = str(Path(sys.executable).with_name("pvisor"))

#: the corpus's file of requests per agent (tests/corpus/requests; Claude Code's is captured here)
CORPUS_FILES = {
    "codex": "codex-0.171.0.jsonl",
    "gemini-cli": "gemini-cli-0.61.0.jsonl",
    "opencode": "opencode-1.18.33.jsonl",
    "qwen-code": "qwen-code-0.24.4.jsonl",
    "mini-swe-agent": "mini-swe-agent-2.4.6.jsonl",
}
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's end (it loops on text)
TASK = "Count to the end, one step at a time."
KINDS = ("replay-only", "handoff A->A", "handoff A->B")


# --------------------------------------------------------------------------- the run


def script(agent: str, steps: int) -> dict[str, Any]:
    """The scripted model's turns: ``steps`` turns of one shell call each, then the end."""
    turns: list[dict[str, Any]] = [
        {
            "text": f"Step {i}.",
            "tool_calls": [{"tool": "@shell", "command": f"echo {i} >> log.txt && tail -1 log.txt"}],
        }
        for i in range(1, steps + 1)
    ]
    end: dict[str, Any] = {"text": "Done."}
    if agent == "mini-swe-agent":
        end["tool_calls"] = [{"tool": "@shell", "command": SUBMIT}]
    return {"model": "mock-model", "seed": 1, "turns": [*turns, end]}


def _pvisor(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [PVISOR, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"pvisor {' '.join(args[2:5])} ... failed (exit {proc.returncode}): {proc.stderr[-2000:]}"
        )
    return proc


def capture(root: Path, env: dict[str, str], agent: str, entrypoint: Path, steps: int) -> tuple[Path, str]:
    """``pvisor run --script`` of ``agent`` for ``steps`` steps: (journal, run id)."""
    journal = root / "data" / "j.sqlite"
    (root / "data").mkdir()
    (root / "ws").mkdir()
    (root / "script.json").write_text(json.dumps(script(agent, steps)))
    args = ["--journal", str(journal), "run", "--agent", agent, "--agent-entrypoint", str(entrypoint),
            "--script", str(root / "script.json"), "--workspace", str(root / "ws"), "--timeout", "900",
            "--json", "--", TASK]  # fmt: skip
    return journal, json.loads(_pvisor(args, env, root).stdout)["run"]


def one(
    kind: str,
    root: Path,
    env: dict[str, str],
    journal: Path,
    run: str,
    agents: dict[str, tuple[str, Path]],
    n: int,
    tag: str,
) -> dict[str, Any]:
    """One replay-only or handoff after ``n`` steps in a fresh workspace: wall ms, result.json's
    timings, status and summary line."""
    ws, out = root / f"ws-{tag}", root / f"out-{tag}"
    ws.mkdir()
    name, entrypoint = agents[kind]
    if kind == "replay-only":
        head = ["replay", "--agent", name]
    else:
        head = ["handoff", "--to-agent", name]
    args = ["--journal", str(journal), *head, "--run", run, "--after-step", str(n), "--replay-only",
            "--workspace", str(ws), "--output", str(out), "--agent-entrypoint", str(entrypoint),
            "--no-progress"]  # fmt: skip
    t = time.perf_counter()
    proc = _pvisor(args, env, root)
    wall = (time.perf_counter() - t) * 1000
    doc = json.loads((out / "result.json").read_text())
    if doc["status"] != "ok":
        raise SystemExit(f"{kind}: status {doc['status']}: {proc.stdout}{proc.stderr[-2000:]}")
    shutil.rmtree(ws, ignore_errors=True)
    return {
        "wall_ms": wall,
        "agent_ms": doc["timings_ms"].get("agent"),
        "total_ms": doc["timings_ms"].get("total"),
        "timings_ms": doc["timings_ms"],
        "summary": proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else "",
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def runs(
    root: Path, env: dict[str, str], agents_dir: Path, agent: str, to_agent: str, steps: int, rounds: int
) -> tuple[Path, str, dict[str, Any]]:
    """The run's part (module docstring): (journal, run id, figures)."""
    ep = {a: agents_dir / ENTRYPOINTS[a] for a in (agent, to_agent)}
    for a, path in ep.items():
        if not (path.exists() and os.access(path, os.X_OK)):
            raise SystemExit(
                f"{a} is not installed at {path}: run scripts/install-agents or give --agents-dir"
            )
    t = time.perf_counter()
    journal, run = capture(root, env, agent, ep[agent], steps)
    capture_ms = (time.perf_counter() - t) * 1000
    who = {
        "replay-only": (agent, ep[agent]),
        "handoff A->A": (agent, ep[agent]),
        "handoff A->B": (to_agent, ep[to_agent]),
    }
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    for r in range(rounds):
        order = [KINDS[0], KINDS[1]] if r % 2 == 0 else [KINDS[1], KINDS[0]]
        for kind in [*order, KINDS[2]]:
            got[kind].append(one(kind, root, env, journal, run, who, steps, f"{KINDS.index(kind)}-{r}"))
            print(f"  round {r + 1} {kind}: {got[kind][-1]['wall_ms']:.0f} ms", file=sys.stderr)
    fig: dict[str, Any] = {"agent": agent, "to_agent": to_agent, "steps": steps, "rounds": rounds,
                           "capture_ms": capture_ms, "kinds": {}}  # fmt: skip
    for kind in KINDS:
        fig["kinds"][kind] = {
            "wall_ms": spread([x["wall_ms"] for x in got[kind]]),
            "agent_ms": spread([x["agent_ms"] for x in got[kind]]),
            "total_ms": spread([x["total_ms"] for x in got[kind]]),
            "all": got[kind],
            "summary": got[kind][-1]["summary"],
        }
    k = fig["kinds"]
    for what in ("wall_ms", "agent_ms", "total_ms"):
        fig[f"ratio_{what}"] = k[KINDS[1]][what]["median"] / k[KINDS[0]][what]["median"]
        fig[f"ratio_cross_{what}"] = k[KINDS[2]][what]["median"] / k[KINDS[0]][what]["median"]
    return journal, run, fig


# --------------------------------------------------------------------------- the translation

#: the workspace the built source runs were recorded in, and the targets' own
RECORDED = "/recorded/ws"
TARGET_WS = "/handed/ws"
#: what the source's write puts in src/app.py (about 2 KB) and what its edit changes
APP = "".join(f'def step_{i}(x):\n    return x + {i}  # "quoted" $HOME `tick`\n\n' for i in range(40))
EDIT_OLD, EDIT_NEW = "return x + 7 ", "return x * 7 "


def request_tools(protocol: str, path: str, body: bytes) -> tuple[str, tuple[ToolSpec, ...]]:
    mod = get_protocol(protocol)
    return protocol, tuple(mod.offered_tools(mod.parse_request(body, path=path)))


def corpus_request_one(agent: str, corpus: Path) -> tuple[str, tuple[ToolSpec, ...]]:
    """(protocol, tools) of the first request in ``agent``'s corpus file that offers its shell."""
    d = get_descriptor(agent)
    for line in (corpus / CORPUS_FILES[agent]).read_bytes().splitlines():
        doc = orjson.loads(line)
        mod = protocol_for_path(doc.get("path") or "") if doc.get("body") is not None else None
        if doc.get("method") != "POST" or mod is None:
            continue
        protocol, tools = request_tools(mod.NAME, doc["path"], orjson.dumps(doc["body"]))
        if any(d.effect_of(t.name).effect is Effect.SHELL for t in tools):
            return protocol, tools
    raise SystemExit(f"{corpus / CORPUS_FILES[agent]}: no request offers {agent}'s shell tool")


def journal_request_one(journal: Path, run: str, agent: str) -> tuple[str, tuple[ToolSpec, ...]]:
    """(protocol, tools) of the first main-loop request of ``run`` (the chain rule picks it)."""
    with JournalReader(journal) as reader:
        c = classify_run(reader, run, prefer=get_descriptor(agent).chain_hint)
        first = c.main_requests[0]
        body = reader.request_body(first.exchange)
        path = first.exchange.path
    if body is None or not first.protocol:
        raise SystemExit(f"run {run}: request 1 has no body or protocol")
    return request_tools(first.protocol, path, body)


def _declared(agent: str, tools: Sequence[ToolSpec], *effects: Effect) -> tuple[str, Any] | None:
    """(name, effect facts) of the first tool of ``effects`` that ``agent`` declared."""
    d = get_descriptor(agent)
    offered = {t.name for t in tools}
    for effect in effects:
        for name, fx in d.tool_effects.items():
            if fx.effect is effect and name in offered:
                return name, fx
    return None


def source_steps(agent: str, protocol: str, tools: Sequence[ToolSpec]) -> tuple[list[Step], int]:
    """A run of ``agent`` (its tools and argument names; those its request 1 declares): 1 a
    shell call, 2 a write of src/app.py, 3 an edit of it, 4 two reads at once, 5 a plan call (a
    subagent where the agent declares no plan tool; none for mini-swe-agent). A write, an edit or a
    read without a tool of its own is a shell call. (steps, number of calls)."""
    prefix = get_protocol(protocol).CALL_ID_PREFIX
    shell = _declared(agent, tools, Effect.SHELL)
    assert shell is not None, agent
    sh_name, sh_fx = shell
    per_step: list[list[tuple[str, dict[str, Any], str]]] = []

    def sh(command: str, result: str = "") -> tuple[str, dict[str, Any], str]:
        """A shell call of ``agent``: (tool, arguments, recorded result)."""
        return sh_name, {sh_fx.arg(Role.COMMAND) or "command": command}, result

    per_step.append([sh("mkdir -p src logs && echo started > logs/run.log && ls", "logs\nsrc\n")])
    write = _declared(agent, tools, Effect.WRITE)
    if write is not None:
        name, fx = write
        per_step.append(
            [(name, {fx.arg(Role.PATH): f"{RECORDED}/src/app.py", fx.arg(Role.CONTENT): APP}, "Wrote.")]
        )
    else:
        per_step.append([sh(f"cat > src/app.py <<'APP_END'\n{APP}APP_END")])
    edit = _declared(agent, tools, Effect.EDIT)
    if edit is not None:
        name, fx = edit
        args = {
            fx.arg(Role.PATH): f"{RECORDED}/src/app.py",
            fx.arg(Role.OLD): EDIT_OLD,
            fx.arg(Role.NEW): EDIT_NEW,
        }
        per_step.append([(name, args, "Edited.")])
    else:
        per_step.append([sh(f"sed -i 's/{EDIT_OLD}/{EDIT_NEW}/' src/app.py")])
    final = APP.replace(EDIT_OLD, EDIT_NEW, 1)
    read = _declared(agent, tools, Effect.READ)
    batch = []
    for rel, content in (("src/app.py", final), ("logs/run.log", "started\n")):
        if read is not None:
            name, fx = read
            batch.append((name, {fx.arg(Role.PATH): f"{RECORDED}/{rel}"}, content))
        else:
            batch.append(sh(f"cat {rel}", content))
    per_step.append(batch)
    plan = _declared(agent, tools, Effect.PLAN, Effect.SUBAGENT)
    if plan is not None:
        per_step.append([(plan[0], {"plan": "Write the app, edit it, check it."}, "Plan noted.")])
    steps: list[Step] = []
    calls = 0
    for n, batch_ in enumerate(per_step, 1):
        tcs = [
            ToolCall(f"{prefix}src{n}{i}", name, orjson.dumps(a).decode(), a)
            for i, (name, a, _) in enumerate(batch_)
        ]
        results = [ToolResult(tc.id, out) for tc, (_, _, out) in zip(tcs, batch_)]
        steps.append(Step(n, Action(text=f"Step {n}.", tool_calls=tcs), Observation(results=results)))
        calls += len(tcs)
    return steps, calls


def translation_table(
    requests: dict[str, tuple[str, tuple[ToolSpec, ...]]], repeat: int, warmup: int = 5
) -> dict[str, Any]:
    """ms per :func:`translate` for every ordered pair of ``requests``' agents (median of
    ``repeat``), with each translation's B steps and fates. Fails when a source call is not
    accounted for."""
    sources = {a: source_steps(a, *requests[a]) for a in requests}
    table: dict[str, dict[str, Any]] = {}
    for a, (steps, calls) in sources.items():
        for b, (protocol, tools) in requests.items():
            if a == b:
                continue
            target = Target(get_descriptor(b), protocol, tools, TARGET_WS, RECORDED)
            src = get_descriptor(a)
            for _ in range(warmup):
                tr = translate(steps, src, target)
            times = []
            for _ in range(repeat):
                t = time.perf_counter_ns()
                tr = translate(steps, src, target)
                times.append((time.perf_counter_ns() - t) / 1e6)
            if len(tr.calls) != calls:
                raise SystemExit(f"{a} -> {b}: {len(tr.calls)} of {calls} source calls accounted for")
            fates: dict[str, int] = {}
            for c in tr.calls:
                fates[c.fate.value] = fates.get(c.fate.value, 0) + 1
            table.setdefault(a, {})[b] = {
                "ms": spread(times),
                "source_steps": len(steps),
                "source_calls": calls,
                "target_steps": tr.target_steps,
                "fates": fates,
            }
    return table


def markdown(table: dict[str, Any]) -> str:
    agents = [a for a in AGENTS if a in table]
    lines = ["| source \\ target | " + " | ".join(agents) + " |", "|---" * (len(agents) + 1) + "|"]
    for a in agents:
        cells = ["—" if a == b else f"{table[a][b]['ms']['median']:.3f}" for b in agents]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def machine() -> dict[str, Any]:
    model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "loadavg_start": os.getloadavg(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_agents = os.environ.get("PVISOR_AGENTS_DIR") or str(REPO / ".agents")
    ap.add_argument("--agents-dir", type=Path, default=Path(default_agents))
    ap.add_argument("--agent", default="claude-code", choices=AGENTS, help="A, the source's agent")
    ap.add_argument("--to-agent", default="codex", choices=AGENTS, help="B of the cross-agent handoff")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=200, help="translations timed per pair")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here as JSON")
    a = ap.parse_args()
    if a.to_agent == a.agent:
        ap.error("--to-agent: give another agent than --agent (the A->A handoff is measured anyway)")
    root = Path(tempfile.mkdtemp(prefix="pvisor-handoff-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVISOR_")}
    env["HOME"] = str(root / "home")
    (root / "home").mkdir()
    figures: dict[str, Any] = {"machine": machine()}
    try:
        journal, run, figures["run"] = runs(root, env, a.agents_dir, a.agent, a.to_agent, a.steps, a.rounds)
        corpus = REPO / "tests" / "corpus" / "requests"
        requests = {ag: corpus_request_one(ag, corpus) for ag in CORPUS_FILES}
        if a.agent == "claude-code":
            requests["claude-code"] = journal_request_one(journal, run, "claude-code")
        else:  # Claude Code's request 1 is captured, never read from a file: a short run of its own
            cc_root = root / "claude-code"
            cc_root.mkdir()
            cc_journal, cc_run = capture(
                cc_root, env, "claude-code", a.agents_dir / ENTRYPOINTS["claude-code"], 1
            )
            requests["claude-code"] = journal_request_one(cc_journal, cc_run, "claude-code")
        requests = {ag: requests[ag] for ag in AGENTS}
        figures["translation"] = translation_table(requests, a.repeat)
        figures["machine"]["loadavg_end"] = os.getloadavg()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    r = figures["run"]
    m = figures["machine"]
    load = f"load average {m['loadavg_start'][0]:.1f} at the start, {m['loadavg_end'][0]:.1f} at the end"
    print(f"{r['agent']}, {r['steps']} steps (captured in {r['capture_ms']:.0f} ms), {r['rounds']} rounds; "
          f"{m['nproc']} CPUs ({m['cpu']}), {load}")  # fmt: skip
    print("| run | wall median | fastest | slowest | timings_ms.agent | timings_ms.total |")
    print("|---|---|---|---|---|---|")
    for kind in KINDS:
        k = r["kinds"][kind]
        label = kind.replace("B", r["to_agent"]).replace("A", r["agent"]) if kind != "replay-only" else kind
        w = k["wall_ms"]
        print(f"| {label} | {w['median']:.0f} ms | {w['min']:.0f} ms | {w['max']:.0f} ms "
              f"| {k['agent_ms']['median']:.0f} ms | {k['total_ms']['median']:.0f} ms |")  # fmt: skip
    print(f"handoff A->A over replay-only: wall {r['ratio_wall_ms']:.2f}x, agent {r['ratio_agent_ms']:.2f}x, "
          f"total {r['ratio_total_ms']:.2f}x")  # fmt: skip
    print("\nms per translation (median of", a.repeat, "):")
    print(markdown(figures["translation"]))
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
