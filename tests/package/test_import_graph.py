"""The import graph has the pipeline's shape: no circle, counting imports inside functions, and each layer
imports only what lies below it (device -> plugins -> settings/tuning -> profile -> kernels -> ops, tools on top).

Imports under ``if TYPE_CHECKING:`` never run, but a circle through them is still a knot a reader (and a type
checker) must untie: the no-circle test counts them too (a record or protocol in a leaf module breaks such a
circle); the layering tests read the imports that run.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import hwprofile

PKG = Path(hwprofile.__file__).parent
ROOT = Path(__file__).resolve().parents[2]


def _modules(pkg_dir: Path, pkg: str) -> dict[str, Path]:
    """Every module of the package at ``pkg_dir`` by dotted name (a package by its own name)."""
    out = {}
    for p in sorted(pkg_dir.rglob("*.py")):
        rel = p.relative_to(pkg_dir).with_suffix("")
        parts = [pkg, *rel.parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST, typing_too: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that can run: at module level, in functions and classes; under ``if TYPE_CHECKING:`` only if ``typing_too``."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node) and not typing_too:
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif (lazy := _own_lazy_import(node)) is not None:
            yield lazy
        todo.extend(ast.iter_child_nodes(node))


def _own_lazy_import(node: ast.AST) -> ast.ImportFrom | None:
    """A package's lazy face, ``importlib.import_module(f"{__name__}.sub")``, as the ``from . import sub`` it is."""
    if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args):
        return None
    arg = node.args[0]
    if not (isinstance(arg, ast.JoinedStr) and len(arg.values) == 2):
        return None
    head, tail = arg.values
    if not (isinstance(head, ast.FormattedValue) and isinstance(head.value, ast.Name) and head.value.id == "__name__"):
        return None
    if not (isinstance(tail, ast.Constant) and isinstance(tail.value, str) and re.fullmatch(r"\.\w+", tail.value)):
        return None
    return ast.ImportFrom(module=None, names=[ast.alias(tail.value[1:])], level=1, lineno=node.lineno)


def imports_of(name: str, path: Path, known: set[str], typing_too: bool = False) -> set[str]:
    """The modules of ``known`` that module ``name`` (file ``path``) imports anywhere it can run.

    Relative imports are resolved against ``name``'s package. ``from pkg import sub`` (``sub`` a module)
    counts ``pkg.sub``; ``from pkg import name`` (a name ``pkg/__init__.py`` defines) counts ``pkg``.
    Importing ``pkg.sub`` runs ``pkg/__init__.py`` first, whatever that imports, so each package above
    the target counts too, except the packages ``name`` itself lies in: they are imported before it.
    """
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    mine = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)} | ({name} if is_pkg else set())
    out: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text()), typing_too):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = here[: len(here) - node.level + 1] if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            subs = [f"{mod}.{a.name}" for a in node.names]
            targets = [t for t in subs if t in known]
            if len(targets) < len(subs):  # a name the module itself defines (or a star import)
                targets.append(mod)
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
            t = t.rpartition(".")[0]
            while t:  # each package above the target runs its __init__ first, unless this module lies in it
                if t in known and t not in mine:
                    out.add(t)
                t = t.rpartition(".")[0]
    return out


