"""Ops: written contracts, torch fallbacks that honour them, and per-architecture dispatch.

Contracts (every path, kernel or fallback, returns exactly this):

==================  =================================================  ======================
op                  inputs                                             output
==================  =================================================  ======================
router_gemm         hidden [M, K] bf16, weight [N, K] bf16             [M, N] **float32**
linear_bf16_fp32    x [M, K] bf16, w [N, K] bf16                       [M, N] **float32**
gemv                x [1, K] bf16, w [N, K] bf16                       [1, N] bf16 (fp32 acc.)
fp8_gemv            x [1, K] bf16, w [N, K] float8_e4m3fn, scale fp32  [1, N] bf16 (fp32 acc.)
                    ([] / [1] per tensor, or [N] per output row)
==================  =================================================  ======================

Dispatch is decided from a per-device table built once from the profile (thresholds, predicate
bounds, available kernels), so a decision is a few comparisons. ``HWPROFILE_DETERMINISTIC=1``
keeps every op on its fallback. A kernel that fails to build or load warns once and the op falls
back (``HWPROFILE_STRICT=1`` raises instead).
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import profiles as _profile_mod
from ._log import get_logger
from .errors import KernelError
from .profiles import Profile, profile

if TYPE_CHECKING:
    import torch

log = get_logger(__name__)

_ARG_TYPES = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int)
NO_SCALE, TENSOR_SCALE, ROW_SCALE = 0, 1, 2


@dataclass(frozen=True)
class Decision:
    """Which path an op takes for a shape, and why (for tests, logs and ``hwprofile explain``)."""

    op: str
    path: str  # "kernel" | "fallback"
    reason: str


class _Predicate:
    """GEMV shape predicate bounds, read once from the profile."""

    __slots__ = ("k_multiple", "max_k", "max_n", "min_k", "min_n", "n_multiple", "roof_max", "roof_min")

    def __init__(self, prof: Profile, op: str) -> None:
        for name in self.__slots__:
            key = {"roof_min": "cublas_roof_n_min", "roof_max": "cublas_roof_n_max"}.get(name, name)
            setattr(self, name, prof[f"{op}.{key}"])

    def why_not(self, n: int, k: int) -> str | None:
        if not self.min_k <= k <= self.max_k:
            return f"K={k} outside [{self.min_k}, {self.max_k}]"
        if k % self.k_multiple:
            return f"K={k} not a multiple of {self.k_multiple}"
        if n % self.n_multiple or not self.min_n <= n <= self.max_n:
            return f"N={n} outside [{self.min_n}, {self.max_n}] or not a multiple of {self.n_multiple}"
        if self.roof_min <= n < self.roof_max:
            return f"N={n} in [{self.roof_min}, {self.roof_max}) where the fallback is near the bandwidth roof"
        return None

    def ok(self, n: int, k: int) -> bool:
        return (
            self.min_k <= k <= self.max_k
            and k % self.k_multiple == 0
            and n % self.n_multiple == 0
            and self.min_n <= n <= self.max_n
            and not self.roof_min <= n < self.roof_max
        )


class _Table:
    """Everything a dispatch decision needs for one device, resolved once per profile."""

    def __init__(self, prof: Profile) -> None:
        self.prof = prof
        self.index = prof.device.index
        k = prof.kernels
        det = bool(prof["deterministic"])
        self.deterministic = det
        self.strict = bool(prof["strict"])
        self.split_k = bool(prof["gemv.split_k"])
        self.router_max = 0 if det or "router_gemm" not in k else int(prof["router_gemm.max_tokens"])
        self.linear_max = 0 if det or "linear_bf16_fp32" not in k else int(prof["linear_bf16_fp32.max_tokens"])
        self.linear_max_n = int(prof["linear_bf16_fp32.max_n"])
        self.gemv = None if det or "gemv" not in k else _Predicate(prof, "gemv")
        self.fp8 = None if det or "fp8_gemv" not in k else _Predicate(prof, "fp8_gemv")
        self.failed: set[str] = set()
        self.launches: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self.logged: set[tuple[str, str]] = set()

    def count(self, op: str, path: str) -> None:
        c = self.prof.stats.counts.setdefault(op, {"kernel": 0, "fallback": 0})
        c[path] += 1
        if (op, path) not in self.logged:
            self.logged.add((op, path))
            log.debug("hwprofile %s: first %s call on device %d takes the %s path", self.prof.fingerprint, op, self.index, path)


_tables: dict[int, _Table] = {}
_tables_lock = threading.Lock()


def _table(index: int) -> _Table:
    t = _tables.get(index)
    if t is None or t.prof is not _profile_mod._profiles.get(index):
        with _tables_lock:
            t = _Table(profile(index))
            _tables[index] = t
    return t


def reset_dispatch() -> None:
    """Forget dispatch tables (after ``hwprofile.reset()``)."""
    _tables.clear()


# --- decisions (pure, testable on CPU against any simulated profile) -----------------------------


def decide(op: str, prof: Profile, *, m: int, n: int, k: int) -> Decision:
    """The path ``op`` takes on ``prof``'s device for an ``[m, k] x [n, k]`` problem, with the reason."""
    t = _Table(prof)
    if t.deterministic:
        return Decision(op, "fallback", "deterministic mode (HWPROFILE_DETERMINISTIC) keeps ops on their fallback")
    if op not in prof.kernels:
        who = prof.plugin.name if prof.plugin else "no architecture plugin"
        return Decision(op, "fallback", f"{who} provides no {op} kernel for {prof.device.sm}")
    if op == "router_gemm" or op == "linear_bf16_fp32":
        limit = t.router_max if op == "router_gemm" else t.linear_max
        key = f"{op}.max_tokens"
        if k % 8:
            return Decision(op, "fallback", f"K={k} is not a multiple of 8")
        if not 1 <= m <= limit:
            return Decision(op, "fallback", f"M={m} > {key}={limit}")
        if op == "linear_bf16_fp32" and n > t.linear_max_n:
            return Decision(op, "fallback", f"N={n} > linear_bf16_fp32.max_n={t.linear_max_n}")
        return Decision(op, "kernel", f"M={m} <= {key}={limit}")
    pred = t.gemv if op == "gemv" else t.fp8
    assert pred is not None
    if m != 1:
        return Decision(op, "fallback", f"M={m}: the GEMV kernel takes M = 1 only")
    why = pred.why_not(n, k)
    return Decision(op, "fallback", why) if why else Decision(op, "kernel", f"N={n}, K={k} inside the {op} predicate")


