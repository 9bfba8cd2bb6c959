"""The house's shape as figures: sizes, long functions, private names imported across modules.

Run from a checkout (reads the source folders, imports nothing of pvisor)::

    python3 bench/house_figures.py            # a table on stdout
    python3 bench/house_figures.py --json     # the same figures as one JSON object

Figures (lines are physical lines of ``.py`` files, tests and bench excluded):

- ``package_lines`` and ``lines_by_folder``: each top-level source folder (``pvisor/`` is the CLI
  folder, installed as ``pvisor``; the others install as ``pvisor.<folder>``);
- ``modules_over_1000``: modules over 1,000 lines, with their line counts;
- ``functions_over_100``: functions and methods over 100 lines (``end_lineno - lineno + 1``);
- ``private_imports_across``: ``from pvisor.X import _name`` where ``pvisor.X`` is another module
  (a module's own package ``__init__`` counts as another module);
- ``private_attributes_across``: ``y._name`` where ``y`` is another pvisor module imported as a
  name (``from pvisor.x import y``, ``from . import y``, ``import pvisor.x.y as y``, or
  ``pvisor.x.y._name`` after ``import pvisor.x.y``), each use once per module and name;
- ``imports_in_functions``: the share of ``import`` statements of pvisor's modules that sit inside a
  function body (a start-up trick: deferred imports);
- ``module_getattr``: modules defining ``__getattr__`` (lazy attribute loading).

The folders are read from ``pyproject.toml``'s ``package-dir`` table, so a new layer is counted
without a change here.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def folders() -> dict[str, Path]:
    """``{"pvisor.journal": ROOT/"journal", ...}`` from pyproject.toml's ``package-dir``."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = dict(re.findall(r'"(pvisor(?:\.\w+)?)"\s*=\s*"([\w/]+)"', text))
    return {pkg: ROOT / folder for pkg, folder in found.items()}


def module_name(pkg: str, base: Path, path: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([pkg, *parts])


def absolute_target(node: ast.ImportFrom, package: str) -> str:
    """The module ``node`` imports from, a relative one (``from . import x``) made absolute."""
    target = node.module or ""
    if node.level:
        base_parts = package.split(".")
        base_parts = base_parts[: len(base_parts) - node.level + 1]
        target = ".".join([*base_parts, *([node.module] if node.module else [])])
    return target


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for an attribute chain of names, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def private_attribute_uses(tree: ast.Module, name: str, package: str, modules: dict) -> list[str]:
    """``name <- pvisor.x.y._z (attribute)`` for each ``y._z`` in ``tree`` where ``y`` is another
    module of pvisor (one of ``modules``) bound to a name by an import; ``import pvisor.x.y``
    binds ``pvisor.x.y`` itself."""
    bound: dict[str, str] = {}  # the name in this module -> the pvisor module it is
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = absolute_target(node, package)
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if full in modules:
                    bound[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    bound[alias.asname or alias.name] = alias.name
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
            continue
        if node.attr.startswith("__"):
            continue
        base = dotted(node.value)
        target = bound.get(base or "")
        if target is not None and target != name:
            found.append(f"{name} <- {target}.{node.attr} (attribute)")
    return found


def figures() -> dict:
    roots = folders()
    files: dict[str, Path] = {}
    for pkg, base in roots.items():
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).parts
            if pkg == "pvisor" and rel[0] in {r.name for r in roots.values() if r != base}:
                continue
            if any(p.startswith(".") or p == "__pycache__" for p in rel):
                continue
            files[module_name(pkg, base, path)] = path
    lines_by_folder: dict[str, int] = {}
    over_1000: list[tuple[str, int]] = []
    over_100: list[tuple[str, int]] = []
    private: list[str] = []
    private_attributes: list[str] = []
    in_functions = 0
    imports = 0
    getattr_modules: list[str] = []
    for name, path in files.items():
        source = path.read_text(encoding="utf-8")
        n = source.count("\n") + (0 if source.endswith("\n") or not source else 1)
        folder = (
            name.split(".")[1]
            if name.count(".") and name.split(".")[1] in {p.split(".")[-1] for p in roots if p != "pvisor"}
            else "pvisor"
        )
        lines_by_folder[folder] = lines_by_folder.get(folder, 0) + n
        if n > 1000:
            over_1000.append((name, n))
        tree = ast.parse(source, str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        private_attributes += private_attribute_uses(tree, name, package, files)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 100:
                    over_100.append((f"{name}:{node.name}", length))
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)) and inner is not node:
                        in_functions += 1
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports += 1
            if isinstance(node, ast.ImportFrom):
                target = absolute_target(node, package)
                if not target.startswith("pvisor"):
                    continue
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__") and target != name:
                        private.append(f"{name} <- {target}.{alias.name}")
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and node in tree.body:
                getattr_modules.append(name)
    return {
        "modules": len(files),
        "package_lines": sum(lines_by_folder.values()),
        "lines_by_folder": dict(sorted(lines_by_folder.items())),
        "modules_over_1000": sorted(over_1000, key=lambda x: -x[1]),
        "functions_over_100": sorted(over_100, key=lambda x: -x[1]),
        "private_imports_across": sorted(set(private)),
        "private_attributes_across": sorted(set(private_attributes)),
        "imports_in_functions": round(in_functions / imports, 3) if imports else 0.0,
        "module_getattr": sorted(getattr_modules),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = parser.parse_args(argv)
    got = figures()
    if args.json:
        json.dump(got, sys.stdout, indent=1)
        print()
        return 0
    print(f"modules {got['modules']}, package lines {got['package_lines']:,}")
    for folder, n in got["lines_by_folder"].items():
        print(f"  {folder:<10} {n:>7,}")
    print(f"modules over 1,000 lines: {len(got['modules_over_1000'])}")
    for name, n in got["modules_over_1000"]:
        print(f"  {name:<50} {n:>6,}")
    print(f"functions over 100 lines: {len(got['functions_over_100'])}")
    for name, n in got["functions_over_100"]:
        print(f"  {name:<70} {n:>5}")
    print(f"private names imported across modules: {len(got['private_imports_across'])}")
    for line in got["private_imports_across"]:
        print(f"  {line}")
    print(f"private names used as attributes of another module: {len(got['private_attributes_across'])}")
    for line in got["private_attributes_across"]:
        print(f"  {line}")
    print(f"imports inside functions: {got['imports_in_functions']:.1%}")
    print(f"modules with __getattr__: {', '.join(got['module_getattr'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
