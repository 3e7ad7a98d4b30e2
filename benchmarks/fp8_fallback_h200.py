"""FP8 GEMV fallback candidates on the GPU: which torch path is fast enough, and as precise as the kernel.

Candidates, each for x [M, K] bf16 and w [N, K] e4m3 with a per-tensor or per-row scale:
  dequant    w.to(bf16) in chunks + torch.mm(out_dtype=fp32) + scale (the shipped fallback)
  final      the shipped fallback (hwprofile.ops._fallbacks.fp8_mm): 3 e4m3 parts with per-row e8m0
             scales, fused casts, one _scaled_mm, from 4 MiB of weight; the dequantising path below
  split3     x split exactly into 3 e4m3 parts with power-of-two per-row scales, stacked along M
             (padded to 16), one torch._scaled_mm(out_dtype=fp32) with unit scales, parts scaled
             back exactly and summed in fp32, the weight scale in fp32, one bf16 rounding
Timed in CUDA-graph replay with cold L2 (rotating weight copies >= 512 MB), median of 15 replays;
each checked against a float64 reference. Prints one line per shape; writes $OUT/fp8_fallback.json; exit 1 when the
shipped fallback ("final") is over 2x the kernel at a shape the kernel runs (issue 32). Usage:
    OUT=dir python3 benchmarks/fp8_fallback_h200.py   (benchmarks/run_h200.sh fp8)
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch

SHAPES = [(1, 5120, 192), (1, 2048, 7168), (1, 4096, 5120), (1, 7168, 16384), (1, 8192, 28672), (1, 28672, 8192),
          (1, 5376, 21504), (1, 152064, 5120), (4, 4096, 7168), (16, 4096, 7168), (1, 2304, 16384), (3, 8192, 28672)]


def _cell(v: object) -> str:
    return f"{v:8.2f}" if isinstance(v, float) else f"{'-':>8}"


def split_parts(x: torch.Tensor, parts: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] bf16 -> (q [parts*M, K] e4m3, s [parts*M, 1] fp32 powers of two) with sum_j s_j q_j == x."""
    r = x.float()
    qs, ss = [], []
    for _ in range(parts):
        amax = r.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
        s = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
        q = (r / s).to(torch.float8_e4m3fn)
        r = r - q.float() * s
        qs.append(q)
        ss.append(s)
    return torch.cat(qs), torch.cat(ss)


def fb_split(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, parts: int = 3) -> torch.Tensor:
    m = x.shape[0]
    q, s = split_parts(x, parts)
    rows = q.shape[0]
    pad = (-rows) % 16
    if pad:
        q = torch.cat([q, q.new_zeros(pad, q.shape[1])])
    one = torch.ones((), device=x.device, dtype=torch.float32)
    y = torch._scaled_mm(q, w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)[:rows]
    y = (y * s).view(parts, m, -1).sum(0)
    return (y * scale.float().view(1, -1) if scale.numel() > 1 else y * scale.float()).to(torch.bfloat16)


def fb_dequant(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    from hwprofile.ops import _fallbacks
    return _fallbacks.fp8_dequant_mm(x, w, scale)


def fb_final(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The shipped fallback (``hwprofile.ops.fallback("fp8_gemv")``): 3-part split + _scaled_mm from 4 MiB, else dequant."""
    from hwprofile.ops import _fallbacks
    return _fallbacks.fp8_mm(x, w, scale)


def fb_dequant_l2(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, chunk: int = 1 << 23) -> torch.Tensor:
    n, k = w.shape
    rows = max(1, chunk // k)
    out = torch.empty(x.shape[0], n, device=x.device, dtype=torch.float32)
    for i in range(0, n, rows):
        torch.mm(x, w[i:i + rows].to(torch.bfloat16).t(), out_dtype=torch.float32, out=out[:, i:i + rows])
    return (out * scale.float().view(1, -1) if scale.numel() > 1 else out * scale.float()).to(torch.bfloat16)


def graph_us(fn, copies: list) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for c in copies[:2]:
            fn(*c)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for c in copies:
            fn(*c)
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / len(copies))
    return statistics.median(times)


def main() -> int:
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    if not torch.cuda.is_available():
        print("fp8_fallback_h200.py: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    import hwprofile
    from hwprofile import ops

    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    prof = hwprofile.profile(0)
    rows = []
    print(f"{'shape':>16} {'scale':>6} {'kernel':>8} {'dequant':>8} {'deqL2':>8} {'split3':>8} {'final':>8} {'bf16':>8}"
          "   err final/dequant/kernel")
    for m, n, k in SHAPES:
        for mode in ("tensor", "row"):
            wbytes = n * k
            ncopy = max(2, min(64, (512 << 20) // wbytes + 1))
            x = torch.randn(m, k, device=dev).to(torch.bfloat16)
            ws = [(torch.randn(n, k, device=dev) * 0.5).to(torch.float8_e4m3fn) for _ in range(ncopy)]
            scale = (torch.rand(n, device=dev) + 0.5) if mode == "row" else torch.tensor(0.7, device=dev)
            copies = [(x, w, scale) for w in ws]
            ref = (x.double() @ (ws[0].double() * (scale.double().view(-1, 1) if mode == "row" else scale.double())).t())
            errs = {}
            res = {"m": m, "n": n, "k": k, "scale": mode}
            cands = {"dequant": fb_dequant, "deqL2": fb_dequant_l2, "split3": fb_split, "final": fb_final}
            dec = ops.decide("fp8_gemv", prof, m=m, n=n, k=k)
            if m == 1:
                cands["kernel"] = lambda x_, w_, s_: ops.fp8_gemv(x_, w_, s_)
            for name, fn in cands.items():
                try:
                    y = fn(x, ws[0], scale)
                    errs[name] = float((y.double() - ref).abs().max() / ref.abs().max())
                    res[name] = graph_us(fn, copies)
                except Exception as exc:  # noqa: BLE001  # a candidate a shape refuses: recorded, not fatal
                    res[name] = None
                    errs[name] = repr(exc)[:120]
            wb = [w.to(torch.bfloat16) for w in ws[: max(2, ncopy // 2)]]
            res["bf16"] = graph_us(lambda x_, w_: torch.nn.functional.linear(x_, w_), [(x, w) for w in wb])
            res["errors"] = errs
            res["kernel_decision"] = dec.path
            rows.append(res)
            times = " ".join(_cell(res.get(c)) for c in ("kernel", "dequant", "deqL2", "split3", "final", "bf16"))
            print(f"{m}x{n}x{k:>6} {mode:>6} {times}   "
                  f"{errs.get('final')} / {errs.get('dequant')} / {errs.get('kernel')} ({dec.path})", flush=True)
            del ws, wb, copies
            torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "fp8_fallback.json"), "w") as fh:
            json.dump(rows, fh, indent=1)
    # issue 32's target for the shipped fallback ("final"): at most 2x the kernel wherever the kernel runs
    over = [r for r in rows if isinstance(r.get("kernel"), float) and isinstance(r.get("final"), float) and r["final"] > 2.0 * r["kernel"]]
    for r in over:
        print(f"OVER {r['m']}x{r['n']}x{r['k']} {r['scale']}: fallback {r['final']:.2f} us > 2x kernel {r['kernel']:.2f} us")
    ran = sum(isinstance(r.get("kernel"), float) for r in rows)
    print(f"{'PASS' if not over else 'FAIL'}: the shipped FP8 fallback within 2x of the kernel at {ran - len(over)} of {ran} rows")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
