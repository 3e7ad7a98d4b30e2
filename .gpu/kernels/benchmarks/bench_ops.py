"""Kernel vs fallback, side by side in one run, on the current GPU (written for the H200).

Cold L2: every timed call reads a different copy of the weights (copies total >= 512 MB, the L2 is
60 MB). GPU time per call = (CUDA-graph replay of one call per copy) / copies, median of 15 replays.
Eager wall time per call = host loop of real op calls + synchronize. Writes bench.json and one PNG
per op to $OUT (or ./out). Kernels are launched through ``hwprofile.ops.run_kernel`` (no routing, every
operand checked); the fallback side is ``hwprofile.ops.fallback(op)``, the function the op dispatches
to (for FP8 the chunked dequantising fallback; logs before 2026-11-30 18:27 timed a whole-weight
dequantise + ``F.linear`` there).

Usage (``benchmarks/run_h200.sh ops | eager | floor`` runs it with the wheels installed):
    OUT=dir python3 benchmarks/bench_ops.py [all | eager | floor]
``eager``: only the eager host-cost comparison of every op against its fallback (eager.json);
``floor``: only the op's own cost with a stubbed fallback and the wrapper floor (floor.json).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import hwprofile
from hwprofile import kernels, ops
from hwprofile.ops import _dispatch
from hwprofile.optable import OPS
from hwprofile.sweep import replay_times

OUT = Path(os.environ.get("OUT", "out"))  # created when a run starts (cli), not on import
dev = torch.device("cuda:0")
ROT_BYTES = 512 << 20
#: the skinny kernels' C signature (out, x, w, scale, M, N, K), for loading one directly through hwprofile.kernels.load
ARG_TYPES = (ctypes.c_void_p,) * 4 + (ctypes.c_int,) * 3


def graph_time(fn, calls: int, reps: int = 15) -> tuple[float, float]:
    """Median and spread (max-min)/median of GPU microseconds per call (hwprofile.sweep's replay timer)."""
    times = replay_times(fn, calls, reps, dev)
    med = statistics.median(times)
    return med, (max(times) - min(times)) / med


def copies_for(nbytes: int) -> int:
    return max(2, min(64, math.ceil(ROT_BYTES / nbytes)))


def copy_bw() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / 1000)
    return 2 * a.numel() / statistics.median(ts) / 1e12


def kernel_caller(op: str, x, ws, scales, out):
    """Call ``i`` launches ``op``'s kernel on weight copy ``i`` (checked once here: False means no kernel)."""
    assert ops.run_kernel(op, out, x, ws[0], scales[0] if scales else None), f"{op}: the kernel cannot be built or loaded here"

    def f(i: int) -> None:
        ops.run_kernel(op, out, x, ws[i], scales[i] if scales else None)

    return f


