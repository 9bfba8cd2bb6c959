"""``pvisor report``: one run of the journal as a self-contained HTML page (docs/report.md).

The page holds everything it shows: its CSS, its script and the run's data (a JSON document in
a ``<script type="application/json">``); it loads nothing from the network. What it shows:

- the run (agent, mode, task, labels, attempts) and, for a derived run, its parent (a link to
  the parent's page, written beside it) and its boundary step; for a handoff's child, its
  lineage (:func:`pvisor.journal.model.run_lineage`: the parent or the native file, the pause
  with both numbers, the pause's snapshot, the from and to agents);
- the runs derived or handed off from it (its child runs: id, mode, agent, pause), each linked
  to its page when that page was written beside;
- the timeline of every exchange in arrival order: each main-loop one as its step (the action's
  text, its tool calls, the observation that came back, flags, retries, timings, token usage
  where the protocol reports it), the auxiliary ones greyed with the chain rule's reason;
- each exchange expandable to its request and response bodies (the reassembled reply of a
  stream), cut to ``body_limit`` bytes (the head and the tail; ``pvisor journal body`` has the
  rest), secrets already removed as the journal removes them;
- for a derived run, per step up to the boundary, the parent's observation O against the
  replay's O' for each tool call, equal or with their line diff.

The page's template, style and script are files in ``report_assets/`` (package data); its
data is :func:`pvisor.adapters.exports.report_document.run_document`'s. The script renders the
timeline in slices as the reader scrolls, so a run of thousands of steps
opens at once (bench/report_bench.py measures it).

The export format ``report`` (:data:`FORMAT`, :mod:`pvisor.adapters.exports`): files of one
journal run, the page at the path given and the parent's beside it; ``pvisor report`` writes it.
:func:`write_folder` writes the pages of many runs into one folder with their index
(:mod:`pvisor.adapters.exports.report_index`; ``pvisor report --all``), each page linked to its
parent, its child runs and the index.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from pvisor.adapters.exports.base import (
    ExportFormat,
    JournalSource,
    Option,
    Output,
    Settings,
    Source,
    Written,
)
from pvisor.adapters.exports.report_document import DEFAULT_BODY_LIMIT, run_document
from pvisor.adapters.exports.report_index import INDEX_NAME, index_row, page_names, render_index
from pvisor.adapters.exports.shared import shared
from pvisor.core.errors import PvisorError
from pvisor.core.outfile import replacing
from pvisor.journal.reader import JournalReader

#: the page's template, style and script, shipped beside this module (package data)
ASSETS = Path(__file__).with_name("report_assets")
#: the template's slots, filled in one pass (a run's data may hold a slot's name)
_SLOT = re.compile(r"%(TITLE|STYLE|SCRIPT|DATA)%")


@cache
def _assets() -> tuple[str, str, str]:
    """The page's template, CSS and script (read once per process)."""
    return tuple(  # type: ignore[return-value]
        (ASSETS / name).read_text(encoding="utf-8") for name in ("page.html", "page.css", "page.js")
    )


def render(
    doc: dict[str, Any],
    parent_href: str | None = None,
    child_hrefs: dict[str, str] | None = None,
    index_href: str | None = None,
) -> str:
    """The HTML page of a :func:`run_document` (``parent_href``: the parent's page, relative;
    ``child_hrefs``: the pages of child runs written beside it, by run id; ``index_href``: the
    folder's index, for a page ``pvisor report --all`` wrote, else None)."""
    links = {"parent_href": parent_href, "child_hrefs": child_hrefs or {}, "index_href": index_href}
    # every "<" as \u003c: a "</script" would end the data's element, and a "<!--<script" in
    # any text (a step's, a file's) would make the HTML parser read past its end and swallow
    # the page's script (a blank page); JSON has no "<" outside its strings
    data = orjson.dumps(shared({**doc, **links})).replace(b"<", b"\\u003c").decode()
    run = doc["run"]
    title = html.escape(f"pvisor · {run['id']} · {run['agent'] or 'run'}")
    template, style, script = _assets()
    slots = {"TITLE": title, "STYLE": style, "SCRIPT": script, "DATA": data}
    return _SLOT.sub(lambda m: slots[m.group(1)], template)


