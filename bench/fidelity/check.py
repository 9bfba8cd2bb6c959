"""The independent checker of the fidelity benchmark: standard library only, never imports
pvisor. It trusts the generator's manifest (generate.py) and what it reads from disk.

:func:`check_sample` returns the list of reasons a sample is invalid (empty: valid):

- the run exited 0 and printed one JSON result (``--result -``) with ``status: ok``,
  ``replayed_tool_calls == 0`` and ``agent_started is False``;
- source digest: ``source.sha256`` equals the manifest's sha256 of the file, and the file's
  sha256 is still that after the run;
- ``prefix.json`` parses; in the wire protocol the result names (``prefix.protocol``) the
  first batch is complete: every call of it with its id, and its exact arguments (the exact
  string for agents that store a string; for those that store an object, the object with keys
  in their order, or the compact JSON string of it for a string-argument protocol), and after
  them every result with its exact historical output; the prefix ends with those results
  (nothing after the observation O_1);
- the second action is excluded: no string of A2 or O2 (its call id, command, text, output
  or the command's unique tag) occurs in the prefix bytes (decoded), nor JSON-escaped;
- the workspace: the pre-existing file's bytes are unchanged and the inventory (relative
  path, mode, size, sha256 of every entry) equals the one taken before the run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def inventory(root: Path) -> list[tuple]:
    """(relative path, mode, size, sha256 of content or symlink target) of every entry, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            if os.path.islink(p):
                digest = hashlib.sha256(os.readlink(p).encode()).hexdigest()
            elif p.is_file():
                digest = sha256_file(p)
            else:
                digest = None
            out.append((str(p.relative_to(root)), st.st_mode, st.st_size if digest else 0, digest))
    return sorted(out)


def _calls_and_results(body: dict, protocol: str):
    """([(id, name, arguments as sent)], [(id, output value as sent)], kind of the last item)
    in prefix order, per wire protocol."""
    calls, results, last = [], [], None
    if protocol == "anthropic":
        for m in body.get("messages", []):
            content = m.get("content")
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            for b in blocks:
                t = b.get("type")
                if t == "tool_use":
                    calls.append((b.get("id"), b.get("name"), b.get("input")))
                    last = "call"
                elif t == "tool_result":
                    results.append((b.get("tool_use_id"), b.get("content")))
                    last = "result"
                else:
                    last = f"{m.get('role')}:{t}"
    elif protocol == "openai-chat":
        for m in body.get("messages", []):
            last = f"{m.get('role')}:message"
            for c in m.get("tool_calls") or []:
                f = c.get("function") or {}
                calls.append((c.get("id"), f.get("name"), f.get("arguments")))
                last = "call"
            if m.get("role") == "tool":
                results.append((m.get("tool_call_id"), m.get("content")))
                last = "result"
    elif protocol == "openai-responses":
        for it in body.get("input", []):
            t = it.get("type")
            if t == "function_call":
                calls.append((it.get("call_id"), it.get("name"), it.get("arguments")))
                last = "call"
            elif t == "function_call_output":
                results.append((it.get("call_id"), it.get("output")))
                last = "result"
            else:
                last = f"{it.get('role')}:{t}"
    elif protocol == "gemini":
        for c in body.get("contents", []):
            for p in c.get("parts", []):
                if "functionCall" in p:
                    fc = p["functionCall"]
                    calls.append((fc.get("id"), fc.get("name"), fc.get("args")))
                    last = "call"
                elif "functionResponse" in p:
                    fr = p["functionResponse"]
                    results.append((fr.get("id"), fr.get("response")))
                    last = "result"
                else:
                    last = f"{c.get('role')}:part"
    else:
        raise ValueError(protocol)
    return calls, results, last


def _args_ok(sent, want: dict) -> bool:
    if want["arguments_raw"] is not None:  # the file stores a string: kept exactly
        return sent == want["arguments_raw"]
    if isinstance(sent, str):  # an object sent as a string: its compact JSON, keys in their order
        return sent == json.dumps(want["arguments"], ensure_ascii=False, separators=(",", ":"))
    return isinstance(sent, dict) and list(sent.items()) == list(want["arguments"].items())


def _output_ok(sent, output: str, protocol: str) -> bool:
    if protocol == "gemini":
        return sent == {"output": output}
    if sent == output:
        return True
    # a content list of text blocks (Anthropic) whose texts are exactly the output
    return (
        isinstance(sent, list)
        and len(sent) == 1
        and isinstance(sent[0], dict)
        and sent[0].get("type") == "text"
        and sent[0].get("text") == output
    )


def check_sample(
    item: dict,
    code: int,
    stdout: bytes,
    out_dir: Path,
    workspace: Path,
    before: list,
    pre_file: Path,
    pre_bytes: bytes,
) -> list[str]:
    bad: list[str] = []
    # workspace first: it is checked whatever else happened
    if not pre_file.is_file() or pre_file.read_bytes() != pre_bytes:
        bad.append("pre-existing file changed")
    if inventory(workspace) != before:
        bad.append("workspace inventory changed")
    if sha256_file(item["file"]) != item["sha256"]:
        bad.append("source file changed")
    if code != 0:
        return bad + [f"exit {code}"]
    try:
        result = json.loads(stdout)
    except ValueError:
        return bad + ["stdout is not one JSON document"]
    if result.get("status") != "ok":
        bad.append(f"status {result.get('status')}")
    if (result.get("source") or {}).get("sha256") != item["sha256"]:
        bad.append("source digest differs")
    if result.get("replayed_tool_calls") != 0:
        bad.append("replayed_tool_calls != 0")
    if result.get("agent_started") is not False:
        bad.append("agent_started not false")
    prefix_path = out_dir / "prefix.json"
    try:
        raw = prefix_path.read_bytes()
        body = json.loads(raw)
    except (OSError, ValueError) as exc:
        return bad + [f"prefix.json: {exc}"]
    protocol = (result.get("prefix") or {}).get("protocol")
    try:
        calls, results, last = _calls_and_results(body, protocol)
    except (ValueError, AttributeError, TypeError) as exc:
        return bad + [f"prefix not read as {protocol}: {exc!r}"]
    want = item["batch1"]
    got_calls = {c[0]: c for c in calls}
    got_results = {r[0]: r for r in results}
    if [c[0] for c in calls] != [w["id"] for w in want]:
        bad.append(f"calls {[c[0] for c in calls]} != first batch")
    for w in want:
        c = got_calls.get(w["id"])
        if c is None or not _args_ok(c[2], w):
            bad.append(f"arguments of {w['id']} not exact")
        r = got_results.get(w["id"])
        if r is None or not _output_ok(r[1], w["output"], protocol):
            bad.append(f"observation of {w['id']} not exact")
    if [r[0] for r in results] != [w["id"] for w in want]:
        bad.append("results are not the first batch's, in call order")
    if last != "result":
        bad.append(f"prefix does not end with the observation (last: {last})")
    text = raw.decode("utf-8", "replace")
    for tok in item["step2_tokens"]:
        if tok in text or json.dumps(tok)[1:-1] in text or json.dumps(tok, ensure_ascii=False)[1:-1] in text:
            bad.append("second action leaked")
            break
    return bad
