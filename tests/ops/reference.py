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


def moe_gate(logits: Any, bias: Any, n_group: int, topk_group: int, top_k: int, renormalize: bool, scaling: float) -> tuple[Any, Any]:
    """The DeepSeek-V3 gate's selection in float64, one token at a time, written from the rules (not from the op).

    Rules: score = sigmoid(logit); choice = score + bias; group score = sum of the group's two largest
    choices; keep the topk_group best groups; pick the top_k best choices among their experts; weight
    = the score, / (sum + 1e-20) if renormalize, * scaling. Ties: the lower index first.
    Returns (ids [M, top_k] int64, weights [M, top_k] float64).
    """
    lg = logits.double()
    m, n = lg.shape
    per = n // n_group
    ids, weights = [], []
    for row in range(m):
        score = [1.0 / (1.0 + float(torch.exp(-lg[row, e]))) for e in range(n)]
        choice = [score[e] + (float(bias[e]) if bias is not None else 0.0) for e in range(n)]
        gscore = [sum(sorted(choice[g * per : (g + 1) * per], reverse=True)[:2]) for g in range(n_group)]
        groups = sorted(range(n_group), key=lambda g: (-gscore[g], g))[:topk_group] if n_group > 1 else [0]
        experts = [e for g in groups for e in range(g * per, (g + 1) * per)] if n_group > 1 else list(range(n))
        pick = sorted(experts, key=lambda e: (-choice[e], e))[:top_k]
        w = [score[e] for e in pick]
        if renormalize:
            total = sum(w) + 1e-20
            w = [v / total for v in w]
        ids.append(pick)
        weights.append([v * scaling for v in w])
    return torch.tensor(ids, dtype=torch.int64).reshape(m, top_k), torch.tensor(weights, dtype=torch.float64).reshape(m, top_k)


def decisive(logits: Any, bias: Any, n_group: int, topk_group: int, top_k: int, margin: float = 1e-6) -> Any:
    """Rows whose choice is not within ``margin`` of a tie at a group or expert boundary (bool [M], float64).

    Where two candidates are closer than fp32 rounding, fp32 and float64 may both be right and differ.
    """
    lg = logits.double()
    m, n = lg.shape
    per = n // n_group
    choice = lg.sigmoid() + (bias.double() if bias is not None else 0.0)
    ok = torch.ones(m, dtype=torch.bool)
    if n_group > 1:
        gs = choice.view(m, n_group, per).topk(2, dim=-1).values.sum(-1)
        g = gs.sort(dim=-1, descending=True)
        if topk_group < n_group:
            ok &= (g.values[:, topk_group - 1] - g.values[:, topk_group]) > margin
        keep = torch.zeros(m, n_group, dtype=torch.bool).scatter_(1, g.indices[:, :topk_group], True)
        choice = choice.masked_fill(~keep.repeat_interleave(per, dim=1), float("-inf"))
    c = choice.sort(dim=-1, descending=True).values[:, : top_k + 1]
    gaps = c[:, :-1] - c[:, 1:]  # the order of the picked experts and the boundary after the last
    ok &= torch.nan_to_num(gaps, posinf=1.0).min(dim=-1).values > margin
    return ok
