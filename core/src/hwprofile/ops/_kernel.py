"""The kernel path of an op: operand checks, loading through ``hwprofile.kernels``, launching. Never routes.

Routing (whether a call takes the kernel) is ``_dispatch``'s; this module only runs a kernel it is
handed, on a dispatch table it is handed (``_dispatch._Table``: the profile, the loaded launchers,
strict mode). ``hwprofile.ops.run_kernel`` is the public, checked seam over it for sweep, benchmarks
and tests; :func:`launch` is the test seam CPU tests replace with a fake launcher.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._log import get_logger
from ..errors import KernelError, NotWarmedError
from ..optable import NO_SCALE, OPS, ROW_SCALE, TENSOR_SCALE
from . import _verify

if TYPE_CHECKING:
    from ..profiles import Profile
    from ._table import Table as _Table



#: the kernels' C signature: (out, x, w, scale, M, N, K); every plugin kernel of every op takes it
ARG_TYPES = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int)

log = get_logger(__name__)

_current_raw_stream: Any = None  # torch._C._cuda_getCurrentRawStream (what Triton uses: no Stream object), bound lazily


def raw_stream(index: int) -> int:
    """Handle of torch's current stream on ``index`` (so graph capture records the launch)."""
    global _current_raw_stream
    if _current_raw_stream is None:
        import torch

        _current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (lambda i: torch.cuda.current_stream(i).cuda_stream)
    return int(_current_raw_stream(index))


#: (op, device index, thread ident) whose fallback ran in that thread on that device, outside a capture
#: (a first call, or ``hwprofile.ops.warmup``): its libraries (the cuBLAS / cuBLASLt handle torch keeps
#: per device and thread, its workspace) exist, so the fallback is safe inside a capture. Never cleared
#: by ``hwprofile.reset()``: the handles outlive it.
fallback_ready: set[tuple[str, int, int]] = set()
_warned_capture: set[tuple[str, int, int, int]] = set()
thread_id = threading.get_ident


def first_fallback(op: str, index: int, shape: str) -> None:
    """Before ``op``'s fallback first runs on device ``index`` in this thread: mark it ready, or, inside a
    CUDA-graph capture, raise :class:`NotWarmedError` before anything reaches the stream.

    torch creates the cuBLAS / cuBLASLt handle (and its workspace) of a device and thread on its first
    GEMM; created inside a capture it invalidates the capture ("operation failed due to a previous error
    during capture"), which then cannot be recovered. The ops call this only while the key is absent
    from :data:`fallback_ready`, so a warm call pays one set lookup.
    """
    if _capturing(index):
        raise NotWarmedError(
            f"{op} ({shape}) was first called inside a CUDA-graph capture on cuda:{index}, on its torch fallback, which never ran "
            f"on this device in this thread: its first cuBLAS call would break the capture; call hwprofile.ops.warmup(device={index}, "
            f"shapes={{{op!r}: [({shape.replace('M=', '').replace('N=', '').replace('K=', '')})]}}) (or call the op once) in the "
            "capturing thread before capturing"
        )
    fallback_ready.add((op, index, thread_id()))


