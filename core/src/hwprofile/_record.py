"""Base of hwprofile's records: slotted, frozen, compared by value, and not tuples; never imports ``typing``.

Never imports ``typing``, ``dataclasses`` or ``inspect`` at run time: records are defined while the
first ``profile()`` runs, and hwprofile's modules took 26.4 ms to import with dataclasses against
9.2 ms with NamedTuples (benchmarks/RESULTS.md, "Start-up"). A record costs what a NamedTuple costs
(``__slots__``, one plain ``__init__``) without the tuple behaviour: no ``len``, no indexing, no
unpacking, no equality with a plain tuple.

A record is a ``@final`` subclass of :class:`Record` that declares its fields once, as annotated
class attributes, each with a ``#:`` doc comment where the name does not say it all::

    @final
    class Launch(Record):
        name_expression: str
        grid: tuple[int, int, int]
        shared_bytes: int = 0  #: a default is the value written in the class body

The annotation order is the field order (of ``__init__``'s parameters and of ``repr``); a
``ClassVar`` annotation is not a field. The base (its metaclass) generates ``__slots__`` and an
``__init__`` that takes every field by position or keyword, defaults honoured (a missing or unexpected
argument is Python's own ``TypeError``, naming ``<Record>.__init__`` and the field; the function is
compiled when the record is first constructed, :func:`_first_init`); a record writes neither, and
defining either is a ``TypeError``. Type checkers see the same ``__init__`` (``dataclass_transform``).
A record that checks or normalises its input does it in one hook, ``__post_init__(self)``: the
generated ``__init__`` calls it after setting the fields (and so does :meth:`Record.replace` and
unpickling, which construct), and it normalises a field with ``_set(self, "field", value)`` (the
only place outside this module that may; ``tests/package/test_record_idiom.py`` holds the rule).

What is a record and what is state: a value that is complete when constructed is a ``Record``;
an accumulator filled in step by step (a report, counters) is state, a plain ``@dataclass`` or class.
Two more kinds are not records, by design: the op table's declarations (``optable.OpDef``, ``GateDef``), built
once at import and compared by identity (one object per op, which a by-value hash of 25 fields would only
slow), and ``ops._route.Decision``, whose equality is its op, path and reason alone (its basis and times may differ).
"""

from __future__ import annotations

from keyword import iskeyword
from types import MappingProxyType

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, ClassVar, Self, dataclass_transform, final
else:

    def final(cls):  # typing.final only informs the type checker
        return cls

    def dataclass_transform(**_):  # so does typing.dataclass_transform
        return final


__all__ = ["Record", "final"]

_set = object.__setattr__  # how a record's fields are set (plain setattr raises): the generated __init__, __post_init__

_CLASSVAR = ("ClassVar", "typing.ClassVar", "t.ClassVar")


def _hashable(v: object) -> object:
    if isinstance(v, (dict, MappingProxyType)):
        return frozenset(v.items())
    if isinstance(v, (list, set)):
        return tuple(v)
    return v


def _annotations(name: str, ns: dict[str, Any]) -> dict[str, object]:
    """The class body's annotations, in order: ``__annotations__`` (3.11-3.13, and any module with
    ``from __future__ import annotations``), else the lazy ``__annotate__`` of Python 3.14+."""
    if "__annotations__" in ns:
        return dict(ns["__annotations__"])
    annotate = ns.get("__annotate__") or ns.get("__annotate_func__")
    if annotate is None:
        return {}
    try:  # Python 3.14+: a module without the future import leaves only the lazy __annotate__
        import annotationlib  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise TypeError(f"record {name}: its class body has __annotate__ but no __annotations__, and no annotationlib to read it") from None
    out: dict[str, object] = annotationlib.call_annotate_function(annotate, annotationlib.Format.STRING)
    return out


def _is_classvar(annotation: object) -> bool:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(_CLASSVAR)


def _fields(name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, object], tuple[str, ...]]:
    """(every field in order, the defaults, this class's own fields) of the record being defined; its
    defaults leave the namespace (a slot and a class attribute of one name cannot coexist)."""
    fields: list[str] = []
    defaults: dict[str, object] = {}
    for base in bases:
        fields += getattr(base, "__record_fields__", ())
        defaults.update(getattr(base, "__record_defaults__", {}))
    own: list[str] = []
    for field, annotation in _annotations(name, ns).items():
        if _is_classvar(annotation):
            continue
        if field in fields:
            raise TypeError(f"record {name} declares field {field!r} again: it is a field of a base record already")
        if not field.isidentifier() or iskeyword(field):
            raise TypeError(f"record {name}: field {field!r} is not a Python identifier")
        if field.startswith("__"):
            raise TypeError(f"record {name}: field {field!r} starts with '__'; name fields without leading double underscores")
        if field in ns:
            defaults[field] = ns.pop(field)
        elif defaults:
            first = next(iter(defaults))
            raise TypeError(
                f"record {name}: field {field!r} has no default but follows {first!r}, which has one; "
                "put the fields without a default first"
            )
        own.append(field)
    return (*fields, *own), defaults, tuple(own)