def main() -> None:
    hwprofile.reset()
    prof = hwprofile.profile(0)
    print(
        f"device: {prof.device.name}, plugin {prof.plugin.label if prof.plugin else None}, torch {torch.__version__}, "
        f"fingerprint {prof.fingerprint}"
    )
    res: dict[str, object] = {
        "device": prof.device.name,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "cublas": torch.backends.cuda.preferred_blas_library().name if hasattr(torch.backends.cuda, "preferred_blas_library") else "?",
    }
    bw = copy_bw()
    res["copy_tbps"] = bw
    print(f"copy bandwidth {bw:.2f} TB/s")

    # the fallback side of each comparison: what the op dispatches to off its kernel (cuBLAS here)
    fb_mm = ops.fallback("router_gemm")  # torch.mm(out_dtype=float32)
    fb_lin = ops.fallback("linear_bf16_fp32")  # the same function
    fb_gemv = ops.fallback("gemv")  # F.linear

    # --- router GEMM -------------------------------------------------------------------------
    rows = []
    for n in (256, 384):
        k = 7168
        ws = [torch.randn(n, k, device=dev).bfloat16() for _ in range(copies_for(n * k * 2))]
        for m in range(1, 17):
            x = torch.randn(m, k, device=dev).bfloat16()
            out = torch.empty(m, n, device=dev)
            kt, kn = graph_time(kernel_caller("router_gemm", x, ws, None, out), len(ws))
            ft, fn_ = graph_time(lambda i: fb_mm(x, ws[i]), len(ws))
            ref = x.double() @ ws[0].double().t()
            err = float((ops.router_gemm(x, ws[0]).double() - ref).norm() / ref.norm())
            # eager wall time per call: the op (kernel path) vs the fallback call
            w0 = ws[0]
            for fn in (lambda: ops.router_gemm(x, w0), lambda: torch.mm(x, w0.t(), out_dtype=torch.float32)):
                fn()
            torch.cuda.synchronize()
            walls = []
            for fn in (lambda: ops.router_gemm(x, w0), lambda: torch.mm(x, w0.t(), out_dtype=torch.float32)):
                t0 = time.perf_counter()
                for _ in range(500):
                    fn()
                torch.cuda.synchronize()
                walls.append((time.perf_counter() - t0) / 500 * 1e6)
            rows.append(
                {
                    "m": m,
                    "n": n,
                    "k": k,
                    "kernel_us": kt,
                    "fallback_us": ft,
                    "kernel_spread": kn,
                    "fallback_spread": fn_,
                    "rel_err": err,
                    "eager_op_us": walls[0],
                    "eager_fallback_us": walls[1],
                }
            )
            print(
                f"router M={m:2d} N={n}: kernel {kt:6.2f} us  cuBLAS {ft:6.2f} us  x{ft / kt:4.2f}  "
                f"eager op {walls[0]:5.1f} vs {walls[1]:5.1f} us  err {err:.1e}"
            )
    res["router_gemm"] = rows

    # --- linear_bf16_fp32 ----------------------------------------------------------------------
    rows = []
    for n in (256, 4096):
        k = 7168
        ws = [torch.randn(n, k, device=dev).bfloat16() for _ in range(copies_for(n * k * 2))]
        for m in (1, 2, 4, 8, 16, 32, 64, 128):
            x = torch.randn(m, k, device=dev).bfloat16()
            out = torch.empty(m, n, device=dev)
            kt = graph_time(kernel_caller("linear_bf16_fp32", x, ws, None, out), len(ws))[0] if m <= 16 else float("nan")
            ft = graph_time(lambda i: fb_lin(x, ws[i]), len(ws))[0]
            rows.append({"m": m, "n": n, "k": k, "kernel_us": kt, "fallback_us": ft})
            print(f"linear M={m:3d} N={n}: kernel {kt:7.2f} us  cuBLAS {ft:7.2f} us")
    res["linear_bf16_fp32"] = rows

    # --- GEMV bf16 and FP8 ----------------------------------------------------------------------
    shapes = [
        (2048, 7168),
        (4096, 4096),
        (7168, 2048),
        (7168, 16384),
        (12288, 4096),
        (16384, 5120),
        (28672, 4096),
        (57344, 7168),
        (152064, 5120),
    ]
    grows, frows = [], []
    for n, k in shapes:
        wb = n * k * 2
        ws = [torch.randn(n, k, device=dev).bfloat16() for _ in range(copies_for(wb))]
        x = torch.randn(1, k, device=dev).bfloat16()
        out = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
        kt, kn = graph_time(kernel_caller("gemv", x, ws, None, out), len(ws))
        ft, fn_ = graph_time(lambda i: fb_gemv(x, ws[i]), len(ws))
        ref = x.double() @ ws[0].double().t()
        out.fill_(float("nan"))
        ops.run_kernel("gemv", out, x, ws[0])
        err = float((out.double() - ref).norm() / ref.norm())
        dec = ops.decide("gemv", prof, m=1, n=n, k=k).path
        grows.append(
            {
                "n": n,
                "k": k,
                "mb": wb / 1e6,
                "kernel_us": kt,
                "fallback_us": ft,
                "kernel_tbps": wb / kt / 1e6,
                "fallback_tbps": wb / ft / 1e6,
                "rel_err": err,
                "dispatch": dec,
                "kernel_spread": kn,
                "fallback_spread": fn_,
            }
        )
        print(
            f"gemv N={n:6d} K={k:5d} ({wb / 1e6:6.0f} MB): kernel {kt:8.2f} us {wb / kt / 1e6:4.2f} TB/s  "
            f"cuBLAS {ft:8.2f} us {wb / ft / 1e6:4.2f} TB/s  x{ft / kt:4.2f}  err {err:.1e}  -> {dec}"
        )
        fb = n * k
        w8 = [(torch.randn(n, k, device=dev) * 3).to(torch.float8_e4m3fn) for _ in range(copies_for(fb))]
        sc = [torch.rand(n, device=dev) + 0.5 for _ in w8]
        out.fill_(float("nan"))
        ops.run_kernel("fp8_gemv", out, x, w8[0], sc[0])  # a scale of N elements: per-row
        ref = x.double() @ (w8[0].double() * sc[0].double()[:, None]).t()
        err8 = float((out.double() - ref).norm() / ref.norm())
        k8, _ = graph_time(kernel_caller("fp8_gemv", x, w8, sc, out), len(w8))
        # the fallback fp8_gemv dispatches to (chunked exact bf16 dequantisation, fp32 accumulation); logs
        # before 2026-11-30 18:27 timed a whole-weight dequantise + F.linear here ("dequant+linear")
        fp8_fb = ops.fallback("fp8_gemv")
        f8, _ = graph_time(lambda i: fp8_fb(x, w8[i], sc[i]), len(w8))
        frows.append(
            {
                "n": n,
                "k": k,
                "mb": fb / 1e6,
                "kernel_us": k8,
                "fallback_us": f8,
                "kernel_tbps": fb / k8 / 1e6,
                "vs_bf16_kernel": kt / k8,
                "rel_err": err8,
            }
        )
        print(
            f"fp8  N={n:6d} K={k:5d} ({fb / 1e6:6.0f} MB): kernel {k8:8.2f} us {fb / k8 / 1e6:4.2f} TB/s  "
            f"fallback {f8:9.2f} us  x{kt / k8:4.2f} vs own bf16  err {err8:.1e}"
        )
    res["gemv"] = grows
    res["fp8_gemv"] = frows

    eager_costs(prof, res)
    compile_and_load(prof, res)
    (OUT / "bench.json").write_text(json.dumps(res, indent=1))
    plot(res)


