"""The ctypes launcher's argument block, checked on the CPU with a stand-in for cuLaunchKernel
(the GPU twin in test_ops_gpu.py compares its results with the cuda-python launch)."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from hwprofile import fastlaunch
from hwprofile.errors import KernelError
from hwprofile.kernelspec import Launch


class Kernel:
    function = 0xDEAD0
    name = "hwp_gemv_simt<...>"


def test_arguments_reach_the_driver_as_the_kernel_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def driver(fn: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, smem: int, stream: int, params: Any, extra: Any) -> int:
        ptrs = [params[i] for i in range(7)]
        vals = [ctypes.c_uint64.from_address(p).value for p in ptrs[:4]] + [ctypes.c_int.from_address(p).value for p in ptrs[4:]]
        seen.append((fn.value, (gx, gy, gz), (bx, by, bz), smem, stream, vals, extra))
        return 0

    monkeypatch.setattr(fastlaunch, "_cu_launch", driver)
    go = fastlaunch.FastLaunch(Kernel.function, Launch("k", (12, 2, 1), (128, 1, 1), 4096), Kernel.name)
    go(77, 0x1000, 0x2000, 0x3000, 0, 1, 4096, 7168)
    go(78, 0x1010, 0x2010, 0x3010, 0x4000, 1, 2048, 512)
    assert seen[0] == (0xDEAD0, (12, 2, 1), (128, 1, 1), 4096, 77, [0x1000, 0x2000, 0x3000, 0, 1, 4096, 7168], None)
    assert seen[1][5] == [0x1010, 0x2010, 0x3010, 0x4000, 1, 2048, 512]


def test_a_driver_error_is_a_kernel_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastlaunch, "_cu_launch", lambda *a: 1)
    go = fastlaunch.FastLaunch(1, Launch("k", (1, 1, 1), (32, 1, 1), 0), "k")
    with pytest.raises(KernelError, match="CUresult 1"):
        go(0, 0, 0, 0, 0, 1, 1, 1)


def test_without_libcuda_there_is_no_fast_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastlaunch, "_cu_launch", False)
    assert fastlaunch.make(Kernel(), Launch("k", (1, 1, 1), (32, 1, 1), 0)) is None
