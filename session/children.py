"""The child run of a handoff, started by ``pvisor run --child-run ID`` or a replay's
``child_run=``: ``TrajectoryReplay.restore_handoff`` created it pending (docs/snapshots.md); a
start checks it (:func:`child_target`), takes it in one journal transaction
(:func:`claim_child`; of starts made at once exactly one gets it), gives it back when the start
fails before the agent ran (:func:`release_child`), and warns when the workspace it starts from
is not the one the handoff restored (:func:`workspace_manifest_digest`,
:func:`check_child_workspace`). Errors are UsageError (exit 2) naming the option as its caller
wrote it (:func:`child_named`)."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any, Callable

from pvisor.core.errors import PvisorError, UsageError, shown
from pvisor.journal.child_runs import Claim, claim_child_run, release_child_run
from pvisor.journal.model import RUN_ID_PATTERN, Run, RunMode
from pvisor.journal.reader import JournalReader
from pvisor.journal.snapshots import FilesystemDriver

#: ``warn(line)``: one warning line for the user
Warn = Callable[[str], None]


def child_named(option: str, child: str) -> str:
    """``--child-run ID`` or ``child_run='ID'``: the option as its caller wrote it, a long id
    shortened (:func:`~pvisor.core.errors.shown`)."""
    return f"{option}{shown(repr(child))}" if option.endswith("=") else f"{option} {shown(child)}"


def child_target(
    journal_path: Path, child: str, option: str = "--child-run", *, claimed: bool = False
) -> Run:
    """The pending child run ``child`` of a handoff, to be started now. UsageError (exit 2),
    naming ``option``, when the journal or the run is missing, the run is no handoff's child, its
    restore has not finished, or it was started already (a child run starts once). Only reads:
    :func:`claim_child` takes it; ``claimed``: this process took it already (its claim is the
    attempt the run now has)."""
    path = Path(journal_path)
    named = child_named(option, child)
    if not child or not child.strip():
        raise UsageError(
            f"{option} is empty: give the id of the handoff's child run (pvisor journal ls lists it)"
        )
    if not re.fullmatch(RUN_ID_PATTERN, child):
        raise UsageError(
            f"{named}: not a run id (letters, digits, '.', '_' and '-', at most 128, starting with a letter "
            "or digit): give the id of the handoff's child run (pvisor journal ls lists it)"
        )
    if not path.exists():
        raise UsageError(f"{named}: journal {path} does not exist")
    with JournalReader(path) as r:
        if not r.run_exists(child):
            raise UsageError(
                f"{named}: no run {child} in journal {path}; a handoff's child run is created by "
                "TrajectoryReplay.restore_handoff (docs/snapshots.md)"
            )
        run = r.run(child)
        status = r.run_status(run)
        attempts = r.attempts(run.id)
    if run.mode != RunMode.HANDOFF.value:
        raise UsageError(
            f"{named}: run {child} is a {run.mode} run, not a handoff's child run (created pending by "
            "TrajectoryReplay.restore_handoff)"
        )
    if claimed:
        return run
    if status == "restoring":
        raise UsageError(
            f"{named}: the handoff's child run {child} is still being restored (its restore_handoff has not "
            f"finished; one that died leaves it so: pvisor journal rm {child}, and hand the pause off again)"
        )
    if status != "pending":
        what = (
            f"attempt {len(attempts)} began {_when(attempts[-1].started_ms)}"
            if attempts
            else "it has exchanges"
        )
        raise UsageError(
            f"{named}: the handoff's child run {child} was started already ({what}): a child run "
            "starts once; hand the pause off again under a new child id"
        )
    return run


def claim_child(journal_path: Path, child: str, option: str = "--child-run") -> int:
    """Take the pending child run ``child`` for this start, in one transaction of the journal
    (:func:`~pvisor.journal.child_runs.claim_child_run`), before the agent starts: of starts made
    at once exactly one gets it; the others raise the UsageError (exit 2) of
    :func:`child_target` for a child run started already. Returns when it was claimed (Unix
    epoch ms: its attempt 1's start)."""
    when = int(time.time() * 1000)
    outcome = claim_child_run(journal_path, child, when)
    if outcome is Claim.CLAIMED:
        return when
    child_target(journal_path, child, option)  # says why, as for a start made later
    raise UsageError(  # the winner released it meanwhile: still, this start did not get it
        f"{child_named(option, child)}: another start took the handoff's child run {child}: a child run "
        "starts once"
    )


def _when(ms: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def workspace_manifest_digest(workspace: Path, start: Any = None) -> str | None:
    """The manifest digest of ``workspace`` as a snapshot of it would have (the ``start``
    snapshot's when one was taken; else a walk that stores nothing), or None when it cannot be
    read."""
    if start is not None and getattr(start, "digest", None):
        return start.digest
    try:
        return FilesystemDriver().checkpoint(workspace, lambda b: hashlib.sha256(b).hexdigest()).digest()
    except (OSError, UsageError):
        return None


def check_child_workspace(child: Run, digest: str | None, where: str, warn: Warn) -> bool:
    """Warn (one line) when ``digest``, the manifest digest of the workspace the child run starts
    from (``where``), differs from the snapshot its handoff restored; True when they agree."""
    want = child.workspace_snapshot
    if not want or digest == want:
        return True
    warn(
        f"{where} differs from the snapshot the handoff restored for child run {child.id} (manifest "
        f"{want[:12]}, {'now ' + digest[:12] if digest else 'unreadable'}): the agent starts from another "
        "state"
    )
    return False


def release_child(journal_path: Path, child: str) -> None:
    """Give the claim of the child run ``child`` back when its start failed before the agent ran
    (the attempt was not recorded), so that it can be started later; a journal locked past the
    busy timeout keeps the claim (``journal ls`` then shows the run open)."""
    try:
        release_child_run(journal_path, child)
    except PvisorError:
        pass
