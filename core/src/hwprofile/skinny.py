"""Launch planning for the shared skinny-GEMM kernel family (``include/hwprofile/gemv.cuh``).

Architecture plugins describe their SM (multiprocessor count, shared memory per block, largest
portable cluster) in an :class:`ArchTuning` and get the four op kernels (router GEMM, fp32-output
linear, bf16 GEMV, FP8 GEMV) as :class:`~hwprofile.jit.KernelSpec` objects whose ``configure``
picks tile sizes and the split-K factor for a shape. The kernel source each plugin ships includes
the shared header and checks its constants against the SM's limits at compile time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from .jit import KernelSpec, Launch

NO_SCALE, TENSOR_SCALE, ROW_SCALE = 0, 1, 2


@dataclass(frozen=True)
class ArchTuning:
    """Per-SM constants the launch plan depends on."""

    sm_count: int
    max_shared_bytes: int  # opt-in dynamic shared memory per block
    max_cluster: int = 8  # portable cluster size
    warps: int = 4
    rows: int = 2
    unroll: int = 4
    fp8_unroll: int = 2
    blocks_per_sm_goal: int = 2  # split K until the grid covers this many blocks per SM


def plan(t: ArchTuning, *, m: int, n: int, k: int, fp8: bool, out: str, scale: int, split_k: bool) -> Launch:
    """Tile and split-K choice for one call; pure, so it is tested on the CPU for every architecture."""
    vec = 16 if fp8 else 8
    xv = 2 if fp8 else 1
    rows_per_block = t.warps * t.rows
    tiles = -(-n // rows_per_block)
    kvec = k // vec
    ksplit = 1

    def smem(ks: int) -> int:
        return m * -(-kvec // ks) * xv * 16

    if split_k:
        # Split K while the grid is short of the goal and each split keeps >= 2 vectors per lane.
        while ksplit < t.max_cluster and tiles * ksplit < t.blocks_per_sm_goal * t.sm_count and kvec // (ksplit * 2) >= 64:
            ksplit *= 2
    while smem(ksplit) > t.max_shared_bytes and ksplit < t.max_cluster:
        ksplit *= 2  # a larger split also shrinks the staged x slice
    if smem(ksplit) > t.max_shared_bytes:
        raise ValueError(f"x slice of {smem(ksplit)} bytes exceeds {t.max_shared_bytes} bytes of shared memory (m={m}, k={k})")
    # Deep unrolling keeps many weight loads in flight; at large M the x operands it would hoist
    # cost more registers than the extra loads buy, so unroll less there.
    unroll = t.fp8_unroll if fp8 else (t.unroll if m <= 4 else 2)
    tout = "float" if out == "float" else "__nv_bfloat16"
    expr = f"hwp_skinny_gemm<{'true' if fp8 else 'false'}, {tout}, {m}, {t.warps}, {t.rows}, {ksplit}, {unroll}, {scale}>"
    return Launch(expr, (tiles, ksplit, 1), (t.warps * 32, 1, 1), smem(ksplit))


ROUTER_SHAPES = [(m, n, 7168) for m in range(1, 17) for n in (256, 384)]
GEMV_SHAPES = [(2048, 7168), (4096, 4096), (7168, 2048), (7168, 16384), (12288, 4096), (16384, 5120), (28672, 4096), (57344, 7168)]


def kernel_specs(package: str, source: str, t: ArchTuning, *, ops: tuple[str, ...] = ("router_gemm", "linear_bf16_fp32", "gemv", "fp8_gemv")) -> list[KernelSpec]:
    """The op kernels of the skinny-GEMM family for one SM, with their pre-built instances.

    ``configure(m=, n=, k=, split_k=, scale=)`` returns the launch for a call; the pre-built
    instances cover the canonical shapes with split-K on and off.
    """
    kinds = {
        "router_gemm": ("router GEMM bf16 x bf16 -> fp32, M = 1..16", ROUTER_SHAPES, False, "float", (NO_SCALE,)),
        "linear_bf16_fp32": ("small-M linear bf16 x bf16 -> fp32", [(m, n, 7168) for m in range(1, 17) for n in (256, 4096)], False, "float", (NO_SCALE,)),
        "gemv": ("bf16 GEMV M = 1, fp32 accumulation", [(1, n, k) for n, k in GEMV_SHAPES], False, "bf16", (NO_SCALE,)),
        "fp8_gemv": ("FP8 e4m3 GEMV M = 1, per-tensor or per-row scale", [(1, n, k) for n, k in GEMV_SHAPES], True, "bf16", (TENSOR_SCALE, ROW_SCALE)),
    }
    specs = []
    for op in ops:
        doc, shapes, fp8, out, scales = kinds[op]
        exprs = {
            plan(t, m=m, n=n, k=k, fp8=fp8, out=out, scale=sc, split_k=sk).name_expression
            for m, n, k in shapes
            for sc in scales
            for sk in (True, False)
        }
        specs.append(KernelSpec(op, package, source, tuple(sorted(exprs)), partial(_configure, t, fp8, out), doc=doc))
    return specs


def _configure(t: ArchTuning, fp8: bool, out: str, *, m: int, n: int, k: int, split_k: bool, scale: int = NO_SCALE) -> Launch:
    return plan(t, m=m, n=n, k=k, fp8=fp8, out=out, scale=scale, split_k=split_k)
