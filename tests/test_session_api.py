"""The Python API's import paths: ``pvisor.session`` is where continuation's API lives; its old
path, ``pvisor.replay``, gives the same objects with a DeprecationWarning naming the new one; and
no module of the installed package imports a deprecated path."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import pvisor

API = ("continue_run", "continue_many", "Result")


@pytest.mark.parametrize("name", API)
def test_the_old_path_warns_naming_the_new_one_and_gives_the_same_object(name: str):
    session = importlib.import_module("pvisor.session")
    replay = importlib.import_module("pvisor.replay")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = getattr(session, name)
    assert caught == []  # the new path is quiet
    with pytest.warns(DeprecationWarning, match=rf"from pvisor\.session import {name}\b") as record:
        old = getattr(replay, name)
    assert old is new and new is getattr(importlib.import_module("pvisor.session.api"), name)
    # the warning points at the caller's line, not at pvisor's own shim
    assert [w.filename for w in record] == [__file__]


def test_a_from_import_of_the_old_path_warns_and_works():
    """`from pvisor.replay import continue_run` in a fresh interpreter: a DeprecationWarning
    naming the new path, at the importing line (Python's import looks the name up twice, so
    under "always" it is said twice, under the default filter once), and the function is the
    new path's."""
    code = (
        "import warnings\n"
        "warnings.simplefilter('error')\n"
        "from pvisor.session import continue_run as new\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    from pvisor.replay import continue_run\n"
        "assert continue_run is new\n"
        "assert {(x.category, x.filename, x.lineno) for x in w} == {(DeprecationWarning, '<string>', 6)}\n"
        "print(w[0].message)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("pvisor.replay.continue_run moved"), out
    assert "from pvisor.session import continue_run" in out


def test_importing_pvisor_session_imports_nothing_else():
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import pvisor.session\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith('pvisor')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['pvisor', 'pvisor._version', 'pvisor.session']", out


def _deprecated_uses(tree: ast.AST) -> list[str]:
    """Where ``tree`` reaches a deprecated path: ``from pvisor.replay import continue_run |
    continue_many | Result`` or an attribute ``pvisor.replay.continue_*`` / ``pvisor.replay.Result``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pvisor.replay" and node.level == 0:
            found += [
                f"line {node.lineno}: from pvisor.replay import {a.name}" for a in node.names if a.name in API
            ]
        elif isinstance(node, ast.Attribute) and node.attr in API:
            base = node.value
            if (
                isinstance(base, ast.Attribute)
                and base.attr == "replay"
                and getattr(base.value, "id", "") == "pvisor"
            ):
                found.append(f"line {node.lineno}: pvisor.replay.{node.attr}")
    return found


def test_the_deprecated_uses_finder_finds_both_spellings():
    tree = ast.parse(
        "from pvisor.replay import prepare_only, continue_run\nimport pvisor.replay\npvisor.replay.Result\n"
    )
    assert _deprecated_uses(tree) == [
        "line 1: from pvisor.replay import continue_run",
        "line 3: pvisor.replay.Result",
    ]


def test_no_module_of_pvisor_imports_a_deprecated_path():
    """Every module of the installed package (each folder under its own pvisor.* name) reaches
    continuation's API by its new path."""
    roots = {Path(pvisor.__file__).parent}
    for sub in ("journal", "adapters", "gateway", "replay", "session"):
        roots.add(Path(importlib.import_module(f"pvisor.{sub}").__file__).parent)
    files = sorted({f for root in roots for f in root.rglob("*.py")})
    assert len(files) > 50
    uses = {str(f): u for f in files if (u := _deprecated_uses(ast.parse(f.read_text())))}
    assert uses == {}
