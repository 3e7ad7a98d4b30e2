"""The torch fallbacks, one per op of the op table. Never imports torch at import (``bind`` does, once).

:data:`FALLBACKS` is the registry: op name -> the function that computes the op's contract on 2-D
operands (``x [M, K]``, ``w [N, K]``, and ``scale`` for a scaled op) in the contract's dtypes. It is
the one place a fallback is chosen: the ops' eager front and general path call it through their
run-time entry (``_dispatch.ENTRIES[op].fallback``, bound from here at import), ``hwprofile sweep``
(the side it times against the kernel) and the benchmarks through ``hwprofile.ops.fallback(op)``;
the identity string a tuning stamp records beside it is the op table's ``OpDef.fallback`` (change
both together).
:data:`BACKWARDS` holds the gradient formulas an ``OpDef.backward`` names. ``hwprofile.ops`` refuses to
import when an op of the table has no entry here, or names a backward that is not here (one error
naming every missing piece: ``hwprofile.ops._pieces``).

Each fallback is at least as precise as the kernel it replaces (fp32 accumulation, one rounding)
and uses no more memory than its result plus one bounded chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from .. import _state, optable
from .._log import get_logger

log = get_logger(__name__)

_torch: Any = None  # the torch module, bound by bind()
_F_linear: Any = None  # torch.nn.functional.linear, bound by bind()
_mm_out_dtype: bool | None = None  # does this torch have torch.mm(..., out_dtype=) on CUDA? probed once

FP8_CHUNK_ELEMENTS: Final = 1 << 24  # weight elements dequantised at a time: 32 MB of bf16
#: e4m3 weights (bytes) from which the FP8 fallback splits x instead of dequantising the weight: below,
#: the split's dozen small launches cost more than dequantising (H200, benchmarks/fp8_fallback_h200.py)
FP8_SPLIT_MIN_BYTES: Final = 4 << 20
#: each part p of x's split has the per-row power-of-two scale e8m0(amax * FP8_PART_SCALES[p]): part 1
#: holds x rounded to e4m3 (|x / s1| < 384 <= 448), part 2 the residual (s1 / 16: the rounding residual of
#: an 8-bit bf16 value has <= 4 bits, <= 256 in those units), part 3 what part 2's e4m3 subnormal steps
#: missed of elements more than 2^14 below the row's largest (an activation outlier's neighbours), to
#: 2^-28 of the row's largest
FP8_PART_SCALES: Final = (2.0**-8, 2.0**-12, 2.0**-30)

#: device index -> (unit fp32 scale, part-scale factors [P, 1, 1]) where torch._scaled_mm runs the split
#: exactly, or None where it cannot (no fp8 tensor cores, a torch without it): probed once per device,
#: never inside a CUDA-graph capture or a trace
_fp8_split: dict[int, tuple[Any, Any] | None] = {}


@_state.on_reset
def _forget_probe() -> None:
    global _mm_out_dtype
    _mm_out_dtype = None  # probed again on the next CUDA call (another torch may have been installed)
    _fp8_split.clear()


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
    after the product, and rounded to bf16 once. Reads and writes the weight again per call: the
    FP8 fallback takes it only where :func:`fp8_split_mm` cannot run or costs more (small weights).
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


def fp8_split(x: Any, factors: Any, fused: bool = True) -> tuple[Any, Any]:
    """Split bf16 ``x [M, K]`` into e4m3 parts: ``(q [P*M, K] e4m3, s [P, M, 1] fp32)``, ``x == sum_p s[p] * q[p]``.

    Each part is the rounding residual of the ones before it, scaled by a per-row power of two
    (``s[p] = e8m0(amax_row * factors[p])``, the same tensor that rescales the GEMM's output, so the
    split stays exact where e8m0 clamps a tiny row's scale at 2^-127). With the default
    :data:`FP8_PART_SCALES` the sum is exact for every element within 2^14 of its row's largest
    (rows of bf16 zeros, subnormals or values near bf16's maximum alike); a smaller one (an
    outlier's neighbour) is off by at most 2^-28 of the row's largest, through the third part. ``fused``: each division writes its
    e4m3 part straight into the buffer (one kernel each on CUDA); off under ``torch.compile``,
    which fuses the plain ops itself.
    """
    torch = _torch
    m, k = x.shape
    p = factors.shape[0]
    amax = torch.linalg.vector_norm(x, float("inf"), dim=1, keepdim=True)  # exact in x's dtype
    if fused:
        s8 = torch.empty((p, m, 1), dtype=torch.float8_e8m0fnu, device=x.device)
        torch.mul(amax, factors, out=s8)
    else:
        s8 = torch.mul(amax, factors).to(torch.float8_e8m0fnu)
    s = s8.to(torch.float32)
    q = torch.empty((p * m, k), dtype=torch.float8_e4m3fn, device=x.device)
    parts = []
    r = x
    for i in range(p):
        if fused:
            qi = q[i * m : (i + 1) * m]
            torch.div(r, s[i], out=qi)
        else:
            qi = torch.div(r, s[i]).to(torch.float8_e4m3fn)
            parts.append(qi)
        if i + 1 < p:
            r = torch.addcmul(r, s[i], qi.to(torch.float32), value=-1.0)  # exact: the rounding residual
    return (q if fused else torch.cat(parts)), s


def fp8_split_mm(x: Any, w: Any, scale: Any, one: Any, factors: Any, fused: bool = True) -> Any:
    """``x . (w * scale)^T -> bf16`` through ONE ``torch._scaled_mm`` that reads the e4m3 weight once.

    ``x`` is split exactly into e4m3 parts (:func:`fp8_split`) stacked along M; their products with
    the weight are exact and accumulated in fp32 by cuBLAS (unit scales ``one``, no fast
    accumulation), scaled back by their powers of two and summed in fp32, times the weight's scale
    in fp32, and rounded to bf16 once: the kernel's precision. Needs K and N multiples of 16 and a
    row-major weight (``w.t()`` is then the column-major operand cuBLAS takes). Beside the result it
    allocates x's parts and their fp32 products ((P + 1) x M x N floats).

    Non-finite elements of ``x`` give the reference's result, not a NaN row: they are left out of the
    split (e4m3 holds no infinity, and an infinite row maximum would make every part NaN) and stacked
    as one more part, their signs (NaN for a NaN), into the same GEMM; a row holding any adds
    ``inf * sum(sign * w)`` to its finite sum: +-inf by the product's sign, NaN where the infinity
    meets a zero weight, across a NaN, or where infinities of both signs cancel to zero (IEEE's inf -
    inf; unlike IEEE, infinities of both signs whose weighted signs do not cancel give the sign of the
    larger sum). No host sync: finite rows take the same path and come out bit-identical.
    """
    torch = _torch
    m = x.shape[0]
    n = w.shape[0]
    finite = torch.isfinite(x)
    xf = torch.where(finite, x, 0.0)
    q, s = fp8_split(xf, factors, fused)
    odd = torch.sign(x - xf).to(torch.float8_e4m3fn)  # +-1 where +-inf, NaN where NaN, 0 elsewhere
    y = torch._scaled_mm(torch.cat((q, odd)), w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    parts, t = y[: -m or None], y[-m:]
    acc = torch.mul(parts.view(-1, m, n), s).sum(0)
    bad = ~finite.all(1, keepdim=True)  # rows holding +-inf or NaN
    acc = torch.where(bad, acc + t * float("inf"), acc)
    ws = scale.reshape(1, -1) if scale.numel() == n and n != 1 else scale.reshape(())
    if not fused:
        return (acc * ws).to(torch.bfloat16)
    out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    return torch.mul(acc, ws, out=out)  # fp32 product, one bf16 rounding


def _fp8_split_ready(index: int) -> tuple[Any, Any] | None:
    """Probe once on CUDA device ``index`` whether :func:`fp8_split_mm` runs there and agrees with the dequantising
    path on a small problem (to a bf16 step); keep its constants (made here, never inside a capture)."""
    if index in _fp8_split:
        return _fp8_split[index]
    torch = _torch
    dev = torch.device("cuda", index)
    got: tuple[Any, Any] | None = None
    if hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e8m0fnu"):
        try:
            one = torch.ones((), dtype=torch.float32, device=dev)
            factors = torch.tensor(FP8_PART_SCALES, dtype=torch.float32, device=dev).reshape(-1, 1, 1)
            g = torch.Generator(device=dev).manual_seed(0)
            x = torch.randn((2, 64), device=dev, generator=g).to(torch.bfloat16)
            x[1, 0] = 3000.0  # an outlier: the third part at work
            w = torch.randn((32, 64), device=dev, generator=g).to(torch.float8_e4m3fn)
            sc = torch.rand((32,), device=dev, generator=g) + 0.5
            a = fp8_split_mm(x, w, sc, one, factors)
            b = fp8_dequant_mm(x, w, sc)
            if bool(torch.allclose(a.float(), b.float(), rtol=2.0**-7, atol=0.0)):  # within a bf16 step
                got = (one, factors)
            else:
                log.info("hwprofile: the FP8 split fallback disagrees with the dequantising one on cuda:%d; "
                         "FP8 falls back by dequantising", index)
        except (RuntimeError, TypeError, NotImplementedError) as exc:  # no fp8 tensor cores, an older torch
            log.info("hwprofile: torch._scaled_mm cannot run the FP8 split on cuda:%d (%s); FP8 falls back by dequantising", index, exc)
    _fp8_split[index] = got
    return got


def _capturing() -> bool:
    torch = _torch
    return bool(torch.cuda.is_current_stream_capturing())


def _compiling() -> bool:
    compiler = getattr(_torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


def fp8_mm(x: Any, w: Any, scale: Any) -> Any:
    """The FP8 GEMV fallback: :func:`fp8_split_mm` where it runs and pays, else :func:`fp8_dequant_mm`.

    The split path takes CUDA tensors on a device the probe passed (:func:`_fp8_split_ready`: fp8
    tensor cores and a torch with ``_scaled_mm``), K and N multiples of 16, a row-major weight with
    16-byte aligned rows and start, and weights of at least :data:`FP8_SPLIT_MIN_BYTES`. The probe runs on
    the first call outside a CUDA-graph capture and a ``torch.compile`` trace
    (``hwprofile.ops.warmup`` makes that call); a first call inside one takes the dequantising
    path, which needs nothing new.
    """
    n, k = w.shape
    if not (x.is_cuda and n * k >= FP8_SPLIT_MIN_BYTES and n % 16 == 0 and k % 16 == 0):
        return fp8_dequant_mm(x, w, scale)
    if w.stride(1) != 1 or w.stride(0) % 16 or w.data_ptr() % 16:  # cuBLASLt's FP8 operands: row-major, 16-byte aligned rows
        return fp8_dequant_mm(x, w, scale)
    idx = x.device.index
    if idx in _fp8_split:
        ready = _fp8_split[idx]
    elif _compiling() or _capturing():
        ready = None
    else:
        ready = _fp8_split_ready(idx)
    if ready is None:
        return fp8_dequant_mm(x, w, scale)
    return fp8_split_mm(x, w, scale, ready[0], ready[1], fused=not _compiling())


def probe_fp8_split(index: int) -> bool:
    """Settle, outside any capture, whether :func:`fp8_mm` splits on CUDA device ``index`` (``hwprofile.ops.warmup``)."""
    return _fp8_split_ready(index) is not None


def probe_mm_out_dtype(index: int) -> None:
    """Settle whether ``torch.mm(..., out_dtype=)`` works on CUDA device ``index``, with a real 1x8 tensor.

    Called while ``torch.compile`` traces a fallback route (``_dispatch``): the traced fallback then
    reads a settled answer instead of tracing the probe's try/except.
    """
    if _mm_out_dtype is None:
        t = _torch.zeros((1, 8), dtype=_torch.bfloat16, device=f"cuda:{index}")
        mm_fp32(t, t)
    _fp8_split_ready(index)  # and the FP8 fallback's split path (fp8_mm)


def gemm_backward(g: Any, x: Any, w: Any, scale: Any, need_x: bool, need_w: bool) -> tuple[Any, Any]:
    """Gradients of ``y = x . (w * scale)^T`` (``OpDef.backward`` ``"gemm"``) in float32 accumulation, one rounding.

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
    optable.ROUTER_GEMM.name: mm_fp32,
    optable.LINEAR_BF16_FP32.name: mm_fp32,
    optable.GEMV.name: linear_bf16,
    optable.FP8_GEMV.name: fp8_mm,
}

#: backward name (``OpDef.backward``) -> ``f(g, x, w, scale, need_x, need_w) -> (dL/dx or None, dL/dw or None)``:
#: ``g`` is ``dL/dy [..., N]`` in the op's output dtype, the operands are those of the forward (``x [..., K]``)
BACKWARDS: dict[str, Callable[..., tuple[Any, Any]]] = {
    optable.GEMM_BACKWARD: gemm_backward,
}

