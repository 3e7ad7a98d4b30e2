"""Aliasing and layout through the public ops, on the CPU seam: a kernel (which declares its pointers
``__restrict__``) is never handed an ``out`` that overlaps an operand; overlapping and expanded
(zero-stride) operands are read correctly (the fallback takes what is not contiguous); an ``out``
whose own elements overlap is a ValueError. (torch has no negative strides: ``as_strided`` refuses them.)
"""

from __future__ import annotations

from typing import Any

import pytest

from hwprofile import ops
from hwprofile.ops._dispatch import _overlap, _self_overlapping

from .reference import _gemm
from .test_gates import FakeLauncher, fake, rand  # noqa: F401 - the fixture, shared

torch = pytest.importorskip("torch")


class RestrictLauncher(FakeLauncher):
    """A fake kernel that, like the real ones, must not be given an out that overlaps an input."""

    def __call__(
        self, t: Any, op: str, out: Any, x: Any, w: Any, scale: Any, m: int, n: int, k: int, mode: int, split_k: bool | None = None
    ) -> bool:
        for name, v in (("x", x), ("w", w), ("scale", scale)):
            assert not _overlap(out, v), f"{op}: the kernel was handed an out that overlaps {name}"
        return super().__call__(t, op, out, x, w, scale, m, n, k, mode)


@pytest.fixture
def restrict(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> RestrictLauncher:  # noqa: F811
    launcher = RestrictLauncher()
    monkeypatch.setattr(ops._kernel, "launch", launcher)
    return launcher


def test_out_that_is_the_input_is_computed_through_a_temporary(restrict: RestrictLauncher) -> None:
    x, w = rand(1, 4096), rand(4096, 4096)
    expect = _gemm(x, w).to(torch.bfloat16)
    r = ops.gemv(x, w, out=x)
    assert r is x and restrict.calls == [("gemv", 1, 4096, 4096, 0)]
    assert torch.equal(x, expect)


def test_out_inside_the_weight_is_computed_through_a_temporary(restrict: RestrictLauncher) -> None:
    h, w = rand(4, 7168), rand(256, 7168)
    out = w.view(-1).view(torch.float32)[: 4 * 256].view(4, 256)  # the first rows of w, reinterpreted
    expect = _gemm(h, w.clone()).float()
    ops.router_gemm(h, w, out=out)
    assert restrict.calls == [("router_gemm", 4, 256, 7168, 0)]
    assert torch.allclose(out, expect, rtol=1e-5, atol=1e-4)


def test_a_self_overlapping_out_is_refused() -> None:
    x, w = rand(3, 64), rand(16, 64)
    with pytest.raises(ValueError, match=r"gemv: out has overlapping elements \(shape \(3, 16\), strides \(0, 1\)"):
        ops.gemv(x, w, out=torch.empty(1, 16, dtype=torch.bfloat16).expand(3, 16))


@pytest.mark.parametrize("which", ["x", "w"])
def test_expanded_operands_take_the_fallback_and_are_read_correctly(restrict: RestrictLauncher, which: str) -> None:
    h, w = rand(4, 7168), rand(256, 7168)
    if which == "x":
        h = rand(1, 7168).expand(4, 7168)
    else:
        w = rand(1, 7168).expand(256, 7168)
    out = ops.router_gemm(h, w)
    assert restrict.calls == []
    assert torch.allclose(out, _gemm(h, w).float(), rtol=1e-5, atol=1e-4)


def test_rows_that_overlap_each_other_take_the_fallback(restrict: RestrictLauncher) -> None:
    base = rand(4 * 8 + 7168)
    h = base.as_strided((4, 7168), (8, 1))  # each row starts 8 elements after the last
    w = rand(256, 7168)
    out = ops.router_gemm(h, w)
    assert restrict.calls == []
    assert torch.allclose(out, _gemm(h, w).float(), rtol=1e-5, atol=1e-4)


def test_inputs_that_overlap_each_other_may_take_the_kernel(restrict: RestrictLauncher) -> None:
    """Both are only read: a kernel may take them (``__restrict__`` forbids writing through an alias, not reading)."""
    w = rand(4096, 4096)
    x = w[:1]
    out = ops.gemv(x, w)
    assert restrict.calls == [("gemv", 1, 4096, 4096, 0)]
    assert torch.equal(out, _gemm(x, w).to(torch.bfloat16))


def test_the_overlap_predicates() -> None:
    buf = torch.zeros(64)
    assert _overlap(buf[:10], buf[9:20]) and not _overlap(buf[:10], buf[10:20]) and not _overlap(buf[:0], buf)
    assert _self_overlapping(buf[:1].expand(4)) and _self_overlapping(buf.as_strided((4, 8), (2, 1)))
    assert not _self_overlapping(buf.view(8, 8)[:, ::2]) and not _self_overlapping(buf.view(8, 8).t())
