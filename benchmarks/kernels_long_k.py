"""The new kernel shape classes (issue 21, item 3) against their fallbacks, side by side, on the current GPU.

    OUT=dir python3 benchmarks/kernels_long_k.py [--ops gemv,fp8_gemv,router_gemm,linear_bf16_fp32] [--quick]

Shapes: the GEMVs (bf16, FP8 per-row scale) at the served long-K down projections (K = 14336 .. 32768),
at K = 2880 and 8192, at the widest LM heads of the model catalog (gpt-oss N = 201088 x 2880, Llama-4
N = 202048 x 5120), and at three shapes RESULTS.md's "Current" rows already record (2048x7168,
4096x4096, 7168x16384: the bar the chunked code must not move); the router GEMM at every catalog router
(N 8..512 x K 2048..7168) at M = 1, 8, 16; the small-M linear at K past the swept 7168.

Method: ``hwprofile.sweep.GpuTimer``, as ``hwprofile sweep`` times: kernel (``ops.run_kernel``, the
profile's plan, split-K as the profile says) and the op's fallback (``ops.fallback(op)``), cold L2 (weight
copies rotated through >= 512 MB), CUDA-graph replay, median of 15 replays, 2 passes with fresh weights.
Before timing, each kernel's output is checked against a float64 reference (relative error < 1e-2 for
bf16 out, < 1e-5 for fp32 out). Prints one row per shape (kernel µs, fallback µs, fallback / kernel,
weight TB/s of the kernel, its plan) and writes kernels_long_k.json to $OUT (or ./out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

import hwprofile
from hwprofile import ops
from hwprofile.optable import OPS
from hwprofile.sweep import GpuTimer

OUT = Path(os.environ.get("OUT", "out"))
LONG_K = (2880, 8192, 14336, 16384, 25600, 28672, 32768)
#: (N, K): served long-K down projections and the reference shapes the Current table records
GEMV_SHAPES = (
    (2048, 7168), (4096, 4096), (7168, 16384),  # RESULTS.md "Current": the bar
    (2880, 2880), (5120, 8192), (8192, 8192), (4096, 14336), (7168, 16384), (5120, 25600), (8192, 28672), (7168, 32768),
    (2048, 32768), (16384, 32768), (201088, 2880), (202048, 5120),
)
ROUTER_N = (8, 16, 32, 128, 160, 256, 384, 512)
ROUTER_K = (2048, 2880, 4096, 5120, 6144, 7168)
LINEAR = ((160, 2880), (4096, 8192), (4096, 14336), (4096, 28672))


def shapes(op: str, quick: bool) -> list[tuple[int, int, int]]:
    if op in ("gemv", "fp8_gemv"):
        return [(1, n, k) for n, k in dict.fromkeys(GEMV_SHAPES)][: 6 if quick else None]
    if op == "router_gemm":
        ms = (1, 16) if quick else (1, 8, 16)
        return [(m, n, k) for n in ROUTER_N for k in ROUTER_K for m in ms if not quick or k in (2880, 7168)]
    return [(m, n, k) for n, k in LINEAR for m in ((1, 16) if quick else (1, 8, 16))]


def check(op: str, m: int, n: int, k: int, dev: torch.device) -> float:
    """Relative error of the kernel's output against float64, fresh random inputs (NaN-poisoned output)."""
    d = OPS[op]
    x = torch.randn(m, k, device=dev).bfloat16()
    if d.scaled:
        w = (torch.randn(n, k, device=dev) * 3).to(torch.float8_e4m3fn)
        scale = torch.rand(n, device=dev) + 0.5
        ref = (x.double() @ w.double().t()) * scale.double()
    else:
        w, scale = torch.randn(n, k, device=dev).bfloat16(), None
        ref = x.double() @ w.double().t()
    out = torch.full((m, n), float("nan"), device=dev, dtype=getattr(torch, d.out_dtype))
    if not ops.run_kernel(op, out, x, w, scale):
        return float("nan")
    torch.cuda.synchronize(dev)
    if torch.isnan(out).any():
        return float("inf")
    return float((out.double() - ref).norm() / ref.norm())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=",".join(OPS), help="comma list of ops (default: every op)")
    ap.add_argument("--quick", action="store_true", help="a few shapes per op")
    args = ap.parse_args()
    todo = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in todo if o not in OPS]
    if unknown:
        print(f"kernels_long_k.py: unknown op(s) {', '.join(unknown)}; ops: {', '.join(OPS)}", file=sys.stderr)
        return 2
    prof = hwprofile.profile(0)
    dev = torch.device("cuda", prof.device.index)
    timer = GpuTimer(prof, reps=15, rotate_bytes=512 << 20)
    print(f"# {prof.device.name} ({prof.device.sm}), plugin {prof.plugin.name if prof.plugin else '-'}, "
          f"split_k={prof['gemv.split_k']}, torch {torch.__version__}")
    rows: list[dict[str, Any]] = []
    bad = 0
    for op in todo:
        d = OPS[op]
        tol = 1e-5 if d.out_dtype == "float32" else 1e-2
        print(f"\n## {op}\n{'M':>3} {'N':>7} {'K':>6} {'kernel us':>10} {'fallback us':>12} {'fb/kernel':>9} {'TB/s':>6} {'err':>9}  plan")
        for m, n, k in shapes(op, args.quick):
            spec = prof.kernels.get(op)
            plan = spec.configure(m=m, n=n, k=k, split_k=prof["gemv.split_k"], **({"scale": 2} if d.scaled else {})) if spec else None
            err = check(op, m, n, k, dev)
            ok = err < tol
            bad += not ok
            p = timer.measure(op, m, n, k, passes=2)
            wbytes = n * k * (1 if d.scaled else 2)
            tbs = wbytes / (p.kernel * 1e-6) / 1e12 if p.kernel_us else float("nan")
            row = {"op": op, "m": m, "n": n, "k": k, "kernel_us": p.kernel if p.kernel_us else None,
                   "fallback_us": p.fallback, "kernel_passes": p.kernel_passes, "fallback_passes": p.fallback_passes,
                   "rel_err": err, "ok": ok, "plan": plan.name_expression if plan else None,
                   "grid": list(plan.grid) if plan else None, "shared_bytes": plan.shared_bytes if plan else None}
            rows.append(row)
            ratio = p.fallback / p.kernel if p.kernel_us else float("nan")
            print(f"{m:>3} {n:>7} {k:>6} {p.kernel:>10.2f} {p.fallback:>12.2f} {ratio:>9.2f} {tbs:>6.2f} {err:>9.2e}  "
                  f"{row['plan']} grid={row['grid']} smem={row['shared_bytes']}{'' if ok else '  WRONG'}")
        ratios = [r["fallback_us"] / r["kernel_us"] for r in rows if r["op"] == op and r["kernel_us"]]
        if ratios:
            gm = statistics.geometric_mean(ratios)
            print(f"# {op}: fallback / kernel geomean {gm:.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "kernels_long_k.json").write_text(json.dumps({"device": prof.device.name, "rows": rows}, indent=1))
    print(f"\n{len(rows)} shapes, {bad} wrong; wrote {OUT / 'kernels_long_k.json'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
