"""Reliability figures of the gateway (docs/reliability.md): crashes and load, checked exchange
by exchange against what the clients sent and received.

- ``crash``: per round, a real ``pvisor gateway`` (a process of its own, journal writer as
  ``--writer`` says) between streaming clients and an upstream, killed with SIGKILL at a random
  moment (``--kill gateway``: the gateway's pid, as an OOM killer does; ``group``: its whole
  process group, writer process included). Then, as the promise in docs/journal.md goes: the
  journal opens and ``verify`` passes; every exchange a client finished more than ``--window``
  seconds before the kill is there, its request and response byte-exact; every request whose
  answer had begun that long before is there, with its request, and ``incomplete`` if it had
  not finished (its response a prefix of what the client got, or the other way round); no
  exchange is still in flight once the dead writer is reaped; no response holds another
  request's id. A kill of the gateway alone with its writer in a process of its own loses no
  window at all: every request the upstream received is in the journal.
- ``load``: ``--clients`` streaming clients for ``--seconds`` through one gateway (or two
  gateways writing the same journal file, ``--gateways 2``), then a clean stop: every request
  answered is journaled once, byte-exact, none mixed up; peak RSS of the gateway and its writer;
  time to first byte and to the last byte.

The upstream is an aiohttp server in this process; every request carries a unique id that the
upstream puts into each event, so that a response can be matched to its request.

    python bench/reliability.py crash [--rounds 100] [--clients 8] [--writer process|thread]
                                      [--kill gateway|group|both] [--target gateway|run]
    python bench/reliability.py load [--clients 128] [--seconds 60] [--gateways 1|2]
    (either: [--seed N] [--json FILE])
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web
from gateway_bench import peak_rss_kib  # bench/: the peak RSS of a gateway and its writer process

EVENTS = 20  # per stream
EVENT_GAP_S = 0.01  # between two events: a stream lasts about 0.2 s
PAD = "p" * 1200  # request bodies of about 1.3 KB
PVISOR = shutil.which("pvisor", path=os.path.dirname(sys.executable)) or "pvisor"


def _event(rid: str, n: int) -> bytes:
    obj = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": f"{rid} part {n} "}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


#: the request ids the upstream received, with when (time.monotonic())
UPSTREAM_SAW = web.AppKey("upstream_saw", dict)


async def _upstream_handler(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    rid = body["messages"][0]["content"].split(" ", 1)[0]
    request.app[UPSTREAM_SAW][rid] = time.monotonic()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    try:
        for n in range(EVENTS):
            await resp.write(_event(rid, n))
            await asyncio.sleep(EVENT_GAP_S)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionError:
        pass  # the gateway was killed
    return resp


async def start_upstream() -> tuple[web.AppRunner, str]:
    app = web.Application()
    app[UPSTREAM_SAW] = {}
    app.router.add_post("/v1/chat/completions", _upstream_handler)
    app.router.add_post(
        "/v1/messages", _upstream_handler
    )  # the fake agent of --target run (its events are not Anthropic's: only the bytes matter)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


#: a stand-in for ``claude`` (``--target run``): answers ``--version``, then streams requests
#: through ``$ANTHROPIC_BASE_URL`` one after another, appending one JSON line per request to
#: ``$PVISOR_CRASH_OUT`` as it goes (its client records), until it is killed
FAKE_AGENT = r"""#!{python}
import base64, http.client, json, os, sys, time, urllib.parse
if sys.argv[1:2] == ["--version"]:
    print("2.1.332 (Claude Code)"); sys.exit(0)
base = urllib.parse.urlsplit(os.environ["ANTHROPIC_BASE_URL"])
out = open(os.environ["PVISOR_CRASH_OUT"], "a", buffering=1)
k = 0
while True:
    rid = f"a-r{{k}}"; k += 1
    msg = {{"role": "user", "content": rid + " " + "p" * 1200}}
    body = json.dumps({{"model": "m", "stream": True, "messages": [msg]}},
                      separators=(",", ":")).encode()
    rec = {{"rid": rid, "body": base64.b64encode(body).decode(), "t_start": time.monotonic()}}
    out.write(json.dumps({{**rec, "event": "start"}}) + "\n")
    conn = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
    headers = {{"Content-Type": "application/json"}}
    conn.request("POST", base.path + "/v1/messages", body=body, headers=headers)
    resp = conn.getresponse()
    t_headers = time.monotonic()
    received = resp.read()
    out.write(json.dumps({{**rec, "event": "done", "t_headers": t_headers, "t_done": time.monotonic(),
                          "received": base64.b64encode(received).decode()}}) + "\n")
    conn.close()