# --- argument checks -----------------------------------------------------------------------------


def _check(name: str, t: Any, dtype: Any, ndim: int = 2) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")


def _same_device(*named: tuple[str, Any]) -> None:
    dev = named[0][1].device
    for name, t in named[1:]:
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but {named[0][0]} is on {dev}; put them on one device")


def _launchable(t: _Table, op: str, *tensors: Any) -> bool:
    """Kernels need contiguous, 16-byte aligned operands; others take the fallback (logged once)."""
    if all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in tensors):
        return True
    if (op, "layout") not in t.logged:
        t.logged.add((op, "layout"))
        log.info("hwprofile: %s gets a non-contiguous or unaligned operand; such calls take the torch fallback", op)
    return False


# --- kernel path ---------------------------------------------------------------------------------


def _raw_stream(index: int) -> int:
    """Handle of torch's current stream on ``index`` (so graph capture records the launch)."""
    import torch

    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton uses: no Stream object
    return int(get(index)) if get is not None else int(torch.cuda.current_stream(index).cuda_stream)


_IN_DTYPE = {"router_gemm": "bfloat16", "linear_bf16_fp32": "bfloat16", "gemv": "bfloat16", "fp8_gemv": "float8_e4m3fn"}
_OUT_DTYPE = {"router_gemm": "float32", "linear_bf16_fp32": "float32", "gemv": "bfloat16", "fp8_gemv": "bfloat16"}


