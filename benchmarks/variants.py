"""Variant sweep of the shared skinny-GEMM kernels on the H200: which tiles win for which shapes.

Times each template configuration directly (graph replay, cold L2, rotation as bench_ops.py) so
the plan in hwprofile.skinny can be chosen from measurements. Also measures the per-kernel floor
of graph replay (a 1-element torch kernel) to know what "latency-bound" means here.
Usage: PYTHONPATH=... python benchmarks/variants.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_ops import OUT, copies_for, graph_time

import hwprofile
from hwprofile import jit, ops
from hwprofile.jit import Launch

dev = torch.device("cuda:0")
prof = hwprofile.profile(0)
spec = prof.kernels["gemv"]
stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
results = []


def time_launch(launch: Launch, m: int, n: int, k: int, fp8: bool = False, out_dtype=torch.float32) -> float:
    kern = jit.load(spec, prof.target, launch, 0, ops._ARG_TYPES)
    nbytes = n * k * (1 if fp8 else 2)
    ws = [(torch.randn(n, k, device=dev) * (3 if fp8 else 1)).to(torch.float8_e4m3fn if fp8 else torch.bfloat16) for _ in range(copies_for(nbytes))]
    sc = torch.rand(n, device=dev) + 0.5
    x = torch.randn(m, k, device=dev).bfloat16()
    out = torch.full((m, n), float("nan"), device=dev, dtype=out_dtype)
    kern.launch(launch, stream(), (out.data_ptr(), x.data_ptr(), ws[0].data_ptr(), sc.data_ptr(), m, n, k))
    torch.cuda.synchronize()
    ref = x.double() @ (ws[0].double() * (sc.double()[:, None] if fp8 else 1)).t()
    err = float((out.double() - ref).norm() / ref.norm())
    assert err < 1e-2, (launch.name_expression, err)

    def f(i: int) -> None:
        kern.launch(launch, stream(), (out.data_ptr(), x.data_ptr(), ws[i].data_ptr(), sc.data_ptr(), m, n, k))

    us, spread = graph_time(f, len(ws))
    results.append({"expr": launch.name_expression, "grid": launch.grid, "block": launch.block, "m": m, "n": n, "k": k, "us": us, "tbps": nbytes / us / 1e6, "spread": spread})
    print(f"{launch.name_expression:<70} grid={launch.grid} M={m:2d} N={n:6d} K={k:5d}: {us:8.2f} us {nbytes / us / 1e6:5.2f} TB/s  (spread {spread:.0%})")
    return us


def mma(m, n, k, warps, nt, ks, u, out="float", fp8=False, scale=0) -> None:
    mt = 1 if m <= 8 else 2
    expr = f"hwp_skinny_mma<{'true' if fp8 else 'false'}, {out}, {mt}, {warps}, {nt}, {ks}, {u}, {scale}>"
    time_launch(Launch(expr, (-(-n // (8 * nt)), ks, 1), (warps * 32, 1, 1), 0), m, n, k, fp8, torch.float32 if out == "float" else torch.bfloat16)


def simt(m, n, k, warps, rows, ks, u, out="__nv_bfloat16", fp8=False, scale=0) -> None:
    vec = 16 if fp8 else 8
    per = -(-(k // vec) // ks)
    smem = m * per * (2 if fp8 else 1) * 16
    expr = f"hwp_gemv_simt<{'true' if fp8 else 'false'}, {out}, {m}, {warps}, {rows}, {ks}, {u}, {scale}>"
    time_launch(Launch(expr, (-(-n // (warps * rows)), ks, 1), (warps * 32, 1, 1), smem), m, n, k, fp8, torch.float32 if out == "float" else torch.bfloat16)


def floor() -> None:
    y = torch.zeros(1, device=dev)
    us, _ = graph_time(lambda i: y.add_(1), 64)
    results.append({"expr": "torch add_ 1 element", "us": us})
    print(f"graph-replay floor (1-element torch kernel): {us:.2f} us")


def round1() -> None:
    """First sweep: MMA vs SIMT, cluster split-K, warps per block, rows per warp."""
    floor()
    mma(1, 16, 512, 4, 2, 8, 8)
    mma(1, 16, 512, 4, 2, 1, 8)
    for m in (1, 16):
        for warps, nt, ks, u in [(4, 2, 8, 8), (4, 2, 4, 8), (4, 2, 1, 8), (8, 2, 8, 4), (4, 1, 8, 8), (2, 2, 8, 8), (4, 4, 8, 4), (2, 1, 8, 8)]:
            mma(m, 256, 7168, warps, nt, ks, u if m <= 8 else 4)
    for m in (1, 4):
        for warps, rows, ks, u in [(4, 2, 8, 4), (4, 2, 4, 4), (8, 1, 8, 4), (2, 2, 8, 4), (4, 1, 8, 8)]:
            simt(m, 256, 7168, warps, rows, ks, u, out="float")
    for n, k in [(2048, 7168), (4096, 4096), (57344, 7168)]:
        for warps, rows, ks, u in [(4, 2, 1, 4), (4, 2, 2, 4), (4, 2, 4, 4), (8, 2, 2, 4), (8, 1, 4, 8), (4, 4, 2, 2), (16, 1, 1, 8), (8, 2, 1, 4)]:
            simt(1, n, k, warps, rows, ks, u)
        for warps, nt, ks, u in [(4, 2, 2, 8), (8, 1, 4, 8)]:
            mma(1, n, k, warps, nt, ks, u, out="__nv_bfloat16")
        for warps, rows, ks, u in [(4, 2, 1, 4), (4, 2, 2, 4), (8, 2, 2, 4), (8, 1, 4, 8), (4, 4, 2, 2)]:
            simt(1, n, k, warps, rows, ks, u, fp8=True, scale=2)


def round2() -> None:
    """Second sweep, around round 1's winners: more warps for the router, batch depth for GEMV/FP8."""
    floor()
    for n in (256, 384):
        for m in (1, 8, 16):
            for warps, nt, ks in [(8, 2, 8), (8, 1, 8), (16, 1, 8), (16, 2, 8), (4, 1, 8), (8, 1, 4)]:
                mma(m, n, 7168, warps, nt, ks, 8 if m <= 8 else 4)
    for n, k in [(2048, 7168), (4096, 4096), (7168, 2048), (7168, 16384), (57344, 7168)]:
        for warps, rows, ks, u in [(4, 2, 1, 4), (4, 2, 2, 4), (4, 1, 2, 8), (2, 2, 2, 4), (8, 2, 1, 4), (4, 2, 2, 2), (4, 1, 1, 8)]:
            simt(1, n, k, warps, rows, ks, u)
        for warps, rows, ks, u in [(4, 2, 1, 4), (8, 2, 1, 4), (4, 1, 1, 8), (4, 2, 1, 2), (2, 2, 1, 4), (4, 2, 2, 4), (4, 1, 2, 8)]:
            simt(1, n, k, warps, rows, ks, u, fp8=True, scale=2)


if __name__ == "__main__":
    {"1": round1, "2": round2}[sys.argv[1] if len(sys.argv) > 1 else "2"]()
    (OUT / "variants.json").write_text(json.dumps(results, indent=1))
