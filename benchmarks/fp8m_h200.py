"""The FP8 GEMV op against the bf16 GEMV op at decode batch sizes, over the served-model catalog (run on a GPU).

    OUT=dir python3 benchmarks/fp8m_h200.py [--ms 1,2,4,8,16,32,64] [--reps 10] [--passes 3] [--max-seconds 420]

For every catalog projection shape (``hwprofile.sweep.model_grid("gemv")``) whose weight has N x K >= 16M elements
(16 MB in e4m3) and every M of ``--ms``: ``ops.fp8_gemv`` (e4m3 weight, per-row scale) and ``ops.gemv`` (bf16
weight), each as the op dispatches it (kernel or fallback, by the profile), CUDA-graph replay, weights rotated over
at least 4x the device's L2 (``hwprofile.sweep.rotate_factor``), ``--passes`` passes with fresh allocations each;
the time of a path is the median of its pass medians, its noise the spread between passes. The two ops alternate
within a pass, so clock drift hits both.

Targets (issue 41), each checked per row, the exit status non-zero when one fails:
  * M = 1..16 and N x K >= 16M: the FP8 op at least 1.6x faster than the bf16 op;
  * every M of --ms (up to 64): the FP8 op never slower than the bf16 op beyond the pass noise (at least 2 %).
Writes fp8m.json (every row: shape, M, both times, pass medians, ratio, the path each op took and why) and
fp8m.log (the table and the verdict). Exit: 0 all targets met, 1 a target failed, 2 the time budget ran out first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

MIN_ELEMENTS = 16 << 20  # N x K: the FP8 weight is 16 MB or more
SPEEDUP = 1.6
NOISE_FLOOR = 0.02


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="1,2,4,8,16,32,64", help="comma list of M (tokens)")
    ap.add_argument("--reps", type=int, default=10, help="timed replays per pass")
    ap.add_argument("--passes", type=int, default=3, help="independent passes (fresh weights each)")
    ap.add_argument("--max-seconds", type=float, default=420.0, help="stop (exit 2) past this much wall time")
    args = ap.parse_args()
    ms = [int(x) for x in args.ms.split(",") if x]
    if not ms or min(ms) < 1 or args.reps < 3 or args.passes < 2:
        ap.error("--ms needs M >= 1, --reps at least 3, --passes at least 2")
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)

    import torch

    import hwprofile
    from hwprofile import ops, sweep

    dev = torch.device("cuda", 0)
    prof = hwprofile.profile(0)
    l2 = sweep.l2_bytes(torch, dev)
    rotate = max(256 << 20, sweep.rotate_factor(l2))
    shapes = sorted({(n, k) for _, n, k in sweep.model_grid("gemv") if n * k >= MIN_ELEMENTS}, key=lambda s: s[0] * s[1])
    log_lines: list[str] = [f"device {prof.device.name}, L2 {l2 >> 20} MB, rotation {rotate >> 20} MB, {len(shapes)} shapes x M {ms}"]
    rows: list[dict[str, Any]] = []
    start = time.monotonic()
    status = 0

    def times(fn: Any, copies: int) -> list[float]:
        return sweep.replay_times(fn, copies, args.reps, dev)

    for n, k in shapes:
        for m in ms:
            if time.monotonic() - start > args.max_seconds:
                log_lines.append(f"time budget of {args.max_seconds:.0f} s spent before {m}x{n}x{k}: incomplete")
                status = 2
                break
            f8p: list[float] = []
            bfp: list[float] = []
            for _ in range(args.passes):
                copies8 = max(2, min(64, -(-rotate // (n * k))))
                copies16 = max(2, min(64, -(-rotate // (n * k * 2))))
                w8 = [(torch.randn(n, k, device=dev) * 3).to(torch.float8_e4m3fn) for _ in range(copies8)]
                sc = [torch.rand(n, device=dev) + 0.5 for _ in range(copies8)]
                wb = [torch.randn(n, k, device=dev).bfloat16() for _ in range(copies16)]
                x = torch.randn(m, k, device=dev).bfloat16()
                f8p.append(statistics.median(times(lambda i: ops.fp8_gemv(x, w8[i], sc[i]), copies8)))
                bfp.append(statistics.median(times(lambda i: ops.gemv(x, wb[i]), copies16)))
            f8, bf = statistics.median(f8p), statistics.median(bfp)
            noise = max(NOISE_FLOOR, (max(f8p) - min(f8p)) / f8, (max(bfp) - min(bfp)) / bf)
            d8 = ops.decide("fp8_gemv", prof, m=m, n=n, k=k)
            db = ops.decide("gemv", prof, m=m, n=n, k=k)
            big = m <= 16 and n * k >= MIN_ELEMENTS
            fails = []
            if big and bf / f8 < SPEEDUP:
                fails.append(f"speed-up {bf / f8:.2f} < {SPEEDUP}")
            if f8 > bf * (1 + noise):
                fails.append(f"FP8 slower than bf16 beyond the noise ({noise:.1%})")
            rows.append({
                "m": m, "n": n, "k": k, "fp8_us": round(f8, 3), "bf16_us": round(bf, 3), "speedup": round(bf / f8, 3),
                "fp8_pass_medians": [round(t, 3) for t in f8p], "bf16_pass_medians": [round(t, 3) for t in bfp], "noise": round(noise, 4),
                "fp8_path": d8.path, "fp8_why": d8.reason, "bf16_path": db.path, "bf16_why": db.reason, "fails": fails,
            })
            line = f"{m:>3} x {n:>6} x {k:>6}  fp8 {f8:9.2f} us ({d8.path:8})  bf16 {bf:9.2f} us ({db.path:8})  x{bf / f8:5.2f}"
            log_lines.append(line + (f"  FAIL: {'; '.join(fails)}" if fails else ""))
            if fails and status == 0:
                status = 1
        if status == 2:
            break
    failed = sum(bool(r["fails"]) for r in rows)
    log_lines.append(
        f"{len(rows)} rows, {failed} failing; {'ALL TARGETS MET' if status == 0 else 'INCOMPLETE' if status == 2 else 'TARGET FAILED'}"
        f" ({time.monotonic() - start:.0f} s)"
    )
    doc = {"device": prof.device.name, "l2_bytes": l2, "rotate_bytes": rotate, "rows": rows}
    (out_dir / "fp8m.json").write_text(json.dumps(doc, indent=1))
    (out_dir / "fp8m.log").write_text("\n".join(log_lines) + "\n")
    print("\n".join(log_lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
