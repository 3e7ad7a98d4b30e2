"""Ops: contracts, torch fallbacks that honour them, and the one routing function. Never imports torch at import.

Contracts (every path, kernel or fallback, returns exactly this; facts from ``hwprofile.optable``):

==================  ====================================================  =========================
op                  inputs                                                output
==================  ====================================================  =========================
router_gemm         hidden [..., K] bf16, weight [N, K] bf16              [..., N] **float32**
linear_bf16_fp32    x [..., K] bf16, w [N, K] bf16                        [..., N] **float32**
gemv                x [..., K] bf16, w [N, K] bf16                        [..., N] bf16 (fp32 acc.)
fp8_gemv            x [..., K] bf16, w [N, K] float8_e4m3fn, scale fp32   [..., N] bf16 (fp32 acc.)
                    ([] / [1] per tensor, or [N] per output row)
==================  ====================================================  =========================

Every op takes ``out=`` (a preallocated result of exactly that shape and dtype, written and
returned), any leading batch dimensions, empty dimensions (M = 0 or N = 0 give an empty result,
K = 0 gives zeros) and strided weights (a row stride other than K: the fallback takes them).

:func:`route` is the only place that decides kernel or fallback: the ops call it once per
(device, M, N, K) and remember the answer (:data:`_memos`), :func:`decide` calls it and turns its
answer into words. Its inputs are read once per device into
a :class:`_Route` per op (thresholds and bounds from the profile, availability of the kernel,
deterministic mode), so a decision is a few integer comparisons. A kernel that fails to build or
load warns once and the op falls back from then on (``HWPROFILE_STRICT=1`` raises instead).

Under ``torch.compile`` each op goes through its ``torch.ops.hwprofile.<op>`` custom op (registered
with a fake implementation, see :func:`register`); in eager mode ``hwprofile.ops.<op>`` is the op's
eager front (:func:`_front`), which checks and routes the common call inline: the dispatcher would
add host time to every call, and an op may cost at most 1 µs more than its fallback (measured in
benchmarks/RESULTS.md, "Ops in an engine").
"""

from __future__ import annotations

import ctypes
import functools
import math
import sys
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, final

from . import _state
from . import profiles as _profile_mod
from ._log import get_logger
from .errors import KernelError
from .optable import FP8_GEMV, GEMV, LINEAR_BF16_FP32, NO_SCALE, OPS, ROUTER_GEMM, ROW_SCALE, TENSOR_SCALE, OpDef
from .profiles import Profile, profile

if TYPE_CHECKING:
    from typing import Literal

    import torch

    Path = Literal["kernel", "fallback"]  #: where a Decision sends a call

__all__ = [
    "NO_SCALE", "ROW_SCALE", "TENSOR_SCALE", "Decision", "decide", "fp8_gemv", "gemv", "linear_bf16_fp32", "register",
    "reset_dispatch", "route", "router_gemm",
]

log = get_logger(__name__)

_ARG_TYPES = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int)

#: test seam: the device index CPU tensors are routed as (-1: CPU tensors always take the fallback).
#: Tests set it to 0 together with a fake :func:`_launch` to drive every gate through the public ops.
_cpu_index: int = -1


@final
class Decision:
    """Which path an op takes for a shape, and why (for tests, logs and ``hwprofile explain``)."""

    __slots__ = ("gate", "op", "path", "reason")

    op: str
    path: Path  #: "kernel" | "fallback"
    reason: str  #: in words, naming the setting or bound that decided
    gate: str | None  #: the gate that sent the call to the fallback (None: kernel); see :func:`route`

    def __init__(self, op: str, path: Path, reason: str, gate: str | None = None) -> None:
        self.op, self.path, self.reason, self.gate = op, path, reason, gate

    def __repr__(self) -> str:
        return f"Decision({self.op!r}, {self.path!r}, {self.reason!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Decision) and (self.op, self.path, self.reason) == (other.op, other.path, other.reason)

    __hash__ = None  # type: ignore[assignment]