def graph_of(pkg_dir: Path, pkg: str, typing_too: bool = False) -> dict[str, set[str]]:
    mods = _modules(pkg_dir, pkg)
    return {m: imports_of(m, p, set(mods), typing_too) for m, p in mods.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest import circle through each module that lies on any, each as ``[a, b, ..., a]``, deduplicated."""
    found: dict[frozenset[str], list[str]] = {}
    for start in sorted(graph):
        prev: dict[str, str] = {}
        todo, seen = [start], {start}
        while todo and start not in prev:
            nxt = []
            for m in todo:
                for t in sorted(graph.get(m, ())):
                    if t == start and start not in prev:
                        prev[start] = m
                    elif t not in seen:
                        seen.add(t)
                        prev[t] = m
                        nxt.append(t)
            todo = nxt
        if start in prev:
            path, m = [start], prev[start]
            while m != start:
                path.append(m)
                m = prev[m]
            path = [start, *reversed(path[1:]), start]
            found.setdefault(frozenset(path), path)
    return list(found.values())


GRAPH = graph_of(PKG, "hwprofile")
#: with the imports under ``if TYPE_CHECKING:``: what a reader and a type checker follow
TYPED_GRAPH = graph_of(PKG, "hwprofile", typing_too=True)


def test_a_sibling_module_is_not_an_import_of_the_package(tmp_path: Path) -> None:
    """``from . import sub`` imports ``sub``; ``from . import NAME`` (defined in ``__init__``) imports the package."""
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a\nNAME = 1\n")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import NAME\n")
    assert graph_of(pkg, "p") == {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}}


def test_the_graph_sees_function_level_imports() -> None:
    """The reader itself: an import inside a function counts, one under TYPE_CHECKING does not."""
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\ndef f():\n    from .c import x\n"
    tree = ast.parse(src)
    found = {n.module for n in _import_nodes(tree) if isinstance(n, ast.ImportFrom)}
    assert found == {"typing", "c"}
    assert {a.name for n in _import_nodes(tree, typing_too=True) for a in n.names} == {"TYPE_CHECKING", "b", "x"}


def test_no_import_circle() -> None:
    found = circles(TYPED_GRAPH)
    assert not found, (
        "import circles (imports inside functions, under TYPE_CHECKING, and the packages a submodule's import runs, counted):\n"
        + "\n".join(" -> ".join(c) for c in found)
    )


def test_the_circle_check_sees_a_type_checking_import(tmp_path: Path) -> None:
    """A circle closed only by an ``if TYPE_CHECKING:`` import is found (hookspecs typing ``Profile`` was one)."""
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    assert circles(graph_of(pkg, "p")) == []
    assert circles(graph_of(pkg, "p", typing_too=True)) == [["p.a", "p.b", "p.a"]]


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's floor in a graph without circles: 0 for a module importing none of the package, else one above
    the highest module it imports (so every import goes down: none climbs)."""
    out: dict[str, int] = {}

    def floor(m: str) -> int:
        if m not in out:
            out[m] = 1 + max((floor(t) for t in graph[m]), default=-1)
        return out[m]

    for m in graph:
        floor(m)
    return out


def test_the_leaves_every_layer_shares_sit_below_their_readers() -> None:
    """The version and the registry's records on the ground floors; the stamps below settings and tuning, which read them."""
    assert not circles(TYPED_GRAPH)  # floors need a graph without circles (test_no_import_circle names them)
    f = floors(TYPED_GRAPH)
    for leaf in ("hwprofile._version", "hwprofile._registry_records", "hwprofile.errors"):
        assert f[leaf] <= 1, f"{leaf} is on floor {f[leaf]}: it imports {sorted(TYPED_GRAPH[leaf])}"
    assert f["hwprofile.stamps"] < min(f["hwprofile.settings"], f["hwprofile.tuning"], f["hwprofile.registry"])
    assert "hwprofile.profiles" not in reachable(TYPED_GRAPH, "hwprofile.hookspecs")  # hooks type a protocol


def test_a_submodule_import_runs_its_package(tmp_path: Path) -> None:
    """``from .ops import _dispatch`` runs ``ops/__init__.py``, so a function-level import there back to the importer is a circle."""
    pkg = tmp_path / "p"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ops" / "__init__.py").write_text("from . import _dispatch\ndef f():\n    from .. import selftest\n")
    (pkg / "ops" / "_dispatch.py").write_text("from .. import errors\n")
    (pkg / "errors.py").write_text("")
    (pkg / "selftest.py").write_text("def g():\n    from .ops import _dispatch\n")
    graph = graph_of(pkg, "p")
    assert graph["p.selftest"] == {"p.ops", "p.ops._dispatch"} and graph["p.ops._dispatch"] == {"p.errors"}
    assert circles(graph) == [["p.ops", "p.selftest", "p.ops"]]


def test_nothing_names_a_module_to_import_it() -> None:
    """A module named in a string (``import_module("hwprofile.retune")``, ``"hwprofile.retune:at_first_profile"``) is an
    import the graph cannot see: a layer reaches the tools above it through a hook (hwprofile.hookspecs) instead."""
    named = re.compile(r"\.?hwprofile(\.\w+)*(:\w+)?|\.\w+")
    found = []
    for name, path in _modules(PKG, "hwprofile").items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__"):
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and named.fullmatch(arg.value):
                    found.append(f"{name}:{node.lineno} imports {arg.value!r}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"hwprofile(\.\w+)+:\w+", node.value):
                found.append(f"{name}:{node.lineno} names {node.value!r}")
    assert not found, f"imports by name: {found}"


def test_the_lazy_faces_are_edges() -> None:
    assert "hwprofile.kernels._pipeline" in GRAPH["hwprofile.kernels"]


@pytest.mark.parametrize("low", ["hwprofile.device", "hwprofile.catalog"])
def test_detection_never_reaches_profiles(low: str) -> None:
    bad = reachable(GRAPH, low) & {"hwprofile.profiles", "hwprofile.registry", "hwprofile.settings"}
    assert not bad, f"{low} imports {sorted(bad)}: detection sits below plugins, settings and profiles"


def test_kernels_never_reach_settings_registry_or_ops() -> None:
    for mod in (m for m in GRAPH if m.startswith("hwprofile.kernels")):
        bad = {m for m in reachable(GRAPH, mod) if m.split(".")[1:2] in (["settings"], ["registry"], ["ops"], ["profiles"])}
        assert not bad, f"{mod} imports {sorted(bad)}: the kernel pipeline sits below settings, registry, profiles and ops"


def test_errors_imports_only_the_redaction() -> None:
    """Every module imports errors: one import there closes a circle with all of them, unless the module
    imported imports nothing of hwprofile (_redact: every error message passes it)."""
    assert GRAPH["hwprofile.errors"] == {"hwprofile._redact"} and not GRAPH["hwprofile._redact"]


def test_env_imports_only_errors() -> None:
    """Every layer reads its control variables from _env, so it sits at the bottom with errors (and the
    redaction, the store URL's check and the record base, which sit below it)."""
    assert GRAPH["hwprofile._env"] == {"hwprofile.errors", "hwprofile._redact", "hwprofile._storeurl", "hwprofile._record"}
    assert not GRAPH["hwprofile._record"]  # a leaf: every record of every layer derives from it
    assert GRAPH["hwprofile._storeurl"] == {"hwprofile._redact"}


def test_kernels_face_is_the_pipelines() -> None:
    """hwprofile.kernels' lazy face (a PEP 562 ``__getattr__``, the deferred import of the pipeline) is written once, as its
    ``__all__``: exactly the public names ``_pipeline`` defines or hands on (``from .x import a as a``), which is what the
    type checker's star import reads; each resolves to ``_pipeline``'s object."""
    import hwprofile.kernels
    from hwprofile.kernels import _pipeline

    tree = ast.parse((ROOT / "core" / "src" / "hwprofile" / "kernels" / "_pipeline.py").read_text())
    exported = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            exported.add(node.name)
        elif isinstance(node, ast.Assign):
            exported |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):
            exported |= {a.name for a in node.names if a.asname == a.name}
    assert sorted(n for n in exported if not n.startswith("_")) == sorted(hwprofile.kernels.__all__)
    assert not hasattr(_pipeline, "__all__")  # no second list
    for name in hwprofile.kernels.__all__:
        assert getattr(hwprofile.kernels, name) is getattr(_pipeline, name)
    with pytest.raises(AttributeError, match="no attribute 'kcache'"):
        hwprofile.kernels.kcache  # noqa: B018 - a stage _pipeline uses is not the face


PLUGIN_PACKAGES = sorted(p for p in (ROOT / "plugins").glob("*/src/*") if (p / "__init__.py").exists())


def test_plugin_packages_are_found() -> None:
    assert {p.name for p in PLUGIN_PACKAGES} >= {"hwprofile_sm90", "hwprofile_sm100", "hwprofile_sm120"}


@pytest.mark.parametrize(
    "pkg_dir",
    PLUGIN_PACKAGES,
    ids=lambda p: p.name,
)
def test_plugins_import_only_the_plugin_api(pkg_dir: Path) -> None:
    """A plugin builds on ``hwprofile.plugin`` (and ``hwprofile``) only: what else it reached into could change under it."""
    allowed = {"hwprofile", "hwprofile.plugin"}
    for name, path in _modules(pkg_dir, pkg_dir.name).items():
        for node in _import_nodes(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if not node.level else []
            for m in mods:
                if m == "hwprofile" or m.startswith("hwprofile."):
                    assert m in allowed, f"{name} imports {m}: plugins import only hwprofile.plugin (and hwprofile)"


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md describes the layout as built: a module added (or split off) without a word there fails here."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    pkg = ROOT / "core" / "src" / "hwprofile"
    missing = [str(p.relative_to(pkg)) for p in sorted(pkg.rglob("*.py"))
               if p.stem != "__init__" and "/build/" not in str(p) and not re.search(rf"`[\w/]*\b{re.escape(p.stem)}(\.py)?\b", doc)]
    assert not missing, f"docs/architecture.md ('Modules') names no module {missing}: add a word on each"


def test_no_module_is_over_900_lines() -> None:
    """docs/architecture.md, "Bounds that hold": a module past 900 lines is split along its own sections, never let grow."""
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "core" / "src").rglob("*.py"))
            if "/build/" not in str(p) and (n := len(p.read_text().splitlines())) > 900}
    assert not long, long
