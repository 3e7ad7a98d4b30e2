"""Eager kernel launches through libcuda's ``cuLaunchKernel`` by ctypes. Never loads or compiles anything.

Why: on the H200 host a launch through cuda-python (``jit.LoadedKernel.launch``) cost 10.8 µs of
host time, more than half of an op's eager call and more than a whole ``F.linear`` at small shapes
(benchmarks/RESULTS.md, "Ops in an engine"). This module calls the same driver entry point with a
pre-packed argument block, so a launch is one slice assignment and one foreign call. The function
handle comes from the loaded kernel (``int(kernel.function)``); the first launch of every
(kernel, launch) still goes through ``LoadedKernel.launch``, which raises the dynamic shared-memory
limit where needed. ``tests/test_ops_gpu.py`` checks that both launches write identical results.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, final

from .errors import KernelError

_cu_launch: Any = None  # libcuda's cuLaunchKernel with argtypes set; False when unavailable


def _driver_launch() -> Any:
    global _cu_launch
    if _cu_launch is None:
        try:
            f = ctypes.CDLL("libcuda.so.1").cuLaunchKernel  # torch already loaded it: same handle
        except (OSError, AttributeError):
            _cu_launch = False
        else:
            u = ctypes.c_uint
            f.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            f.restype = ctypes.c_int
            _cu_launch = f
    return _cu_launch


@final
class FastLaunch:
    """One kernel instance with one launch shape: call it with (stream, out, x, w, scale, m, n, k) pointers and ints."""

    __slots__ = ("_args", "_fn", "_launch", "_lock", "_params", "name")

    def __init__(self, function: Any, launch: Any, name: str) -> None:
        f = _driver_launch()
        if not f:
            raise KernelError("libcuda.so.1 (cuLaunchKernel) is not loadable")
        self.name = name
        self._fn = ctypes.c_void_p(int(function))
        # (out, x, w, scale) pointers, then m, n, k: each in its own 8-byte slot; the kernel reads 4 bytes of an int slot
        self._args = (ctypes.c_uint64 * 7)()
        base = ctypes.addressof(self._args)
        self._params = (ctypes.c_void_p * 7)(*(base + 8 * i for i in range(7)))
        g, b = launch.grid, launch.block
        self._launch = (self._fn, g[0], g[1], g[2], b[0], b[1], b[2], launch.shared_bytes)
        self._lock = threading.Lock()

    def __call__(self, stream: int, out: int, x: int, w: int, scale: int, m: int, n: int, k: int) -> None:
        with self._lock:  # one argument block per instance: concurrent launches must not interleave
            self._args[:] = (out, x, w, scale, m, n, k)  # type: ignore[call-overload]
            err = _cu_launch(*self._launch, stream, self._params, None)
        if err:
            raise KernelError(f"launching {self.name} failed with CUresult {err}; the arguments were checked, so this is a driver or kernel fault")


def make(kernel: Any, launch: Any) -> FastLaunch | None:
    """A fast launcher for a loaded kernel, or None where libcuda or the handle is not usable (then use kernel.launch)."""
    try:
        return FastLaunch(kernel.function, launch, getattr(kernel, "name", "kernel"))
    except (KernelError, TypeError, ValueError, AttributeError):
        return None
