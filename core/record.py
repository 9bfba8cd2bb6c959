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

``@dataclass`` itself, even with nothing to generate, still costs 0.07 ms a class (it collects
the fields with a regular expression match per annotation, rebuilds the class for its slots and
looks up several attributes per field): :func:`record` gives the same class, fields, slots and
parameters for these classes' one case without that work (0.01 ms a class), and
``tests/test_records.py`` compares what it makes with what ``@dataclass`` makes.

A decorator gets the class made: :func:`record`, as ``@dataclass(slots=True)``, makes it a
second time with its slots, 0.1 M instructions a class (valgrind; ``replay --prepare-only``
loads some 50). ``class TextPart(Record, record=True):`` makes the same class in one go
(:class:`RecordType`, the class of every record, reads the fields before the class is made):
the modules on the short commands' paths write their records so; ``@record`` stays for the
others.

This module imports nothing of pvisor's and nothing outside the standard library.
"""

from __future__ import annotations

import abc
from dataclasses import MISSING, Field, FrozenInstanceError, dataclass, fields
from operator import attrgetter
from types import MemberDescriptorType
from typing import Any, Callable, TypeVar

T = TypeVar("T", bound=type)

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


class RecordType(type):
    """The class of :class:`Record` and of every class derived from it. A class statement that
    says ``record=True`` (``class TextPart(Record, record=True):``) is made as :func:`record`
    would remake it, in one go: the class is made once, not made and then made again with its
    slots (0.1 M instructions a class, some 40 classes on every ``replay --prepare-only``:
    bench/startup_bench.py). Any other class (one that ``@record`` or ``@dataclass`` makes
    into a record afterwards) is made as ``type`` makes it. A record cannot also derive from a
    class of another metaclass (an ``abc.ABC``, a ``typing.Protocol``)."""

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], record: bool = False, **kw: Any
    ) -> RecordType:
        if not record:
            return super().__new__(mcls, name, bases, namespace, **kw)
        notes = namespace.get("__annotations__")
        if notes is None and any(k.startswith("__annotate") for k in namespace):
            # Python 3.14's deferred annotations (no future import): made, then remade
            return globals()["record"](super().__new__(mcls, name, bases, namespace, **kw))
        made = _record_namespace(namespace.get("__qualname__", name), bases, namespace, notes or {}, True)
        new = super().__new__(mcls, name, bases, made, **kw)
        _finish(new, made)
        return new


class Record(metaclass=RecordType):
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


@dataclass(slots=True, init=False, repr=False, eq=False)
class _Model:
    """The one class of this module that ``@dataclass`` makes: its parameters are the ones every
    :func:`record` shares, and its field's kind is the one the others' fields take (both are
    private to :mod:`dataclasses`, and their shape differs between Python versions)."""

    x: int = 0


_PARAMS = _Model.__dataclass_params__  # type: ignore[attr-defined]
_FIELD_KIND = _Model.__dataclass_fields__["x"]._field_type  # type: ignore[attr-defined]


#: the arguments a field with a plain default takes after its default, as ``field(default=...)``
#: gives them (``default_factory``, ``init``, ``repr``, ``hash``, ``compare``, ``metadata``,
#: ``kw_only``; and ``doc`` from Python 3.14): :class:`Field` is made directly, ``field()``
#: would cost a call more per field
_DOC = (None,) if "doc" in Field.__slots__ else ()
_PLAIN_FIELD = (MISSING, True, True, None, True, None, False, *_DOC)


def _record_namespace(
    qualname: str, bases: tuple[type, ...], body: Any, notes: Any, own: bool = False
) -> dict[str, Any]:
    """The namespace of the slotted class :func:`record` makes of a class ``qualname`` with
    ``bases``, whose own namespace is ``body`` (its annotations ``notes``; ``own``: a dict this
    call may change, a class statement's): the fields taken out of it, ``__slots__``,
    ``__dataclass_fields__`` (a :class:`_Fields`), ``__dataclass_params__`` and
    ``__match_args__``. The errors are :func:`record`'s."""
    inherited: set[str] = set()
    for b in bases:
        for base in b.__mro__:
            if base is object:
                continue
            namespace = base.__dict__
            if "__dataclass_fields__" in namespace:
                raise TypeError(f"record {qualname}: a dataclass base ({base.__qualname__}); use @dataclass")
            slots = namespace.get("__slots__", ())
            inherited.update((slots,) if isinstance(slots, str) else slots)
    made = body if own else dict(body)
    take = made.pop
    spec: list[tuple[str, Any, Any]] = []
    match_args: list[str] = []
    # done for some 50 classes on every prepare-only: per field only the checks, the Field
    # objects are made on first use (:class:`_Fields`)
    for name, kind in notes.items():
        shown = kind if kind.__class__ is str else repr(kind)
        if ("Var" in shown or "KW_ONLY" in shown) and (
            "ClassVar" in shown or "InitVar" in shown or "KW_ONLY" in shown
        ):
            raise TypeError(f"record {qualname}.{name}: {shown} is not covered; use @dataclass")
        default = take(name, MISSING)
        if default is MISSING:
            match_args.append(name)
        elif isinstance(default, Field):
            if default.kw_only is MISSING:
                default.kw_only = False
            if default.init and not default.kw_only:
                match_args.append(name)
            if default.default is not MISSING and default.default.__class__.__hash__ is None:
                raise ValueError(
                    f"mutable default {type(default.default)} for field {name} is not allowed: "
                    "use default_factory"
                )
        else:
            if isinstance(default, MemberDescriptorType):
                default = MISSING  # a slot of a base, not a default
            elif default.__class__.__hash__ is None:
                raise ValueError(
                    f"mutable default {type(default)} for field {name} is not allowed: use default_factory"
                )
            match_args.append(name)
        spec.append((name, kind, default))
    for name, value in made.items():
        if isinstance(value, Field):
            raise TypeError(f"{name!r} is a field but has no type annotation")
    take("__dict__", None)
    take("__weakref__", None)
    made["__slots__"] = tuple(name for name, _, _ in spec if name not in inherited)
    made["__dataclass_params__"] = _PARAMS
    made["__dataclass_fields__"] = _Fields(spec)
    if "__match_args__" not in made:
        made["__match_args__"] = tuple(match_args)
    return made


class _Fields:
    """A record's ``__dataclass_fields__`` until it is first read (``dataclasses.fields``,
    orjson, a comparison): then the ``{name: Field}`` dict is made and takes its place in the
    class, so that later reads are a plain attribute's. ``spec``: ``(name, annotation,
    default)`` per field, the default :data:`MISSING`, a value or a ``field(...)``. The fields
    are checked when the class is made (:func:`_record_namespace`): only the 300 or so Field
    objects of the records on ``replay --prepare-only``'s path wait (0.005 M instructions
    each), and that command reads none."""

    __slots__ = ("spec", "owner")

    def __init__(self, spec: list[tuple[str, Any, Any]]) -> None:
        self.spec = spec
        self.owner: type | None = None

    def __get__(self, obj: Any, cls: type | None = None) -> dict[str, Field]:
        found: dict[str, Field] = {}
        for name, kind, default in self.spec:
            f = default if isinstance(default, Field) else Field(default, *_PLAIN_FIELD)
            f.name = name
            f.type = kind
            f._field_type = _FIELD_KIND  # type: ignore[attr-defined]
            found[name] = f
        owner = self.owner if self.owner is not None else cls
        if owner is not None and owner.__dict__.get("__dataclass_fields__") is self:
            type.__setattr__(owner, "__dataclass_fields__", found)
        return found


def _finish(new: type, made: dict[str, Any]) -> None:
    """What :func:`record` does to the class made of ``made`` (:func:`_record_namespace`): its
    fields' owner set, the docstring ``@dataclass`` would write when it has none, the abstract
    methods of an abstract base class updated."""
    made["__dataclass_fields__"].owner = new
    if not new.__doc__:
        import inspect  # as @dataclass words it; no class of pvisor's goes without a docstring

        new.__doc__ = new.__name__ + str(inspect.signature(new)).replace(" -> None", "")
    if isinstance(new, abc.ABCMeta):  # only an abstract base class has abstract methods to update
        abc.update_abstractmethods(new)


def record(cls: T) -> T:
    """``cls`` as ``@dataclass(slots=True, init=False, repr=False, eq=False)`` would return it (a
    new, slotted class with the same ``__dataclass_fields__``, ``__dataclass_params__`` and
    ``__match_args__``), for a class that writes its own ``__init__`` (module docstring).

    Covers the fields that class bodies here declare: an annotation, with no default, a plain
    default or a ``field(...)``. Raises TypeError for what it does not cover (``ClassVar``,
    ``InitVar`` or ``KW_ONLY`` annotations, fields of a dataclass base, a ``field()`` with no
    annotation) and ValueError for a mutable default, as ``@dataclass`` does; use
    ``@dataclass`` there."""
    body = cls.__dict__
    notes = body.get("__annotations__")
    if notes is None:  # none, or Python 3.14's deferred ones (a module without the future import)
        notes = cls.__annotations__ if "__annotate__" in body else {}
    made = _record_namespace(cls.__qualname__, cls.__bases__, body, notes)
    new = type(cls)(cls.__name__, cls.__bases__, made)
    new.__qualname__ = cls.__qualname__
    _finish(new, made)
    return new  # type: ignore[return-value]


__all__ = ["FrozenRecord", "Record", "RecordType", "record"]