"""


@dataclass
class Gateway:
    proc: subprocess.Popen
    url: str
    journal: Path


def start_gateway(journal: Path, upstream: str, writer: str, ready: Path) -> Gateway:
    """A ``pvisor gateway`` in a session of its own; returns once it listens."""
    env = {**os.environ, "PVISOR_JOURNAL_WRITER": writer}
    proc = subprocess.Popen(
        [
            PVISOR,
            "--journal",
            str(journal),
            "gateway",
            "--port",
            "0",
            "--upstream",
            f"openai={upstream}",
            "--ready-file",
            str(ready),
            "--shutdown-grace",
            "5",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not ready.exists() or not ready.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"the gateway did not start: {proc.stderr.read().decode() if proc.stderr else ''}"
            )
        time.sleep(0.02)
    return Gateway(proc, json.loads(ready.read_text())["url"], journal)


@dataclass
class Record:
    """One request as its client saw it; times are time.monotonic()."""

    rid: str
    body: bytes
    t_start: float
    t_headers: float | None = None
    t_done: float | None = None
    received: bytearray = field(default_factory=bytearray)
    ttfb_s: float | None = None


def _body(rid: str) -> bytes:
    msg = {"role": "user", "content": f"{rid} {PAD}"}
    return json.dumps({"model": "m", "stream": True, "messages": [msg]}, separators=(",", ":")).encode()


async def client(
    session: ClientSession, url: str, name: str, records: list[Record], stop: asyncio.Event
) -> None:
    """Stream requests one after another until ``stop`` is set or the gateway is gone."""
    k = 0
    while not stop.is_set():
        rid = f"{name}-r{k}"
        k += 1
        rec = Record(rid, _body(rid), time.monotonic())
        records.append(rec)
        try:
            async with session.post(
                url + "/v1/chat/completions", data=rec.body, headers={"Content-Type": "application/json"}
            ) as resp:
                rec.t_headers = time.monotonic()
                async for chunk in resp.content.iter_any():
                    if rec.ttfb_s is None:
                        rec.ttfb_s = time.monotonic() - rec.t_start
                    rec.received += chunk
            rec.t_done = time.monotonic()
        except Exception:  # the gateway was killed: this request ends here
            return


def reap(journal: Path, deadline_s: float = 30.0) -> None:
    """Open and close a writer until no exchange is in flight: the dead writer's lease is
    reaped once its processes are gone (a killed writer process takes a moment to die)."""
    from pvisor.journal.writer import Journal

    deadline = time.monotonic() + deadline_s
    while True:
        with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as db:
            open_rows = db.execute("SELECT count(*) FROM exchanges WHERE outcome IS NULL").fetchone()[0]
            open_leases = db.execute("SELECT count(*) FROM writers WHERE closed_ms IS NULL").fetchone()[0]
        if open_rows == 0 and open_leases == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{open_rows} exchange(s) still in flight, {open_leases} lease(s) open")
        Journal.open(journal).close()
        time.sleep(0.1)


def verify(
    journal: Path,
    records: list[Record],
    t_kill: float | None,
    window: float,
    upstream_saw: dict[str, float] | None = None,
) -> dict:
    """Check the journal against the clients' records (module docstring). ``upstream_saw``: the
    ids of the requests the upstream received (with when), each of which must be journaled
    (a kill of the gateway alone, its writer a process of its own). Returns counts and a list
    of problems (empty when every promise held)."""
    from pvisor.journal.reader import JournalReader

    problems: list[str] = []
    by_rid = {r.rid: r for r in records}
    seen: dict[str, int] = {}
    counts = {"journaled": 0, "ok": 0, "incomplete": 0, "lost_in_window": 0, "client_cut": 0}
    lost_ages: list[float] = []
    with JournalReader(journal) as reader:
        report = reader.verify()
        if not report.ok:
            problems += [f"verify: {p}" for p in report.problems]
        for ex in reader.exchanges():
            counts["journaled"] += 1
            body = reader.request_body(ex)
            if body is None:
                problems.append(f"exchange {ex.id} ({ex.outcome}): no request body")
                continue
            rid = json.loads(body)["messages"][0]["content"].split(" ", 1)[0]
            rec = by_rid.get(rid)
            seen[rid] = seen.get(rid, 0) + 1
            if rec is None or body != rec.body:
                problems.append(f"exchange {ex.id}: request {rid} is not one a client sent")
                continue
            got = reader.response_body(ex, raw=True) or b""
            others = {part.split(b" part ", 1)[0][-40:] for part in got.split(b'"content":"')[1:]}
            if any(not o.endswith(rid.encode()) for o in others):
                problems.append(f"exchange {ex.id}: the response of {rid} holds another request's events")
            mine = bytes(rec.received)
            if ex.outcome == "ok":
                counts["ok"] += 1
                if got != mine:
                    if mine and got.startswith(mine) and rec.t_done is None:
                        counts["client_cut"] += 1  # the kill came while the client read the last bytes
                    else:
                        problems.append(
                            f"exchange {ex.id} ({rid}): journaled response differs from the client's"
                        )
            elif ex.outcome == "incomplete":
                counts["incomplete"] += 1
                if not (got.startswith(mine) or mine.startswith(got)):
                    problems.append(
                        f"exchange {ex.id} ({rid}): incomplete response is not a prefix of the client's"
                    )
            else:
                problems.append(f"exchange {ex.id} ({rid}): outcome {ex.outcome}")
    for rid, n in seen.items():
        if n > 1:
            problems.append(f"request {rid} journaled {n} times")
    for rid, t_up in (upstream_saw or {}).items():
        if rid not in seen:
            age = f"{t_kill - t_up:.3f} s before the kill" if t_kill is not None else "before the stop"
            problems.append(f"request {rid} reached the upstream {age}, not journaled")
    for rec in records:
        if rec.rid in seen:
            continue
        if t_kill is None:
            if rec.t_done is not None:
                problems.append(f"request {rec.rid} was answered but is not in the journal")
            continue
        began = rec.t_headers
        if rec.t_done is not None and rec.t_done < t_kill - window:
            problems.append(
                f"request {rec.rid} finished {t_kill - rec.t_done:.3f} s before the kill, not journaled"
            )
        elif rec.t_done is None and began is not None and began < t_kill - window:
            problems.append(
                f"request {rec.rid} in flight {t_kill - began:.3f} s before the kill, not journaled"
            )
        elif rec.t_done is not None:
            counts["lost_in_window"] += 1
            lost_ages.append(t_kill - rec.t_done)
    return {**counts, "max_lost_age_s": max(lost_ages, default=0.0), "problems": problems}


async def _crash_round(tmp: Path, seed: int, clients: int, writer: str, kill: str, window: float) -> dict:
    rng = random.Random(seed)
    runner, upstream = await start_upstream()
    journal = tmp / "journal.sqlite"
    gw = start_gateway(journal, upstream, writer, tmp / "ready.json")
    records: list[Record] = []
    stop = asyncio.Event()
    try:
        async with ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=30)) as session:
            tasks = [
                asyncio.ensure_future(client(session, gw.url, f"c{i}", records, stop)) for i in range(clients)
            ]
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            t_kill = time.monotonic()
            if kill == "group":
                os.killpg(gw.proc.pid, signal.SIGKILL)
            else:
                os.kill(gw.proc.pid, signal.SIGKILL)
            stop.set()
            await asyncio.wait(tasks, timeout=30)
        gw.proc.wait(30)
        if gw.proc.stderr is not None:
            gw.proc.stderr.close()
    finally:
        await runner.cleanup()
    await asyncio.get_running_loop().run_in_executor(None, reap, journal)
    saw = runner.app[UPSTREAM_SAW]
    # a kill of the gateway alone leaves its writer process, which reads the pipe to its end:
    # every request forwarded had been handed to it before (JournalProcess.request_read)
    strict = kill == "gateway" and writer == "process"
    result = verify(journal, records, t_kill, window, saw if strict else None)
    result.update(seed=seed, writer=writer, kill=kill, requests=len(records), upstream_saw=len(saw))
    try:
        os.killpg(gw.proc.pid, signal.SIGKILL)  # whatever of the group is left
    except ProcessLookupError:
        pass
    return result


def _agent_records(path: Path) -> list[Record]:
    """The fake agent's records (:data:`FAKE_AGENT`); a request it had started but not finished
    has no ``t_headers`` (it cannot say when its answer began: counted as in flight only)."""
    import base64

    recs: dict[str, Record] = {}
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue  # the last line, cut by the kill
        rec = recs.setdefault(d["rid"], Record(d["rid"], base64.b64decode(d["body"]), d["t_start"]))
        if d["event"] == "done":
            rec.t_headers, rec.t_done = d["t_headers"], d["t_done"]
            rec.received = bytearray(base64.b64decode(d["received"]))
    return list(recs.values())


async def _run_round(tmp: Path, seed: int, writer: str, window: float) -> dict:
    """``pvisor run`` (its gateway in-process) with :data:`FAKE_AGENT`, killed with SIGKILL."""
    rng = random.Random(seed)
    runner, upstream = await start_upstream()
    journal = tmp / "data" / "journal.sqlite"
    agent = tmp / "fake-claude"
    agent.write_text(FAKE_AGENT.format(python=sys.executable))
    agent.chmod(0o755)
    (tmp / "ws").mkdir()
    records_file = tmp / "agent-records.jsonl"
    env = {
        **os.environ,
        "PVISOR_JOURNAL_WRITER": writer,
        "PVISOR_CRASH_OUT": str(records_file),
        "ANTHROPIC_API_KEY": "sk-ant-crash-test-key-not-real",
    }
    proc = subprocess.Popen(
        [
            PVISOR,
            "--journal",
            str(journal),
            "run",
            "--agent",
            "claude-code",
            "--agent-entrypoint",
            str(agent),
            "--upstream",
            upstream,
            "--workspace",
            str(tmp / "ws"),
            "--no-snapshots",
            "--",
            "stream",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not records_file.exists():  # the agent has started
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "pvisor run did not start the agent: "
                    + (proc.stderr.read().decode() if proc.stderr else "")
                )
            await asyncio.sleep(0.02)
        await asyncio.sleep(rng.uniform(0.3, 1.5))
        t_kill = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
        await asyncio.sleep(0.3)  # the agent dies with pvisor (PR_SET_PDEATHSIG): its last line is cut
    finally:
        await runner.cleanup()
    await asyncio.get_running_loop().run_in_executor(None, reap, journal)
    records = _agent_records(records_file)
    result = verify(journal, records, t_kill, window)
    result.update(seed=seed, writer=writer, kill="run", requests=len(records))
    return result


def crash(
    rounds: int,
    clients: int = 8,
    writer: str = "process",
    kill: str = "both",
    seed: int = 1,
    window: float = 0.25,
    progress=None,
    target: str = "gateway",
) -> dict:
    """``rounds`` kill rounds (``kill`` ``both``: alternating gateway and group). Returns totals
    and every round's result."""
    results = []
    for n in range(rounds):
        how = kill if kill != "both" else ("gateway" if n % 2 == 0 else "group")
        with tempfile.TemporaryDirectory(prefix="pvisor-crash-") as tmp:
            if target == "run":
                results.append(asyncio.run(_run_round(Path(tmp), seed + n, writer, window)))
            else:
                results.append(asyncio.run(_crash_round(Path(tmp), seed + n, clients, writer, how, window)))
        if progress is not None:
            progress(results[-1])
    totals = {
        k: sum(r.get(k, 0) for r in results)
        for k in ("requests", "upstream_saw", "journaled", "ok", "incomplete", "lost_in_window", "client_cut")
    }
    return {
        "target": target,
        "rounds": rounds,
        "clients": clients if target == "gateway" else 1,
        "writer": writer,
        "kill": kill if target == "gateway" else "run",
        "window_s": window,
        **totals,
        "max_lost_age_s": max((r["max_lost_age_s"] for r in results), default=0.0),
        "rounds_with_problems": sum(1 for r in results if r["problems"]),
        "problems": [p for r in results for p in r["problems"]][:50],
        "per_round": results,
    }


