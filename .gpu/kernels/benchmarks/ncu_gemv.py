"""Hardware counters of the GEMV kernels against cuBLAS on the H200, for issue 15's "measured reason".

Run under Nsight Compute with profiling off at start; each measured launch sits alone between
``cudaProfilerStart``/``Stop``, so the report holds exactly the launches listed in ``ncu_order.txt``
(kernel or cuBLAS, per shape), in that order. Weights are fresh random tensors; ncu flushes the
caches before each replay (cold L2, as in the graph-replay benchmarks).
Usage (``benchmarks/run_h200.sh counters`` runs it twice, with the sections RESULTS cites):
    OUT=dir ncu --profile-from-start off --clock-control none --cache-control all --section ... \
        python3 benchmarks/ncu_gemv.py
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.nn.functional as F

import hwprofile
from hwprofile import ops
from hwprofile.optable import ROW_SCALE

OUT = Path(os.environ.get("OUT", "out"))
dev = torch.device("cuda:0")
BF16 = [(2048, 7168), (4096, 4096), (7168, 16384), (28672, 4096), (57344, 7168)]  # router shapes: see main()
FP8 = [(2048, 7168), (4096, 4096), (7168, 16384), (28672, 4096)]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    prof = hwprofile.profile(0)
    split_k = bool(prof["gemv.split_k"])  # what ops.run_kernel plans with (split_k=None): the labels name that launch
    order: list[str] = []

    def measured(label: str, fn) -> None:  # one launch inside the profiler window
        fn()  # load / warm the code path outside the window
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        order.append(label)

    for n in (256, 384):
        for m in (1, 8, 16):
            k = 7168
            x = torch.randn(m, k, device=dev).bfloat16()
            w = torch.randn(n, k, device=dev).bfloat16()
            out = torch.empty(m, n, device=dev)
            launch = prof.kernels["router_gemm"].configure(m=m, n=n, k=k, split_k=split_k)
            measured(f"router M={m} N={n} kernel {launch.name_expression} grid {launch.grid}",
                     lambda: ops.run_kernel("router_gemm", out, x, w))
            measured(f"router M={m} N={n} cuBLAS torch.mm(out_dtype=fp32)", lambda: torch.mm(x, w.t(), out_dtype=torch.float32))
    for n, k in BF16:
        x = torch.randn(1, k, device=dev).bfloat16()
        w = torch.randn(n, k, device=dev).bfloat16()
        out = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
        mb = n * k * 2 / 1e6
        launch = prof.kernels["gemv"].configure(m=1, n=n, k=k, split_k=split_k)
        measured(f"bf16 {n}x{k} {mb:.0f}MB kernel {launch.name_expression} grid {launch.grid}",
                 lambda: ops.run_kernel("gemv", out, x, w))
        measured(f"bf16 {n}x{k} {mb:.0f}MB cuBLAS F.linear", lambda: F.linear(x, w))
    for n, k in FP8:
        x = torch.randn(1, k, device=dev).bfloat16()
        w = (torch.randn(n, k, device=dev) * 2).to(torch.float8_e4m3fn)
        s = torch.rand(n, device=dev) + 0.5
        out = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
        launch = prof.kernels["fp8_gemv"].configure(m=1, n=n, k=k, split_k=split_k, scale=ROW_SCALE)
        measured(f"fp8 {n}x{k} {n * k / 1e6:.0f}MB kernel {launch.name_expression} grid {launch.grid}",
                 lambda: ops.run_kernel("fp8_gemv", out, x, w, s))
    (OUT / "ncu_order.txt").write_text("\n".join(order) + "\n")
    print("\n".join(order))


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
