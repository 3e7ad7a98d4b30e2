"""The selection kernel of ``ops.moe_gate``: its route, loading and launch, and the fallback on any fault.

``moe_gate`` is router_gemm (routed as that op) followed by the expert selection; a plugin that
ships a :class:`~hwprofile.kernels.KernelSpec` for op ``"moe_gate"`` (``hwprofile_sm90.moe_gate``)
runs the selection as one kernel on the logits, launched right after the GEMM on the same stream.
The spec is not an op of the op table (``optable.OPS``): its ABI is not the GEMM's ``(out, x, w,
scale, M, N, K)`` but :data:`ARG_TYPES`, and its ``configure`` takes the gate's shape
(``m, n, n_group, topk_group, top_k``); a ValueError from it is the route's reason for the torch
selection. Every fault (compile, load, launch) is one warning and the torch selection from then on
on that device, as for the ops; ``HWPROFILE_STRICT=1`` raises it.
"""

from __future__ import annotations

import ctypes
import warnings
from typing import TYPE_CHECKING, Any

from .._log import get_logger
from ..errors import KernelError
from . import _dispatch, _kernel

if TYPE_CHECKING:
    from ..kernels import Launch
    from ..profiles import Profile

OP = "moe_gate"
#: the selection kernel's C signature: (ids int64*, weights f32*, logits f32*, bias f32* or null,
#: M, N, n_group, topk_group, top_k, renormalize, routed_scaling_factor)
ARG_TYPES = (ctypes.c_void_p,) * 4 + (ctypes.c_int,) * 6 + (ctypes.c_float,)

log = get_logger(__name__)

#: device index -> why the selection kernel failed there (cleared with the device's dispatch table)
failed: dict[int, str] = {}
_loaded: dict[tuple[int, str], Any] = {}  # (device index, name expression) -> LoadedKernel
_warned_capture: set[int] = set()


def _new_table(t: _dispatch._Table) -> None:
    """A rebuilt dispatch table (a reset, a new profile): the gate's failures and launchers of that device go with the old one."""
    failed.pop(t.index, None)
    for key in [key for key in _loaded if key[0] == t.index]:
        del _loaded[key]


_dispatch.on_new_table.append(_new_table)


def unplannable(prof: Profile, m: int, n: int, n_group: int, topk_group: int, top_k: int) -> str | None:
    """Why ``prof``'s device cannot run the selection kernel for this gate (None: it can), in words."""
    spec = prof.kernels.get(OP)
    if spec is None:
        who = f"plugin {prof.plugin.name}" if prof.plugin is not None else "no architecture plugin"
        return f"{who} ships no moe_gate selection kernel for {prof.device.name}"
    if prof.device.index in failed:
        return f"its selection kernel failed on cuda:{prof.device.index} in this process: {failed[prof.device.index]}"
    try:
        spec.configure(m=m, n=n, n_group=n_group, topk_group=topk_group, top_k=top_k)
    except ValueError as exc:
        return str(exc)
    return None


