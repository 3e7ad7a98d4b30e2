"""hwprofile-sm90: the architecture plugin for Hopper (compute capability 9.0: H100, H200, H20).

Every value carries its reason. Thresholds were measured on an H200 (see benchmarks/RESULTS.md)
against the fallbacks named in their reasons; each carries the stamp of its sweep, shipped in measured/.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofile.plugin import ArchSpec, DeviceInfo, EnvDefault, KernelSpec, Stamp, Value, hookimpl, shipped_stamp

NAME = "sm90"


@hookimpl
def hwprofile_arch() -> ArchSpec:
    return ArchSpec({(9, 0): "sm_90a"}, "NVIDIA Hopper (H100, H200, H20): wgmma, TMA, clusters, 227 KB smem/block")


# Every measured threshold carries the stamp of the sweep it came from: measured/OP.toml holds the [stamp] and
# [thresholds] that `hwprofile sweep OP` wrote on the lent H200 with kernels/sm90_gemv.cu (2026-11-30; raw sweeps in
# the repository's benchmarks/h200/2026-11-30-sweeps-3/, and -sweeps-4/ for fp8_gemv, re-swept against the chunked,
# fp32-accumulating FP8 fallback). The stamp records the fallback the sweep measured, so when hwprofile's fallback for
# an op changes, hwprofile reports that op's values stale at run time, as it does when the device generation, this
# plugin, the kernel source or, on a real GPU, the major.minor of the fallback's libraries (torch, cuBLAS) change.
#
# The sweeps recorded kernel 49c753f4f64a..., the source with the never-dispatched hwp90_gemv_bulk in it. Moving that
# kernel to benchmarks/kernels/sm90_variants.cu left the code of every instance this plugin ships or plans
# byte-identical for sm_90a (SASS and every per-kernel cubin section compared, with NVRTC 13.0 and 13.5), so the
# shipped copies recorded the new source's digest. Adding the chunked-x GEMV instances for long K (2026-12-02) again
# left every shipped or planned instance byte-identical (benchmarks/compare_instances.py) and the swept shapes' plans
# unchanged, so they record this source's digest, 076d38e963e5... (each file says so beside it);
# tests/test_sm90_stamps.py holds them equal to the raw sweeps in everything else.


def _stamp(op: str) -> Stamp:
    """The stamp of ``op``'s sweep, read from ``measured/OP.toml`` on the first call (remembered until ``hwprofile.reset()``)."""
    return shipped_stamp(__name__, f"measured/{op}.toml", op=op)


@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    router, linear, gemv, fp8 = _stamp("router_gemm"), _stamp("linear_bf16_fp32"), _stamp("gemv"), _stamp("fp8_gemv")
    return {
        # sweep: kernel 2.69-3.18 us (N=256) / 2.87-3.54 us (N=384) vs cuBLAS 6.4-7.8 us at every M = 1..16.
        "router_gemm.max_tokens": Value(16, "kernel faster at every M = 1..16, N = 256 and 384", router),
        # dispatch only where the sweep measured: N = 256..384, K = 7168 (DeepSeek-V3 / Kimi-K2 routers)
        "router_gemm.min_n": Value(256, "smallest N the sweep measured", router),
        "router_gemm.max_n": Value(384, "largest N the sweep measured", router),
        "router_gemm.min_k": Value(7168, "the sweep measured K = 7168 only", router),
        "router_gemm.max_k": Value(7168, "the sweep measured K = 7168 only", router),
        # sweep: N=256 2.7-3.2 vs 6.4-7.5 us; N=4096 17.1-18.6 vs 20.1-21.2 us: the kernel wins at every M.
        "linear_bf16_fp32.max_tokens": Value(16, "kernel faster at every M = 1..16, N = 256 and 4096", linear),
        "linear_bf16_fp32.min_n": Value(256, "narrowest N swept", linear),
        "linear_bf16_fp32.max_n": Value(4096, "widest N swept", linear),
        "linear_bf16_fp32.min_k": Value(7168, "the sweep measured K = 7168 only", linear),
        "linear_bf16_fp32.max_k": Value(7168, "the sweep measured K = 7168 only", linear),
        "gemv.split_k": Value(
            True,
            "small N leaves most of the 132 SMs idle without split-K over a cluster (the GEMVs, and the router GEMM "
            "and small-M linear plans); "
            "not bit-identical, opt out with HWPROFILE_GEMV_SPLIT_K=0",
        ),
        # sweep over N x K: the largest all-winning box is N <= 4096, K <= 7168 (1.03-1.20x); the
        # kernel also wins at N = 7168-12288 for K = 2048-7168 (not a box), ties or loses from K = 16384
        # and N = 16384 (cuBLAS reaches 3.6-4.0 TB/s there).
        "gemv.max_n": Value(4096, "largest all-winning box of the sweep: N <= 4096", gemv),
        "gemv.max_k": Value(7168, "largest all-winning box of the sweep: K <= 7168", gemv),
        "gemv.cublas_roof_n_min": Value(0, "no gap: the box already leaves cuBLAS's near-roof range to cuBLAS", gemv),
        "gemv.cublas_roof_n_max": Value(0, "no gap", gemv),
        # FP8: against the chunked fallback (bf16 dequantise per 32 MB, fp32 product, scale) the kernel
        # won 5-16x at every swept shape: N = 2048..152064, K = 2048..7168; dispatched only there.
        "fp8_gemv.min_n": Value(2048, "smallest N the sweep measured", fp8),
        "fp8_gemv.max_n": Value(152064, "every swept N won", fp8),
        "fp8_gemv.min_k": Value(2048, "smallest K the sweep measured", fp8),
        "fp8_gemv.max_k": Value(7168, "every swept K won; K = 7168 is the widest swept", fp8),
        "fp8_gemv.cublas_roof_n_min": Value(0, "no gap: the kernel won at every swept N (no near-roof fallback for FP8 at M = 1)", fp8),
        "fp8_gemv.cublas_roof_n_max": Value(0, "no gap", fp8),
    }


@hookimpl
def hwprofile_env_defaults(device: DeviceInfo, settings: Mapping[str, Any]) -> dict[str, EnvDefault]:
    return {
        "TORCH_CUDA_ARCH_LIST": EnvDefault("9.0a", "build torch extensions for sm_90a so wgmma/TMA code paths are compiled in"),
        "CUDA_MODULE_LOADING": EnvDefault("LAZY", "load kernels on first use: less context memory and a faster start with large libraries"),
    }


@hookimpl
def hwprofile_kernels(device: DeviceInfo, target: str) -> list[KernelSpec]:
    """sm_90a kernels: the op table's (``kernels/sm90_gemv.cu``), planned per shape (and for this device's SMs) by
    :mod:`hwprofile_sm90.planning`, and the fused gate of ``ops.moe_gate`` (``kernels/moe_gate.cu``, :mod:`hwprofile_sm90.moe_gate`)."""
    from .moe_gate import kernel_spec
    from .planning import kernel_specs

    return [*kernel_specs(__name__, device), kernel_spec(__name__, device)]
