"""Module-level regular expressions compiled on first use.

``re.compile`` of a pattern costs 0.05 to 0.5 ms (the key-shape pattern of the redaction, the
Codex git-commit pattern): 2.7 ms for the sixteen that ``replay --prepare-only`` would compile at
import, of which it uses a few. A :class:`LazyPattern` compiles on the first attribute read and
then holds the compiled pattern's methods as its own attributes, so that later calls cost what
they cost on the pattern itself (no ``__getattr__`` in between).

This module imports nothing of pvisor's and nothing outside the standard library.
"""

from __future__ import annotations

import re
from typing import Any

#: what a LazyPattern takes over from its compiled pattern after the first use
_ATTRS = (
    "search",
    "match",
    "fullmatch",
    "sub",
    "subn",
    "split",
    "findall",
    "finditer",
    "pattern",
    "flags",
    "groups",
    "groupindex",
)


class LazyPattern:
    """``re.compile(pattern, flags)``, done when first used; it answers what a compiled pattern
    answers (``search``, ``sub``, ``pattern``, ...). ``compiled`` is the :class:`re.Pattern`
    itself, for an API that wants one (``re.sub(p.compiled, ...)``)."""

    def __init__(self, pattern: str | bytes, flags: int = 0) -> None:
        self._source = (pattern, flags)

    @property
    def compiled(self) -> re.Pattern:
        compiled = self.__dict__.get("_compiled")
        return compiled if compiled is not None else self._compile()

    def _compile(self) -> re.Pattern:
        compiled = re.compile(*self._source)
        for name in _ATTRS:
            self.__dict__[name] = getattr(compiled, name)
        self.__dict__["_compiled"] = compiled
        return compiled

    def __getattr__(self, name: str) -> Any:
        # only for what is not an attribute yet: the first use of a pattern's method
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._compile(), name)

    def __repr__(self) -> str:
        return f"LazyPattern({self._source[0]!r}, {self._source[1]!r})"


__all__ = ["LazyPattern"]