def _check_launch(op: str, index: int, out: Any, x: Any, w: Any, scale: Any, m: int, n: int, k: int) -> None:
    """The last gate before a launch: a mismatch is a ValueError naming the argument, never a launch on bad memory."""
    import torch

    want = {
        "out": (out, getattr(torch, _OUT_DTYPE[op]), (m, n)),
        "x": (x, torch.bfloat16, (m, k)),
        "w": (w, getattr(torch, _IN_DTYPE[op]), (n, k)),
    }
    if scale is not None:
        want["scale"] = (scale, torch.float32, None)
    for name, (tensor, dtype, shape) in want.items():
        if tensor.dtype != dtype:
            raise ValueError(f"{op}: {name} must be {dtype}, got {tensor.dtype}")
        if shape is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{op}: {name} must have shape {shape}, got {tuple(tensor.shape)}")
    for name, (tensor, _, _) in want.items():
        if not tensor.is_cuda or tensor.get_device() != index:
            raise ValueError(f"{op}: {name} must be on cuda:{index}, got {tensor.device}")
        if not tensor.is_contiguous() or tensor.data_ptr() % 16:
            raise ValueError(f"{op}: {name} must be contiguous and 16-byte aligned for the kernel")
    if scale is not None and scale.numel() not in (1, n):
        raise ValueError(f"{op}: scale must have 1 or {n} elements, got {scale.numel()}")


def _run_kernel(t: _Table, op: str, out: Any, x: Any, w: Any, scale: Any, m: int, n: int, k: int, scale_mode: int = NO_SCALE) -> bool:
    """Launch ``op``'s kernel; False (after one warning) if it cannot be built or loaded."""
    _check_launch(op, t.index, out, x, w, scale, m, n, k)

    key = (op, m, n, k, scale_mode)
    hit = t.launches.get(key)
    if hit is None:
        spec = t.prof.kernels[op]
        launch = spec.configure(m=m, n=n, k=k, split_k=t.split_k, **({"scale": scale_mode} if op == "fp8_gemv" else {}))
        try:
            from . import jit

            kern = jit.load(spec, t.prof.target, launch, t.index, _ARG_TYPES)
        except KernelError as exc:
            if t.strict:
                raise
            t.failed.add(op)
            warnings.warn(f"hwprofile: {op} kernel unavailable, using the torch fallback: {exc}", RuntimeWarning, stacklevel=3)
            return False
        hit = t.launches[key] = (kern, launch)
    kern, launch = hit
    stream = _raw_stream(t.index)
    kern.launch(launch, stream, (out.data_ptr(), x.data_ptr(), w.data_ptr(), scale.data_ptr() if scale is not None else 0, m, n, k))
    return True


# --- ops -----------------------------------------------------------------------------------------


