"""One record idiom in core (hwprofile._record): the rule over the sources, and the generated ``__init__``."""

from __future__ import annotations

import ast
import pickle
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

import pytest

import hwprofile
from hwprofile._record import Record, _RecordType, _set

SRC = Path(hwprofile.__file__).parent


def _decorated_frozen_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        if isinstance(d, ast.Call) and ast.unparse(d.func).split(".")[-1] == "dataclass":
            if any(kw.arg == "frozen" and isinstance(kw.value, ast.Constant) and kw.value.value for kw in d.keywords):
                return True
    return False


def violations(source: str, where: str) -> list[str]:
    """Every other record idiom in ``source``: a NamedTuple (class or call), a frozen dataclass, and a field set
    with ``_set(self, ...)`` / ``object.__setattr__(self, ...)`` outside ``__post_init__``."""
    found: list[str] = []
    tree = ast.parse(source)
    hooks = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "__post_init__" for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            if any(ast.unparse(b).split(".")[-1] == "NamedTuple" for b in node.bases):
                found.append(f"{where}:{node.lineno}: {node.name} is a NamedTuple")
            if _decorated_frozen_dataclass(node):
                found.append(f"{where}:{node.lineno}: {node.name} is a frozen dataclass")
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func.split(".")[-1] in ("NamedTuple", "namedtuple"):
                found.append(f"{where}:{node.lineno}: {func}(...) makes a tuple record")
            setter = func in ("_set", "object.__setattr__")
            if setter and node.args and ast.unparse(node.args[0]) == "self" and id(node) not in hooks:
                found.append(f"{where}:{node.lineno}: {func}(self, ...) outside __post_init__")
    return found


def test_core_has_one_record_idiom() -> None:
    found = [v for path in sorted(SRC.rglob("*.py")) if path.name != "_record.py"
             for v in violations(path.read_text(), str(path.relative_to(SRC)))]
    assert found == [], "a value record is a hwprofile._record.Record (its docstring says how):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "from typing import NamedTuple\nclass P(NamedTuple):\n    x: int\n",
        "import typing\nclass P(typing.NamedTuple):\n    x: int\n",
        "import collections\nP = collections.namedtuple('P', 'x')\n",
        "from dataclasses import dataclass\n@dataclass(frozen=True)\nclass P:\n    x: int\n",
        "import dataclasses\n@dataclasses.dataclass(eq=True, frozen=True)\nclass P:\n    x: int\n",
        "class P(Record):\n    x: int\n    def __init__(self, x: int) -> None:\n        _set(self, 'x', x)\n",
        "class P:\n    def __init__(self) -> None:\n        object.__setattr__(self, 'x', 1)\n",
    ],
)
def test_the_rule_sees_each_other_idiom(source: str) -> None:
    assert len(violations(source, "m.py")) == 1


def test_the_rule_allows_state_and_the_hook() -> None:
    ok = (
        "from dataclasses import dataclass, field\n@dataclass\nclass Report:\n    seen: list[int] = field(default_factory=list)\n"
        "class P(Record):\n    x: int\n    def __post_init__(self) -> None:\n        _set(self, 'x', int(self.x))\n"
    )
    assert violations(ok, "m.py") == []


# --- the generated __init__ -----------------------------------------------------------------------

POSTED: list[str] = []


class Point(Record):
    UNITS: ClassVar[str] = "mm"  # not a field
    x: int
    y: int
    label: str = ""
    tags: tuple[str, ...] = ()
    meta: Mapping[str, int] = MappingProxyType({})

    def __post_init__(self) -> None:
        POSTED.append(self.label)
        if self.x < 0:
            raise ValueError(f"Point.x must be >= 0, got {self.x}")
        _set(self, "tags", tuple(self.tags))
        _set(self, "meta", MappingProxyType(dict(self.meta)))


class Plain(Record):
    b: str
    a: int = 1


def test_fields_are_the_annotations_in_order_classvar_skipped() -> None:
    assert Point.__record_fields__ == ("x", "y", "label", "tags", "meta") == Point.__slots__
    assert Plain.__record_fields__ == ("b", "a")  # annotation order, not sorted
    assert Point.UNITS == "mm" and "UNITS" not in Point.__record_fields__
    assert dict(Point.__record_defaults__) == {"label": "", "tags": (), "meta": {}}
    assert repr(Plain("z")) == "Plain(b='z', a=1)"
    assert not hasattr(Plain("z"), "__dict__")


