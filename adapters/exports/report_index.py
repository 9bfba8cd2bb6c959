"""The index of a folder of run pages (``pvisor report --all``, docs/report.md "A folder of runs").

A self-contained HTML page, rendered here: a table of the runs of the folder, newest first, one
row each (the run's id linked to its page, agent, mode, creation time in UTC, steps, exchanges,
the outcome and the totals when the page's data gives them, the parent and the child runs,
linked when their pages are in the folder). It holds no script, its content security policy is
the run pages' one, and every text in it is escaped (run ids, labels and agent names are the
journal's, and the journal takes them from whoever ran the agent).

Also the names of the pages: :func:`page_name` (one run's), :func:`page_names` (the folder's) and
:func:`is_report_folder` (a folder an earlier ``--all`` wrote, recognised by its index).
"""

from __future__ import annotations

import hashlib
import html
import re
import time
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from pvisor.adapters.exports.shared import shared
from pvisor.journal.model import is_run_id

#: the index's file name in the folder
INDEX_NAME = "index.html"
#: the line of the index that says pvisor wrote the folder (:func:`is_report_folder` reads it)
GENERATOR = '<meta name="generator" content="pvisor report --all">'
#: the index's template, beside the run pages' (package data)
_TEMPLATE = Path(__file__).with_name("report_assets") / "index.html"
#: the template's slots, filled in one pass
_SLOT = re.compile(r"%(TITLE|GENERATOR|SUMMARY|ROWS)%")
#: bytes of an existing index.html read to find :data:`GENERATOR`
_HEAD_BYTES = 4096


def page_name(run_id: str) -> str:
    """The file name of ``run_id``'s page: ``RUN.html``, or ``run-<sha256 of the id, 16
    hex>.html`` for an id that is no run id pvisor makes (:func:`~pvisor.journal.model.is_run_id`:
    an older or foreign journal's, a path such as ``../x``, one holding a key)."""
    if is_run_id(run_id):
        return f"{run_id}.html"
    return _hashed(run_id)


def _hashed(run_id: str) -> str:
    return f"run-{hashlib.sha256(run_id.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}.html"


def page_names(run_ids: Iterable[str]) -> dict[str, str]:
    """The file name of each run's page in the folder, by run id: ``RUN.html``; for an id that
    is no run id pvisor makes (:func:`~pvisor.journal.model.is_run_id`: an older or foreign
    journal), for ``index`` (the index's own name) and for an id whose name another one's
    takes on a file system that ignores case, ``run-<sha256 of the id, 16 hex>.html``."""
    names: dict[str, str] = {}
    taken = {INDEX_NAME}
    for run_id in run_ids:
        name = page_name(run_id)
        if name.casefold() in taken:
            name = _hashed(run_id)
        taken.add(name.casefold())
        names[run_id] = name
    return names


def is_report_folder(directory: Path) -> bool:
    """True when ``directory`` holds an ``index.html`` that ``pvisor report --all`` wrote (its
    :data:`GENERATOR` line in its first bytes): a folder whose pages a new ``--all`` may write
    over. A link or anything but a regular file is not one."""
    index = directory / INDEX_NAME
    if index.is_symlink() or not index.is_file():
        return False
    try:
        with index.open("rb") as f:
            return GENERATOR.encode() in f.read(_HEAD_BYTES)
    except OSError:
        return False


def index_row(
    doc: dict[str, Any], href: str, parent_href: str | None, child_hrefs: dict[str, str]
) -> dict[str, Any]:
    """The index's row of a run page's data (:func:`~pvisor.adapters.exports.report_document.
    run_document`): ``{id, href, agent, mode, created_ms, steps, exchanges, outcome, totals,
    exit_code, parent, parent_href, children: [{id, href|None}]}``; ``outcome`` and ``totals``
    are the document's (None when it has none), ``exit_code`` the last attempt's."""
    run = doc["run"]
    attempts = doc.get("attempts") or []
    return {
        "id": run["id"],
        "href": href,
        "agent": run.get("agent"),
        "mode": run.get("mode"),
        "created_ms": run.get("created_ms"),
        "steps": run.get("steps"),
        "exchanges": len(doc.get("exchanges") or []),
        "outcome": doc.get("outcome"),
        "totals": doc.get("totals"),
        "exit_code": attempts[-1].get("exit_code") if attempts else None,
        "parent": run.get("parent_run"),
        "parent_href": parent_href,
        "children": [{"id": c["id"], "href": child_hrefs.get(c["id"])} for c in doc.get("children") or []],
    }


