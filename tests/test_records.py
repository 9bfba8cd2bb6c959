"""Every :class:`pvisor.core.record.Record` of the package behaves as the dataclass it replaces
(core/record.py): its hand-written ``__init__`` takes the fields in their order with their
defaults (a fresh default for a factory field), and equality, ``repr``, hashing, frozenness,
copy, pickle and ``dataclasses.replace`` give what ``@dataclass`` would generate, checked
against a reference dataclass made from the same fields."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
import pkgutil

import pytest

import pvisor
from pvisor.core.record import FrozenRecord, Record, record

#: modules that need an optional extra or a real process around them to import
SKIP = {"pvisor.gateway.intercept_addon"}  # runs inside mitmdump, with its mitmproxy


def _records() -> list[type]:
    found = {}
    for mod in pkgutil.walk_packages(pvisor.__path__, "pvisor."):
        if mod.name in SKIP or mod.name.endswith("__main__"):
            continue
        module = importlib.import_module(mod.name)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Record) and obj not in (Record, FrozenRecord):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


RECORDS = _records()


def test_the_prepare_path_classes_are_records():
    names = {c.__qualname__ for c in RECORDS}
    # the classes replay --prepare-only loads (docs/benchmarks.md): a dataclass among them would
    # bring its import-time code generation back
    for name in ("Message", "ToolCall", "Step", "Trajectory", "Prefix", "NativeWarning", "Problem"):
        assert name in names


def _sample(f: dataclasses.Field, i: int):
    return ("value", f.name, i)  # distinct, comparable, hashable, picklable


def _reference(cls: type) -> type:
    frozen = issubclass(cls, FrozenRecord)
    spec = []
    for f in dataclasses.fields(cls):
        kw = {}
        if f.default is not dataclasses.MISSING:
            kw["default"] = f.default
        if f.default_factory is not dataclasses.MISSING:
            kw["default_factory"] = f.default_factory
        spec.append((f.name, f.type, dataclasses.field(init=f.init, kw_only=f.kw_only, **kw)))
    return dataclasses.make_dataclass(cls.__name__, spec, frozen=frozen, slots=True)


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_a_record_behaves_as_its_dataclass(cls: type):
    assert dataclasses.is_dataclass(cls) and not hasattr(cls, "__dict__") or "__slots__" in vars(cls)
    ref = _reference(cls)
    fields = dataclasses.fields(cls)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    init_fields = [f for f in fields if f.init]
    assert [p.name for p in params] == [f.name for f in init_fields], "the fields, in order"
    for p, f in zip(params, init_fields):
        want_kind = inspect.Parameter.KEYWORD_ONLY if f.kw_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert p.kind == want_kind, f.name
        if f.default is not dataclasses.MISSING:
            assert p.default == f.default or (p.default != p.default and f.default != f.default), f.name
        elif f.default_factory is not dataclasses.MISSING:
            assert p.default is None, f"{f.name}: a factory field takes None"
        else:
            assert p.default is inspect.Parameter.empty, f"{f.name} is required"
    # only the required fields: defaults and fresh factory values, as the dataclass gives them
    required = {f.name: _sample(f, i) for i, f in enumerate(init_fields) if p_required(f)}
    a, b, r = cls(**required), cls(**required), ref(**required)
    for f in fields:
        assert getattr(a, f.name) == getattr(r, f.name), f.name
        if f.default_factory is not dataclasses.MISSING:
            assert getattr(a, f.name) is not getattr(b, f.name), f"{f.name}: a fresh default each time"
    # every field given
    given = {f.name: _sample(f, i) for i, f in enumerate(init_fields)}
    a, b, r = cls(**given), cls(**given), ref(**given)
    assert [getattr(a, f.name) for f in fields] == [getattr(r, f.name) for f in fields]
    assert repr(a) == repr(r).replace(ref.__qualname__, cls.__qualname__, 1)
    if cls.__eq__ is object.__eq__:  # compared by identity, as eq=False made it
        assert a != b and a == a
    else:
        assert a == b and (a != r) and a.__eq__(r) is NotImplemented
        if init_fields:
            other = cls(**{**given, init_fields[-1].name: ("other",)})
            assert a != other
    if issubclass(cls, FrozenRecord):
        assert hash(a) == hash(b) == hash(r)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(a, fields[0].name, 1)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(a, fields[0].name)
    elif cls.__eq__ is not object.__eq__:
        with pytest.raises(TypeError):
            hash(a)
    with pytest.raises(AttributeError):
        a.not_a_field = 1  # slotted
    for clone in (copy.copy(a), copy.deepcopy(a), dataclasses.replace(a)):
        assert [getattr(clone, f.name) for f in fields] == [getattr(a, f.name) for f in fields]
    if cls.__module__ and not cls.__qualname__.startswith("_"):
        try:
            restored = pickle.loads(pickle.dumps(a))
        except (pickle.PicklingError, AttributeError):
            restored = None  # a class not reachable by its name (none today)
        if restored is not None:
            assert [getattr(restored, f.name) for f in fields] == [getattr(a, f.name) for f in fields]


def p_required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


# ---------------------------------------------------------------- record() against @dataclass

#: class bodies the package's records use, and the edges of what record() covers; each is made
#: twice, by record() and by @dataclass(slots=True, init=False, repr=False, eq=False)
BODIES = {
    "no fields": ("Record", '"""Doc."""'),
    "required and defaults": (
        "Record",
        '"""Doc."""\n    a: str\n    b: int = 0\n    c: "str | None" = None\n'
        "    def __init__(self, a, b=0, c=None):\n        self.a, self.b, self.c = a, b, c",
    ),
    "factories and field options": (
        "Record",
        '"""Doc."""\n    a: list = field(default_factory=list)\n'
        "    b: dict = field(default_factory=dict, repr=False)\n"
        "    c: int = field(default=3, compare=False, metadata={'k': 1})\n"
        "    d: int = field(default=4, kw_only=True)\n    e: int = field(default=5, init=False)\n"
        "    def __init__(self, a=None, b=None, c=3, *, d=4):\n"
        "        self.a, self.b, self.c, self.d, self.e = a or [], b or {}, c, d, 5",
    ),
    "frozen": (
        "FrozenRecord",
        '"""Doc."""\n    a: tuple = ()\n    def __init__(self, a=()):\n'
        '        object.__setattr__(self, "a", a)',
    ),
    "no docstring": ("Record", "a: int = 1\n    def __init__(self, a: int = 1) -> None:\n        self.a = a"),
    "own match args and a method": (
        "Record",
        '"""Doc."""\n    __match_args__ = ("a",)\n    a: int = 0\n    b: int = 1\n'
        "    def __init__(self, a=0, b=1):\n        self.a, self.b = a, b\n"
        "    def total(self):\n        return self.a + self.b",
    ),
}


def _make(body: tuple[str, str], future: bool, by_record: bool | str) -> type:
    """``Made`` of ``body`` by ``@record`` (True), ``@dataclass`` (False) or, ``"keyword"``, the
    class statement's ``record=True`` (core/record.py's RecordType)."""
    base, text = body
    deco = (
        "@record\n"
        if by_record is True
        else ""
        if by_record
        else "@dataclass(slots=True, init=False, repr=False, eq=False)\n"
    )
    keyword = ", record=True" if by_record == "keyword" else ""
    src = ("from __future__ import annotations\n" if future else "") + (
        "from dataclasses import dataclass, field\n"
        "from pvisor.core.record import FrozenRecord, Record, record\n"
        f"{deco}class Made({base}{keyword}):\n    {text}\n"
    )
    ns: dict = {"__name__": __name__}  # dataclass looks string annotations up in the module
    exec(compile(src, "<made>", "exec"), ns)
    return ns["Made"]


def _shape(cls: type) -> dict:
    return {
        "fields": [repr(f) for f in dataclasses.fields(cls)],
        "all fields": {k: repr(v) for k, v in cls.__dataclass_fields__.items()},
        "params": repr(cls.__dataclass_params__),
        "slots": cls.__slots__,
        "match_args": cls.__match_args__,
        "doc": cls.__doc__,
        "names": (cls.__name__, cls.__qualname__, cls.__module__, cls.__bases__),
        "attributes": sorted(k for k in vars(cls) if k not in ("__dataclass_params__",)),
        "mro": [c.__name__ for c in cls.__mro__],
    }


@pytest.mark.parametrize("how", [True, "keyword"], ids=["@record", "record=True"])
@pytest.mark.parametrize("future", [True, False], ids=["string annotations", "evaluated annotations"])
@pytest.mark.parametrize("name", list(BODIES))
def test_record_makes_what_dataclass_makes(name: str, future: bool, how: bool | str):
    import orjson

    mine, theirs = _make(BODIES[name], future, how), _make(BODIES[name], future, False)
    assert _shape(mine) == _shape(theirs)
    required = {f.name: "x" for f in dataclasses.fields(mine) if f.init and p_required(f)}
    a, b = mine(**required), theirs(**required)
    assert dataclasses.is_dataclass(mine) and not hasattr(a, "__dict__")
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert orjson.dumps(a) == orjson.dumps(b)
    assert dataclasses.astuple(dataclasses.replace(a)) == dataclasses.astuple(dataclasses.replace(b))


@pytest.mark.parametrize(
    "text, error",
    [
        ('"""Doc."""\n    a: list = []', ValueError),  # a mutable default, refused as @dataclass does
        ('"""Doc."""\n    a = field(default=1)', TypeError),  # a field() with no annotation
    ],
)
def test_record_refuses_what_dataclass_refuses(text: str, error: type):
    with pytest.raises(error) as theirs:
        _make(("Record", text), True, False)
    for how in (True, "keyword"):
        with pytest.raises(error) as mine:
            _make(("Record", text), True, how)
        assert str(mine.value) == str(theirs.value)


@pytest.mark.parametrize("annotation", ["ClassVar[int]", "InitVar[int]", "KW_ONLY"])
def test_record_refuses_what_it_does_not_cover(annotation: str):
    with pytest.raises(TypeError, match="use @dataclass"):
        _make(("Record", f'"""Doc."""\n    a: {annotation}'), True, True)


def test_record_refuses_a_dataclass_base():
    base = _make(BODIES["required and defaults"], True, False)
    with pytest.raises(TypeError, match="a dataclass base"):
        record(type("Sub", (base,), {"__doc__": "Doc."}))
