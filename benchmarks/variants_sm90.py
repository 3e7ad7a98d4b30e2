"""Variant sweep of the sm90 kernels on the H200: the plugin's templates and the measured, never dispatched ones.

Times each template configuration directly against cuBLAS in the same run (CUDA-graph replay, cold
L2 by rotating weight copies, median of 15 replays, bench_ops.py's timer), checks every timed
variant against a float64 reference first, and measures what a launch costs by itself: an empty
kernel with clusters of 1..8 blocks, with and without programmatic dependent launch (PDL).

Two sources: the plugin's (``hwprofile_sm90/kernels/sm90_gemv.cu``: ``hwp90_router``, ``hwp90_gemv``,
``hwp90_gemv_simt``), loaded through ``hwprofile.kernels.load`` as the ops load it, and
``benchmarks/kernels/sm90_variants.cu`` (``hwp90_gemv_bulk``, the bulk-copy GEMV: measured in rounds
1-3, never dispatched, kept out of the plugin source because every shipped threshold's stamp digests
that source), compiled here through ``hwprofile.kernels.toolchain.nvrtc_compile`` and loaded
through ``hwprofile.kernels.launch``.

Usage: OUT=dir python3 benchmarks/variants_sm90.py [round]   (writes variants_sm90.json; default round 7;
``benchmarks/run_h200.sh variants`` runs it with ROUND=...). Logs of every round are in benchmarks/h200/
(RESULTS.md, "Kernels", names them). Rounds 1-3 ran against earlier revisions of the source; kernel
templates changed since (hwp90_gemv lost its split-K and prefetch parameters, hwp90_router gained
PUSH and MINB), so round 2's 7-parameter ``hwp90_gemv`` instances (17 of its 53, and its host-launch
cost) no longer compile. Every instance of rounds 1 and 3-7 compiles against the current sources
(NVRTC 13.5 for sm_90a on a CPU machine, 2026-12-02); their timings are only comparable with the logs
where the template's body is unchanged since.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from bench_ops import OUT, copies_for, graph_time

import hwprofile
from hwprofile import kernels
from hwprofile.kernels import launch as klaunch
from hwprofile.kernels import toolchain
from hwprofile.plugin import Launch, plan_skinny_gemm

dev = torch.device("cuda:0")
VARIANTS_CU = Path(__file__).parent / "kernels" / "sm90_variants.cu"
#: templates defined in VARIANTS_CU rather than in the plugin's source
VARIANT_TEMPLATES = frozenset({"hwp90_gemv_bulk"})
#: the skinny kernels' C signature (out, x, w, scale, M, N, K)
ARG_TYPES = (ctypes.c_void_p,) * 4 + (ctypes.c_int,) * 3
# set by setup(), once a GPU is known to be there
prof: Any = None
SPEC: Any = None  # the plugin's gemv KernelSpec: its source holds every template but VARIANT_TEMPLATES
SMS = 0
results: list[dict[str, Any]] = []
_variant_kernels: dict[str, klaunch.LoadedKernel] = {}


def setup() -> None:
    global prof, SPEC, SMS
    prof = hwprofile.profile(0)
    SPEC = prof.kernels["gemv"]
    SMS = torch.cuda.get_device_properties(0).multi_processor_count


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def record(**kw: Any) -> None:
    results.append(kw)
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items()), flush=True)


def _load_cubin(cubin: bytes, lowered: str, arg_types: tuple[type, ...], what: str) -> klaunch.LoadedKernel:
    """A function of a cubin compiled here, loaded into torch's context of device 0."""
    fn = klaunch.load_function(hashlib.sha256(cubin).hexdigest(), cubin, lowered, 0, what=what)
    return klaunch.LoadedKernel(fn, what, arg_types)