@final
class _Route:
    """One op's dispatch facts on one device, resolved from the profile once (plain ints)."""

    __slots__ = (
        "counts",
        "k_multiple",
        "max_k",
        "max_m",
        "max_n",
        "min_k",
        "min_n",
        "n_multiple",
        "off",
        "op",
        "roof_hi",
        "roof_lo",
        "who",
    )

    def __init__(self, op: OpDef, prof: Profile) -> None:
        settings: Any = prof  # Profile[key] is the setting's value, typed Any (bounds are read as int below)

        def val(b: int | str) -> int:
            return b if isinstance(b, int) else int(settings[b])

        self.op = op
        self.who = prof.plugin.name if prof.plugin else "no architecture plugin"
        self.off: str | None = None  #: "deterministic" | "no_kernel" | "failed" | None
        if prof["deterministic"]:
            self.off = "deterministic"
        elif op.name not in prof.kernels:
            self.off = "no_kernel"
        self.max_m, self.min_n, self.max_n = val(op.max_m), val(op.min_n), val(op.max_n)
        self.n_multiple = val(op.n_multiple)
        self.min_k, self.max_k = val(op.min_k), val(op.max_k)
        self.k_multiple = math.lcm(val(op.k_multiple), op.k_vec)  # the kernels' 16-byte loads need k_vec too
        self.roof_lo, self.roof_hi = (val(op.roof[0]), val(op.roof[1])) if op.roof else (0, 0)
        self.counts = prof.stats.counts.setdefault(op.name, {"kernel": 0, "fallback": 0})


def route(r: _Route, m: int, n: int, k: int, operands: tuple[Any, ...] | None = None) -> str | None:
    """The routing function: ``None`` (take the kernel) or the name of the first gate that says no.

    Gates, in order: ``empty`` (M, N or K is 0: nothing to launch), ``deterministic``,
    ``no_kernel``, ``failed`` (the kernel did not build or load here), ``m``, ``n``,
    ``n_multiple``, ``k``, ``k_multiple``, ``roof`` (N where the fallback is near the bandwidth
    roof), ``layout`` (an operand is not contiguous or not 16-byte aligned; checked only when
    ``operands`` are given). Bounds are those of the measured region: outside it, the fallback.
    """
    if not (m and n and k):
        return "empty"
    if r.off is not None:
        return r.off
    if m > r.max_m:
        return "m"
    if n < r.min_n or n > r.max_n:
        return "n"
    if n % r.n_multiple:
        return "n_multiple"
    if k < r.min_k or k > r.max_k:
        return "k"
    if k % r.k_multiple:
        return "k_multiple"
    if r.roof_lo <= n < r.roof_hi:
        return "roof"
    if operands is not None and _misplaced(operands):
        return "layout"
    return None


def _misplaced(operands: tuple[Any, ...]) -> bool:
    """True if an operand (None: absent) is not contiguous or not 16-byte aligned: the kernels cannot take it."""
    return any(t is not None and (not t.is_contiguous() or t.data_ptr() % 16) for t in operands)


def _reason(r: _Route, gate: str | None, m: int, n: int, k: int) -> str:
    """Words for :func:`route`'s answer, naming the setting behind each bound."""
    op = r.op

    def name(b: int | str, what: str) -> str:
        return f"{b}" if isinstance(b, str) else f"the {op.name} kernel's {what}"

    region = f"M <= {r.max_m}, N in [{r.min_n}, {r.max_n}], K in [{r.min_k}, {r.max_k}]"
    if gate is None:
        return f"M={m}, N={n}, K={k} inside the measured region of the {op.name} kernel ({region})"
    if gate == "empty":
        return f"empty problem (M={m}, N={n}, K={k}): nothing to launch; the result is {'zeros' if m and n else 'empty'}"
    if gate == "deterministic":
        return "deterministic mode (HWPROFILE_DETERMINISTIC) keeps ops on their fallback"
    if gate == "no_kernel":
        return f"{r.who} provides no {op.name} kernel for this device"
    if gate == "failed":
        return f"the {op.name} kernel failed to build or load in this process (warned once); set HWPROFILE_STRICT=1 to see the error raised"
    if gate == "m":
        if isinstance(op.max_m, int):
            return f"M={m}: the {op.name} kernel takes M <= {r.max_m} only"
        return f"M={m} > {op.max_m}={r.max_m}"
    if gate == "n":
        return f"N={n} outside [{r.min_n}, {r.max_n}] ({name(op.min_n, 'smallest N')} .. {name(op.max_n, 'largest N')}): not measured"
    if gate == "n_multiple":
        return f"N={n} is not a multiple of {r.n_multiple} ({name(op.n_multiple, 'N multiple')})"
    if gate == "k":
        return f"K={k} outside [{r.min_k}, {r.max_k}] ({name(op.min_k, 'smallest K')} .. {name(op.max_k, 'largest K')}): not measured"
    if gate == "k_multiple":
        return f"K={k} is not a multiple of {r.k_multiple} ({name(op.k_multiple, 'K multiple')}, and 16-byte loads need {op.k_vec})"
    if gate == "roof":
        lo, hi = op.roof or ("", "")
        return f"N={n} in [{r.roof_lo}, {r.roof_hi}) ({lo} .. {hi}) where the fallback is near the bandwidth roof"
    if gate == "layout":
        return "an operand is not contiguous or not 16-byte aligned (e.g. a padded weight row stride): the fallback takes it"
    raise AssertionError(f"unknown gate {gate!r}")