def write_report(
    reader: JournalReader,
    run_id: str,
    output: Path,
    body_limit: int = DEFAULT_BODY_LIMIT,
    with_parent: bool = True,
    workspace: bool = True,
) -> list[Path]:
    """Write the page of ``run_id`` to ``output`` and, for a derived run whose parent is in the
    journal, the parent's page beside it (``<parent>.html``, linked from the first); ``workspace``
    False leaves every page's files changed per step out (``--no-workspace``). Returns the
    files written. Raises UsageError for an unknown run; OSError as the file system gives it."""
    parsed: dict[str, Any] = {}
    doc = run_document(reader, run_id, body_limit, parsed, workspace=workspace)
    written = []
    parent = doc["run"]["parent_run"]
    href = None
    if parent and with_parent:
        try:
            parent_doc = run_document(reader, parent, body_limit, parsed, workspace=workspace)
        except PvisorError:  # a parent that is not in this journal: no link
            parent_doc = None
        if parent_doc is not None:
            target = output.with_name(f"{parent_doc['run']['id']}.html")
            if target != output:
                # the parent's list of its children links back to the page written here
                _write(target, render(parent_doc, child_hrefs={doc["run"]["id"]: output.name}))
                written.append(target)
                href = target.name
    _write(output, render(doc, href))
    return [output, *written]


def write_folder(
    reader: JournalReader,
    run_ids: list[str],
    directory: Path,
    body_limit: int = DEFAULT_BODY_LIMIT,
    selection: str = "",
    workspace: bool = True,
) -> list[Path]:
    """Write the page of each run of ``run_ids`` (whole ids, in the index's order: newest first)
    into ``directory`` (which exists) as :func:`report_index.page_names` names it, then the index
    (``index.html``); returns the files written, the index last. Each page links its parent and
    its child runs whose pages are in the folder, and the index; a parent or child outside
    ``run_ids`` is named on the page, not linked, and not written. Each run is read once: pages
    are written oldest first, and a run's reading is kept until the last of its children that
    compares against it is written. ``selection``: the index's line saying which runs these are;
    ``workspace`` False leaves the files changed per step out (``--no-workspace``).
    Raises OSError (``filename`` the page) as the file system gives it."""
    names = page_names(run_ids)
    selected = set(run_ids)
    runs = {r.id: r for r in reader.runs()}
    children: dict[str, list[str]] = {}
    for r in runs.values():
        if r.parent_run in selected and r.id in selected:
            children.setdefault(r.parent_run, []).append(r.id)
    # the selected runs still to be written that read each run (itself, or its parent)
    readers = Counter(p for i in run_ids for p in (i, runs[i].parent_run) if p)
    parsed: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    written = []
    for run_id in reversed(run_ids):  # oldest first: a parent's reading is kept for its children
        parent = runs[run_id].parent_run
        parent_href = names[parent] if parent in selected else None
        child_hrefs = {c: names[c] for c in children.get(run_id, [])}
        doc = run_document(reader, run_id, body_limit, parsed, workspace=workspace)
        path = directory / names[run_id]
        _write_named(path, render(doc, parent_href, child_hrefs, INDEX_NAME))
        written.append(path)
        rows[run_id] = index_row(doc, names[run_id], parent_href, child_hrefs)
        for read in (run_id, parent):
            if read:
                readers[read] -= 1
                if readers[read] <= 0:
                    parsed.pop(read, None)
    index = directory / INDEX_NAME
    _write_named(index, render_index([rows[i] for i in run_ids], selection))
    return [*written, index]


def _write_named(path: Path, text: str) -> None:
    """:func:`_write`, an OSError naming ``path`` (not the temporary file beside it)."""
    try:
        _write(path, text)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None


def _write(path: Path, text: str) -> None:
    """``text`` into ``path``: a file beside it renamed over it when whole, a device or a FIFO in
    place (core/outfile.py)."""
    with replacing(str(path)) as out:
        out.write(text.encode("utf-8"))


def write(source: JournalSource, output: Path, settings: Settings) -> Written:
    """:func:`write_report` of ``source``'s run to ``output`` (``settings.body_limit``, default
    :data:`DEFAULT_BODY_LIMIT`; the parent's page unless ``settings.with_parent`` is False; no
    files changed per step when ``settings.workspace`` is False); counts the pages, the files
    written in :attr:`Written.paths`."""
    limit = DEFAULT_BODY_LIMIT if settings.body_limit is None else settings.body_limit
    written = write_report(
        source.reader,
        source.run_id,
        output,
        limit,
        with_parent=settings.with_parent,
        workspace=settings.workspace,
    )
    return Written(len(written), tuple(written))


FORMAT = ExportFormat(
    name="report",
    describe={Source.RUN: "one self-contained HTML page of RUN (and its parent run's page beside it)"},
    write=write,
    unit="pages",
    extension="html",
    reads=frozenset({Option.BODY_LIMIT, Option.NO_PARENT, Option.NO_WORKSPACE}),
    output=Output.FILES,
)