def _wall(fn, calls: int = 2000) -> float:
    """Eager wall microseconds per call: a host loop of ``calls`` calls, then one synchronize."""
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def eager_costs(prof: hwprofile.Profile, res: dict) -> None:
    """Issue 11 item 7, same run: each op against its fallback called directly, at shapes of both paths.

    The targets: on the fallback path at most 1 us more than the fallback (RESULTS: not met); on the
    kernel path an eager wall time no higher than the fallback's. "fallback" is ``ops.fallback(op)``, the function the op
    runs on its fallback path; "torch" is the bare torch call a user would write instead
    (``torch.mm(x, w.t(), out_dtype=torch.float32)``, ``F.linear``), which has no Python frame of its
    own. Rounds rotate op, fallback and torch; the median of 7 rounds.
    """
    fb = {op: ops.fallback(op) for op in OPS}
    cases = [("router_gemm", m, n, 7168) for m in (1, 4, 16) for n in (256, 384)] + [
        ("router_gemm", 32, 256, 7168),
        ("router_gemm", 4, 1024, 7168),
    ]
    cases += [("linear_bf16_fp32", m, n, 7168) for m in (1, 8) for n in (256, 4096)] + [("linear_bf16_fp32", 16, 4096, 7168)]
    cases += [("linear_bf16_fp32", 64, 4096, 7168)]
    cases += [("gemv", 1, n, k) for n, k in ((2048, 2048), (4096, 4096), (12288, 4096), (4096, 7168), (28672, 4096), (64, 512))]
    cases += [("gemv", 8, 4096, 4096)]
    cases += [("fp8_gemv", 1, n, k) for n, k in ((4096, 4096), (2048, 7168), (56, 4096), (64, 512))]
    f32 = torch.float32
    rows = []
    for op, m, n, k in cases:
        x = torch.randn(m, k, device=dev).bfloat16()
        if op == "fp8_gemv":
            w = (torch.randn(n, k, device=dev) * 2).to(torch.float8_e4m3fn)
            s = torch.rand(n, device=dev) + 0.5
            a = (x, w, s)
            bare = None
        else:
            w = torch.randn(n, k, device=dev).bfloat16()
            a = (x, w)
            bare = (lambda: torch.mm(x, w.t(), out_dtype=f32)) if op in ("router_gemm", "linear_bf16_fp32") else (lambda: F.linear(x, w))
        f_op, f_fb = getattr(ops, op), fb[op]
        path = ops.decide(op, prof, m=m, n=n, k=k).path
        fns = [lambda: f_op(*a), lambda: f_fb(*a)] + ([bare] if bare else [])
        rounds = [[_wall(f) for f in (fns[i % len(fns) :] + fns[: i % len(fns)])] for i in range(7)]
        # undo the rotation: column j of round i is fns[(i + j) % len]
        per = [[r[(j - i) % len(fns)] for i, r in enumerate(rounds)] for j in range(len(fns))]
        o, f = statistics.median(per[0]), statistics.median(per[1])
        b = statistics.median(per[2]) if bare else float("nan")
        ok = (o <= f + 1.0) if path == "fallback" else (o <= f)
        rows.append(
            {"op": op, "m": m, "n": n, "k": k, "path": path, "op_us": o, "fallback_us": f, "torch_us": b, "meets_target": ok}
        )
        print(
            f"eager {op:17s} M={m:2d} N={n:6d} K={k:5d} {path:8s}: op {o:6.2f} us  fallback {f:6.2f} us  torch {b:6.2f} us  "
            f"diff {o - f:+5.2f} (vs torch {o - b:+5.2f}) us  {'ok' if ok else 'MISSES TARGET'}"
        )
    res["eager"] = rows
    front_only(res)
    # pieces of the kernel path, for the record
    x = torch.randn(1, 4096, device=dev).bfloat16()
    w = torch.randn(4096, 4096, device=dev).bfloat16()
    out = torch.empty(1, 4096, device=dev, dtype=torch.bfloat16)
    spec = prof.kernels["gemv"]
    launch = spec.configure(m=1, n=4096, k=4096, split_k=bool(prof["gemv.split_k"]))  # what run_kernel plans (split_k=None)
    kern = kernels.load(spec, prof.target, launch, 0, ARG_TYPES)
    stream = torch.cuda.current_stream().cuda_stream
    args = (out.data_ptr(), x.data_ptr(), w.data_ptr(), 0, 1, 4096, 4096)
    # The logs of 2026-11-30 name these pieces "jit LoadedKernel.launch", "ops._launch (memo + stream +
    # launch)" and "route()". The last two were private; measured through the public seams now:
    # ops.run_kernel adds the operand checks, ops.decide() also builds the Decision and its reason.
    res["host_us"] = {
        "kernels LoadedKernel.launch (cuda-python)": _wall(lambda: kern.launch(launch, stream, args)),
        "ops.run_kernel (checks + memo + stream + launch)": _wall(lambda: ops.run_kernel("gemv", out, x, w)),
        "x.new_empty": _wall(lambda: x.new_empty((1, 4096))),
        "ops.decide()": _wall(lambda: ops.decide("gemv", prof, m=1, n=4096, k=4096)),
        "torch.compiler.is_compiling()": _wall(torch.compiler.is_compiling),
        "torch add_": _wall(lambda: out.add_(1)),
        # what the fallback path's checks are made of (the same reads on the CPU machine: cpu_eager_floor.py)
        "empty lambda": _wall(lambda: None, 20000),
        "x.shape": _wall(lambda: x.shape, 20000),
        "x.dtype": _wall(lambda: x.dtype, 20000),
        "x.get_device()": _wall(lambda: x.get_device(), 20000),
        "w.device == x.device": _wall(lambda: w.device == x.device, 20000),
    }
    print("host us per call:", {k: round(v, 2) for k, v in res["host_us"].items()})


