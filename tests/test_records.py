"""Every :class:`pvisor.journal.record.Record` of the package behaves as the dataclass it replaces
(journal/record.py): its hand-written ``__init__`` takes the fields in their order with their
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
from pvisor.journal.record import FrozenRecord, Record

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