def test_positional_keyword_and_defaults() -> None:
    p = Point(1, 2)
    assert (p.x, p.y, p.label, p.tags, dict(p.meta)) == (1, 2, "", (), {})
    assert Point(1, 2, "a", ["t"]) == Point(y=2, x=1, tags=("t",), label="a")
    assert Plain(a=3, b="q").a == 3


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Point(1), r"Point.__init__\(\) missing 1 required positional argument: 'y'"),
        (lambda: Point(y=1), r"Point.__init__\(\) missing 1 required positional argument: 'x'"),
        (lambda: Point(1, 2, "a", (), {}, 6), r"Point.__init__\(\) takes from 3 to 6 positional arguments but 7 were given"),
        (lambda: Point(1, 2, colour="red"), r"Point.__init__\(\) got an unexpected keyword argument 'colour'"),
        (lambda: Point(1, 2, x=1), r"Point.__init__\(\) got multiple values for argument 'x'"),
    ],
)
def test_missing_and_extra_arguments_name_the_record_and_the_field(call: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        call()  # type: ignore[operator]


def test_post_init_runs_on_construct_replace_and_unpickle() -> None:
    POSTED.clear()
    p = Point(1, 2, "first", ["a"], {"k": 1})
    assert POSTED == ["first"] and p.tags == ("a",) and isinstance(p.meta, MappingProxyType)
    q = p.replace(label="second")
    assert POSTED == ["first", "second"] and q.meta == p.meta and q.tags == ("a",)
    with pytest.raises(ValueError, match="Point.x must be >= 0, got -1"):
        p.replace(x=-1)
    r = pickle.loads(pickle.dumps(p))  # the mappingproxy travels as a dict; __post_init__ re-wraps it
    assert r == p and isinstance(r.meta, MappingProxyType) and POSTED[-1] == "first"
    with pytest.raises(AttributeError, match=r"Point is frozen: make a changed copy with .replace\(x=...\)"):
        p.x = 3  # type: ignore[misc]
    with pytest.raises(AttributeError, match="frozen"):
        del p.x  # type: ignore[misc]


def test_value_equality_and_hash_need_the_same_type() -> None:
    assert Point(1, 2, meta={"a": 1}) == Point(1, 2, meta={"a": 1}) and hash(Point(1, 2, meta={"a": 1})) == hash(Point(1, 2, meta={"a": 1}))
    assert Plain("a", 1) != Point(1, 2) and Plain("a", 1) != ("a", 1)


def _define(name: str, body: dict[str, object]) -> type:
    return _RecordType(name, (Record,), {"__module__": __name__, "__qualname__": name, **body})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"__annotations__": {"x": "int"}, "__init__": lambda self: None}, "record Bad defines __init__: .* __post_init__"),
        ({"__annotations__": {"x": "int"}, "__slots__": ("x",)}, "record Bad defines __slots__"),
        ({"__annotations__": {"a": "int", "b": "int"}, "a": 1}, "record Bad: field 'b' has no default but follows 'a'"),
        ({"__annotations__": {}}, "record Bad declares no fields"),
        ({"__annotations__": {"K": "ClassVar[int]"}, "K": 1}, "record Bad declares no fields"),
        ({"__annotations__": {"__x": "int"}}, "record Bad: field '__x' starts with '__'"),
        ({"__annotations__": {"x=1): pass\nimport os #": "int"}}, "record Bad: field .* is not a Python identifier"),
        ({"__annotations__": {"lambda": "int"}}, "record Bad: field 'lambda' is not a Python identifier"),
    ],
)
def test_a_record_written_another_way_is_refused_naming_it(body: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        _define("Bad", body)


def test_a_field_declared_again_by_a_subclass_is_refused() -> None:
    with pytest.raises(TypeError, match="record Again declares field 'b' again"):
        _RecordType("Again", (Plain,), {"__module__": __name__, "__qualname__": "Again", "__annotations__": {"b": "str"}})
    sub = _RecordType("More", (Plain,), {"__module__": __name__, "__qualname__": "More", "__annotations__": {"c": "int"}, "c": 0})
    assert sub.__record_fields__ == ("b", "a", "c") and sub.__slots__ == ("c",)  # type: ignore[attr-defined]


def test_lazy_annotations_are_read_through_annotationlib_or_refused() -> None:
    # Python 3.14 leaves __annotate__ (no __annotations__) in the body of a module without the future import
    def annotate(fmt: int) -> dict[str, object]:
        return {"x": "int", "y": "str"}

    body: dict[str, object] = {"__annotate__": annotate}
    if sys.version_info >= (3, 14):  # pragma: no cover - this suite's interpreters are 3.11-3.13
        assert _define("Lazy", body).__record_fields__ == ("x", "y")  # type: ignore[attr-defined]
    else:
        with pytest.raises(TypeError, match="record Lazy: its class body has __annotate__ but no __annotations__"):
            _define("Lazy", body)


def test_record_imports_neither_typing_nor_dataclasses_nor_inspect() -> None:
    import subprocess

    code = (
        "import sys; import hwprofile._record as r\n"
        "class P(r.Record):\n    x: 'int'\n    y: 'int' = 2\n"
        "assert P(1).y == 2\n"
        "print(sorted(m for m in ('typing', 'dataclasses', 'inspect', 'annotationlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_init_is_compiled_on_first_construction_and_behaves_the_same() -> None:
    # the stand-in (hwprofile._record._first_init) and the compiled __init__ give the same results and errors
    fresh = _define("Fresh", {"__annotations__": {"x": "int", "y": "int"}, "y": 5})
    stand_in = fresh.__init__  # type: ignore[misc]
    assert stand_in.__code__.co_varnames[:3] == ("self", "args", "kwargs")
    with pytest.raises(TypeError, match=r"Fresh.__init__\(\) missing 1 required positional argument: 'x'"):
        fresh()
    compiled = fresh.__init__  # type: ignore[misc]
    assert compiled is not stand_in and compiled.__code__.co_varnames[:3] == ("self", "x", "y")
    with pytest.raises(TypeError, match=r"Fresh.__init__\(\) missing 1 required positional argument: 'x'"):
        fresh()
    assert repr(fresh(1)) == "Fresh(x=1, y=5)" and fresh.__init__ is compiled  # type: ignore[misc]