def stub_fallbacks(stub) -> dict:
    """Replace every op's fallback by ``stub`` where the ops call it; return what to restore.

    The seam is each op's run-time entry (``hwprofile.ops._dispatch.ENTRIES[op].fallback``, bound from
    the registry ``hwprofile.ops._fallbacks.FALLBACKS`` at import); front_only checks that the op really
    calls the stub before timing anything.
    """
    saved = {name: e.fallback for name, e in _dispatch.ENTRIES.items()}
    for e in _dispatch.ENTRIES.values():
        e.fallback = stub
    return saved


def restore_fallbacks(saved: dict) -> None:
    for name, fn in saved.items():
        _dispatch.ENTRIES[name].fallback = fn


def front_only(res: dict) -> None:
    """The op's own host cost on its fallback path, without torch: each fallback replaced by a function
    that returns a preallocated result, so op minus that function is the checks, the route and the count."""
    rows = []
    for op, m, n, k in (("router_gemm", 32, 256, 7168), ("linear_bf16_fp32", 64, 4096, 7168), ("gemv", 8, 4096, 4096),
                        ("fp8_gemv", 1, 56, 4096)):
        x = torch.randn(m, k, device=dev).bfloat16()
        o = torch.empty(m, n, device=dev)
        if op == "fp8_gemv":
            a = (x, torch.zeros(n, k, device=dev).to(torch.float8_e4m3fn), torch.ones(n, device=dev))
        else:
            a = (x, torch.zeros(n, k, device=dev).bfloat16())

        def stub(*args, o=o):
            return o

        saved = stub_fallbacks(stub)
        try:
            f_op = getattr(ops, op)
            if f_op(*a) is not o:  # never time the real fallback under the stub's name
                problem = f"{op} did not call the stubbed fallback (hwprofile.ops._dispatch.ENTRIES[{op!r}].fallback)"
                print(f"front: NOT MEASURED: {problem}", flush=True)
                rows.append({"op": op, "m": m, "n": n, "k": k, "error": problem})
                continue
            per = [(_wall(lambda: f_op(*a), 20000), _wall(lambda: stub(*a), 20000)) for _ in range(5)]
        finally:
            restore_fallbacks(saved)
        o_us, s_us = statistics.median(p[0] for p in per), statistics.median(p[1] for p in per)
        rows.append({"op": op, "m": m, "n": n, "k": k, "op_us": o_us, "stub_us": s_us, "front_us": o_us - s_us})
        print(f"front {op:17s} M={m:2d} N={n:5d}: op with a stub fallback {o_us:5.2f} us, the stub alone {s_us:5.2f} us: "
              f"the op's own cost {o_us - s_us:4.2f} us")
    res["front"] = rows
    floor(res)


