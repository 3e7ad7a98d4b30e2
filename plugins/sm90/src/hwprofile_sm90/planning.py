"""Launch planning for the sm90 kernels (``kernels/sm90_gemv.cu``): which kernel, tiles and grid per shape.

Pure functions of the shape and the SM count, so every plan is tested on the CPU. The choices come
from the variant sweeps on the H200 (``benchmarks/variants_sm90.py``, logs in ``benchmarks/h200/``):

* fp32 output (router GEMM, small-M linear): ``hwp90_router``, always launched with programmatic
  dependent launch. K is split over the block's warps and a cluster of up to 8 blocks until the
  grid has about two blocks per SM; ranks push their partials into rank 0 (``st.async``). Beyond
  32 groups of 8 rows, 16 rows per block where that halves x's traffic (M > 8) or widens the
  cluster (see ``plan_router``).
* bf16 GEMV: when fewer than 3 row groups per SM exist (N < 3168 at 8 rows a group), the shared
  split-K kernel (a 2-block cluster) fills the SMs best; otherwise ``hwp90_gemv``, a persistent
  grid of 2 blocks per SM that stages x once per block.
* FP8 GEMV: at M = 1 the shared SIMT kernel (none of the sm90 variants beat it at every shape); at M = 2..16
  the shared FP8 tensor-core kernel (``hwprofile/skinny_fp8.cuh``), which reads each weight once for all M
  tokens (not measured yet). Both are built from ``kernels/sm90_fp8.cu``.
* Long K: the shared SIMT kernel streams x through shared memory in chunks once a block's slice
  passes 32 KB (K > 16384 bf16 without split-K), and takes the bf16 GEMV where ``hwp90_gemv`` cannot
  keep two blocks' copies of x per SM.

The SM count and shared memory are the device's (driver attributes; a simulated device's catalog).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from hwprofile.plugin import (
    NO_SCALE,
    PREBUILT_SHAPES,
    ArchTuning,
    KernelSpec,
    Launch,
    Planner,
    check_kernel_shape,
    op_def,
    plan_skinny_gemm,
    prebuilt_instances,
)

if TYPE_CHECKING:
    from hwprofile.plugin import DeviceInfo

SOURCE = "kernels/sm90_gemv.cu"
#: the FP8 GEMV's own source (M = 1 SIMT, M = 2..16 tensor cores): a change to it re-measures fp8_gemv alone
SOURCE_FP8 = "kernels/sm90_fp8.cu"
SM_COUNT = 132  # H100 SXM and H200: the plan of a simulated device without a catalog entry
MAX_SHARED = 227 * 1024  # opt-in shared memory per block on sm_90 (the source's kMaxSharedPerBlock)


def tuning(sm_count: int = SM_COUNT, max_shared: int = MAX_SHARED) -> ArchTuning:
    """The planning constants on sm_90 (the shared SIMT body's entry points are ``hwp90_gemv_simt``)."""
    return ArchTuning(sm_count=sm_count, max_shared_bytes=min(max_shared, MAX_SHARED), max_cluster=8, prefix="hwp90")


TUNING = tuning()

PREFETCH_MAX_BYTES = 16 << 20  # router weights prefetched into L2 up to this size (N = 384 x 7168 is 5.5 MB)
# persistent GEMV: 8 warps x 2 rows per group, 4 vectors per row per batch, 2 blocks per SM
GEMV_WARPS, GEMV_ROWS, GEMV_UNROLL, GEMV_BLOCKS_PER_SM = 8, 2, 4, 2


def _b(v: bool) -> str:
    return "true" if v else "false"


def plan_router(*, m: int, n: int, k: int, split_k: bool, sm_count: int = SM_COUNT) -> Launch:
    """fp32-output skinny GEMM (router GEMM, linear_bf16_fp32), 1 <= M <= 16, any N, K a multiple of 8."""
    check_kernel_shape(m=m, n=n, k=k, vec=8, max_m=16, what="sm90 router kernel")
    mt, warps, nt, ksplit, unroll, pf, minb, groups = router_tiles(m=m, n=n, k=k, split_k=split_k, sm_count=sm_count)
    expr = f"hwp90_router<{mt}, {warps}, {nt}, {ksplit}, {unroll}, {_b(pf)}, true, {minb}>"
    return Launch(expr, (groups, ksplit, 1), (warps * 32, 1, 1), shared_bytes=0, pdl=True)


def router_tiles(*, m: int, n: int, k: int, split_k: bool, sm_count: int = SM_COUNT) -> tuple[int, int, int, int, int, bool, int, int]:
    """``hwp90::router``'s tiling for a checked shape: (MT, WARPS, NT, KSPLIT, U, PF, MINB, groups); the fused gate
    (:mod:`hwprofile_sm90.moe_gate`) runs the same GEMM, so it plans with this too."""
    mt = 1 if m <= 8 else 2
    chunks = -(-k // 32)

    def cluster(groups: int) -> int:  # split K until the grid has about 2 blocks per SM
        ks = 1
        while split_k and ks < 8 and groups * ks * 2 <= 2 * sm_count and chunks >= 2 * (ks * 2) * 8:
            ks *= 2
        return ks

    # 16 rows a block (nt = 2) once there are more than 32 groups of 8: with 9-16 tokens it halves
    # x's L2 traffic (N = 4096: 20.3-21.5 against 26 us), and with fewer it pays only where it
    # buys a wider cluster (N = 384: cluster 8 instead of 4, 2.9-3.1 against 3.1-3.4 us); at
    # N = 4096, M <= 8 it loses (19.7 against 17.4 us).
    g8 = -(-n // 8)
    nt = 2 if g8 > 32 and (m > 8 or cluster(-(-n // 16)) > cluster(g8)) else 1
    groups = -(-n // (8 * nt))
    ksplit = cluster(groups)
    warps, unroll = (16, 2) if ksplit == 4 else (8, 4)
    # __launch_bounds__ blocks per SM: 2 x 256 threads caps a thread at 128 registers, so the next PDL
    # launch's blocks fit beside this one's (variants round 4); 16 warps get no cap (64 would spill)
    minb = 2 if warps == 8 else 1
    # L2 prefetch of the weights before griddepcontrol.wait only while they take a small part of the
    # 60 MB L2: at N = 4096 (59 MB) the next call's prefetch evicted lines the running call had yet
    # to read (linear 20.0-20.5 us against 17.4 without it), as in every GEMV variant with prefetch.
    pf = n * k * 2 <= PREFETCH_MAX_BYTES
    return mt, warps, nt, ksplit, unroll, pf, minb, groups


def plan_gemv(
    *, m: int, n: int, k: int, split_k: bool, fp8: bool = False, scale: int = NO_SCALE, t: ArchTuning = TUNING
) -> Launch:
    """bf16-output GEMV, M = 1 (bf16 or FP8 weights) or M = 2..16 (FP8 weights: the family's FP8 tensor-core
    kernel, ``hwp90_skinny_mma`` of ``kernels/sm90_fp8.cu``), planned for the SM count and shared memory of ``t``.

    ``hwp90_gemv`` stages all of x once per block and wants 2 blocks per SM: it takes K while two
    copies of x fit the shared memory of a block (K <= 58112); longer K, like small N and FP8, goes
    to the shared SIMT kernel, which streams x through shared memory in chunks.
    """
    what = "sm90 FP8 GEMV kernel" if fp8 else "sm90 GEMV kernel"
    check_kernel_shape(m=m, n=n, k=k, vec=16 if fp8 else 8, max_m=16 if fp8 else 1, what=what)
    smem = k * 2
    if fp8 or (split_k and n < 3 * t.sm_count * 8) or smem * GEMV_BLOCKS_PER_SM > t.max_shared_bytes:
        return plan_skinny_gemm(t, m=m, n=n, k=k, fp8=fp8, out="bf16", scale=scale, split_k=split_k)
    rows = GEMV_WARPS * GEMV_ROWS
    groups = -(-n // rows)
    grid = min(groups, GEMV_BLOCKS_PER_SM * t.sm_count)
    expr = f"hwp90_gemv<false, {GEMV_WARPS}, {GEMV_ROWS}, {GEMV_UNROLL}, {scale}>"
    return Launch(expr, (grid, 1, 1), (GEMV_WARPS * 32, 1, 1), shared_bytes=smem)


def _configure(
    t: ArchTuning, *, kind: str, fp8: bool, m: int, n: int, k: int, split_k: bool, scale: int = NO_SCALE
) -> Launch:
    if kind == "router":
        return plan_router(m=m, n=n, k=k, split_k=split_k, sm_count=t.sm_count)
    return plan_gemv(m=m, n=n, k=k, split_k=split_k, fp8=fp8, scale=scale, t=t)


def kernel_specs(package: str, device: DeviceInfo | None = None) -> list[KernelSpec]:
    """The family's four op kernels for sm_90a, with its pre-built shapes' instances (``hwprofile compile``).

    The fp32-output ops (router GEMM, small-M linear) take ``hwp90_router``, the M = 1 GEMVs
    :func:`plan_gemv`; which op is which, and which is FP8, is the op table's. Plans use ``device``'s
    SM count and shared memory (an H100 PCIe has 114 SMs, not the H200's 132; a real GPU's read from
    the driver on the first plan, see ``hwprofile.plugin.Planner``); without one, the H200's.
    """
    specs = []
    for op in PREBUILT_SHAPES:  # the ops the skinny-GEMM family computes
        d = op_def(op)
        kind = "router" if d.out_dtype == "float32" else "gemv"
        configure = Planner(partial(_configure, kind=kind, fp8=d.scaled), TUNING, device)
        doc = (
            f"hwp90_router: {d.x_dtype} x {d.w_dtype} -> float32, M = 1..16 (PDL, cluster split-K)"
            if kind == "router"
            else f"GEMV M = 1 (SIMT) and M = 2..16 (tensor cores), {d.w_dtype} weights x scale, fp32 accumulation -> {d.out_dtype}"
            if d.scaled
            else f"GEMV M = 1, {d.w_dtype} weights, fp32 accumulation -> {d.out_dtype}"
        )
        source = SOURCE_FP8 if d.scaled else SOURCE
        specs.append(KernelSpec(op, package, source, prebuilt_instances(op, configure.prebuild()), configure, doc=doc))
    return specs