def linear_bf16_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x[M,K] bf16 . w[N,K]^T -> [M,N] float32``; small M may use the plugin kernel."""
    import torch

    _check("x", x, torch.bfloat16)
    _check("w", w, torch.bfloat16)
    _same_device(("x", x), ("w", w))
    m, k = x.shape
    n, k2 = w.shape
    if k != k2:
        raise ValueError(f"x has K={k} but w has K={k2}; shapes {tuple(x.shape)} and {tuple(w.shape)}")
    if x.is_cuda:
        t = _table(x.device.index)
        if 1 <= m <= t.linear_max and n <= t.linear_max_n and k % 8 == 0 and "linear_bf16_fp32" not in t.failed and _launchable(t, "linear_bf16_fp32", x, w):
            out = torch.empty((m, n), dtype=torch.float32, device=x.device)
            if _run_kernel(t, "linear_bf16_fp32", out, x, w, None, m, n, k):
                t.count("linear_bf16_fp32", "kernel")
                return out
        t.count("linear_bf16_fp32", "fallback")
    return _mm_fp32(x, w)


_mm_out_dtype: bool | None = None  # does this torch have torch.mm(..., out_dtype=) on CUDA? probed once


def _mm_fp32(x: Any, w: Any) -> Any:
    """The fp32-output fallback: cuBLAS with fp32 output where torch has it, else an fp32 upcast."""
    global _mm_out_dtype
    import torch

    if x.is_cuda and _mm_out_dtype is not False:
        try:
            out = torch.mm(x, w.t(), out_dtype=torch.float32)
        except (TypeError, NotImplementedError) as exc:  # older torch: no out_dtype for mm
            _mm_out_dtype = False
            log.info("hwprofile: torch.mm(out_dtype=float32) is not available (%s); fp32 fallbacks upcast instead", exc)
        else:
            _mm_out_dtype = True
            return out
    return torch.mm(x.float(), w.float().t())


def router_gemm(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """MoE router logits: ``hidden[M,K] bf16 . weight[N,K]^T -> [M,N] float32`` on every path."""
    import torch

    _check("hidden", hidden, torch.bfloat16)
    _check("weight", weight, torch.bfloat16)
    _same_device(("hidden", hidden), ("weight", weight))
    m, k = hidden.shape
    n, k2 = weight.shape
    if k != k2:
        raise ValueError(f"hidden has K={k} but weight has K={k2}")
    if hidden.is_cuda:
        t = _table(hidden.device.index)
        if 1 <= m <= t.router_max and k % 8 == 0 and "router_gemm" not in t.failed and _launchable(t, "router_gemm", hidden, weight):
            out = torch.empty((m, n), dtype=torch.float32, device=hidden.device)
            if _run_kernel(t, "router_gemm", out, hidden, weight, None, m, n, k):
                t.count("router_gemm", "kernel")
                return out
        t.count("router_gemm", "fallback")
    return _mm_fp32(hidden, weight)


def gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Decode GEMV: ``x[1,K] bf16 . w[N,K]^T -> [1,N] bf16`` with fp32 accumulation."""
    import torch

    _check("x", x, torch.bfloat16)
    _check("w", w, torch.bfloat16)
    _same_device(("x", x), ("w", w))
    if x.shape[0] != 1:
        raise ValueError(f"gemv takes x of shape [1, K], got {tuple(x.shape)}; use linear for M > 1")
    k = x.shape[1]
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"x has K={k} but w has K={w.shape[1]}")
    if x.is_cuda:
        t = _table(x.device.index)
        if t.gemv is not None and t.gemv.ok(n, k) and "gemv" not in t.failed and _launchable(t, "gemv", x, w):
            out = torch.empty((1, n), dtype=torch.bfloat16, device=x.device)
            if _run_kernel(t, "gemv", out, x, w, None, 1, n, k):
                t.count("gemv", "kernel")
                return out
        t.count("gemv", "fallback")
    return torch.nn.functional.linear(x, w)


def fp8_gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x[1,K] bf16 . (w[N,K] e4m3 * scale)^T -> [1,N] bf16``; scale per tensor ([] or [1]) or per row ([N])."""
    import torch

    _check("x", x, torch.bfloat16)
    _check("w", w, torch.float8_e4m3fn)
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        raise ValueError(f"scale must be a float32 tensor, got {getattr(scale, 'dtype', type(scale).__name__)}")
    _same_device(("x", x), ("w", w), ("scale", scale))
    if x.shape[0] != 1:
        raise ValueError(f"fp8_gemv takes x of shape [1, K], got {tuple(x.shape)}")
    k = x.shape[1]
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"x has K={k} but w has K={w.shape[1]}")
    if scale.numel() == 1:
        mode = TENSOR_SCALE
    elif scale.dim() == 1 and scale.numel() == n:
        mode = ROW_SCALE
    else:
        raise ValueError(f"scale must have 1 element (per tensor) or N={n} elements (per row), got shape {tuple(scale.shape)}")
    if x.is_cuda:
        t = _table(x.device.index)
        if t.fp8 is not None and t.fp8.ok(n, k) and k % 16 == 0 and "fp8_gemv" not in t.failed and _launchable(t, "fp8_gemv", x, w, scale):
            out = torch.empty((1, n), dtype=torch.bfloat16, device=x.device)
            if _run_kernel(t, "fp8_gemv", out, x, w, scale, 1, n, k, mode):
                t.count("fp8_gemv", "kernel")
                return out
        t.count("fp8_gemv", "fallback")
    w_deq = (w.to(torch.float32) * scale.reshape(-1, 1)).to(torch.bfloat16)
    return torch.nn.functional.linear(x, w_deq)