@final
class _Table:
    """Everything dispatch needs for one device, resolved once per profile."""

    __slots__ = ("index", "launches", "logged", "prof", "routes", "split_k", "strict")

    def __init__(self, prof: Profile) -> None:
        self.prof = prof
        self.index = prof.device.index
        self.strict = bool(prof["strict"])
        self.split_k = bool(prof["gemv.split_k"])
        self.routes = {name: _Route(op, prof) for name, op in OPS.items()}
        self.launches: dict[tuple[Any, ...], Callable[..., None]] = {}  # (op, m, n, k, scale mode) -> launcher
        self.logged: set[tuple[str, str]] = set()

    @property
    def failed(self) -> set[str]:
        """Ops whose kernel failed to build or load on this device."""
        return {name for name, r in self.routes.items() if r.off == "failed"}

    def count(self, op: str, path: str) -> None:
        self.routes[op].counts[path] += 1


_tables: dict[int, _Table] = {}
_memos: dict[str, dict[tuple[int, int, int, int], Any]] = {name: {} for name in OPS}  # see _dispatch
_tables_lock = threading.RLock()
_generation = 0  # bumped (under _tables_lock) whenever tables or memos are dropped; see _remember
_profiles = _profile_mod._profiles


@_state.in_forked_child
def _reinit_locks_in_child() -> None:
    global _tables_lock, _register_lock
    # a thread of the parent may have held them at the fork (a table build waits on profile()); it
    # does not exist in the child, which must still route and register
    _tables_lock = threading.RLock()
    _register_lock = threading.Lock()



def _table(index: int) -> _Table:
    """Device ``index``'s dispatch table, rebuilt when its profile changed (the memos go with the old one)."""
    t = _tables.get(index)
    if t is None or t.prof is not _profiles.get(index):
        with _tables_lock:
            t = _tables.get(index)
            if t is None or t.prof is not _profiles.get(index):
                if t is not None:
                    _forget()  # memo entries hold the replaced table
                t = _Table(profile(index))
                _tables[index] = t
    return t


def _forget(op: str | None = None) -> None:
    """Drop the routing memos (of ``op``, or all) so that no entry computed before survives."""
    global _generation
    with _tables_lock:
        _generation += 1
        for name, memo in _memos.items():
            if op is None or name == op:
                memo.clear()


@_state.on_reset
def reset_dispatch() -> None:
    """Forget dispatch tables and routing memos (``hwprofile.reset()`` calls it)."""
    with _tables_lock:
        _tables.clear()
        _forget()


# --- decisions (pure, testable on CPU against any simulated profile) -----------------------------


