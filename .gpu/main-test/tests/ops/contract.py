"""The op contract as checks any op can be put through: every op of the table, and one a test defines.

An :class:`OpUnderTest` is an op's table entry, the function callers call, and its float64
reference. Each ``check_*`` raises AssertionError when the op breaks a promise of the contract in
``hwprofile.ops`` (shape and dtype of the result on every path, batch dimensions, ``out=``, empty
problems, strided weights, errors naming the argument, precision against float64, torch.compile).
tests/ops/test_contract.py runs them over ``hwprofile.optable.OPS``; tests/ops/test_new_op.py over
an op defined inside the test, and shows that a wrong fallback fails them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from hwprofile.optable import OpDef

from .reference import REFERENCES, operands

torch = pytest.importorskip("torch")

K = 64  # K of the CPU checks: the fallback takes any K


class OpUnderTest:
    """One op to check: its table entry, the callable (``fn(*operands, out=None)``) and its float64 reference."""

    def __init__(self, op: OpDef, fn: Callable[..., Any], reference: Callable[..., Any] | None = None) -> None:
        self.op, self.fn = op, fn
        self.reference = reference or REFERENCES[op.name]
        self.out_dtype = getattr(torch, op.out_dtype)

    def operands(self, lead: tuple[int, ...], n: int, k: int = K, **kw: Any) -> tuple[Any, ...]:
        return operands(self.op, lead, n, k, **kw)

    def __repr__(self) -> str:
        return f"OpUnderTest({self.op.name!r})"


def bf16_ulp(v: Any) -> Any:
    """Spacing of bf16 numbers at |v| (8 significant bits)."""
    e = torch.floor(torch.log2(v.abs().clamp_min(2.0**-126)))
    return torch.pow(2.0, e - 7)


def assert_precise(t: OpUnderTest, out: Any, args: tuple[Any, ...]) -> None:
    """Within half a unit in the last place of the output dtype of the float64 reference, plus fp32 accumulation error.

    The kernels accumulate in fp32 and round once; a fallback must be at least as precise. The
    accumulation term is 1e-5 of the reference evaluated on absolute values (the sum without cancellation).
    """
    ref = t.reference(*args)
    magnitude = t.reference(*(a.double().abs() for a in args)).abs()
    half_ulp = bf16_ulp(ref) * 0.5 if t.out_dtype == torch.bfloat16 else ref.abs() * 2.0**-24
    err = (out.double() - ref).abs()
    bad = err > half_ulp + 1e-5 * magnitude + 1e-30
    worst = float(err.max()) if err.numel() else 0.0
    assert not bool(bad.any()), f"{t.op.name}: {int(bad.sum())} of {bad.numel()} elements off the float64 reference (max {worst:.3g})"


def check_result(t: OpUnderTest, out: Any, args: tuple[Any, ...], shape: tuple[int, ...]) -> None:
    assert tuple(out.shape) == shape, f"{t.op.name}: shape {tuple(out.shape)}, contract {shape}"
    assert out.dtype == t.out_dtype, f"{t.op.name}: dtype {out.dtype}, contract torch.{t.op.out_dtype}"
    assert_precise(t, out, args)


def check_batch_dims(t: OpUnderTest) -> None:
    for lead in [(), (1,), (5,), (2, 3), (2, 1, 4)]:
        args = t.operands(lead, 24)
        check_result(t, t.fn(*args), args, (*lead, 24))


def check_out(t: OpUnderTest) -> None:
    args = t.operands((2, 3), 24)
    out = torch.full((2, 3, 24), float("nan"), dtype=t.out_dtype)
    r = t.fn(*args, out=out)
    assert r is out and not torch.isnan(out).any(), f"{t.op.name}: out= was not written and returned"
    assert torch.equal(out, t.fn(*args)), f"{t.op.name}: out= differs from the returned result"
    name = re.escape(t.op.name)
    wrong = torch.float16 if t.out_dtype != torch.float16 else torch.float32
    with pytest.raises(ValueError, match=rf"{name}: out must be torch\.\w+ of shape \(2, 3, 24\)"):
        t.fn(*args, out=torch.empty(2, 3, 24, dtype=wrong))
    with pytest.raises(ValueError, match=rf"{name}: out must be .* of shape \(2, 3, 24\)"):
        t.fn(*args, out=torch.empty(6, 24, dtype=t.out_dtype))


def check_empty(t: OpUnderTest) -> None:
    for m, n, k in [(0, 24, K), (3, 0, K), (0, 0, K), (3, 24, 0), (0, 24, 0)]:
        out = t.fn(*t.operands((m,), n, k))
        got = f"{out.dtype} {tuple(out.shape)}"
        assert out.shape == (m, n) and out.dtype == t.out_dtype, f"{t.op.name}: empty problem {(m, n, k)} gave {got}"
        assert not out.any(), f"{t.op.name}: K = 0 must give zeros"


def check_strided_weights(t: OpUnderTest) -> None:
    for layout in ("padded", "column_major"):
        args = t.operands((3,), 40, layout=layout)
        assert not args[1].is_contiguous()
        check_result(t, t.fn(*args), args, (3, 40))


def check_errors_name_the_argument(t: OpUnderTest) -> None:
    args = list(t.operands((2,), 8))
    name, xn, wn = re.escape(t.op.name), t.op.args[0], t.op.args[1]
    bad_x = args.copy()
    bad_x[0] = args[0].to(torch.float16 if args[0].dtype != torch.float16 else torch.float32)
    with pytest.raises(ValueError, match=rf"{name}: {xn} must be torch\.{t.op.x_dtype}"):
        t.fn(*bad_x)
    bad_w = args.copy()
    bad_w[1] = args[1].to(torch.float16 if args[1].dtype != torch.float16 else torch.float32)
    with pytest.raises(ValueError, match=rf"{name}: {wn} must be torch\.{t.op.w_dtype}"):
        t.fn(*bad_w)
    short = args.copy()
    short[0] = args[0][..., : K // 2]
    with pytest.raises(ValueError, match=rf"{name}: {xn} must be \[\.\.\., K\] with K={K}"):
        t.fn(*short)


def check_compiled(t: OpUnderTest) -> None:
    """Under torch.compile (fullgraph, the aot_eager backend: no C++ compiler needed) the op gives the eager result."""
    args = t.operands((4,), 16)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: t.fn(*a), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*args), t.fn(*args)), f"{t.op.name}: compiled and eager results differ"


CHECKS: list[Callable[[OpUnderTest], None]] = [
    check_batch_dims,
    check_out,
    check_empty,
    check_strided_weights,
    check_errors_name_the_argument,
    check_compiled,
]