@cache
def _template() -> str:
    return _TEMPLATE.read_text(encoding="utf-8")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _utc(ms: Any) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def _link(run_id: str, href: str | None) -> str:
    """A run id linked to its page, or named only (its page is not in the folder); isolated
    (``<bdi>``): a right-to-left override in one id turns that id only, not the next one named
    in the same cell."""
    if href:
        return f'<a href="{_e(href)}"><bdi>{_e(run_id)}</bdi></a>'
    return f'<span class="out" title="not in this folder"><bdi>{_e(run_id)}</bdi></span>'


def _outcome(row: dict[str, Any]) -> str:
    outcome = row["outcome"] or {}
    verdict = outcome.get("verdict")
    code = outcome.get("exit_code", row["exit_code"])
    parts = []
    if verdict:
        parts.append(f'<span class="v-{_e(verdict)}">{_e(verdict)}</span>')
    if code is not None:
        parts.append(f"exit {_e(code)}")
    return " · ".join(parts) or "-"


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "-"


def _totals(row: dict[str, Any]) -> tuple[str, str, str]:
    """(tokens in/out, tool calls and failed ones, wall time) of a row, ``-`` where not given."""
    t = row["totals"] or {}
    tokens = "-"
    if t.get("tokens_in") is not None or t.get("tokens_out") is not None:
        tokens = f"{_count(t.get('tokens_in'))} / {_count(t.get('tokens_out'))}"
    calls = _count(t.get("tool_calls"))
    if t.get("failed_calls"):
        calls += f' <span class="bad">({_count(t["failed_calls"])} failed)</span>'
    wall = t.get("wall_ms")
    return tokens, calls, f"{wall / 1000:,.1f} s" if isinstance(wall, (int, float)) else "-"


def _row_html(row: dict[str, Any]) -> str:
    tokens, calls, wall = _totals(row)
    parent = _link(row["parent"], row["parent_href"]) if row["parent"] else "-"
    children = ", ".join(_link(c["id"], c["href"]) for c in row["children"]) or "-"
    cells = [
        f'<td class="id" title="{_e(row["id"])}">{_link(row["id"], row["href"])}</td>',
        f"<td>{_e(row['agent'] or '-')}</td>",
        f"<td>{_e(row['mode'] or '-')}</td>",
        f'<td class="when">{_e(_utc(row["created_ms"]))}</td>',
        f'<td class="n">{_e(_count(row["steps"]))}</td>',
        f'<td class="n">{_e(_count(row["exchanges"]))}</td>',
        f'<td class="outcome">{_outcome(row)}</td>',
        f'<td class="n">{_e(tokens)}</td>',
        f'<td class="n">{calls}</td>',
        f'<td class="n">{_e(wall)}</td>',
        f'<td class="parent">{parent}</td>',
        f'<td class="children">{children}</td>',
    ]
    return f'<tr data-run="{_e(row["id"])}">{"".join(cells)}</tr>'


def render_index(rows: list[dict[str, Any]], selection: str) -> str:
    """The index page of ``rows`` (:func:`index_row`'s, in the order shown: newest first);
    ``selection`` says which runs of the journal these are (``the 3 newest of 5 runs``). Every
    row passes through :func:`~pvisor.adapters.exports.shared.shared` (a key in a label or an
    id is redacted as on the run pages) and every text is escaped."""
    rows = shared(rows)
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    slots = {
        "TITLE": _e(f"pvisor · {len(rows)} runs"),
        "GENERATOR": GENERATOR,
        "SUMMARY": _e(f"{selection} · written {generated}"),
        "ROWS": "\n".join(_row_html(r) for r in rows),
    }
    return _SLOT.sub(lambda m: slots[m.group(1)], _template())
