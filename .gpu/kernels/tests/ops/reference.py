"""Float64 references and random contract operands, for every op of the table.

:data:`REFERENCES` is keyed by op name; tests/ops/test_contract.py fails for an op of the table
that has none, so a new op cannot ship without the float64 truth its paths are checked against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hwprofile.optable import OpDef

torch = pytest.importorskip("torch")


def _gemm(x: Any, w: Any, scale: Any = None) -> Any:
    """``x . (w * scale)^T`` in float64, ``[..., K] x [N, K] -> [..., N]``."""
    wd = w.double()
    if scale is not None:
        wd = wd * scale.double().reshape(-1, 1)
    return x.double() @ wd.t()


#: op name -> its float64 reference on the op's public operands
REFERENCES: dict[str, Callable[..., Any]] = {
    "router_gemm": _gemm,
    "linear_bf16_fp32": _gemm,
    "gemv": _gemm,
    "fp8_gemv": _gemm,
}


def _tensor(shape: tuple[int, ...], dtype_name: str, spread: float = 1.0) -> Any:
    dtype = getattr(torch, dtype_name)
    if dtype_name.startswith("float8"):
        spread *= 2.0  # use more of e4m3's range
    return (torch.randn(*shape) * spread).to(dtype)


def operands(op: OpDef, lead: tuple[int, ...], n: int, k: int, *, layout: str = "contiguous") -> tuple[Any, ...]:
    """Random operands of ``op``'s contract: ``x [*lead, K]``, ``w [N, K]`` (``layout``: contiguous,
    padded rows, or the transpose of a ``[K, N]`` tensor), and a per-row scale for a scaled op."""
    x = _tensor((*lead, k), op.x_dtype)
    if layout == "padded":
        w = _tensor((n, k + 24), op.w_dtype)[:, :k]
    elif layout == "column_major":
        w = _tensor((k, n), op.w_dtype).t()
    else:
        w = _tensor((n, k), op.w_dtype)
    if op.scaled:
        return x, w, torch.rand(n) + 0.25
    return x, w
