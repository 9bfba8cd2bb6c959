"""The build's one step beyond pyproject.toml: the source commit goes into the package.

setuptools reads everything else from pyproject.toml. This hook writes ``pvisor/_build.py``
(``COMMIT = "<40 hex>[-dirty]"`` or ``None``) into the build, so that an installed pvisor names
the commit it was built from (``pvisor --version``; docs/install.md). The commit is, in order:
``$PVISOR_SOURCE_COMMIT``; the checkout's ``HEAD`` when this file is the top of a git work tree
(``-dirty`` appended when tracked files had changes, as scripts/build-bundle does); else None
(a build from an unpacked source archive). A ``$PVISOR_SOURCE_COMMIT`` that is not 7 to 40 hex
digits with an optional ``-dirty`` fails the build with one line (``pvisor --version`` prints it
as given, and a newline in it made two lines).
"""

import os
import re
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
#: what ``$PVISOR_SOURCE_COMMIT`` may hold: an abbreviated or full commit id, ``-dirty`` optional
COMMIT_ID = re.compile(r"[0-9a-f]{7,40}(?:-dirty)?")


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_commit() -> str | None:
    given = os.environ.get("PVISOR_SOURCE_COMMIT", "").strip()
    if given:
        if COMMIT_ID.fullmatch(given) is None:
            raise SystemExit(
                f"error: PVISOR_SOURCE_COMMIT={given!r} is not a commit id: give 7 to 40 lowercase hex "
                "digits, -dirty optional (git rev-parse HEAD), or unset it to read the checkout's HEAD"
            )
        return given
    # only this checkout's own repository: an unpacked archive inside another work tree is not it
    top = _git("rev-parse", "--show-toplevel")
    if top is None or os.path.realpath(top) != os.path.realpath(ROOT):
        return None
    head = _git("rev-parse", "HEAD")
    if head is None:
        return None
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}-dirty" if changed else head


class BuildPyWithCommit(build_py):
    def run(self) -> None:
        commit = source_commit()  # a bad $PVISOR_SOURCE_COMMIT fails before anything is built
        super().run()
        target = os.path.join(self.build_lib, "pvisor", "_build.py")
        with open(target, "w", encoding="utf-8") as f:
            f.write(
                '"""Written by setup.py when this package was built: the source commit."""\n\n'
                f"COMMIT = {commit!r}\n"
            )


setup(cmdclass={"build_py": BuildPyWithCommit})