def decide(op: str, prof: Profile, *, m: int, n: int, k: int) -> Decision:
    """The path ``op`` takes on ``prof``'s device for an ``[m, k] x [n, k]`` problem, with the reason.

    It is :func:`route` on the same per-device facts the ops use (contiguous, aligned operands
    assumed), so it also reports a kernel that failed to load in this process.
    """
    for dim, v in (("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"decide({op!r}): {dim} must be an int >= 0, got {v!r}")
    t = _tables.get(prof.device.index)
    if t is None or t.prof is not prof:
        t = _Table(prof)
    r = t.routes.get(op)
    if r is None:
        raise KeyError(f"no op {op!r}; known ops: {', '.join(OPS)}")
    gate = route(r, m, n, k)
    return Decision(op, "kernel" if gate is None else "fallback", _reason(r, gate, m, n, k), gate)


# --- kernel path ---------------------------------------------------------------------------------


_current_raw_stream: Any = None  # torch._C._cuda_getCurrentRawStream (what Triton uses: no Stream object), bound lazily


def _raw_stream(index: int) -> int:
    """Handle of torch's current stream on ``index`` (so graph capture records the launch)."""
    global _current_raw_stream
    if _current_raw_stream is None:
        import torch

        _current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (lambda i: torch.cuda.current_stream(i).cuda_stream)
    return int(_current_raw_stream(index))


def _load(t: _Table, op: str, m: int, n: int, k: int, scale_mode: int) -> Callable[..., None] | None:
    """The launcher of ``op``'s kernel for a shape (memoised per table); None after one warning if it cannot load.

    A ctypes call of cuLaunchKernel was measured against cuda-python's on the H200 host: 11.08 vs
    11.09 µs per launch (the driver's own cost dominates), so launches stay with ``jit``.
    """
    key = (op, m, n, k, scale_mode)
    spec = t.prof.kernels[op]
    try:
        launch = spec.configure(m=m, n=n, k=k, split_k=t.split_k, **({"scale": scale_mode} if OPS[op].scaled else {}))
        from . import kernels

        target = t.prof.target
        if target is None:
            raise KernelError(f"{op}: the profile of device {t.index} has no NVRTC target")
        kern = kernels.load(spec, target, launch, t.index, _ARG_TYPES)
    except KernelError as exc:
        if t.strict:
            raise
        t.routes[op].off = "failed"
        _forget(op)
        warnings.warn(f"hwprofile: {op} kernel unavailable, using the torch fallback: {exc}", RuntimeWarning, stacklevel=4)
        return None

    def go(stream: int, *args: int) -> None:
        kern.launch(launch, stream, args)

    t.launches[key] = go
    return go


def _launch(t: _Table, op: str, out: Any, x: Any, w: Any, scale: Any, m: int, n: int, k: int, scale_mode: int) -> bool:
    """Launch ``op``'s kernel on checked operands; False (after one warning) if it cannot be built or loaded.

    The launcher seam: CPU tests replace it with a fake that computes the result in torch.
    """
    go = t.launches.get((op, m, n, k, scale_mode)) or _load(t, op, m, n, k, scale_mode)
    if go is None:
        return False
    go(_raw_stream(t.index), out.data_ptr(), x.data_ptr(), w.data_ptr(), scale.data_ptr() if scale is not None else 0, m, n, k)
    return True


def _device_of(x: Any) -> int:
    i = int(x.get_device())
    return i if i >= 0 else _cpu_index


def _check_launch(op: str, index: int, out: Any, x: Any, w: Any, scale: Any, m: int, n: int, k: int) -> None:
    """The gate of direct kernel calls (sweep, benchmarks): a mismatch is a ValueError naming the argument."""
    import torch

    d = OPS[op]
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
        if _device_of(tensor) != index:
            raise ValueError(f"{op}: {name} must be on cuda:{index}, got {tensor.device}")
        if not tensor.is_contiguous() or tensor.data_ptr() % 16:
            raise ValueError(f"{op}: {name} must be contiguous and 16-byte aligned for the kernel")
    if scale is not None and scale.numel() not in (1, n):
        raise ValueError(f"{op}: scale must have 1 or {n} elements, got {scale.numel()}")
    if not (m and n and k):
        raise ValueError(f"{op}: the kernel needs M, N, K >= 1, got M={m}, N={n}, K={k}; empty problems take the fallback")


def _run_kernel(t: _Table, op: str, out: Any, x: Any, w: Any, scale: Any, m: int, n: int, k: int, scale_mode: int = NO_SCALE) -> bool:
    """Launch ``op``'s kernel directly (no routing), after checking every operand; False if it cannot load."""
    _check_launch(op, t.index, out, x, w, scale, m, n, k)
    return _launch(t, op, out, x, w, scale, m, n, k, scale_mode)


# --- fallbacks (2-D operands, contract dtypes; the identity each stamps records is in the op table) ---


_mm_out_dtype: bool | None = None  # does this torch have torch.mm(..., out_dtype=) on CUDA? probed once


def _mm_fp32(x: Any, w: Any) -> Any:
    """``x . w^T`` in float32: cuBLAS with fp32 output where torch has it, else an fp32 upcast (CPU)."""
    global _mm_out_dtype
    if _mm_out_dtype and x.is_cuda:
        return _torch.mm(x, w.t(), out_dtype=_torch.float32)
    import torch

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


_F_linear: Any = None  # torch.nn.functional.linear, bound by register()
_torch: Any = None  # the torch module, bound by register()
_F32: Any = None  # torch.float32, bound by register()


def _linear(x: Any, w: Any) -> Any:
    """``x . w^T`` in bf16 with fp32 accumulation (cuBLAS / the CPU BLAS)."""
    return _F_linear(x, w)


FP8_CHUNK_ELEMENTS: Final = 1 << 24  # weight elements dequantised at a time: 32 MB of bf16


def _fp8_fallback(x: Any, w: Any, scale: Any) -> Any:
    """``x . (w * scale)^T -> bf16``, as precise as the kernel and without a full-size dequantised copy.

    e4m3 -> bf16 is exact, so each chunk of rows is dequantised to bf16 (at most
    :data:`FP8_CHUNK_ELEMENTS` elements), multiplied with fp32 accumulation into fp32, scaled in fp32
    after the product, and rounded to bf16 once.
    """
    import torch

    n, k = w.shape
    rows = max(1, FP8_CHUNK_ELEMENTS // max(k, 1))
    if rows >= n:
        acc = _mm_fp32(x, w.to(torch.bfloat16))
    else:
        acc = torch.empty((x.shape[0], n), dtype=torch.float32, device=x.device)
        for i in range(0, n, rows):
            acc[:, i : i + rows] = _mm_fp32(x, w[i : i + rows].to(torch.bfloat16))
    acc.mul_(scale.reshape(1, -1) if scale.numel() == n and n != 1 else scale.reshape(()))
    return acc.to(torch.bfloat16)


# --- the ops -------------------------------------------------------------------------------------


def _dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _validate(op: OpDef, x: Any, w: Any, scale: Any, out: Any) -> tuple[int, int, int, int]:
    """Check the arguments against the op's contract; returns (M, N, K, scale mode). Errors name the argument."""
    import torch

    xn, wn = op.args[0], op.args[1]
    for name, t in ((xn, x), (wn, w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op.name}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dtype != _dtype(op.x_dtype):
        raise ValueError(f"{op.name}: {xn} must be torch.{op.x_dtype}, got {x.dtype}")
    if w.dtype != _dtype(op.w_dtype):
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
    if out is not None:
        want = (*x.shape[:-1], n)
        if not isinstance(out, torch.Tensor) or out.dtype != _dtype(op.out_dtype) or tuple(out.shape) != want or out.device != dev:
            got = f"{out.dtype} {tuple(out.shape)} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"{op.name}: out must be torch.{op.out_dtype} of shape {want} on {dev}, got {got}")
    return m, n, k, mode


_DTYPES: dict[str, tuple[Any, Any, Any]] = {}  # op -> (x, w, out) torch dtypes, filled by register()
_MEMO_SIZE: Final = 4096  # distinct (device, M, N, K) remembered per op before the memo starts over


def _remember(memo: dict[tuple[int, int, int, int], Any], idx: int, op: str, m: int, n: int, k: int) -> tuple[_Table, _Route, str | None]:
    """Look up device ``idx``'s table and :func:`route` (without operands) for one shape, and remember them.

    The entry is stored only if no reset, table rebuild or kernel failure dropped the memos while it
    was computed (another thread): an entry of a dropped table would otherwise outlive the reset.
    """
    gen = _generation
    t = _table(idx)
    r = t.routes[op]
    hit = (t, r, route(r, m, n, k))
    with _tables_lock:
        if gen == _generation:
            if len(memo) >= _MEMO_SIZE:
                memo.clear()
            memo[(idx, m, n, k)] = hit
    return hit


def _dispatch(memo: dict[tuple[int, int, int, int], Any], idx: int, op: str, x: Any, w: Any, scale: Any,
              m: int, n: int, k: int, mode: int, out: Any) -> Any:
    """Route a checked 2-D call on device ``idx``, then run the kernel or the fallback.

    The operands are those of the contract ([M, K] and [N, K] on one device, contract dtypes);
    ``out`` is a contiguous [M, N] result for the kernel to write, or None. ``memo`` (the op's, in
    :data:`_memos`) holds the table, route and :func:`route`'s answer per (device, M, N, K), so the
    common call pays one dict lookup; the layout gate depends on the operands and is checked here
    by the helper :func:`route` uses.
    """
    hit = memo.get((idx, m, n, k))
    t, r, gate = hit if hit is not None else _remember(memo, idx, op, m, n, k)
    if gate is None:
        if not (x.is_cuda or idx == _cpu_index) or _misplaced((x, w, scale, out)):  # a pointer the kernel cannot take
            gate = "layout"
        else:
            res = out if out is not None else x.new_empty((m, n), dtype=_DTYPES[op][2])
            if _launch(t, op, res, x, w, scale, m, n, k, mode):
                r.counts["kernel"] += 1
                return res
    r.counts["fallback"] += 1
    return _fallback(op, gate == "empty", x, w, scale, m, n, mode)


def _fallback(op: str, empty: bool, x: Any, w: Any, scale: Any, m: int, n: int, mode: int) -> Any:
    """The contract's torch computation of a checked 2-D call (zeros for an empty problem)."""
    xdt, _, odt = _DTYPES[op]
    if empty:
        return x.new_zeros((m, n), dtype=odt)
    if mode != NO_SCALE:
        return _fp8_fallback(x, w, scale)
    if odt is not xdt:
        return _mm_fp32(x, w)
    return _F_linear(x, w)  # _linear, without one Python call


def _run(op: OpDef, x: Any, w: Any, scale: Any, out: Any) -> Any:
    """The general eager path: validate (errors name the argument), flatten batch dims, dispatch, fill ``out``.

    The public ops take it for anything but the common call (see :func:`_front`).
    """
    m, n, k, mode = _validate(op, x, w, scale, out)
    x2 = x if x.dim() == 2 else x.reshape(m, k)
    idx = x.get_device()
    if idx < 0:
        idx = _cpu_index
    if idx < 0:  # CPU tensors: torch's own implementation, no dispatch table
        res = _fallback(op.name, not (m and n and k), x2, w, scale, m, n, mode)
    else:
        o2 = None if out is None else (out if out.dim() == 2 else out.view(m, n) if out.is_contiguous() else None)
        res = _dispatch(_memos[op.name], idx, op.name, x2, w, scale, m, n, k, mode, o2)
        if res is o2:
            return out
    if out is not None:
        out.copy_(res.view(out.shape))
        return out
    return res if x2 is x else res.view(*x.shape[:-1], n)


def _front(op: OpDef, general: Callable[..., Any]) -> Callable[..., Any]:
    """The eager entry of ``op``: the common call checked and routed inline, anything else through ``general``.

    The common call is 2-D ``x`` and ``w`` of the contract dtypes on one device, no ``out`` and, for
    a scaled op, an fp32 scale per tensor or per row on that device. An op may cost at most 1 µs
    more than its fallback (benchmarks/RESULTS.md, "Ops in an engine"), so checking that call is a
    few tensor attribute reads (devices compared as integer indices: CPU and meta tensors have -1),
    one memo lookup for the route, and, for the unscaled (host-bound) ops, the fallback called from
    here; fp8_gemv goes through :func:`_dispatch` (its fallback costs ~50 µs). Anything else, or anything
    wrong, goes through ``general`` (the documented function), which validates and says what.
    """
    name = op.name
    xdt, wdt, odt = _DTYPES[name]
    f32, fp32_out, memo = _F32, op.out_dtype != op.x_dtype, _memos[name]

    def device(x: Any, w: Any, scale: Any) -> int:
        # the device index the call runs on, or -1 if the operands are not on one device the ops route
        i = x.get_device()
        if i >= 0:
            return i if w.get_device() == i and (scale is None or scale.get_device() == i) else -1
        # CPU tensors count only under the test seam, and only when all are CPU (a meta tensor is also -1)
        return _cpu_index if x.is_cpu and w.is_cpu and (scale is None or scale.is_cpu) else -1

    if op.scaled:

        def call(x: Any, w: Any, scale: Any, *, out: Any = None) -> Any:
            if out is None and not _compiling():
                try:
                    m, k = x.shape
                    n, wk = w.shape
                    ss = scale.shape
                    s0 = ss[0] if len(ss) == 1 else -1  # -1: not a 1-D scale (never a size)
                    mode = TENSOR_SCALE if not ss or s0 == 1 else ROW_SCALE if s0 == n else NO_SCALE
                    idx = x.get_device()
                    if idx < 0 or w.get_device() != idx or scale.get_device() != idx:
                        idx = device(x, w, scale)
                    fast = k == wk and x.dtype is xdt and w.dtype is wdt and scale.dtype is f32 and mode and idx >= 0
                except (AttributeError, ValueError, TypeError):
                    fast = False
                if fast:  # its fallback costs ~50 µs: _dispatch's one more call does not show
                    return _dispatch(memo, idx, name, x, w, scale, m, n, k, mode, None)
            return general(x, w, scale, out=out)

    else:

        def call(x: Any, w: Any, *, out: Any = None) -> Any:  # type: ignore[misc]
            if out is None and not _compiling():
                try:
                    m, k = x.shape
                    n, wk = w.shape
                    idx = x.get_device()
                    if idx < 0 or w.get_device() != idx:
                        idx = device(x, w, None)
                    fast = k == wk and x.dtype is xdt and w.dtype is wdt and idx >= 0
                except (AttributeError, ValueError, TypeError):
                    fast = False
                if fast:  # routed inline: the unscaled ops are the host-bound ones
                    hit = memo.get((idx, m, n, k))
                    _, r, gate = hit if hit is not None else _remember(memo, idx, name, m, n, k)
                    if gate is None:
                        return _dispatch(memo, idx, name, x, w, None, m, n, k, NO_SCALE, None)
                    r.counts["fallback"] += 1  # _dispatch's fallback tail, without its call
                    if gate == "empty":
                        return x.new_zeros((m, n), dtype=odt)
                    return _mm_fp32(x, w) if fp32_out else _F_linear(x, w)
            return general(x, w, out=out)

    # the closures above name their operands x, w(, scale); the op's own names (router_gemm: hidden,
    # weight) must work as keywords too, so the code object takes the names of the op table's args
    # (locals are addressed by position: renaming changes nothing else)
    code = call.__code__
    call.__code__ = code.replace(co_varnames=(*op.args, *code.co_varnames[len(op.args) :]))
    functools.update_wrapper(call, general)
    return call


def router_gemm(hidden: torch.Tensor, weight: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """MoE router logits: ``hidden[..., K] bf16 . weight[N, K]^T -> [..., N] float32`` on every path."""
    if _compiling():
        return _traced(ROUTER_GEMM, out, hidden, weight)
    return _run(ROUTER_GEMM, hidden, weight, None, out)  # type: ignore[no-any-return]


def linear_bf16_fp32(x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x[..., K] bf16 . w[N, K]^T -> [..., N] float32``; small M may use the plugin kernel."""
    if _compiling():
        return _traced(LINEAR_BF16_FP32, out, x, w)
    return _run(LINEAR_BF16_FP32, x, w, None, out)  # type: ignore[no-any-return]


def gemv(x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode GEMV: ``x[..., K] bf16 . w[N, K]^T -> [..., N] bf16`` with fp32 accumulation (kernel at M = 1)."""
    if _compiling():
        return _traced(GEMV, out, x, w)
    return _run(GEMV, x, w, None, out)  # type: ignore[no-any-return]


def fp8_gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x[..., K] bf16 . (w[N, K] e4m3 * scale)^T -> [..., N] bf16``; scale per tensor ([] or [1]) or per row ([N])."""
    if _compiling():
        return _traced(FP8_GEMV, out, x, w, scale)
    return _run(FP8_GEMV, x, w, scale, out)  # type: ignore[no-any-return]


# --- torch custom ops (torch.compile, CUDA graphs) -----------------------------------------------

_custom: dict[str, Any] = {}  # op name -> torch.ops.hwprofile.<op>
_registered = threading.Event()  # register() has run to its end
_register_lock = threading.Lock()
_library: Any = None


def register() -> None:
    """Register ``torch.ops.hwprofile.<op>`` for every op (idempotent; imports torch).

    It runs by itself when this module is imported after torch, or at the first lookup of an op
    (``ops.router_gemm``), which dynamo performs for real even while it traces.
    """
    global _library, _compiling
    if _registered.is_set():
        return
    import torch

    with _register_lock:
        if _registered.is_set():
            return
        global _F_linear, _torch, _F32
        _F_linear, _torch, _F32 = torch.nn.functional.linear, torch, torch.float32
        for op in OPS.values():
            _DTYPES[op.name] = (getattr(torch, op.x_dtype), getattr(torch, op.w_dtype), getattr(torch, op.out_dtype))
        _compiling = torch.compiler.is_compiling
        fronts = {name: _front(OPS[name], fn) for name, fn in _PUBLIC.items()}
        library: Any = torch.library.Library  # untyped in some torch builds
        lib = library("hwprofile", "FRAGMENT")
        for op in OPS.values():
            _define(torch, lib, op, fronts[op.name])
        _library = lib
        globals().update(fronts)
        _registered.set()


def _define(torch: Any, lib: Any, op: OpDef, front: Callable[..., Any]) -> None:
    """Define ``torch.ops.hwprofile.<op>``: its kernel is the op's eager front (what compiled graphs call), plus a fake."""
    params = ", ".join(f"Tensor {a}" for a in op.args)
    lib.define(f"{op.name}({params}) -> Tensor")
    out_dtype = getattr(torch, op.out_dtype)

    if op.scaled:

        def impl(x: Any, w: Any, scale: Any) -> Any:
            # inside a compile session (inductor constant folding, a backend running the graph) the front
            # would hand the call back to this custom op: run the eager implementation itself there
            return front(x, w, scale) if not _compiling() else _run(op, x, w, scale, None)

        def fake(x: Any, w: Any, scale: Any) -> Any:
            _validate(op, x, w, scale, None)
            return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=out_dtype)
    else:

        def impl(x: Any, w: Any) -> Any:  # type: ignore[misc]
            return front(x, w) if not _compiling() else _run(op, x, w, None, None)

        def fake(x: Any, w: Any) -> Any:  # type: ignore[misc]
            _validate(op, x, w, None, None)
            return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=out_dtype)

    lib.impl(op.name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"hwprofile::{op.name}", fake, lib=lib)
    _custom[op.name] = getattr(torch.ops.hwprofile, op.name).default


def _not_registered() -> bool:
    raise AssertionError("hwprofile.ops: an op ran before register()")  # unreachable: the ops are reached through __getattr__


_compiling: Callable[[], bool] = _not_registered  # torch.compiler.is_compiling once registered


def _traced(op: OpDef, out: torch.Tensor | None, *args: torch.Tensor) -> torch.Tensor:
    """What torch.compile traces: the custom op (opaque, with a fake implementation), then ``out``."""
    res: torch.Tensor = _custom[op.name](*args)
    if out is not None:
        out.copy_(res)
        return out
    return res


# The public ops are reached through the module's __getattr__ (PEP 562) until the custom ops are
# registered: an attribute lookup runs for real even while dynamo traces (a call in a traced frame
# would be traced, and registering cannot be), so the first ``ops.router_gemm`` registers, then
# binds the functions here and later lookups are plain.
_PUBLIC: dict[str, Callable[..., Any]] = {f.__name__: f for f in (router_gemm, linear_bf16_fp32, gemv, fp8_gemv)}
del router_gemm, linear_bf16_fp32, gemv, fp8_gemv


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'hwprofile.ops' has no attribute {name!r}")
    register()
    return globals()[name]  # the op's eager front (see _front), bound by register()


if TYPE_CHECKING:  # for type checkers: the public ops as declared above
    router_gemm = _PUBLIC["router_gemm"]
    linear_bf16_fp32 = _PUBLIC["linear_bf16_fp32"]
    gemv = _PUBLIC["gemv"]
    fp8_gemv = _PUBLIC["fp8_gemv"]

if "torch" in sys.modules:  # torch is already paid for: register now
    register()
