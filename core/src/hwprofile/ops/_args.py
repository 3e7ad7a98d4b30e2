"""Argument checks of the eager path (the op contract, memory overlap). Never routes, dispatches or imports torch at import.

:func:`validate` checks a call's arguments (errors name the argument) and returns the problem's
(M, N, K, scale mode); :func:`_overlap` and :func:`_self_overlapping` tell ``_dispatch.general``
when an ``out`` must go through a temporary or be refused.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

from ..optable import NO_SCALE, ROW_SCALE, TENSOR_SCALE, OpDef


def validate(op: OpDef, x: Any, w: Any, scale: Any, out: Any) -> tuple[int, int, int, int]:
    """Check the arguments against the op's contract; returns (M, N, K, scale mode). Errors name the argument."""
    import torch

    xn, wn = op.args[0], op.args[1]
    for name, t in ((xn, x), (wn, w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op.name}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dtype != getattr(torch, op.x_dtype):
        raise ValueError(f"{op.name}: {xn} must be torch.{op.x_dtype}, got {x.dtype}")
    if w.dtype != getattr(torch, op.w_dtype):
        raise ValueError(f"{op.name}: {wn} must be torch.{op.w_dtype}, got {w.dtype}")
    if w.dim() != 2:
        raise ValueError(f"{op.name}: {wn} must have 2 dimensions [N, K], got shape {tuple(w.shape)}")
    n, k = w.shape
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{op.name}: {xn} must be [..., K] with K={k} (from {wn} {tuple(w.shape)}), got {tuple(x.shape)}")
    dev = x.device
    if w.device != dev:
        raise ValueError(f"{op.name}: {wn} is on {w.device} but {xn} is on {dev}; put them on one device")
    m = math.prod(x.shape[:-1])
    mode = NO_SCALE
    if op.scaled:
        sn = op.args[2]
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
            raise ValueError(f"{op.name}: {sn} must be a float32 tensor, got {getattr(scale, 'dtype', type(scale).__name__)}")
        if scale.device != dev:
            raise ValueError(f"{op.name}: {sn} is on {scale.device} but {xn} is on {dev}; put them on one device")
        if scale.numel() == 1 and scale.dim() <= 1:
            mode = TENSOR_SCALE
        elif scale.dim() == 1 and scale.numel() == n:
            mode = ROW_SCALE
        else:
            raise ValueError(
                f"{op.name}: {sn} must have 1 element (per tensor) or N={n} elements (per row), got shape {tuple(scale.shape)}"
            )
    elif scale is not None:
        raise TypeError(f"{op.name}: takes no scale, got {type(scale).__name__}")
    if out is not None and (
        not isinstance(out, torch.Tensor)
        or out.dtype != getattr(torch, op.out_dtype)
        or tuple(out.shape) != (*x.shape[:-1], n)
        or out.device != dev
    ):
        _bad_out(op, out, (*x.shape[:-1], n), dev)
    return m, n, k, mode


def _bad_out(op: OpDef, out: Any, want: tuple[int, ...], dev: Any) -> NoReturn:
    """:func:`validate`'s error for an ``out`` of the wrong type, dtype, shape or device; out of line, off the per-call path."""
    import torch

    got = f"{out.dtype} {tuple(out.shape)} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
    raise ValueError(f"{op.name}: out must be torch.{op.out_dtype} of shape {want} on {dev}, got {got}")


def _span(t: Any) -> tuple[int, int]:
    """The byte range ``[lo, hi)`` ``t``'s elements occupy (torch strides are never negative)."""
    lo = t.data_ptr()
    last = sum((d - 1) * st for d, st in zip(t.shape, t.stride(), strict=True))
    return lo, lo + (last + 1) * t.element_size()


def _overlap(a: Any, b: Any) -> bool:
    """True if ``b`` (None: absent) may share memory with ``a``: their byte ranges intersect (conservative for interleaved views)."""
    if b is None or a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    (alo, ahi), (blo, bhi) = _span(a), _span(b)
    return alo < bhi and blo < ahi


def _self_overlapping(t: Any) -> bool:
    """True if two elements of ``t`` share memory: a stride 0 over a dimension of size > 1, or strides that interleave."""
    dims = sorted((st, d) for d, st in zip(t.shape, t.stride(), strict=True) if d > 1)
    extent = 1  # elements spanned by the dimensions of smaller stride
    for st, d in dims:
        if st < extent:
            return True
        extent = st * (d - 1) + extent
    return False
