"""The kernel pipeline's modules sit in no import circle (module-level imports, TYPE_CHECKING ones included)."""

from __future__ import annotations

import ast
from pathlib import Path

import hwprofile

PKG = Path(hwprofile.__file__).parent
STAGES = {"kernelspec", "toolchain", "kcache", "launch", "jit"}


def module_imports(name: str) -> set[str]:
    """hwprofile modules that ``name`` imports at module level (inside ``if TYPE_CHECKING:`` too)."""
    tree = ast.parse((PKG / f"{name}.py").read_text())
    out: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If):
            body.extend(node.body)
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hwprofile."):
            out.add(node.module.split(".")[1])  # type: ignore[union-attr]
    return {m for m in out if (PKG / f"{m}.py").exists()}


def test_no_import_circle_runs_through_the_kernel_pipeline() -> None:
    graph = {p.stem: module_imports(p.stem) for p in PKG.glob("*.py")}
    for start in STAGES:
        todo, seen = list(graph[start]), set()
        while todo:
            m = todo.pop()
            assert m != start, f"import circle through {start}"
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))


def test_hookspecs_and_kernelspec_import_no_compile_machinery() -> None:
    assert not module_imports("hookspecs") & {"jit", "toolchain", "kcache", "launch"}
    assert not module_imports("kernelspec") & {"jit", "toolchain", "kcache", "launch", "registry"}


def test_errors_imports_no_hwprofile_module() -> None:
    """Every module imports errors: one import there, even for the type checker, closes a circle with all."""
    assert not module_imports("errors")