async def _load(tmp: Path, clients: int, seconds: float, gateways: int, writer: str) -> dict:
    runner, upstream = await start_upstream()
    journal = tmp / "journal.sqlite"
    gws = [start_gateway(journal, upstream, writer, tmp / f"ready{i}.json") for i in range(gateways)]
    records: list[Record] = []
    stop = asyncio.Event()
    try:
        async with ClientSession(
            connector=TCPConnector(limit=0), timeout=ClientTimeout(total=120)
        ) as session:
            tasks = [
                asyncio.ensure_future(client(session, gws[i % gateways].url, f"c{i}", records, stop))
                for i in range(clients)
            ]
            t0 = time.monotonic()
            await asyncio.sleep(seconds)
            stop.set()
            await asyncio.wait(tasks, timeout=60)
            wall = time.monotonic() - t0
        rss = [peak_rss_kib(g.proc.pid) or 0 for g in gws]
        for g in gws:
            g.proc.send_signal(signal.SIGTERM)
        codes = [g.proc.wait(60) for g in gws]
        for g in gws:
            if g.proc.stderr is not None:
                g.proc.stderr.close()
    finally:
        await runner.cleanup()
    result = verify(journal, records, None, 0.0)
    done = [r for r in records if r.t_done is not None]
    ttfb = sorted(r.ttfb_s * 1000 for r in done if r.ttfb_s is not None)
    total = sorted((r.t_done - r.t_start) * 1000 for r in done)  # type: ignore[operator]

    def pct(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0

    with sqlite3.connect(journal) as db:
        seq_ok = all(
            n == hi
            for n, hi in db.execute("SELECT count(*), max(seq) FROM exchanges GROUP BY run_id").fetchall()
        )
    if not seq_ok:
        result["problems"].append("seq is not dense within a run")
    result.update(
        clients=clients,
        seconds=seconds,
        gateways=gateways,
        writer=writer,
        requests=len(records),
        answered=len(done),
        requests_per_s=len(done) / wall,
        exit_codes=codes,
        peak_rss_mib=[round(k / 1024, 1) for k in rss],
        ttfb_ms={"p50": round(statistics.median(ttfb), 2) if ttfb else 0.0, "p99": round(pct(ttfb, 0.99), 2)},
        total_ms={
            "p50": round(statistics.median(total), 2) if total else 0.0,
            "p99": round(pct(total, 0.99), 2),
        },
    )
    if any(c != 0 for c in codes):
        result["problems"].append(f"gateway exit codes {codes}")
    return result


def load(clients: int = 128, seconds: float = 60.0, gateways: int = 1, writer: str = "process") -> dict:
    with tempfile.TemporaryDirectory(prefix="pvisor-load-") as tmp:
        return asyncio.run(_load(Path(tmp), clients, seconds, gateways, writer))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("crash")
    c.add_argument("--rounds", type=int, default=100)
    c.add_argument("--clients", type=int, default=8)
    c.add_argument("--writer", choices=["process", "thread"], default="process")
    c.add_argument("--kill", choices=["gateway", "group", "both"], default="both")
    c.add_argument("--window", type=float, default=0.25)
    c.add_argument(
        "--target",
        choices=["gateway", "run"],
        default="gateway",
        help="run: kill -9 `pvisor run` with a fake agent streaming through its gateway",
    )
    ld = sub.add_parser("load")
    ld.add_argument("--clients", type=int, default=128)
    ld.add_argument("--seconds", type=float, default=60.0)
    ld.add_argument("--gateways", type=int, choices=[1, 2], default=1)
    ld.add_argument("--writer", choices=["process", "thread"], default="process")
    for p in (c, ld):
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.what == "crash":

        def show(r: dict) -> None:
            print(
                f"seed {r['seed']} ({r['kill']}): {r['requests']} requests, {r['journaled']} journaled,"
                f" {r['incomplete']} incomplete, {r['lost_in_window']} lost in the window,"
                f" {len(r['problems'])} problem(s)",
                flush=True,
            )

        out = crash(
            args.rounds, args.clients, args.writer, args.kill, args.seed, args.window, show, args.target
        )
    else:
        out = load(args.clients, args.seconds, args.gateways, args.writer)
    out["date"] = time.strftime("%Y-%m-%d")
    summary = {k: v for k, v in out.items() if k != "per_round"}
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    sys.exit(1 if out["problems"] else 0)


if __name__ == "__main__":
    main()
