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


# Where and against what every threshold below was measured (benchmarks/RESULTS.md, 2026-11-30).
MEASURED = "H200, torch 2.11.0+cu130, cold L2, CUDA-graph replay, 2026-11-30"
FP32_FALLBACK = "torch.mm(out_dtype=torch.float32) (cuBLAS)"


@hookimpl
def hwprofile_settings(device: Any, resolved: Mapping[str, Any]) -> dict[str, Any]:
    return {
        # Kernel 3.8-4.4 us (N=256) and 4.8-5.3 us (N=384) vs 6.4-7.8 us: wins at every M = 1..16.
        "router_gemm.max_tokens": Value(16, f"kernel wins at every M = 1..16 (1.42-1.74x) against {FP32_FALLBACK}; {MEASURED}"),
        # N=256: wins to M=16; N=4096: wins to M=8 (17.7 vs 20.6 us), loses at M=16 (26.2 vs 20.8 us).
        "linear_bf16_fp32.max_tokens": Value(8, f"N=4096 loses from M=16 against {FP32_FALLBACK}; {MEASURED}"),
        "linear_bf16_fp32.max_n": Value(4096, f"widest N measured to win; wider layers stay on cuBLAS; {MEASURED}"),
        "gemv.split_k": Value(True, "small N leaves most of the 132 SMs idle without split-K over a cluster; not bit-identical, opt out with HWPROFILE_GEMV_SPLIT_K=0"),
        # bf16 GEMV: wins 1.06-1.20x at N <= 7168 with K <= 7168 (latency-bound, < 40 MB of
        # weights); from 100 MB on cuBLAS reaches 3.5-4.2 TB/s and the kernel is 0.89-0.99x.
        "gemv.max_n": Value(7168, f"cuBLAS F.linear wins from N = 12288 (0.89-0.97x) on {MEASURED}"),
        "gemv.max_k": Value(7168, f"cuBLAS F.linear wins at N=7168, K=16384 (0.96x) on {MEASURED}"),
        "gemv.cublas_roof_n_min": Value(0, "no gap needed: gemv.max_n already keeps cuBLAS's near-roof N range"),
        "gemv.cublas_roof_n_max": Value(0, "no gap"),
        # FP8: the fallback dequantises the whole weight every call; the kernel is 15-30x faster.
        "fp8_gemv.max_n": Value(1 << 20, f"kernel wins at every measured N up to 152064 against dequantise + F.linear; {MEASURED}"),
        "fp8_gemv.cublas_roof_n_min": Value(0, "no near-roof fallback for FP8 at M = 1"),
        "fp8_gemv.cublas_roof_n_max": Value(0, "no gap"),
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
