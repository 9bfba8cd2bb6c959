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
"""

from __future__ import annotations

import html
import re
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
    doc: dict[str, Any], parent_href: str | None = None, child_hrefs: dict[str, str] | None = None
) -> str:
    """The HTML page of a :func:`run_document` (``parent_href``: the parent's page, relative;
    ``child_hrefs``: the pages of child runs written beside it, by run id)."""
    data = (
        orjson.dumps(shared({**doc, "parent_href": parent_href, "child_hrefs": child_hrefs or {}}))
        .replace(b"</", b"<\\/")
        .decode()
    )
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
