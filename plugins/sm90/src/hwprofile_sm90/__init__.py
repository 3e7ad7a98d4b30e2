"""hwprofile-sm90: the architecture plugin for Hopper (compute capability 9.0: H100, H200, H20).

Every value carries its reason. Thresholds were measured on an H200 (see benchmarks/RESULTS.md)
against the fallbacks named in their reasons.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofile import ArchSpec, EnvDefault, Value, hookimpl
from hwprofile.skinny import ArchTuning, kernel_specs

NAME = "sm90"
TUNING = ArchTuning(sm_count=132, max_shared_bytes=227 * 1024, max_cluster=8)


@hookimpl
def hwprofile_arch() -> ArchSpec:
    return ArchSpec({(9, 0): "sm_90a"}, "NVIDIA Hopper (H100, H200, H20): wgmma, TMA, clusters, 227 KB smem/block")


@hookimpl
def hwprofile_settings(device: Any, resolved: Mapping[str, Any]) -> dict[str, Any]:
    against = "torch.mm(out_dtype=torch.float32) (cuBLAS) on an H200"
    return {
        "router_gemm.max_tokens": Value(16, f"JIT router GEMM compiled for M = 1..16; measured against {against}"),
        "linear_bf16_fp32.max_tokens": Value(16, f"small-M kernel measured against {against}"),
        "gemv.split_k": Value(True, "small N leaves most of the 132 SMs idle without split-K over a cluster; not bit-identical, opt out with HWPROFILE_GEMV_SPLIT_K=0"),
        # cuBLAS reaches 3.2-3.7 TB/s for N >= 16K on the H200 (near the 4.3 TB/s copy roof),
        # but only 1.7-1.9 TB/s at N = 2048-7168, where the kernel is used.
        "gemv.cublas_roof_n_min": Value(12288, "cuBLAS bf16 GEMV is near the bandwidth roof from N = 12288 on the H200"),
        "gemv.cublas_roof_n_max": Value(32768, "from N = 32768 the kernel beats cuBLAS again on the H200"),
        "fp8_gemv.cublas_roof_n_min": Value(0, "FP8 fallback dequantises then runs a bf16 GEMV: the kernel wins at every N"),
        "fp8_gemv.cublas_roof_n_max": Value(0, "no gap: the kernel is used over the whole N range"),
        "fp8_gemv.k_multiple": Value(512, "K tiles of 512 e4m3 values"),
    }


@hookimpl
def hwprofile_env_defaults(device: Any, settings: Mapping[str, Any]) -> dict[str, EnvDefault]:
    return {
        "TORCH_CUDA_ARCH_LIST": EnvDefault("9.0a", "build torch extensions for sm_90a so wgmma/TMA code paths are compiled in"),
        "CUDA_MODULE_LOADING": EnvDefault("LAZY", "load kernels on first use: less context memory and a faster start with large libraries"),
    }


@hookimpl
def hwprofile_kernels(device: Any, target: str) -> list[Any]:
    return kernel_specs(__name__, "kernels/skinny_gemm.cu", TUNING)