def variant_kernel(expr: str) -> klaunch.LoadedKernel:
    """One instance of a VARIANTS_CU template, compiled with the plugin's include directories and options."""
    kern = _variant_kernels.get(expr)
    if kern is None:
        if not VARIANTS_CU.is_file():
            raise SystemExit(f"{VARIANTS_CU} is missing: {expr.split('<')[0]} lives there, not in the plugin's source")
        include = (*toolchain.include_dirs(), str(VARIANTS_CU.parent), str(SPEC.source_path().parent))
        options = toolchain.CompileOptions(prof.target, include, SPEC.nvrtc_options)
        what = f"{expr} ({VARIANTS_CU.name})"
        cubin, lowered, _log = toolchain.nvrtc_compile(VARIANTS_CU.read_text(), VARIANTS_CU.name, options, [expr], what=what)
        kern = _variant_kernels[expr] = _load_cubin(cubin, lowered[expr], ARG_TYPES, what)
    return kern


def kernel_for(launch: Launch) -> klaunch.LoadedKernel:
    if launch.name_expression.split("<", 1)[0].strip() in VARIANT_TEMPLATES:
        return variant_kernel(launch.name_expression)
    return kernels.load(SPEC, prof.target, launch, 0, ARG_TYPES)


def timed(launch: Launch, m: int, n: int, k: int, fp8: bool, out_dtype: torch.dtype, tag: str, scale: int = 0) -> float:
    """Check one launch against float64, then time it over rotating weight copies."""
    kern = kernel_for(launch)
    nbytes = n * k * (1 if fp8 else 2)
    ws = [
        (torch.randn(n, k, device=dev) * (3 if fp8 else 1)).to(torch.float8_e4m3fn if fp8 else torch.bfloat16)
        for _ in range(copies_for(nbytes))
    ]
    sc = torch.rand(n, device=dev) + 0.5
    x = torch.randn(m, k, device=dev).bfloat16()
    out = torch.full((m, n), float("nan"), device=dev, dtype=out_dtype)
    kern.launch(launch, stream(), (out.data_ptr(), x.data_ptr(), ws[0].data_ptr(), sc.data_ptr(), m, n, k))
    torch.cuda.synchronize()
    w64 = ws[0].double() * (sc.double()[:, None] if scale == 2 else sc.double()[0] if scale == 1 else 1)
    ref = x.double() @ w64.t()
    err = float((out.double() - ref).norm() / ref.norm())
    bad = bool(torch.isnan(out).any()) or not err < 1e-2

    def f(i: int) -> None:
        kern.launch(launch, stream(), (out.data_ptr(), x.data_ptr(), ws[i].data_ptr(), sc.data_ptr(), m, n, k))

    us, spread = graph_time(f, len(ws))
    record(
        tag=tag,
        expr=launch.name_expression,
        grid=list(launch.grid),
        smem=launch.shared_bytes,
        pdl=launch.pdl,
        m=m,
        n=n,
        k=k,
        us=us,
        tbps=nbytes / us / 1e6,
        spread=spread,
        err=err,
        bad=bad,
    )
    return us


def cublas(m: int, n: int, k: int, fp32_out: bool) -> float:
    ws = [torch.randn(n, k, device=dev).bfloat16() for _ in range(copies_for(n * k * 2))]
    x = torch.randn(m, k, device=dev).bfloat16()
    if fp32_out:
        us, spread = graph_time(lambda i: torch.mm(x, ws[i].t(), out_dtype=torch.float32), len(ws))
    else:
        us, spread = graph_time(lambda i: F.linear(x, ws[i]), len(ws))
    record(tag="cublas", m=m, n=n, k=k, us=us, tbps=n * k * 2 / us / 1e6, spread=spread)
    return us


# --- launch cost: empty kernels --------------------------------------------------------------------
EMPTY = r"""
template <int C, bool WAIT>
__global__ void __cluster_dims__(1, C, 1) empty(int* p) {
  if (WAIT) asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;" ::: "memory");
  if (p != nullptr && threadIdx.x == 1023) p[blockIdx.x] = 0;
}
"""


