"""Value classes that cost nothing to define: the base of the dataclasses every command loads.

``@dataclass`` writes the source of each class's ``__init__``, ``__repr__`` and ``__eq__`` (and,
frozen, ``__setattr__``, ``__delattr__``, ``__hash__``) and compiles it with ``exec`` when the
module is imported: 0.5 ms a class on the 2-CPU machine of docs/benchmarks.md, 20 ms for the 37
classes that ``replay --prepare-only`` loads, the largest part of what pvisor adds to the
interpreter's start ("Replay prepare-only: fidelity and startup"). A class that writes its own
``__init__`` (compiled once, into the ``.pyc``, like the rest of the module) and takes
``__repr__`` and ``__eq__`` from :class:`Record` costs 0.1 ms:

    @dataclass(slots=True, init=False, repr=False, eq=False)
    class TextPart(Record):
        text: str
        raw: Any = None

        def __init__(self, text: str, raw: Any = None) -> None:
            self.text = text
            self.raw = raw

It stays a dataclass (``dataclasses.fields``, ``replace``, ``asdict`` and orjson's dataclass
support work), slotted, compared and shown as a generated one would be: ``__eq__`` compares the
fields in order when both are of the same class, ``__repr__`` is ``Name(field=value, ...)``.
The ``__init__`` takes the fields in their order with their defaults; a field with a
``default_factory`` takes ``None`` and builds the default for it (so an explicit ``None`` also
gets a fresh default). ``tests/test_records.py`` checks every such class of the package against
its fields. A frozen one derives from :class:`FrozenRecord` (not ``frozen=True``, which would
generate ``__setattr__`` again) and sets its fields in ``__init__`` with ``object.__setattr__``.

This module imports nothing of pvisor's and nothing outside the standard library.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields
from operator import attrgetter
from typing import Any, Callable

#: {class: attrgetter of its fields}, filled on first comparison
_GETTERS: dict[type, Callable[[Any], Any]] = {}


def _getter(cls: type) -> Callable[[Any], Any]:
    get = _GETTERS.get(cls)
    if get is None:
        names = [f.name for f in fields(cls)]
        # attrgetter of one name gives the value, of none it cannot be made: a tuple always
        get = (
            attrgetter(*names)
            if len(names) > 1
            else (lambda obj, n=tuple(names): tuple(getattr(obj, a) for a in n))
        )
        _GETTERS[cls] = get
    return get


class Record:
    """``__repr__`` and ``__eq__`` of a dataclass defined with ``init=False, repr=False,
    eq=False`` (module docstring). Unhashable, as a generated eq makes a dataclass."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        get = _getter(self.__class__)
        return get(self) == get(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return f"{self.__class__.__qualname__}({shown})"


class FrozenRecord(Record):
    """A :class:`Record` whose fields cannot be assigned after ``__init__`` (which sets them
    with ``object.__setattr__``), hashable by its fields, as a frozen dataclass is."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __hash__(self) -> int:
        return hash(_getter(self.__class__)(self))

    # copy and pickle set a slotted object's state with setattr, which is refused here
    def __getstate__(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self)]

    def __setstate__(self, state: list[Any]) -> None:
        for f, value in zip(fields(self), state):
            object.__setattr__(self, f.name, value)


__all__ = ["FrozenRecord", "Record"]