def _make_init(cls: type, fields: tuple[str, ...], defaults: Mapping[str, object]) -> Callable[..., None]:
    """The record's ``__init__``, as source compiled once per class (as ``dataclasses`` does): the
    parameters are the fields, so Python itself names a missing or unexpected one."""
    params = "".join(f", {f}=__d_{f}" if f in defaults else f", {f}" for f in fields)
    body = "".join(f"\n    __set(self, {f!r}, {f})" for f in fields)
    if hasattr(cls, "__post_init__"):
        body += "\n    self.__post_init__()"
    scope: dict[str, object] = {"__set": _set, **{f"__d_{f}": v for f, v in defaults.items()}}
    exec(f"def __init__(self{params}):{body or chr(10) + '    pass'}\n", scope)  # fields are checked identifiers (_fields)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]  # what Python's argument errors name
    init.__module__ = cls.__module__
    return init  # type: ignore[return-value]


def _first_init(cls: type) -> Callable[..., None]:
    """Until a record is first constructed, its ``__init__`` is this stand-in: it compiles the real one
    (:func:`_make_init`), puts it in its place and calls it. One ``compile`` costs 80-160 µs: a first
    ``profile()`` on a simulated H200 builds most of the records it defines (26 of 31 on 2026-12-06, about 2.5 ms of
    compiles on a loaded 2-core host); the tools' records (re-tuning, self-test, warm-up, cache entries) compile when used."""

    def __init__(self: Record, *args: Any, **kwargs: Any) -> None:
        init = _make_init(cls, cls.__record_fields__, cls.__record_defaults__)  # type: ignore[attr-defined]
        type.__setattr__(cls, "__init__", init)  # two threads may both compile: the same function, either wins
        init(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


class _RecordType(type):
    """Turns a record's annotated class attributes into ``__slots__``, defaults and ``__init__``."""

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any], **kwargs: Any) -> _RecordType:
        for written in ("__init__", "__slots__"):
            if written in ns and bases:
                raise TypeError(
                    f"record {name} defines {written}: a record declares its fields as annotated class attributes "
                    "(the base generates __slots__ and __init__); check or normalise values in __post_init__"
                )
        fields, defaults, own = _fields(name, bases, ns)
        if bases and not fields:
            raise TypeError(f"record {name} declares no fields: annotate each field as a class attribute ('index: int')")
        ns["__slots__"] = own
        ns["__record_fields__"] = fields
        ns["__record_defaults__"] = MappingProxyType(defaults)
        cls = super().__new__(mcs, name, bases, ns, **kwargs)
        type.__setattr__(cls, "__init__", _first_init(cls))
        return cls


# For type checkers, a record is a frozen dataclass: its __init__ is synthesized from the annotated fields, and
# assigning a field is an error. At run time _RecordType generates the same __init__ (PEP 681).
@dataclass_transform(frozen_default=True, eq_default=False)
class Record(metaclass=_RecordType):
    """Frozen value semantics over ``__slots__``: equality and hash by field values, a readable repr."""

    #: The fields, in order (base records' first); set by the base for each record.
    __record_fields__: ClassVar[tuple[str, ...]]
    #: Field -> its default; read-only.
    __record_defaults__: ClassVar[MappingProxyType[str, object]]

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: make a changed copy with .replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: {name} cannot be deleted; make a changed copy with .replace()")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, f) for f in self.__record_fields__)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, *map(_hashable, self._values())))

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__record_fields__)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[Any, tuple[object, ...]]:
        # a read-only mapping field travels as a dict (mappingproxy does not pickle) and is read-only again on arrival
        fields = {f: getattr(self, f) for f in self.__record_fields__}
        proxied = tuple(f for f, v in fields.items() if isinstance(v, MappingProxyType))
        return _rebuild, (type(self), {f: dict(v) if f in proxied else v for f, v in fields.items()}, proxied)

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied; ``__post_init__`` checks them as it checks any value."""
        unknown = set(changes) - set(self.__record_fields__)
        if unknown:
            fields = ", ".join(self.__record_fields__)
            raise TypeError(f"{type(self).__name__} has no field(s) {', '.join(sorted(unknown))}; fields: {fields}")
        return type(self)(**{f: changes.get(f, getattr(self, f)) for f in self.__record_fields__})


def _rebuild(cls: type[Record], fields: dict[str, object], proxied: tuple[str, ...] = ()) -> Record:
    rec = cls(**fields)
    for f in proxied:  # a field its __post_init__ did not wrap again (most take the mapping as given)
        value = getattr(rec, f)
        if isinstance(value, dict):
            _set(rec, f, MappingProxyType(value))
    return rec
