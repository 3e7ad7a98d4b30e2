"""hwprofile-sm90: the architecture plugin for Hopper (compute capability 9.0: H100, H200, H20).

Every value carries its reason. Thresholds were measured on an H200 (see benchmarks/RESULTS.md)
against the fallbacks named in their reasons.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofile.plugin import ArchSpec, DeviceInfo, EnvDefault, KernelSpec, Value, hookimpl, measured_stamp

NAME = "sm90"


@hookimpl
def hwprofile_arch() -> ArchSpec:
    return ArchSpec({(9, 0): "sm_90a"}, "NVIDIA Hopper (H100, H200, H20): wgmma, TMA, clusters, 227 KB smem/block")


# Every measured threshold carries the stamp of the sweep it came from (benchmarks/h200/2026-11-30-sweeps-3/*.toml:
# `hwprofile sweep OP` on the lent H200 with kernels/sm90_gemv.cu, 2026-11-30).
# The fallback function each stamp records is the op table's (measured_stamp): tests/test_sm90_stamps.py
# pins the functions these sweeps measured against, so a change of an op's fallback fails that test
# until the op is re-swept. hwprofile reports a value as stale when the device generation, this plugin,
# the kernel source or, on a real GPU, the major.minor of the fallback's libraries (torch, cuBLAS) change.
_H200: dict[str, Any] = {
    "device": "NVIDIA H200 sm_90 140 GiB",
    "compute_capability": (9, 0),
    "plugin": NAME,
    "plugin_version": "0.1.0",
    # The sweeps recorded 49c753f4f64a..., the source with the never-dispatched hwp90_gemv_bulk in it.
    # Moving that kernel to benchmarks/kernels/sm90_variants.cu left the code of every instance this
    # plugin ships or plans byte-identical for sm_90a (SASS and every per-kernel cubin section compared,
    # with NVRTC 13.0 and 13.5), so the thresholds hold for the new source's digest:
    "kernel": "b8db0e617eeaee3c8d1f7bf8e2be429e153413237ea755a551307d03617148aa",
    "date": "2026-11-30",
}
_LIBS = {"torch": "2.11.0", "cublas": "13.1.0.3", "cublaslt": "13.1.0.3"}
ROUTER = measured_stamp("router_gemm", libraries=_LIBS, **_H200)
LINEAR = measured_stamp("linear_bf16_fp32", libraries=_LIBS, **_H200)
GEMV = measured_stamp("gemv", libraries=_LIBS, **_H200)
# re-swept against the chunked, fp32-accumulating FP8 fallback (benchmarks/h200/2026-11-30-sweeps-4/fp8_gemv.toml, same kernel)
FP8 = measured_stamp("fp8_gemv", libraries=_LIBS, **_H200)


@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    return {
        # sweep: kernel 2.69-3.18 us (N=256) / 2.87-3.54 us (N=384) vs cuBLAS 6.4-7.8 us at every M = 1..16.
        "router_gemm.max_tokens": Value(16, "kernel faster at every M = 1..16, N = 256 and 384", ROUTER),
        # dispatch only where the sweep measured: N = 256..384, K = 7168 (DeepSeek-V3 / Kimi-K2 routers)
        "router_gemm.min_n": Value(256, "smallest N the sweep measured", ROUTER),
        "router_gemm.max_n": Value(384, "largest N the sweep measured", ROUTER),
        "router_gemm.min_k": Value(7168, "the sweep measured K = 7168 only", ROUTER),
        "router_gemm.max_k": Value(7168, "the sweep measured K = 7168 only", ROUTER),
        # sweep: N=256 2.7-3.2 vs 6.4-7.5 us; N=4096 17.1-18.6 vs 20.1-21.2 us: the kernel wins at every M.
        "linear_bf16_fp32.max_tokens": Value(16, "kernel faster at every M = 1..16, N = 256 and 4096", LINEAR),
        "linear_bf16_fp32.min_n": Value(256, "narrowest N swept", LINEAR),
        "linear_bf16_fp32.max_n": Value(4096, "widest N swept", LINEAR),
        "linear_bf16_fp32.min_k": Value(7168, "the sweep measured K = 7168 only", LINEAR),
        "linear_bf16_fp32.max_k": Value(7168, "the sweep measured K = 7168 only", LINEAR),
        "gemv.split_k": Value(
            True,
            "small N leaves most of the 132 SMs idle without split-K over a cluster; "
            "not bit-identical, opt out with HWPROFILE_GEMV_SPLIT_K=0",
        ),
        # sweep over N x K: the largest all-winning box is N <= 4096, K <= 7168 (1.03-1.20x); the
        # kernel also wins at N = 7168-12288 for K = 2048-7168 (not a box), ties or loses from K = 16384
        # and N = 16384 (cuBLAS reaches 3.6-4.0 TB/s there).
        "gemv.max_n": Value(4096, "largest all-winning box of the sweep: N <= 4096", GEMV),
        "gemv.max_k": Value(7168, "largest all-winning box of the sweep: K <= 7168", GEMV),
        "gemv.cublas_roof_n_min": Value(0, "no gap: the box already leaves cuBLAS's near-roof range to cuBLAS", GEMV),
        "gemv.cublas_roof_n_max": Value(0, "no gap", GEMV),
        # FP8: against the chunked fallback (bf16 dequantise per 32 MB, fp32 product, scale) the kernel
        # won 5-16x at every swept shape: N = 2048..152064, K = 2048..7168; dispatched only there.
        "fp8_gemv.min_n": Value(2048, "smallest N the sweep measured", FP8),
        "fp8_gemv.max_n": Value(152064, "every swept N won", FP8),
        "fp8_gemv.min_k": Value(2048, "smallest K the sweep measured", FP8),
        "fp8_gemv.max_k": Value(7168, "every swept K won; K = 7168 is the widest swept", FP8),
        "fp8_gemv.cublas_roof_n_min": Value(0, "no near-roof fallback for FP8 at M = 1"),
        "fp8_gemv.cublas_roof_n_max": Value(0, "no gap"),
    }


@hookimpl
def hwprofile_env_defaults(device: DeviceInfo, settings: Mapping[str, Any]) -> dict[str, EnvDefault]:
    return {
        "TORCH_CUDA_ARCH_LIST": EnvDefault("9.0a", "build torch extensions for sm_90a so wgmma/TMA code paths are compiled in"),
        "CUDA_MODULE_LOADING": EnvDefault("LAZY", "load kernels on first use: less context memory and a faster start with large libraries"),
    }


@hookimpl
def hwprofile_kernels(device: DeviceInfo, target: str) -> list[KernelSpec]:
    """sm_90a kernels (``kernels/sm90_gemv.cu``), planned per shape by :mod:`hwprofile_sm90.planning`."""
    from .planning import kernel_specs

    return kernel_specs(__name__)