def launch_cost() -> None:
    exprs = [f"empty<{c}, {w}>" for c in (1, 2, 4, 8) for w in ("false", "true")]
    cubin, lowered, _ = toolchain.nvrtc_compile(EMPTY, "empty.cu", toolchain.CompileOptions(prof.target), exprs, what="empty kernels")
    torch.zeros(1, device=dev)
    for e in exprs:
        kern = _load_cubin(cubin, lowered[e], (ctypes.c_void_p,), e)
        c = int(e.split("<")[1].split(",")[0])
        for blocks in (132, 256):
            for pdl in (False, True):
                la = Launch(e, (blocks // c, c, 1), (256, 1, 1), 0, pdl)
                us, _ = graph_time(lambda i, la=la, kern=kern: kern.launch(la, stream(), (0,)), 64)
                record(tag="empty", expr=e, blocks=blocks, pdl=pdl, us=us)


# --- router ----------------------------------------------------------------------------------------
def b(v: bool) -> str:
    return "true" if v else "false"


def router_launch(m: int, n: int, warps: int, nt: int, ks: int, u: int, pf: bool, pdl: bool, push: bool = False, minb: int = 1) -> Launch:
    mt = 1 if m <= 8 else 2
    return Launch(
        f"hwp90_router<{mt}, {warps}, {nt}, {ks}, {u}, {b(pf)}, {b(push)}, {minb}>", (-(-n // (8 * nt)), ks, 1), (warps * 32, 1, 1), 0, pdl
    )


def planned_router(m: int, n: int) -> Launch:
    from hwprofile_sm90.planning import plan_router

    return plan_router(m=m, n=n, k=7168, split_k=True)


def router_round(ms: tuple[int, ...], configs: list[tuple]) -> None:
    for n in (256, 384):
        for m in ms:
            cublas(m, n, 7168, True)
            timed(planned_router(m, n), m, n, 7168, False, torch.float32, "router_plan")
            for c in configs:
                timed(router_launch(m, n, *c), m, n, 7168, False, torch.float32, "router")


# --- GEMV ------------------------------------------------------------------------------------------
def bulk_launch(n: int, k: int, fp8: bool, warps: int, kc: int, stages: int, bps: int, pdl: bool, scale: int) -> Launch:
    xbytes = (k * 2 + 15) & ~15
    smem = xbytes + stages * warps * kc + 8 * stages
    groups = -(-n // warps)
    grid = min(groups, SMS * bps)
    return Launch(
        f"hwp90_gemv_bulk<{'true' if fp8 else 'false'}, {warps}, {kc}, {stages}, {scale}>", (grid, 1, 1), (warps * 32, 1, 1), smem, pdl
    )


def old_gemv(n: int, k: int, fp8: bool, scale: int) -> Launch:
    """The shared SIMT body as the previous version planned it (split-K over a 2-block cluster below 3 groups per SM)."""
    from hwprofile_sm90.planning import tuning

    return plan_skinny_gemm(tuning(SMS), m=1, n=n, k=k, fp8=fp8, out="bf16", scale=scale, split_k=True)


def gemv_round(
    shapes: list[tuple[int, int]], configs: list[tuple[int, int, int, int, bool]], fp8_configs: list[tuple[int, int, int, int, bool]]
) -> None:
    for n, k in shapes:
        cublas(1, n, k, False)
        timed(old_gemv(n, k, False, 0), 1, n, k, False, torch.bfloat16, "gemv_old")
        for warps, kc, stages, bps, pdl in configs:
            la = bulk_launch(n, k, False, warps, kc, stages, bps, pdl, 0)
            if la.shared_bytes <= 227 * 1024:
                timed(la, 1, n, k, False, torch.bfloat16, "gemv")
        timed(old_gemv(n, k, True, 2), 1, n, k, True, torch.bfloat16, "fp8_old", 2)
        for warps, kc, stages, bps, pdl in fp8_configs:
            la = bulk_launch(n, k, True, warps, kc, stages, bps, pdl, 2)
            if la.shared_bytes <= 227 * 1024:
                timed(la, 1, n, k, True, torch.bfloat16, "fp8", 2)


def simt_launch(n: int, k: int, fp8: bool, warps: int, rows: int, ks: int, u: int, pfkb: int, pdl: bool, scale: int) -> Launch:
    vec = 16 if fp8 else 8
    per = -(-(k // vec) // ks)
    smem = per * (2 if fp8 else 1) * 16
    return Launch(
        f"hwp90_gemv<{b(fp8)}, {warps}, {rows}, {ks}, {u}, {scale}, {pfkb}>",
        (-(-n // (warps * rows)), ks, 1),
        (warps * 32, 1, 1),
        smem,
        pdl,
    )


def gemv_round2(shapes: list[tuple[int, int]], simt: list[tuple], bulk: list[tuple], simt8: list[tuple], bulk8: list[tuple]) -> None:
    for n, k in shapes:
        cublas(1, n, k, False)
        timed(old_gemv(n, k, False, 0), 1, n, k, False, torch.bfloat16, "gemv_old")
        for c in simt:
            timed(simt_launch(n, k, False, *c, 0), 1, n, k, False, torch.bfloat16, "gemv")
        for c in bulk:
            la = bulk_launch(n, k, False, *c, 0)
            if la.shared_bytes <= 227 * 1024:
                timed(la, 1, n, k, False, torch.bfloat16, "gemv_bulk")
        timed(old_gemv(n, k, True, 2), 1, n, k, True, torch.bfloat16, "fp8_old", 2)
        for c in simt8:
            timed(simt_launch(n, k, True, *c, 2), 1, n, k, True, torch.bfloat16, "fp8", 2)
        for c in bulk8:
            la = bulk_launch(n, k, True, *c, 2)
            if la.shared_bytes <= 227 * 1024:
                timed(la, 1, n, k, True, torch.bfloat16, "fp8_bulk", 2)


def host_launch_cost() -> None:
    """Host microseconds per launch of a tiny GEMV: cuLaunchKernel vs cuLaunchKernelEx (PDL)."""
    import time

    x = torch.randn(1, 512, device=dev).bfloat16()
    w = torch.randn(64, 512, device=dev).bfloat16()
    out = torch.empty(1, 64, device=dev, dtype=torch.bfloat16)
    for pdl in (False, True, False, True):
        la = simt_launch(64, 512, False, 4, 2, 1, 4, 0, pdl, 0)
        kern = kernel_for(la)
        args = (out.data_ptr(), x.data_ptr(), w.data_ptr(), 0, 1, 64, 512)
        st = stream()
        for _ in range(200):
            kern.launch(la, st, args)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5000):
            kern.launch(la, st, args)
        dt = (time.perf_counter() - t0) / 5000 * 1e6
        torch.cuda.synchronize()
        record(tag="host_launch", pdl=pdl, us=dt)


def round2() -> None:
    host_launch_cost()
    router_round(
        (1, 4, 8, 9, 12, 16),
        [
            (8, 1, 8, 4, False, False, False),
            (8, 1, 8, 4, False, False, True),
            (8, 1, 8, 4, True, True, True),
            (8, 1, 8, 4, False, True, True),
            (16, 1, 4, 2, True, True, True),
            (16, 1, 4, 2, False, True, True),
            (16, 1, 4, 2, False, False, True),
            (16, 1, 4, 2, False, True, False),
            (8, 2, 8, 4, True, True, True),
            (8, 2, 8, 4, False, True, True),
            (16, 1, 8, 2, False, True, True),
            (16, 2, 4, 2, False, True, True),
            (8, 2, 4, 4, False, True, True),
            (4, 1, 8, 4, False, True, True),
        ],
    )
    shapes = [(2048, 7168), (4096, 4096), (7168, 2048), (4096, 7168), (16384, 5120), (7168, 16384), (28672, 4096), (57344, 7168)]
    simt = [
        (4, 2, 1, 4, 0, False),
        (4, 2, 1, 4, 0, True),
        (4, 2, 1, 4, 128, True),
        (4, 2, 1, 4, 32, True),
        (4, 2, 2, 4, 128, True),
        (4, 2, 2, 4, 0, False),
        (8, 1, 1, 4, 128, True),
        (4, 4, 1, 2, 128, True),
        (8, 2, 1, 4, 256, True),
        (4, 1, 1, 8, 64, True),
    ]
    bulk = [(4, 4096, 4, 2, True), (4, 8192, 3, 2, True), (8, 4096, 5, 1, True)]
    simt8 = [
        (4, 2, 1, 2, 0, False),
        (4, 2, 1, 2, 0, True),
        (4, 2, 1, 2, 128, True),
        (4, 2, 1, 2, 32, True),
        (4, 2, 2, 2, 64, True),
        (8, 1, 1, 4, 64, True),
        (4, 4, 1, 2, 128, True),
        (8, 2, 1, 2, 128, True),
        (4, 2, 1, 4, 128, True),
    ]
    bulk8 = [(4, 4096, 4, 2, True)]
    gemv_round2(shapes, simt, bulk, simt8, bulk8)


def persist_launch(n: int, k: int, fp8: bool, warps: int, rows: int, u: int, bps: int, pdl: bool, scale: int, ld: int = 0) -> Launch:
    groups = -(-n // (warps * rows))
    grid = groups if bps == 0 else min(groups, SMS * bps)
    smem = (k * 2 + 15) // 16 * 16  # x, bf16
    return Launch(f"hwp90_gemv<{b(fp8)}, {warps}, {rows}, {u}, {scale}, {ld}>", (grid, 1, 1), (warps * 32, 1, 1), smem, pdl)


def round3() -> None:
    router_round(
        (1, 2, 4, 6, 8, 9, 12, 16),
        [
            (8, 1, 8, 4, True, True, True),
            (8, 1, 8, 4, True, True, False),
            (16, 1, 4, 2, True, True, True),
            (8, 2, 8, 4, True, True, True),
            (16, 2, 4, 2, True, True, True),
            (8, 1, 4, 4, True, True, True),
            (16, 1, 8, 2, True, True, True),
            (4, 1, 8, 4, True, True, True),
        ],
    )
    shapes = [
        (2048, 7168),
        (4096, 4096),
        (7168, 2048),
        (4096, 7168),
        (16384, 5120),
        (7168, 16384),
        (28672, 4096),
        (57344, 7168),
        (2048, 16384),
    ]
    cfg = [
        (4, 2, 4, 0, False),
        (4, 2, 4, 4, False),
        (4, 2, 4, 4, True),
        (4, 2, 4, 8, False),
        (8, 2, 4, 2, False),
        (4, 2, 8, 2, False),
        (4, 4, 2, 4, False),
        (2, 2, 4, 8, False),
    ]
    cfg8 = [
        (4, 2, 2, 0, False),
        (4, 2, 2, 4, False),
        (4, 2, 4, 4, False),
        (4, 4, 2, 4, False),
        (8, 2, 2, 2, False),
        (4, 2, 4, 8, False),
        (2, 2, 4, 8, False),
        (4, 2, 4, 4, True),
    ]
    for n, k in shapes:
        cublas(1, n, k, False)
        timed(old_gemv(n, k, False, 0), 1, n, k, False, torch.bfloat16, "gemv_old")
        for c in cfg:
            timed(persist_launch(n, k, False, *c, 0), 1, n, k, False, torch.bfloat16, "gemv")
        la = bulk_launch(n, k, False, 4, 4096, 4, 2, True, 0)
        if la.shared_bytes <= 227 * 1024:
            timed(la, 1, n, k, False, torch.bfloat16, "gemv_bulk")
        timed(old_gemv(n, k, True, 2), 1, n, k, True, torch.bfloat16, "fp8_old", 2)
        for c in cfg8:
            timed(persist_launch(n, k, True, *c, 2), 1, n, k, True, torch.bfloat16, "fp8", 2)


def round4() -> None:
    """Register caps for PDL co-residency (MINB), on the round-3 winners."""
    launch_cost()
    configs = []
    for warps, nt, ks, u in ((8, 1, 8, 4), (16, 1, 4, 2), (8, 2, 8, 4), (16, 2, 4, 2)):
        full = 1024 // (warps * 32)
        for minb in sorted({1, max(1, full // 2), full}):
            configs.append((warps, nt, ks, u, True, True, True, minb))
    router_round((1, 4, 8, 9, 12, 16), configs)


def split_launch(n: int, k: int, fp8: bool, warps: int, rows: int, ks: int, u: int, scale: int) -> Launch:
    vec = 16 if fp8 else 8
    smem = -(-(k // vec) // ks) * (2 if fp8 else 1) * 16
    expr = f"hwp90_gemv_simt<{b(fp8)}, __nv_bfloat16, 1, {warps}, {rows}, {ks}, {u}, {scale}>"
    return Launch(expr, (-(-n // (warps * rows)), ks, 1), (warps * 32, 1, 1), smem)


def round5() -> None:
    """GEMV: wider cluster splits for small N, the L2::256B load hint, FP8 tiles; router: the planned launches."""
    router_round((1, 4, 8, 9, 12, 16), [(8, 2, 8, 4, True, True, True, 2), (8, 1, 8, 4, True, True, True, 2)])
    small = [(2048, 7168), (4096, 4096), (7168, 2048), (2048, 16384)]
    big = [(16384, 5120), (28672, 4096), (57344, 7168)]
    for n, k in small + big:
        cublas(1, n, k, False)
        timed(old_gemv(n, k, False, 0), 1, n, k, False, torch.bfloat16, "gemv_old")
        for c in [(4, 2, 4, 4), (8, 2, 2, 4), (4, 1, 4, 8), (8, 1, 4, 4), (4, 2, 2, 8)] if (n, k) in small else []:
            timed(split_launch(n, k, False, *c, 0), 1, n, k, False, torch.bfloat16, "gemv_split")
        for ld in (0, 1):
            for warps, rows, u, bps in ((8, 2, 4, 2), (8, 1, 8, 2), (4, 2, 4, 4)):
                timed(persist_launch(n, k, False, warps, rows, u, bps, False, 0, ld), 1, n, k, False, torch.bfloat16, f"gemv_ld{ld}")
        timed(old_gemv(n, k, True, 2), 1, n, k, True, torch.bfloat16, "fp8_old", 2)
        for c in [(4, 2, 2, 4), (4, 2, 4, 2), (4, 2, 4, 4), (8, 1, 2, 4), (4, 4, 2, 2), (2, 2, 4, 4), (8, 2, 2, 2), (4, 1, 4, 8)]:
            timed(split_launch(n, k, True, *c, 2), 1, n, k, True, torch.bfloat16, "fp8_split", 2)


def round6() -> None:
    """The planned router launches with and without PDL, every M: what the overlap of consecutive calls buys."""
    from hwprofile_sm90.planning import plan_router

    for n in (256, 384):
        for m in range(1, 17):
            la = plan_router(m=m, n=n, k=7168, split_k=True)
            timed(la, m, n, 7168, False, torch.float32, "router_plan_pdl")
            nopdl = Launch(la.name_expression, la.grid, la.block, shared_bytes=la.shared_bytes, pdl=False)
            timed(nopdl, m, n, 7168, False, torch.float32, "router_plan_nopdl")


def round7() -> None:
    """Persistent GEMV with one block per SM, with and without PDL (late session).

    Nsight Compute put the small GEMVs' loss in ramp and tail, a fixed cost per call (1.95 µs by the
    size fit of the bench shapes, about 3.7 µs under 120 MB). PDL was tried before with 4 blocks a SM
    (grid 528, no gain): those blocks leave no registers for the next call's blocks, so nothing can
    overlap. One 8-warp block a SM (97
    registers: 25K of the 64K) leaves room for the next call's block to be resident and wait.
    """
    shapes = [(2048, 7168), (4096, 4096), (7168, 2048), (4096, 7168), (12288, 4096), (28672, 4096)]
    for n, k in shapes:
        cublas(1, n, k, False)
        timed(old_gemv(n, k, False, 0), 1, n, k, False, torch.bfloat16, "gemv_split")
        from hwprofile_sm90.planning import plan_gemv

        timed(plan_gemv(m=1, n=n, k=k, split_k=True), 1, n, k, False, torch.bfloat16, "gemv_planned")
        for warps, rows, u, bps in ((8, 2, 4, 1), (8, 2, 4, 2), (16, 1, 4, 1), (8, 1, 8, 1)):
            for pdl in (False, True):
                timed(persist_launch(n, k, False, warps, rows, u, bps, pdl, 0), 1, n, k, False, torch.bfloat16, f"gemv_bps{bps}")
    for n, k in [(2048, 7168), (4096, 4096), (28672, 4096)]:
        timed(old_gemv(n, k, True, 2), 1, n, k, True, torch.bfloat16, "fp8_planned", 2)
        for warps, rows, u, bps in ((8, 2, 4, 1), (4, 4, 2, 2)):
            for pdl in (False, True):
                timed(persist_launch(n, k, True, warps, rows, u, bps, pdl, 2), 1, n, k, True, torch.bfloat16, f"fp8_bps{bps}", 2)


def round1() -> None:
    launch_cost()
    router_round(
        (1, 8, 9, 16),
        [
            (8, 1, 8, 4, False, False),
            (8, 1, 8, 4, True, False),
            (8, 1, 8, 4, True, True),
            (8, 1, 4, 4, True, True),
            (8, 1, 2, 4, True, True),
            (4, 1, 8, 4, True, True),
            (8, 2, 8, 4, True, True),
            (8, 2, 4, 4, True, True),
            (16, 1, 4, 2, True, True),
            (4, 1, 4, 4, True, True),
        ],
    )
    shapes = [(2048, 7168), (4096, 4096), (7168, 2048), (7168, 16384), (28672, 4096), (57344, 7168)]
    cfg = [
        (8, 2048, 4, 1, False),
        (8, 2048, 4, 1, True),
        (8, 2048, 6, 1, True),
        (8, 1024, 8, 1, True),
        (4, 2048, 8, 1, True),
        (4, 2048, 6, 2, True),
        (4, 4096, 4, 2, True),
        (8, 4096, 4, 1, True),
        (16, 1024, 6, 1, True),
        (8, 1024, 6, 2, True),
    ]
    gemv_round(shapes, cfg, cfg[1:8])


ROUNDS = {"1": round1, "2": round2, "3": round3, "4": round4, "5": round5, "6": round6, "7": round7}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("round", nargs="?", default="7", choices=sorted(ROUNDS), help="which round of variants to time (default 7)")
    rnd = p.parse_args().round
    OUT.mkdir(parents=True, exist_ok=True)
    setup()
    ROUNDS[rnd]()
    (OUT / "variants_sm90.json").write_text(json.dumps(results, indent=1))
    bad = [r for r in results if r.get("bad")]
    print(f"{len(results)} timings, {len(bad)} failed the float64 check", flush=True)


if __name__ == "__main__":
    main()
