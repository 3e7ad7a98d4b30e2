"""Adding an op is one OpDef, one fallback entry, one short public function and a kernel: the recipe in
``hwprofile.ops``' docstring ("Adding an op"), carried out inside the test.

A toy op (``neg_linear_fp32``: ``-(x . w^T)`` in float32) is defined here exactly as the recipe says and
put through the whole contract suite (tests/ops/contract.py) through the op table. With the
fallback a dtype-based choice would have picked (the plain fp32 GEMM of the other fp32-output ops),
the suite fails: that is what the old layout shipped with every test green.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import hwprofile
from hwprofile import ops
from hwprofile.ops import _dispatch, _fallbacks, _library
from hwprofile.optable import OPS, OpDef

from .contract import CHECKS, OpUnderTest

torch = pytest.importorskip("torch")

# step 1: the OpDef (constant bounds: a toy has no settings of its own)
TOY = OpDef(
    "neg_linear_fp32",
    "negated linear: x[..., K] bf16 . w[N, K]^T -> -[..., N] float32",
    args=("x", "w"),
    w_dtype="bfloat16",
    out_dtype="float32",
    fallback="-torch.mm(out_dtype=torch.float32)",
    max_m=16,
    min_n=1,
    max_n=4096,
    min_k=8,
    max_k=8192,
    threshold="max_tokens",
    grid=((1, 256, 512),),
    settings=(),
)


def neg_mm_fp32(x: Any, w: Any) -> Any:  # step 2: the fallback
    return _fallbacks.mm_fp32(x, w).neg_()


def reference(x: Any, w: Any) -> Any:  # the float64 truth (tests/ops/reference.py for a real op)
    return -(x.double() @ w.double().t())


_defined: dict[str, tuple[Any, Callable[..., Any]]] = {}  # namespace -> (library fragment, kept alive; the public function)


def _define(fallback: Callable[..., Any], ns: str) -> Callable[..., Any]:
    """Steps 2-3 as the package does them: the fallback entry, the run-time entry, the custom op, the public function.

    Once per namespace and process: torch cannot define an operator twice.
    """
    if ns in _defined:
        return _defined[ns][1]
    ops.register()
    entry = _dispatch._Entry(TOY, fallback)
    entry.bind(torch)
    lib = torch.library.Library(ns, "FRAGMENT")
    _library.define(torch, lib, entry)

    def neg_linear_fp32(x: Any, w: Any, *, out: Any = None) -> Any:  # step 3: the public function
        return _dispatch.call(entry, x, w, None, out)

    _defined[ns] = (lib, neg_linear_fp32)
    return neg_linear_fp32


@pytest.fixture
def in_table(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(OPS, TOY.name, TOY)
    monkeypatch.setitem(_fallbacks.FALLBACKS, TOY.name, neg_mm_fp32)
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    yield
    hwprofile.reset()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_a_new_op_passes_the_contract_suite(in_table: None, check: Callable[[OpUnderTest], None]) -> None:
    fn = _define(neg_mm_fp32, "hwprofile_toy_ok")
    check(OpUnderTest(TOY, fn, reference))


PRECISION_CHECKS = [c for c in CHECKS if c.__name__ in ("check_batch_dims", "check_strided_weights")]


@pytest.mark.parametrize("check", PRECISION_CHECKS, ids=lambda c: c.__name__)
def test_a_wrong_fallback_fails_the_suite(in_table: None, check: Callable[[OpUnderTest], None]) -> None:
    fn = _define(_fallbacks.mm_fp32, "hwprofile_toy_wrong")  # what choosing the fallback by output dtype gave
    with pytest.raises(AssertionError, match="off the float64 reference"):
        check(OpUnderTest(TOY, fn, reference))


def test_the_new_op_routes_through_the_table(in_table: None) -> None:
    """decide() reads the new entry's bounds like any op's (no kernel in any plugin: the fallback, saying so)."""
    d = ops.decide(TOY.name, hwprofile.profile(0), m=1, n=256, k=512)
    assert d.path == "fallback" and d.gate == "no_kernel" and "provides no neg_linear_fp32 kernel" in d.reason


def test_missing_pieces_are_named() -> None:
    table = {**OPS, TOY.name: TOY}
    public = {name: (lambda: None) for name in OPS}
    assert _dispatch.missing_pieces(table, _fallbacks.FALLBACKS, public) == [
        "op 'neg_linear_fp32' has no fallback: add it to hwprofile.ops._fallbacks.FALLBACKS",
        "op 'neg_linear_fp32' has no public function: define hwprofile.ops.neg_linear_fp32()",
    ]
    assert _dispatch.missing_pieces(OPS, {**_fallbacks.FALLBACKS, "ghost": len}) == [
        "hwprofile.ops._fallbacks.FALLBACKS has 'ghost', not in the op table (optable.OPS)"
    ]


@pytest.mark.parametrize("torch_first", [True, False])
def test_a_table_entry_alone_stops_the_import_naming_what_is_missing(torch_first: bool) -> None:
    """Only the OpDef added: importing hwprofile.ops says which pieces are missing (not a bare KeyError), torch loaded or not."""
    code = (
        ("import torch\n" if torch_first else "")
        + "from hwprofile import optable\n"
        + "optable.OPS['toy'] = optable.OpDef('toy', 'toy', args=('x', 'w'), w_dtype='bfloat16', out_dtype='float32', fallback='f',"
        + " max_m=1, min_n=1, max_n=1, min_k=1, max_k=1, threshold='max_tokens', grid=(), settings=())\n"
        + "import hwprofile.ops\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "HwprofileError: hwprofile.ops: the op table is incomplete: op 'toy' has no fallback" in r.stderr, r.stderr[-2000:]