def floor(res: dict) -> None:
    """What any Python wrapper pays in the same loop as the real fallback (gemv M = 8, cuBLAS F.linear):
    one Python frame; the frame plus the six reads a contract check needs (shape, dtype and device of
    x and w) and nothing else; the op itself. Rounds rotate the four; the median of 9."""
    x = torch.randn(8, 4096, device=dev).bfloat16()
    w = torch.randn(4096, 4096, device=dev).bfloat16()
    bf16 = torch.bfloat16

    def frame(x, w):
        return F.linear(x, w)

    def reads(x, w):
        _, k = x.shape
        _, wk = w.shape
        if k == wk and x.dtype is bf16 and w.dtype is bf16 and x.get_device() == w.get_device():
            return F.linear(x, w)
        raise AssertionError

    fns = {"F.linear": lambda: F.linear(x, w), "one frame": lambda: frame(x, w), "frame + six reads": lambda: reads(x, w),
           "ops.gemv": lambda: ops.gemv(x, w)}
    per: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for i in range(9):
        for name in names[i % 4 :] + names[: i % 4]:
            per[name].append(_wall(fns[name]))
    med = {k: statistics.median(v) for k, v in per.items()}
    res["floor"] = {k: {"us": v, "over_F_linear": v - med["F.linear"]} for k, v in med.items()}
    print("floor (gemv M=8, fallback path): " + ", ".join(f"{k} {v:.2f} us (+{v - med['F.linear']:.2f})" for k, v in med.items()))


