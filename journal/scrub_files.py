"""Step 4 of a scrub (:mod:`pvisor.journal.scrub`), the run directories: each file holding the
text rewritten in place, each name holding it renamed, each symbolic link pointing at it
relinked (:func:`scrub_tree`), and the search of a directory for what still holds it
(:func:`found_in_tree`, used by ``--dry-run`` and by the check after)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from .scrub_pattern import Pattern
from .scrub_report import ScrubReport


def scrub_tree(root: Path, pattern: Pattern, report: ScrubReport) -> None:
    """Step 4: rewrite in place each regular file under ``root`` that holds the text, then
    rename each file and directory whose name holds it (deepest first, so that a renamed
    directory's own entries were handled under their old path). No symlink is followed; a file
    with more than one hard link is left (rewriting it in place would change the file it shares
    its blocks with, maybe outside the data directory), as is one that cannot be written: each
    goes into ``report.not_rewritten`` with why, and the journal's part stays done."""
    for dirpath, dirs, names in os.walk(root, topdown=False):
        for name in names:
            p = Path(dirpath, name)
            try:
                st = p.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                _relink(p, pattern, report)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            try:
                data = p.read_bytes()
            except OSError as exc:
                if pattern.found(os.fsencode(name)):
                    continue  # its name is handled below
                _left(report, p, f"cannot be read: {exc.strerror}")
                continue
            if not pattern.found(data):
                continue
            if st.st_nlink > 1:
                _left(
                    report,
                    p,
                    f"not rewritten: it has {st.st_nlink} hard links, and another may be outside the data "
                    "directory; remove the link and scrub again",
                )
                continue
            try:
                data.decode("utf-8")
                new, _ = pattern.sub(data)
            except UnicodeDecodeError:
                new, _ = pattern.mask(data)
            try:
                # in place: the same blocks are overwritten rather than a new file written beside
                with open(p, "r+b") as f:
                    f.write(new)
                    f.truncate()
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                _left(report, p, f"not rewritten: {exc.strerror}")
                continue
            report.files_changed.append(str(p))
        for name in dirs:
            if os.path.islink(os.path.join(dirpath, name)):  # a link to a directory: not walked into
                _relink(Path(dirpath, name), pattern, report)
        for name in [*names, *dirs]:
            raw = os.fsencode(name)
            if not pattern.found(raw):
                continue
            new_name = os.fsdecode(pattern.sub(raw)[0])
            old_p, new_p = Path(dirpath, name), Path(dirpath, new_name)
            if os.path.lexists(new_p):
                _left(report, old_p, "not renamed: the new name exists beside it")
                continue
            try:
                os.rename(old_p, new_p)
            except OSError as exc:
                _left(report, old_p, f"not renamed: {exc.strerror}")
                continue
            report.names_changed.append(str(new_p))


def _relink(link: Path, pattern: Pattern, report: ScrubReport) -> None:
    """A symbolic link whose target holds the text points to the target with the replacement
    (a new link renamed over it: a link cannot be rewritten in place)."""
    try:
        target = os.readlink(link)
    except OSError:
        return
    raw = os.fsencode(target)
    if not pattern.found(raw):
        return
    tmp = link.with_name(f".{link.name}.scrub-{os.getpid()}")
    try:
        os.symlink(os.fsdecode(pattern.sub(raw)[0]), tmp)
        os.replace(tmp, link)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _left(report, link, f"link not rewritten: {exc.strerror}")
        return
    report.names_changed.append(str(link))


def _left(report: ScrubReport, path: Path, why: str) -> None:
    report.not_rewritten.append({"path": str(path), "why": why})


def found_in_tree(root: Path, pattern: Pattern) -> list[tuple[str, str, str]]:
    """(path, note, where) of what under ``root`` holds the text: ``where`` is ``content`` (a
    regular file's bytes), ``name`` (a file's or directory's name) or ``target`` (a symbolic
    link's target; no link is followed); the note is empty or says that a file cannot be read."""
    out = []
    for dirpath, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            p = Path(dirpath, name)
            try:
                st = p.lstat()
                if pattern.found(os.fsencode(name)):
                    out.append((str(p), "", "name"))
                elif stat.S_ISLNK(st.st_mode):
                    if pattern.found(os.fsencode(os.readlink(p))):
                        out.append((str(p), "", "target"))
                elif stat.S_ISREG(st.st_mode) and pattern.found(p.read_bytes()):
                    out.append((str(p), "", "content"))
            except OSError as exc:
                out.append((str(p), f" (cannot be read: {exc.strerror})", "content"))
    return out
