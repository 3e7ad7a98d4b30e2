"""Sustained GEMV streaming on the H200: per-call time in back-to-back graph replay against one isolated
call, with the SM clock, power and throttle reasons sampled by nvidia-smi meanwhile (issue 15).

Why: under Nsight Compute (one call, caches flushed) the bf16 kernel streamed 822 MB at 4.38 TB/s
and beat cuBLAS, while bench_ops.py's graph replay in an earlier run had it 2 % behind. This measures
both ways in one run, per kernel, with the clocks and power beside them (the run of 2026-11-30 found
no loss from isolated to sustained for bf16, and 2 % for FP8 at 411 MB under the power cap).
Writes clocks.json to $OUT. Usage: OUT=dir python3 benchmarks/clocks_gemv.py (``benchmarks/run_h200.sh clocks``)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import hwprofile
from hwprofile import ops

OUT = Path(os.environ.get("OUT", "out"))
dev = torch.device("cuda:0")


def isolated_us(fn, reps: int = 20) -> float:
    """One call at a time, the L2 flushed by a 512 MB read before each (events around the call only)."""
    junk = torch.ones(512 << 20, dtype=torch.uint8, device=dev)
    ts = []
    for _ in range(reps):
        junk.max()  # a read: the L2 holds clean lines of junk afterwards, none of the weights
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(0)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000)
    return statistics.median(ts)


def sustained(fn, copies: int, seconds: float = 1.5) -> dict:
    """Graph of ``copies`` calls on rotating weights, replayed for ``seconds`` while nvidia-smi samples."""
    for i in range(copies):
        fn(i)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        for i in range(copies):
            fn(i)
    torch.cuda.current_stream(dev).wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    q = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    per, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(4):
            g.replay()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) * 1000 / (4 * copies))
    smi.terminate()
    lines = [ln.split(", ") for ln in smi.communicate()[0].strip().splitlines() if ln.count(",") == 4]
    samples = lines[len(lines) // 4 :]  # the loop's steady part
    sm = [float(x[0]) for x in samples]
    pw = [float(x[2]) for x in samples]
    return {
        "us_first": per[0], "us_median": statistics.median(per), "us_last": per[-1],
        "sm_mhz_median": statistics.median(sm) if sm else None, "sm_mhz_min": min(sm) if sm else None,
        "mem_mhz": samples[-1][1] if samples else None, "power_w_median": statistics.median(pw) if pw else None,
        "throttle_reasons": sorted({x[4] for x in samples}),
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    prof = hwprofile.profile(0)
    res = []
    cases = [("gemv", 57344, 7168), ("gemv", 28672, 4096), ("fp8_gemv", 7168, 16384), ("fp8_gemv", 57344, 7168)]
    for op, n, k in cases:
        fp8 = op == "fp8_gemv"
        nbytes = n * k * (1 if fp8 else 2)
        copies = max(2, min(8, (2 << 30) // nbytes))
        x = torch.randn(1, k, device=dev).bfloat16()
        ws = [(torch.randn(n, k, device=dev) * (2 if fp8 else 1)).to(torch.float8_e4m3fn if fp8 else torch.bfloat16) for _ in range(copies)]
        sc = [torch.rand(n, device=dev) + 0.5 for _ in range(copies)]
        out = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
        def kern(i: int) -> None:  # the op's kernel, no routing (a scale of N elements: per-row)
            ops.run_kernel(op, out, x, ws[i], sc[i] if fp8 else None)

        variants = [("kernel", kern)] + ([] if fp8 else [("cuBLAS", lambda i: F.linear(x, ws[i]))])
        for name, fn in variants:
            iso = isolated_us(fn)
            st = sustained(fn, copies)
            row = {"op": op, "n": n, "k": k, "mb": nbytes / 1e6, "impl": name, "isolated_us": iso, **st}
            row["isolated_tbps"] = nbytes / iso / 1e6
            row["sustained_tbps"] = nbytes / st["us_median"] / 1e6
            res.append(row)
            print(f"{op:8s} {n}x{k} ({nbytes / 1e6:.0f} MB) {name:7s}: isolated {iso:7.1f} us ({row['isolated_tbps']:.2f} TB/s), "
                  f"sustained {st['us_median']:7.1f} us ({row['sustained_tbps']:.2f} TB/s), SM {st['sm_mhz_median']} MHz "
                  f"(min {st['sm_mhz_min']}), {st['power_w_median']} W, throttle {st['throttle_reasons']}", flush=True)
        ws.clear()
        sc.clear()
        torch.cuda.empty_cache()
    (OUT / "clocks.json").write_text(json.dumps({"device": prof.device.name, "rows": res}, indent=1))


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