def compile_and_load(prof: hwprofile.Profile, res: dict) -> None:
    """Cold NVRTC compile of one router instance (empty disk cache) and a disk-cache hit plus module load."""
    import tempfile

    from cuda.bindings import driver as cu

    os.environ["HWPROFILE_CACHE_DIR"] = tempfile.mkdtemp()
    os.chmod(os.environ["HWPROFILE_CACHE_DIR"], 0o700)
    spec = prof.kernels["router_gemm"]
    colds, loads = [], []
    for m in (1, 8, 16):
        expr = spec.configure(m=m, n=256, k=7168, split_k=True).name_expression
        kernels.clear_cache()  # the in-process memos: the next compile goes to the (empty) disk cache, then NVRTC
        t0 = time.perf_counter()
        kernels.compile_spec(spec, prof.target, (expr,))
        colds.append(time.perf_counter() - t0)
        kernels.clear_cache()  # again: this time the disk cache has the entry
        t0 = time.perf_counter()
        c = kernels.compile_spec(spec, prof.target, (expr,))
        cu.cuModuleLoadData(c.cubin)
        loads.append(time.perf_counter() - t0)
    res["compile_s"] = colds
    res["cached_load_ms"] = [x * 1000 for x in loads]
    print(f"cold compile per instance: {[round(c, 3) for c in colds]} s; cache hit + module load: {[round(v * 1000, 2) for v in loads]} ms")


def plot(res: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots", file=sys.stderr)
        return
    fig, axs = plt.subplots(1, 2, figsize=(11, 4))
    for ax, n in zip(axs, (256, 384), strict=False):
        rs = [r for r in res["router_gemm"] if r["n"] == n]
        ax.plot([r["m"] for r in rs], [r["kernel_us"] for r in rs], "o-", label="hwprofile-sm90 kernel")
        ax.plot([r["m"] for r in rs], [r["fallback_us"] for r in rs], "s-", label="torch.mm(out_dtype=fp32)")
        ax.axvline(16.5, color="gray", ls="--", label="router_gemm.max_tokens = 16")
        ax.set(title=f"router GEMM N={n} K=7168 (GPU time, cold L2)", xlabel="M", ylabel="us")
        ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "router_gemm.png", dpi=90)
    fig, ax = plt.subplots(figsize=(7, 4))
    for n in (256, 4096):
        rs = [r for r in res["linear_bf16_fp32"] if r["n"] == n]
        ax.plot([r["m"] for r in rs], [r["kernel_us"] for r in rs], "o-", label=f"kernel N={n}")
        ax.plot([r["m"] for r in rs], [r["fallback_us"] for r in rs], "s--", label=f"cuBLAS N={n}")
    ax.set(xscale="log", yscale="log", title="linear_bf16_fp32 K=7168", xlabel="M", ylabel="us")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "linear_bf16_fp32.png", dpi=90)
    fig, ax = plt.subplots(figsize=(9, 4))
    lab = [f"{r['n']}x{r['k']}" for r in res["gemv"]]
    xs = range(len(lab))
    ax.plot(xs, [r["kernel_tbps"] for r in res["gemv"]], "o-", label="bf16 kernel")
    ax.plot(xs, [r["fallback_tbps"] for r in res["gemv"]], "s-", label="cuBLAS F.linear")
    ax.plot(xs, [r["kernel_tbps"] for r in res["fp8_gemv"]], "^-", label="fp8 kernel (weight bytes)")
    ax.axhline(res["copy_tbps"], color="gray", ls="--", label="device copy")
    ax.set_xticks(list(xs), lab, rotation=30)
    ax.set(title="GEMV M=1 bandwidth (cold L2)", ylabel="TB/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "gemv.png", dpi=90)


def main_eager() -> None:
    hwprofile.reset()
    prof = hwprofile.profile(0)
    res: dict[str, object] = {"device": prof.device.name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    print(f"device: {prof.device.name}, plugin {prof.plugin.label if prof.plugin else None}, torch {torch.__version__}")
    eager_costs(prof, res)
    (OUT / "eager.json").write_text(json.dumps(res, indent=1))


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="all", choices=["all", "eager", "host", "floor"],
                   help="all: everything (bench.json, plots); eager (alias host): eager host cost only; floor: own cost and floor only")
    mode = p.parse_args().mode
    OUT.mkdir(parents=True, exist_ok=True)
    if mode in ("eager", "host"):  # eager host cost only (writes eager.json)
        main_eager()
    elif mode == "floor":  # only the op's own cost and the wrapper floor (writes floor.json)
        r: dict[str, object] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
        front_only(r)
        (OUT / "floor.json").write_text(json.dumps(r, indent=1))
    else:
        main()


if __name__ == "__main__":
    cli()
