"""The package version, a plain constant so that `pvisor --version` costs no metadata lookup,
the distribution's name, and the source commit the build recorded."""

__version__ = "0.1.0"

#: this project's distribution name. The documents pvisor implements write ``pvisor-sandbox``,
#: which (like ``pvisor``) belongs to another project on the package index (docs/install.md).
DISTRIBUTION = "pvisor-replay"


def source_commit() -> str | None:
    """The commit this installed package was built from (``<40 hex>``, ``-dirty`` appended when
    the checkout had changes), written into ``pvisor/_build.py`` by setup.py; None when the
    build had no git checkout or the package runs from a source tree."""
    try:
        from pvisor._build import COMMIT  # type: ignore[import-not-found]
    except ImportError:
        return None
    return COMMIT if isinstance(COMMIT, str) and COMMIT else None


def version_line() -> str:
    """What ``pvisor --version`` prints: ``pvisor 0.1.0 (pvisor-replay, commit 0123456789ab)``;
    the commit's first 12 characters (and ``-dirty``), or ``commit unknown``."""
    commit = source_commit()
    if commit is None:
        shown = "unknown"
    else:
        head, _, dirty = commit.partition("-")
        shown = head[:12] + (f"-{dirty}" if dirty else "")
    return f"pvisor {__version__} ({DISTRIBUTION}, commit {shown})"
