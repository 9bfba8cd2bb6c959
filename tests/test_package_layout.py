"""The installed package: namespaced import names, layer direction, lazy CLI."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pvisor

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("bare", ["adapters", "journal", "gateway", "replay", "session"])
def test_no_bare_top_level_module_is_importable(bare: str):
    # the repository root is not on sys.path (pytest runs with PYTHONSAFEPATH=1 from the
    # installed package), so only the pvisor.* names exist
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(bare)
    importlib.import_module(f"pvisor.{bare}")


def test_tests_run_against_the_installed_package_not_the_checkout():
    assert str(REPO) not in [os.path.abspath(p or ".") for p in sys.path]


def test_layers_hold(tmp_path: Path):
    """cli -> session -> replay -> gateway -> adapters -> journal, checked by import-linter on the
    installed package; and journal imports nothing of ours."""
    # run outside the checkout: import-linter puts the working directory on sys.path, where
    # the checkout's pvisor/ would shadow the installed package
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable))
    assert lint, "import-linter is part of the test extra"
    proc = subprocess.run(
        [lint, str(REPO / "pyproject.toml"), "--no-cache", "--no-logo"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout


def test_every_module_is_in_a_layer():
    """Each module of the installed package belongs to a layer of the import-linter contract,
    so that the direction of every import is checked."""
    import pkgutil
    import re

    text = (REPO / "pyproject.toml").read_text()
    block = text[text.index("layers = [") :]
    block = block[: block.index("]")]
    roots = {name.strip() for entry in re.findall(r'"([^"]+)"', block) for name in entry.split("|")}
    assert roots
    modules = [m.name for m in pkgutil.walk_packages(pvisor.__path__, "pvisor.")]
    outside = [m for m in modules if not any(m == r or m.startswith(r + ".") for r in roots)]
    assert outside == [], f"modules in no layer: {outside}"


def _imports_of(package_dir: Path) -> set[str]:
    import ast

    found: set[str] = set()
    for f in package_dir.rglob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
    return found


def test_core_imports_nothing_of_ours_journal_only_core_adapters_only_below():
    root = Path(pvisor.__file__).parent
    core_dir = Path(importlib.import_module("pvisor.core").__file__).parent
    journal_dir = Path(importlib.import_module("pvisor.journal").__file__).parent
    adapters_dir = Path(importlib.import_module("pvisor.adapters").__file__).parent

    def ours(names: set[str]) -> set[str]:
        return {n for n in names if n == "pvisor" or n.startswith("pvisor.")}

    assert {n for n in ours(_imports_of(core_dir)) if not n.startswith("pvisor.core")} == set()
    journal_out = {n for n in ours(_imports_of(journal_dir)) if not n.startswith("pvisor.core")}
    assert journal_out == set()
    outside = {n for n in ours(_imports_of(adapters_dir)) if not n.startswith("pvisor.adapters")}
    assert all(n.startswith(("pvisor.journal", "pvisor.core")) for n in outside), outside
    # nothing imports the CLI
    for sub in (
        "pvisor.core",
        "pvisor.journal",
        "pvisor.adapters",
        "pvisor.gateway",
        "pvisor.replay",
        "pvisor.session",
    ):
        d = Path(importlib.import_module(sub).__file__).parent
        assert not {n for n in _imports_of(d) if n.startswith(("pvisor.cli", "pvisor.commands"))}, sub
    assert root.name == "pvisor"


def test_installed_non_editable_in_ci():
    # CI installs the wheel; a developer's editable install maps to the checkout instead
    if os.environ.get("CI"):
        assert Path(pvisor.__file__).resolve().parent != REPO / "pvisor", pvisor.__file__
        assert Path(importlib.import_module("pvisor.journal").__file__).resolve().parent != REPO / "journal"


def _from_imports(path: Path, module: str) -> list[tuple[int, str, list[str]]]:
    """``(line, target module, names)`` of each ``from pvisor... import`` in a file, relative
    ones made absolute, those inside functions included."""
    import ast

    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        target = node.module or ""
        if node.level:
            parts = package.split(".")
            target = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        if target == "pvisor" or target.startswith("pvisor."):
            found.append((node.lineno, target, [a.name for a in node.names]))
    return found


def test_every_import_of_a_pvisor_name_resolves():
    """After a move of modules, an import left pointing at the old place fails only when its
    path runs (a fifth of the imports sit inside functions): every ``from pvisor.X import Y`` of
    the installed package, the tests and bench/ names a module that has Y."""
    import pkgutil
    import warnings

    files = []
    for m in pkgutil.walk_packages(pvisor.__path__, "pvisor."):
        if m.name.endswith("__main__") or m.name.endswith("intercept_addon"):
            continue  # __main__ runs the CLI; the addon imports mitmproxy (its own venv)
        files.append((Path(importlib.util.find_spec(m.name).origin), m.name))
    for folder in ("tests", "bench"):
        files += [(p, p.stem) for p in sorted((REPO / folder).rglob("*.py")) if ".venv" not in str(p)]
    unresolved = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for path, module in files:
            for line, target, names in _from_imports(path, module):
                if target.endswith("__main__"):
                    continue
                mod = importlib.import_module(target)
                for name in names:
                    if name == "*" or hasattr(mod, name):
                        continue
                    try:
                        importlib.import_module(f"{target}.{name}")
                    except ModuleNotFoundError:
                        unresolved.append(f"{path}:{line}: {target}.{name}")
    assert unresolved == []


def test_docs_layout_names_what_exists():
    """docs/layout.md's floors are the import-linter layers' packages, and every file it names
    exists (the document is the map a contributor adds an agent or a format by)."""
    import re

    text = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py)`", text))
    assert named, "docs/layout.md names no file"
    missing = sorted(p for p in named if not (REPO / p).exists() and "NAME" not in p)
    assert missing == []
    floors = set(re.findall(r"^\| `(pvisor(?:\.[a-z]+)?)` \|", text, re.M))
    packages = set(re.findall(r'^"(pvisor(?:\.[a-z]+)?)" = "', (REPO / "pyproject.toml").read_text(), re.M))
    assert floors == packages
