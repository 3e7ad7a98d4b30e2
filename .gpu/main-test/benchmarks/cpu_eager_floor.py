"""The eager front's cost on a CPU-only machine, through the CPU test seam (``hwprofile.ops._dispatch._cpu_index``).

Two measurements (issue 11 item 7; the H200 ones are bench_ops.py ``eager`` and ``floor``):

* own cost: each op with its fallback replaced by a function returning a preallocated tensor, minus
  that function (20000-call loops, median of 5);
* floor: in one loop with a real CPU ``F.linear`` (x [8, 64], w [256, 64], one thread): a bare
  Python frame around it, the frame plus the six reads a contract check needs (shape, dtype and
  device of x and w), and ``ops.gemv`` (median of 9 rotated rounds).

The seam adds a whole-device comparison for CPU tensors (a meta tensor also has index -1), about
0.15 µs that a CUDA call does not pay. The fallbacks are stubbed where the ops call them
(``hwprofile.ops._dispatch.ENTRIES[op].fallback``); every shape here routes to the fallback, so no kernel is
launched on the CPU tensors. Usage: python benchmarks/cpu_eager_floor.py (``benchmarks/run_cpu.sh eager``)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HWPROFILE_DEVICE", "h200")

import torch

from hwprofile import ops
from hwprofile.ops import _dispatch


def wall(fn: Callable[[], Any], n: int = 20000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def own_cost() -> bool:
    """Print each op's own cost; False if the stub could not be put in the op's way (nothing timed then)."""
    ok = True
    for op, m, n, k in (("router_gemm", 32, 256, 7168), ("linear_bf16_fp32", 32, 256, 7168), ("gemv", 1, 28672, 4096),
                        ("fp8_gemv", 1, 56, 4096)):
        x = torch.zeros(m, k, dtype=torch.bfloat16)
        o = torch.zeros(m, n)
        a: tuple[Any, ...] = (x, torch.zeros(n, k).to(torch.float8_e4m3fn), torch.ones(n)) if op == "fp8_gemv" else (
            x, torch.zeros(n, k, dtype=torch.bfloat16))

        def stub(*args: Any, o: Any = o) -> Any:
            return o

        saved = {name: e.fallback for name, e in _dispatch.ENTRIES.items()}
        for e in _dispatch.ENTRIES.values():
            e.fallback = stub
        try:
            f = getattr(ops, op)
            if f(*a) is not o:  # never time the real fallback under the stub's name
                print(f"own cost {op:17s}: NOT MEASURED: the op did not call the stubbed fallback "
                      f"(hwprofile.ops._dispatch.ENTRIES[{op!r}].fallback)")
                ok = False
                continue
            rs = [(wall(lambda: f(*a)), wall(lambda: stub(*a))) for _ in range(5)]
        finally:
            for name, fn in saved.items():
                _dispatch.ENTRIES[name].fallback = fn
        mo, ms = statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)
        print(f"own cost {op:17s}: op with a stub fallback {mo:.2f} us, the stub {ms:.2f} us: {mo - ms:.2f} us")
    return ok


def floor() -> None:
    torch.set_num_threads(1)
    x, w = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(256, 64, dtype=torch.bfloat16)
    linear, bf16 = torch.nn.functional.linear, torch.bfloat16

    def frame(x: Any, w: Any) -> Any:
        return linear(x, w)

    def reads(x: Any, w: Any) -> Any:
        _, k = x.shape
        _, wk = w.shape
        if k == wk and x.dtype is bf16 and w.dtype is bf16 and x.get_device() == w.get_device():
            return linear(x, w)
        raise AssertionError

    fns = {"F.linear": lambda: linear(x, w), "one frame": lambda: frame(x, w), "frame + six reads": lambda: reads(x, w),
           "ops.gemv": lambda: ops.gemv(x, w)}
    per: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for i in range(9):
        for name in names[i % 4 :] + names[: i % 4]:
            per[name].append(wall(fns[name]))
    med = {k: statistics.median(v) for k, v in per.items()}
    print("floor (CPU F.linear): " + ", ".join(f"{k} {v:.2f} us (+{v - med['F.linear']:.2f})" for k, v in med.items()))


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    _dispatch._cpu_index = 0  # the CPU test seam: CPU tensors route as device 0 of the simulated H200
    measured = own_cost()
    floor()
    raise SystemExit(0 if measured else 1)
