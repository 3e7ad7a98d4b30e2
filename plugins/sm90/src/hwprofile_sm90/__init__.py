"""hwprofile-sm90: the architecture plugin for Hopper (compute capability 9.0: H100, H200, H20).

Every value carries its reason. Thresholds were measured on an H200 (see benchmarks/RESULTS.md)
against the fallbacks named in their reasons.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofile.plugin import ArchSpec, ArchTuning, DeviceInfo, EnvDefault, KernelSpec, Stamp, Value, hookimpl, kernel_specs

NAME = "sm90"
TUNING = ArchTuning(sm_count=132, max_shared_bytes=227 * 1024, max_cluster=8)


@hookimpl
def hwprofile_arch() -> ArchSpec:
    return ArchSpec({(9, 0): "sm_90a"}, "NVIDIA Hopper (H100, H200, H20): wgmma, TMA, clusters, 227 KB smem/block")


# Every measured threshold carries the stamp of the sweep it came from (benchmarks/h200/sweeps/*.toml,
# `hwprofile sweep OP` on the lent H200, 2026-11-30). hwprofile reports a value as stale when the
# device, this plugin's version, the kernel source or the fallback (torch, cuBLAS) changes.
_H200: dict[str, Any] = {
    "device": "NVIDIA H200 sm_90 140 GiB",
    "compute_capability": (9, 0),
    "plugin": NAME,
    "plugin_version": "0.1.0",
    "kernel": "3393218f5c1aad15269b853b94443cdb34873642ae2a25fa9393e451c224792b",
    "date": "2026-11-30",
}
_LIBS = {"torch": "2.11.0", "cublas": "13.1.0.3", "cublaslt": "13.1.0.3"}
ROUTER = Stamp("router_gemm", fallback={"function": "torch.mm(out_dtype=torch.float32)", **_LIBS}, **_H200)
LINEAR = Stamp("linear_bf16_fp32", fallback={"function": "torch.mm(out_dtype=torch.float32)", **_LIBS}, **_H200)
GEMV = Stamp("gemv", fallback={"function": "torch.nn.functional.linear", **_LIBS}, **_H200)
FP8 = Stamp("fp8_gemv", fallback={"function": "dequantise + torch.nn.functional.linear", **_LIBS}, **_H200)


@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    return {
        # sweep: kernel 3.8-4.4 us (N=256) / 4.7-5.4 us (N=384) vs cuBLAS 6.4-7.8 us at every M = 1..16.
        "router_gemm.max_tokens": Value(16, "kernel faster at every M = 1..16, N = 256 and 384", ROUTER),
        # sweep: N=256 wins to M=16; N=4096 wins to M=8 (17.9-18.3 vs 20 us) and loses from M=9 (25 vs 20 us).
        "linear_bf16_fp32.max_tokens": Value(8, "N=4096 loses from M=9", LINEAR),
        "linear_bf16_fp32.max_n": Value(4096, "widest N swept", LINEAR),
        "gemv.split_k": Value(True, "small N leaves most of the 132 SMs idle without split-K over a cluster; not bit-identical, opt out with HWPROFILE_GEMV_SPLIT_K=0"),
        # sweep over N x K: the largest all-winning box is N <= 12288, K <= 4096 (1.03-1.21x); at
        # K >= 7168 or N >= 16384 cuBLAS ties or wins (it reaches 3.5-4.2 TB/s there).
        "gemv.max_n": Value(12288, "largest all-winning box of the sweep: N <= 12288", GEMV),
        "gemv.max_k": Value(4096, "largest all-winning box of the sweep: K <= 4096", GEMV),
        "gemv.cublas_roof_n_min": Value(0, "no gap: the box already leaves cuBLAS's near-roof range to cuBLAS", GEMV),
        "gemv.cublas_roof_n_max": Value(0, "no gap", GEMV),
        # FP8: the fallback dequantises the whole weight every call; the kernel won 12-29x at every
        # swept shape, N up to 152064 (this sweep) and K up to 16384 (sweeps_first/fp8_gemv.toml).
        "fp8_gemv.max_n": Value(152064, "every swept N won", FP8),
        "fp8_gemv.max_k": Value(16384, "every swept K won", FP8),
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
    return kernel_specs(__name__, "kernels/skinny_gemm.cu", TUNING)