def decide(prof: Profile, *, m: int, n: int, n_group: int = 1, topk_group: int = 1, top_k: int) -> _dispatch.Decision:
    """The path of ``ops.moe_gate``'s selection on ``prof``'s device for ``m`` tokens of ``n`` experts, with the reason.

    The GEMM before it is router_gemm's (``ops.decide("router_gemm", prof, m=m, n=n, k=K)``). CUDA
    operands without gradients and outside ``torch.compile`` are assumed (those take the torch
    selection, which autograd and inductor see).
    """
    for name, v in (("m", m), ("n", n), ("n_group", n_group), ("topk_group", topk_group), ("top_k", top_k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"decide_moe_gate: {name} must be an int >= 0, got {v!r}")
    if m == 0:
        return _dispatch.Decision(OP, "fallback", "empty problem (M = 0): nothing to select", "empty", "fixed")
    why = unplannable(prof, m, n, n_group, topk_group, top_k)
    if why is None:
        spec = prof.kernels[OP]
        return _dispatch.Decision(OP, "kernel", f"{spec.plugin}'s selection kernel takes M={m}, N={n}, n_group={n_group}, "
                                  f"topk_group={topk_group}, top_k={top_k}", None, "fixed")
    return _dispatch.Decision(OP, "fallback", f"the torch selection: {why}", "kernel", "fixed")


def select(logits: Any, bias: Any, n_group: int, topk_group: int, top_k: int, renormalize: bool, scaling: float) -> tuple[Any, Any] | None:
    """``(ids int64, weights fp32)`` ``[M, top_k]`` from the selection kernel, or None: the caller runs the torch selection.

    ``logits`` is router_gemm's fp32 ``[M, N]`` result; the arguments were checked by ``moe_gate``.
    """
    if _dispatch._compiling() or (logits.requires_grad and _dispatch._grad_enabled()):
        return None  # inductor fuses the torch selection; autograd needs its graph
    idx = logits.get_device()
    if idx < 0:
        idx = _dispatch._cpu_index if logits.is_cpu and (bias is None or bias.is_cpu) else -1
    m, n = logits.shape
    if idx < 0 or m == 0 or not logits.is_contiguous() or (bias is not None and not bias.is_contiguous()):
        return None
    t = _dispatch.table(idx)
    if unplannable(t.prof, m, n, n_group, topk_group, top_k) is not None:
        return None
    ids = logits.new_empty((m, top_k), dtype=_ids_dtype())
    weights = logits.new_empty((m, top_k))
    if not launch(t, ids, weights, logits, bias, m, n, n_group, topk_group, top_k, renormalize, scaling):
        return None
    return ids, weights


_INT64: Any = None


def _ids_dtype() -> Any:
    global _INT64
    if _INT64 is None:
        import torch

        _INT64 = torch.int64  # the torch selection's (sort indices)
    return _INT64


def _fail(t: _dispatch._Table, why: str) -> None:
    failed[t.index] = why
    for key in [key for key in _loaded if key[0] == t.index]:
        del _loaded[key]
    warnings.warn(f"hwprofile: moe_gate selection kernel unavailable on cuda:{t.index}, using the torch selection: {why}",
                  RuntimeWarning, stacklevel=5)  # _fail <- launch <- select <- ops.moe_gate <- the caller


def _kernel_for(t: _dispatch._Table, plan: Launch) -> Any:
    """The loaded selection kernel (memoised per device); None inside a capture when it is not loaded yet."""
    from .. import kernels

    key = (t.index, plan.name_expression)
    kern = _loaded.get(key)
    if kern is not None:
        return kern
    spec, target = t.prof.kernels[OP], t.prof.target
    if target is None:
        raise KernelError(f"moe_gate: the profile of device {t.index} has no NVRTC target")
    if _kernel._capturing(t.index):
        kern = kernels.loaded(spec, target, plan, t.index, ARG_TYPES)
        if kern is None:
            if t.index not in _warned_capture:
                _warned_capture.add(t.index)
                log.warning("moe_gate inside a CUDA-graph capture on cuda:%d: its selection kernel is not loaded, the capture "
                            "records the torch selection; call moe_gate once before capturing", t.index)
            return None
    else:
        kern = kernels.load(spec, target, plan, t.index, ARG_TYPES, record=t.prof.stats.record)
    _loaded[key] = kern
    return kern


def launch(t: _dispatch._Table, ids: Any, weights: Any, logits: Any, bias: Any, m: int, n: int, n_group: int, topk_group: int,
           top_k: int, renormalize: bool, scaling: float) -> bool:
    """Launch the selection kernel on checked operands; False (after one warning, the first time) if it cannot run here.

    The test seam: CPU tests replace it with a fake that computes the selection in torch.
    """
    if t.index in failed and not t.strict:
        return False
    from .. import kernels

    plan = t.prof.kernels[OP].configure(m=m, n=n, n_group=n_group, topk_group=topk_group, top_k=top_k)
    try:
        kern = _kernel_for(t, plan)
        if kern is None:
            return False
        kern.launch(plan, _kernel.raw_stream(t.index), (
            ids.data_ptr(), weights.data_ptr(), logits.data_ptr(), 0 if bias is None else bias.data_ptr(),
            m, n, n_group, topk_group, top_k, int(bool(renormalize)), float(scaling),
        ))
    except kernels.CompileForbiddenError as exc:
        raise kernels.CompileForbiddenError(f"moe_gate (M={m}, N={n}) on cuda:{t.index}: {exc}") from None
    except Exception as exc:
        err = exc if isinstance(exc, KernelError) else KernelError(f"launching the moe_gate kernel: {type(exc).__name__}: {exc}")
        if t.strict:
            if err is exc:
                raise
            raise err from exc
        _fail(t, str(err))
        return False
    return True