def _capturing(index: int) -> bool:
    """Whether the current stream is being captured into a CUDA graph (the test seam fakes it)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _load(t: _Table, op: str, m: int, n: int, k: int, scale_mode: int, split_k: bool) -> Callable[..., None] | None:
    """The launcher of ``op``'s kernel for a shape (memoised per table); None after one warning if it cannot load.

    Inside a CUDA-graph capture nothing is compiled or loaded (either would break the capture): a
    kernel already loaded in this process is used, else the fallback if it is ready there
    (:data:`fallback_ready`, set by ``hwprofile.ops.warmup``; the kernel is not marked failed and
    loads on a later call outside capture), else :class:`NotWarmedError` names the op, the shape
    and ``warmup``. A compile after ``forbid_compile()`` is raised, never a fallback.

    A ctypes call of cuLaunchKernel was measured against cuda-python's on the H200 host: 11.08 vs
    11.09 µs per launch (the driver's own cost dominates), so launches stay with ``hwprofile.kernels``.
    """
    from .. import kernels

    spec = t.prof.kernels[op]
    shape = f"M={m}, N={n}, K={k}"
    try:
        plan = spec.configure(m=m, n=n, k=k, split_k=split_k, **({"scale": scale_mode} if OPS[op].scaled else {}))
        target = t.prof.target
        if target is None:
            raise KernelError(f"{op}: the profile of device {t.index} has no NVRTC target")
        if _capturing(t.index):
            ready = kernels.loaded(spec, target, plan, t.index, ARG_TYPES)
            if ready is None:
                _not_ready_in_capture(t, op, m, n, k, shape)
                return None
            kern = ready
        else:
            kern = kernels.load(spec, target, plan, t.index, ARG_TYPES, record=t.prof.stats.record)
        go = _launcher(kern, plan)

        def launch_on(out: Any, x: Any, w: Any, s: Any) -> None:
            go(raw_stream(t.index), out.data_ptr(), x.data_ptr(), w.data_ptr(), 0 if s is None else s.data_ptr(), m, n, k)

        # verification on first use: no launcher is kept before the instance matched float64 here (ops._verify)
        if not _verify.ensure(t, op, plan, (m, n, k), scale_mode, launch_on, capturing=_capturing(t.index)):
            return None
    except kernels.CompileForbiddenError as exc:
        raise kernels.CompileForbiddenError(f"{op} ({shape}) on cuda:{t.index}: {exc}") from None
    except KernelError as exc:
        if t.strict:
            raise
        t.fail(op, str(exc))
        warnings.warn(f"hwprofile: {op} kernel unavailable, using the torch fallback: {exc}", RuntimeWarning, stacklevel=5)
        return None

    t.launches[(op, m, n, k, scale_mode, split_k)] = go
    return go


def _launcher(kern: Any, plan: Any) -> Callable[..., None]:
    def go(stream: int, *args: int) -> None:
        kern.launch(plan, stream, args)

    return go


def _not_ready_in_capture(t: _Table, op: str, m: int, n: int, k: int, shape: str) -> None:
    """The fallback for a kernel that is not loaded, inside a capture, if that is safe; else :class:`NotWarmedError`."""
    fix = (
        f"call hwprofile.ops.warmup(device={t.index}, shapes={{{op!r}: [({m}, {n}, {k})]}}) (or with models=[...]) before capturing"
    )
    if (op, t.index, thread_id()) not in fallback_ready:
        raise NotWarmedError(
            f"{op} ({shape}) was first called inside a CUDA-graph capture on cuda:{t.index}: its kernel is not loaded and its "
            f"fallback was never initialised on this device in this thread (cuBLAS), and either would break the capture; {fix}"
        )
    if (op, m, n, k) not in _warned_capture:
        _warned_capture.add((op, m, n, k))
        log.warning("%s (%s) inside a CUDA-graph capture: its kernel is not loaded, the capture records the fallback; %s", op, shape, fix)


def launch(
    t: _Table, op: str, out: Any, x: Any, w: Any, scale: Any, m: int, n: int, k: int, mode: int, split_k: bool | None = None
) -> bool:
    """Launch ``op``'s kernel on checked operands; False (after one warning) if it cannot be built, loaded or launched.

    ``split_k`` None takes the profile's ``gemv.split_k``. Any error the launch itself returns
    (a refused ``cuFuncSetAttribute``, ``cuLaunchKernelEx`` refusing a cluster under MIG, MPS or
    vGPU, any other CUDA error) marks the kernel failed on this device (:meth:`_Table.fail`, one
    warning naming kernel, device and error) and the op falls back from then on; strict mode
    raises it. The launcher seam: CPU tests replace it with a fake that computes the result in torch.
    """
    if op in t.errors and not t.strict:  # failed here before (warned then): the fallback, silently; strict tries and raises
        return False
    split = t.split_k if split_k is None else split_k
    go = t.launches.get((op, m, n, k, mode, split)) or _load(t, op, m, n, k, mode, split)
    if go is None:
        return False
    try:
        go(raw_stream(t.index), out.data_ptr(), x.data_ptr(), w.data_ptr(), scale.data_ptr() if scale is not None else 0, m, n, k)
    except Exception as exc:
        err = exc if isinstance(exc, KernelError) else KernelError(f"launching the {op} kernel: {type(exc).__name__}: {exc}")
        if t.strict:
            if err is exc:
                raise
            raise err from exc
        where = f"cuda:{t.index} ({t.prof.device.name})"
        t.fail(op, f"launch failed on {where}: {err}")
        warnings.warn(
            f"hwprofile: {op} kernel failed to launch on {where}, using the torch fallback from now on: {err}",
            RuntimeWarning,
            stacklevel=5,  # launch <- _dispatch <- call <- the public op <- its caller
        )
        return False
    return True


def unplannable(prof: Profile, op: str, m: int, n: int, k: int, split_k: bool) -> str | None:
    """Why ``op``'s planner cannot plan ``(m, n, k)`` on ``prof``'s device (None: it can, within the target's limits).

    The gate :func:`_dispatch.route` asks it last, so a shape every bound admits but the planner
    refuses (a raised ``max_k`` with split-K off: an x slice larger than shared memory) or plans
    past the target's published limits (:mod:`hwprofile.kernels.limits`) takes the fallback and
    :func:`_dispatch.decide` says why, instead of a ``ValueError`` or a launch error reaching the op.
    Every scale mode of a scaled op is planned. Pure (planners are), so tested on the CPU.
    """
    from ..kernels import limits

    spec = prof.kernels.get(op)
    if spec is None:
        return None
    d = OPS[op]
    for sc in d.scale_modes if d.scaled else (None,):
        try:
            plan = spec.configure(m=m, n=n, k=k, split_k=split_k, **({} if sc is None else {"scale": sc}))
        except ValueError as exc:
            return f"its planner refuses M={m}, N={n}, K={k} (split-K {'on' if split_k else 'off'}): {exc}"
        if prof.target is not None:
            try:
                broken = limits.check(prof.target, plan.grid, plan.block, plan.shared_bytes, cluster=plan.grid[1])
            except ValueError:  # a target without recorded limits: the driver decides at launch
                broken = []
            if broken:
                return f"its plan {plan.name_expression} exceeds {prof.target}'s limits: " + "; ".join(broken)
    return None


def device_index(x: Any, cpu_index: int) -> int:
    """``x``'s CUDA device index, or ``cpu_index`` for a CPU tensor (the CPU test seam; -1 outside tests)."""
    i = int(x.get_device())
    return i if i >= 0 else cpu_index


def check_operands(op: str, index: int, cpu_index: int, out: Any, x: Any, w: Any, scale: Any) -> tuple[int, int, int, int]:
    """The gate of direct kernel calls: ``(M, N, K, scale mode)``, or a ValueError naming the argument."""
    import torch

    d = OPS[op]
    for name, tensor in (("out", out), ("x", x), ("w", w)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2:
            got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(f"{op}: {name} must be a 2-D torch.Tensor for the kernel, got {got}")
    if d.scaled and scale is None:
        raise ValueError(f"{op}: the kernel needs a float32 scale ([1] per tensor or [N] per row)")
    if not d.scaled and scale is not None:
        raise ValueError(f"{op}: takes no scale")
    (m, k), n = x.shape, w.shape[0]
    want: dict[str, tuple[Any, Any, tuple[int, int] | None]] = {
        "out": (out, getattr(torch, d.out_dtype), (m, n)),
        "x": (x, getattr(torch, d.x_dtype), (m, k)),
        "w": (w, getattr(torch, d.w_dtype), (n, k)),
    }
    if scale is not None:
        want["scale"] = (scale, torch.float32, None)
    for name, (tensor, dtype, shape) in want.items():
        if tensor.dtype != dtype:
            raise ValueError(f"{op}: {name} must be {dtype}, got {tensor.dtype}")
        if shape is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{op}: {name} must have shape {shape}, got {tuple(tensor.shape)}")
    for name, (tensor, _, _) in want.items():
        if device_index(tensor, cpu_index) != index:
            raise ValueError(f"{op}: {name} must be on cuda:{index}, got {tensor.device}")
        if not tensor.is_contiguous() or tensor.data_ptr() % 16:
            raise ValueError(f"{op}: {name} must be contiguous and 16-byte aligned for the kernel")
    if scale is not None and scale.numel() not in (1, n):
        raise ValueError(f"{op}: scale must have 1 or {n} elements, got {scale.numel()}")
    if not (m and n and k):
        raise ValueError(f"{op}: the kernel needs M, N, K >= 1, got M={m}, N={n}, K={k}; empty problems take the fallback")
    mode = NO_SCALE if scale is None else TENSOR_SCALE if scale.numel() == 1 else ROW_SCALE
    return m, n, k, mode
