"""Base of hwprofile's public records: slotted, frozen, compared by value, and not tuples.

Never imports ``typing`` or ``dataclasses`` at run time: records are defined while the first
``profile()`` runs, and hwprofile's modules took 26.4 ms to import with dataclasses against 9.2 ms
with NamedTuples (benchmarks/RESULTS.md, "Start-up"). A record costs what a NamedTuple costs
(``__slots__``, one plain ``__init__``) without the tuple behaviour: no ``len``, no indexing, no
unpacking, no equality with a plain tuple.

Each record is a ``@final`` subclass of :class:`Record` that lists its fields in ``__slots__`` (in
the order of its ``__init__`` parameters, which ``repr`` shows; ``__init__`` takes each field as a
keyword of the same name, which ``replace`` and pickling rely on), declares each one with its type
and a ``#:`` doc comment, and sets them with ``_set`` in ``__init__``.
"""

from __future__ import annotations

from types import MappingProxyType

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Self, dataclass_transform, final
else:

    def final(cls):  # typing.final only informs the type checker
        return cls

    def dataclass_transform(**_):  # so does typing.dataclass_transform
        return final


__all__ = ["Record", "final"]

_set = object.__setattr__  # how a record's __init__ sets its fields (plain setattr raises)


def _hashable(v: object) -> object:
    if isinstance(v, (dict, MappingProxyType)):
        return frozenset(v.items())
    if isinstance(v, (list, set)):
        return tuple(v)
    return v


# For type checkers, a record is a frozen dataclass with its own __init__: assigning a field is an error.
@dataclass_transform(frozen_default=True, eq_default=False)
class Record:
    """Frozen value semantics over ``__slots__``: equality and hash by field values, a readable repr."""

    __slots__: tuple[str, ...] = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: make a changed copy with .replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: {name} cannot be deleted")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, f) for f in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, *map(_hashable, self._values())))

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[Any, tuple[object, ...]]:
        # a read-only mapping field travels as a dict (mappingproxy does not pickle); the constructor re-wraps it
        fields = {f: getattr(self, f) for f in self.__slots__}
        return _rebuild, (type(self), {f: dict(v) if isinstance(v, MappingProxyType) else v for f, v in fields.items()})

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied; the constructor checks them as it checks any value."""
        unknown = set(changes) - set(self.__slots__)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field(s) {', '.join(sorted(unknown))}; fields: {', '.join(self.__slots__)}")
        return type(self)(**{f: changes.get(f, getattr(self, f)) for f in self.__slots__})


def _rebuild(cls: type[Record], fields: dict[str, object]) -> Record:
    return cls(**fields)
