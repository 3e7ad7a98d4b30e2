"""The op table is the single source of truth: no consumer keeps its own list of ops.

A list, tuple, set or dict literal naming three or more ops (by their string names) anywhere in the
core, the plugins, the tests or the benchmarks is a copy of ``hwprofile.optable.OPS`` that a new op
would silently miss (the old contract tests iterated such a list, so a new op got no contract test).
Iterate ``OPS`` instead, or derive the subset from its facts (``op.scaled``, ``op.threshold`` ...).
Registries keyed by op that hold facts of their own are named below; each is checked to cover the table.
"""

from __future__ import annotations

import ast
from pathlib import Path

from hwprofile.optable import OPS

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["core/src", "plugins", "tests", "benchmarks", "examples", "pytest-hwprofile/src"]
#: registries keyed by op name with facts of their own: REFERENCES (tests/ops/test_contract.py checks every op
#: has one), a test's float64 truth, which the shipped code must not hold
REGISTRIES = {("tests/ops/reference.py", "REFERENCES")}
#: what ships: its per-op facts live in the op table (or in a plugin's KernelSpec, one per op), never in a dict keyed by op
SHIPPED = ["core/src", "plugins/*/src", "examples/*/src", "pytest-hwprofile/src"]


def _literals(tree: ast.AST) -> list[tuple[int, str | None, set[str]]]:
    """(line, assigned name or None, op names) of each container literal naming ops."""
    parents: dict[ast.AST, ast.AST] = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            elts = node.elts
        elif isinstance(node, ast.Dict):
            elts = [k for k in node.keys if k is not None]
        else:
            continue
        names = {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in OPS}
        if len(names) >= 3:
            parent = parents.get(node)
            while isinstance(parent, ast.Call):  # MappingProxyType({...}), tuple([...]): the literal of an assignment still
                parent = parents.get(parent)
            target = None
            if isinstance(parent, ast.Assign | ast.AnnAssign):
                t = parent.targets[0] if isinstance(parent, ast.Assign) else parent.target
                target = t.id if isinstance(t, ast.Name) else None
            out.append((node.lineno, target, names))
    return out


def test_no_consumer_lists_the_ops_by_hand() -> None:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel == "core/src/hwprofile/optable.py" or ".venv" in path.parts:
                continue
            for line, target, names in _literals(ast.parse(path.read_text(), rel)):
                if (rel, target) not in REGISTRIES and target != "__all__":  # __all__ names functions, statically
                    found.append(f"{rel}:{line} lists {sorted(names)}")
    assert not found, "ops listed by hand instead of read from hwprofile.optable.OPS:\n" + "\n".join(found)


def test_the_scan_sees_a_hand_list() -> None:
    src = 'EVERY = ["router_gemm", "linear_bf16_fp32", "gemv"]\nfor op in ("gemv", "fp8_gemv"): pass\n'
    assert [(line, target) for line, target, _ in _literals(ast.parse(src))] == [(1, "EVERY")]


def _op_keyed_dicts(tree: ast.AST) -> list[tuple[int, list[str]]]:
    """(line, op names) of each dict literal or ``dict(op=...)`` call with an op name as a key."""
    out = []
    for node in ast.walk(tree):
        keys: list[str] = []
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value in OPS]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            keys = [k.arg for k in node.keywords if k.arg in OPS]
        if keys:
            out.append((node.lineno, keys))
    return out


def test_no_shipped_module_keeps_a_dict_keyed_by_op() -> None:
    """One op's fact in a dict of its own (``{"gemv": ...}``) is a second table a new op would silently miss."""
    found = []
    for top in SHIPPED:
        for path in sorted(ROOT.glob(f"{top}/**/*.py")):
            rel = str(path.relative_to(ROOT))
            if rel == "core/src/hwprofile/optable.py":
                continue
            found += [f"{rel}:{line} keys {keys}" for line, keys in _op_keyed_dicts(ast.parse(path.read_text(), rel))]
    assert not found, "dicts keyed by op names outside the op table (declare the fact in hwprofile.optable):\n" + "\n".join(found)


def test_the_scan_sees_an_op_keyed_dict() -> None:
    src = 'A = {"gemv": 1}\nB = dict(router_gemm=2)\nC = {op: 3 for op in OPS}\nD = {"gemv.split_k": True}\n'
    assert _op_keyed_dicts(ast.parse(src)) == [(1, ["gemv"]), (2, ["router_gemm"])]


#: where shipped code may name an op by its string: the public face, one short function per op (its entry by name)
FACES = {"core/src/hwprofile/ops/__init__.py"}


def _op_names_used(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, op) of each op name compared with (``op == "gemv"``, ``op in {...}``), listed in a container, or looked up
    (``ENTRIES["router_gemm"]``): a branch or a set of ops a new op would silently miss."""
    from hwprofile.optable import TABLE

    out = []
    for node in ast.walk(tree):
        consts: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            consts = [node.left, *node.comparators]
        elif isinstance(node, ast.List | ast.Tuple | ast.Set):
            consts = list(node.elts)
        elif isinstance(node, ast.Subscript):
            consts = [node.slice]
        out += [(node.lineno, c.value) for c in consts if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in TABLE]
    return out


def test_no_shipped_module_branches_on_an_op_name() -> None:
    """Which served layers feed an op, which GEMM a gate's logits come from: facts of the op table (``OpDef.layer``,
    ``GateDef.gemm``), never ``op in {"router_gemm", "linear_bf16_fp32"}`` in the module that reads them."""
    found = []
    for top in SHIPPED:
        for path in sorted(ROOT.glob(f"{top}/**/*.py")):
            rel = str(path.relative_to(ROOT))
            if rel == "core/src/hwprofile/optable.py" or rel in FACES:
                continue
            found += [f"{rel}:{line} names {op!r}" for line, op in _op_names_used(ast.parse(path.read_text(), rel))]
    assert not found, "ops named outside the op table (declare the fact in hwprofile.optable):\n" + "\n".join(found)


def test_the_scan_sees_an_op_name_branch() -> None:
    src = 'if op == "gemv": pass\nA = {"router_gemm", "x"}\nB = E["moe_gate"]\nC = op == "gemv.split_k"\n'
    assert _op_names_used(ast.parse(src)) == [(1, "gemv"), (2, "router_gemm"), (3, "moe_gate")]
