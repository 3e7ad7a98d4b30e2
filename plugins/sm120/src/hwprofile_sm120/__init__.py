"""hwprofile-sm120: the architecture plugin for Blackwell workstation GPUs and DGX Spark.

Serves compute capability 12.0 (RTX PRO 6000, RTX 5090: ``sm_120a``) and 12.1 (DGX Spark GB10:
``sm_121a``), each matched exactly. SM12x has no tcgen05/TMEM and about 99 KB of shared memory per
block, so datacenter-Blackwell kernels do not apply. Kernels compiled in CI, not run here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofile.plugin import ArchSpec, ArchTuning, DeviceInfo, EnvDefault, KernelSpec, Value, gate_kernel_spec, hookimpl, kernel_specs

NAME = "sm120"
_SMEM = 99 * 1024  # opt-in shared memory per block on SM12x
# The reference card of each capability; plans take the device's own SM count and shared memory
# (kernel_specs(device=): an RTX 5090 has 170 SMs, not the RTX PRO 6000's 188), these only where unknown.
_TUNING = {
    (12, 0): ArchTuning(sm_count=188, max_shared_bytes=_SMEM, max_cluster=8, prefix="hwp120"),  # RTX PRO 6000
    (12, 1): ArchTuning(sm_count=48, max_shared_bytes=_SMEM, max_cluster=8, prefix="hwp120"),  # DGX Spark GB10
}


@hookimpl
def hwprofile_arch() -> ArchSpec:
    return ArchSpec(
        {(12, 0): "sm_120a", (12, 1): "sm_121a"}, "NVIDIA Blackwell workstation / DGX Spark: no tcgen05/TMEM, ~99 KB smem/block"
    )


# Nothing below was measured on SM12x (no such GPU here): `hwprofile explain KEY` says "not measured on this
# architecture" for each, and `hwprofile.tuning.unmeasured` lists them for a sweep. Each value dispatches only where a
# rule supports it, never the op table's wide defaults:
#  * rule "H200 box": the region where the same op's kernel won on the H200 sweep (hwprofile-sm90's measured boxes).
#    The GEMVs are bandwidth-bound on both sides; the kernel's edge is the fallback's fixed per-call cost. SM12x parts
#    have less bandwidth (RTX PRO 6000: 1.8 TB/s GDDR7; DGX Spark: 273 GB/s LPDDR5X), so a given shape is more
#    bandwidth-bound there and that fixed cost weighs less: the box can only shrink, never grow, and stays as measured.
#  * rule "FP8 traffic": the FP8 fallback dequantises the weight to bf16 chunks before its GEMM, so it moves at least
#    3x the kernel's bytes (read e4m3, write and read bf16): on a bandwidth-bound part the kernel moves a third of the
#    bytes. With no tcgen05 on SM12x, cuBLAS FP8 at M = 1 is no alternative. Inside the swept region only (K is also
#    bounded by the x slice in ~99 KB of shared memory).
_UNMEASURED = "not measured on SM120"
_H200_BOX = f"{_UNMEASURED}; rule 'H200 box' (module comment): the region the H200 sweep won"
_FP8_RULE = f"{_UNMEASURED}; rule 'FP8 traffic' (module comment), inside the region the H200 sweep measured"


@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "router_gemm.max_tokens": Value(
            16, f"JIT router GEMM compiled for M = 1..16; {_UNMEASURED} against the fp32-output cuBLAS fallback"
        ),
        "router_gemm.min_n": Value(256, _H200_BOX),
        "router_gemm.max_n": Value(384, _H200_BOX),
        "router_gemm.min_k": Value(7168, _H200_BOX),
        "router_gemm.max_k": Value(7168, _H200_BOX),
        "linear_bf16_fp32.max_tokens": Value(8, f"conservative: half the H200's M <= 16 ({_UNMEASURED} against torch.mm(out_dtype=fp32))"),
        "linear_bf16_fp32.min_n": Value(256, _H200_BOX),
        "linear_bf16_fp32.max_n": Value(4096, _H200_BOX),
        "linear_bf16_fp32.min_k": Value(7168, _H200_BOX),
        "linear_bf16_fp32.max_k": Value(7168, _H200_BOX),
        # SM12x has no tcgen05/TMEM and ~99 KB of shared memory per block, so the datacenter Blackwell GEMM paths do
        # not apply; the SIMT/mma.sync kernels need split-K to fill the SMs.
        "gemv.split_k": Value(
            True,
            "SM12x: no tcgen05/TMEM, ~99 KB smem/block: split-K over a cluster fills the SMs at small N "
            "(the GEMVs, the router GEMM and the small-M linear kernel); "
            f"not bit-identical (summation order), opt out with HWPROFILE_GEMV_SPLIT_K=0; {_UNMEASURED}",
        ),
        "gemv.max_n": Value(4096, f"{_H200_BOX}: N <= 4096"),
        "gemv.max_k": Value(7168, f"{_H200_BOX}: K <= 7168"),
        "gemv.cublas_roof_n_min": Value(0, "no gap: the box already leaves the fallback's near-roof range (N >= 12288) to it"),
        "gemv.cublas_roof_n_max": Value(0, "no gap"),
        "fp8_gemv.min_n": Value(2048, _FP8_RULE),
        "fp8_gemv.max_n": Value(152064, _FP8_RULE),
        "fp8_gemv.min_k": Value(2048, _FP8_RULE),
        "fp8_gemv.max_k": Value(7168, _FP8_RULE),
        "fp8_gemv.cublas_roof_n_min": Value(0, "no gap: rule 'FP8 traffic' holds at every N"),
        "fp8_gemv.cublas_roof_n_max": Value(0, "no gap"),
    }


@hookimpl
def hwprofile_env_defaults(device: DeviceInfo, settings: Mapping[str, Any]) -> dict[str, EnvDefault]:
    arch = "12.1a" if device.compute_capability == (12, 1) else "12.0a"
    return {
        "TORCH_CUDA_ARCH_LIST": EnvDefault(arch, "build torch extensions for the arch-specific SM12x target (FP4/FP8 block-scaled MMA)"),
        "CUDA_MODULE_LOADING": EnvDefault("LAZY", "load kernels on first use: less context memory, faster start"),
    }


@hookimpl
def hwprofile_kernels(device: DeviceInfo, target: str) -> list[KernelSpec]:
    """The shared skinny-GEMM family (and ``ops.moe_gate``'s fused gate on it) for sm_120a / sm_121a, planned for this device's SM count and shared memory."""
    tuning = _TUNING.get(device.compute_capability, _TUNING[(12, 0)])
    return [*kernel_specs(__name__, "kernels/sm120_gemv.cu", tuning, device=device), gate_kernel_spec(__name__, "kernels/sm120_gemv.cu", tuning, device)]
