"""The torch fallbacks, one per op of the op table. Never imports torch at import (``bind`` does, once).

:data:`FALLBACKS` is the registry: op name -> the function that computes the op's contract on 2-D
operands (``x [M, K]``, ``w [N, K]``, and ``scale`` for a scaled op) in the contract's dtypes. It is
the one place a fallback is chosen: the ops' eager front and general path call it through their
run-time entry (``_dispatch.ENTRIES[op].fallback``, bound from here at import), ``hwprofile sweep``
(the side it times against the kernel) and the benchmarks through ``hwprofile.ops.fallback(op)``;
the identity string a tuning stamp records beside it is the op table's ``OpDef.fallback`` (change
both together).
``hwprofile.ops`` refuses to import when an op of the table has no entry here.

Each fallback is at least as precise as the kernel it replaces (fp32 accumulation, one rounding)
and uses no more memory than its result plus one bounded chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from .. import _state
from .._log import get_logger
from ..optable import FP8_GEMV, GEMV, LINEAR_BF16_FP32, ROUTER_GEMM

log = get_logger(__name__)

_torch: Any = None  # the torch module, bound by bind()
_F_linear: Any = None  # torch.nn.functional.linear, bound by bind()
_mm_out_dtype: bool | None = None  # does this torch have torch.mm(..., out_dtype=) on CUDA? probed once

FP8_CHUNK_ELEMENTS: Final = 1 << 24  # weight elements dequantised at a time: 32 MB of bf16


@_state.on_reset
def _forget_probe() -> None:
    global _mm_out_dtype
    _mm_out_dtype = None  # probed again on the next CUDA call (another torch may have been installed)


def bind(torch: Any) -> None:
    """Bind the torch functions the fallbacks call (``hwprofile.ops.register`` calls it once)."""
    global _torch, _F_linear
    _torch, _F_linear = torch, torch.nn.functional.linear


def mm_fp32(x: Any, w: Any) -> Any:
    """``x . w^T`` in float32: cuBLAS with fp32 output where torch has it, else an fp32 upcast (CPU)."""
    global _mm_out_dtype
    torch = _torch
    if _mm_out_dtype and x.is_cuda:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    if x.is_cuda and _mm_out_dtype is None:
        try:
            out = torch.mm(x, w.t(), out_dtype=torch.float32)
        except (TypeError, NotImplementedError) as exc:  # older torch: no out_dtype for mm
            _mm_out_dtype = False
            log.info("hwprofile: torch.mm(out_dtype=float32) is not available (%s); fp32 fallbacks upcast instead", exc)
        else:
            _mm_out_dtype = True
            return out
    return torch.mm(x.float(), w.float().t())


def linear_bf16(x: Any, w: Any) -> Any:
    """``x . w^T`` in bf16 with fp32 accumulation (cuBLAS / the CPU BLAS)."""
    return _F_linear(x, w)


def fp8_dequant_mm(x: Any, w: Any, scale: Any) -> Any:
    """``x . (w * scale)^T -> bf16``, as precise as the kernel and without a full-size dequantised copy.

    e4m3 -> bf16 is exact, so each chunk of rows is dequantised to bf16 (at most
    :data:`FP8_CHUNK_ELEMENTS` elements), multiplied with fp32 accumulation into fp32, scaled in fp32
    after the product, and rounded to bf16 once.
    """
    torch = _torch
    n, k = w.shape
    rows = max(1, FP8_CHUNK_ELEMENTS // max(k, 1))
    if rows >= n:
        acc = mm_fp32(x, w.to(torch.bfloat16))
    else:
        acc = torch.empty((x.shape[0], n), dtype=torch.float32, device=x.device)
        for i in range(0, n, rows):
            acc[:, i : i + rows] = mm_fp32(x, w[i : i + rows].to(torch.bfloat16))
    acc.mul_(scale.reshape(1, -1) if scale.numel() == n and n != 1 else scale.reshape(()))
    return acc.to(torch.bfloat16)


def probe_mm_out_dtype(index: int) -> None:
    """Settle whether ``torch.mm(..., out_dtype=)`` works on CUDA device ``index``, with a real 1x8 tensor.

    Called while ``torch.compile`` traces a fallback route (``_dispatch``): the traced fallback then
    reads a settled answer instead of tracing the probe's try/except.
    """
    if _mm_out_dtype is None:
        t = _torch.zeros((1, 8), dtype=_torch.bfloat16, device=f"cuda:{index}")
        mm_fp32(t, t)


def gemm_backward(g: Any, x: Any, w: Any, scale: Any, need_x: bool, need_w: bool) -> tuple[Any, Any]:
    """Gradients of ``y = x . (w * scale)^T`` (every op of the table is one) in float32 accumulation, one rounding.

    ``g`` is ``dL/dy`` ``[..., N]`` in the op's output dtype; ``x [..., K]``, ``w [N, K]``, ``scale``
    None or per tensor / per row. Returns ``(dL/dx in x's dtype, dL/dw in w's dtype)`` (None where
    not needed). The weight's gradient of a scaled op is not defined here (the op refuses it).
    """
    torch = _torch
    n, k = w.shape
    g2 = g.reshape(-1, n).float()
    gx = gw = None
    if need_x:
        wf = w.to(torch.bfloat16).float() if w.element_size() == 1 else w.float()  # e4m3 -> bf16 is exact
        if scale is not None:
            wf = wf * (scale.reshape(-1, 1) if scale.numel() == n and n != 1 else scale.reshape(()))
        gx = (g2 @ wf).to(x.dtype).reshape(x.shape)
    if need_w:
        gw = (g2.t() @ x.reshape(-1, k).float()).to(w.dtype)
    return gx, gw


#: op name -> its fallback on 2-D contract operands; keyed by the op table (``hwprofile.optable.OPS``)
FALLBACKS: dict[str, Callable[..., Any]] = {
    ROUTER_GEMM.name: mm_fp32,
    LINEAR_BF16_FP32.name: mm_fp32,
    GEMV.name: linear_bf16,
    FP8_GEMV.name: fp8_dequant_mm,
}

