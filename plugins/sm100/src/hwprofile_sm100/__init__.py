"""hwprofile-sm100: the architecture plugin for Blackwell datacenter GPUs.

Serves compute capability 10.0 (B200, GB200: ``sm_100a``) and 10.3 (B300, GB300: ``sm_103a``),
each matched exactly. Kernels have been compiled for both targets in CI, not run (no such GPU here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofile.plugin import ArchSpec, ArchTuning, DeviceInfo, EnvDefault, KernelSpec, Value, gate_kernel_spec, hookimpl, kernel_specs

NAME = "sm100"
# B200 and B300 have 148 SMs, GB300 152: plans take the device's own count (kernel_specs(device=)), this
# one only where it is unknown. 227 KB opt-in shared memory per block.
TUNING = ArchTuning(sm_count=148, max_shared_bytes=227 * 1024, max_cluster=8, prefix="hwp100")
_ARCH_LIST = {(10, 0): "10.0a", (10, 3): "10.3a"}


@hookimpl
def hwprofile_arch() -> ArchSpec:
    return ArchSpec({(10, 0): "sm_100a", (10, 3): "sm_103a"}, "NVIDIA Blackwell datacenter (B200, B300, GB300): tcgen05, TMEM")


# Nothing below was measured on SM100 (no such GPU here): `hwprofile explain KEY` says "not measured on this
# architecture" for each, and `hwprofile.tuning.unmeasured` lists them for a sweep. Each value dispatches only where a
# rule supports it, never the op table's wide defaults:
#  * rule "H200 box": the region where the same op's kernel won on the H200 sweep (hwprofile-sm90's measured boxes). The
#    GEMVs there are bandwidth-bound on both sides; the kernel's edge is the fallback's fixed per-call cost, which is
#    no smaller on SM100, while from N = 16384 or K = 16384 cuBLAS reached 3.6-4.0 TB/s (75-83% of the H200's roof),
#    leaving no gap to win. So the box stays inside what was won, and the near-roof gap is not needed.
#  * rule "FP8 traffic": the FP8 fallback dequantises the weight to bf16 chunks before its GEMM, so it moves at least
#    3x the kernel's bytes (read e4m3, write and read bf16); on any bandwidth-bound part the kernel moves a third of
#    the bytes. Used inside the swept region only (K is also bounded by the x slice in shared memory).
_UNMEASURED = "not measured on SM100"
_H200_BOX = f"{_UNMEASURED}; rule 'H200 box' (module comment): the region the H200 sweep won"
_FP8_RULE = f"{_UNMEASURED}; rule 'FP8 traffic' (module comment), inside the region the H200 sweep measured"


@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    against = "linear_bf16_fp32 (torch.mm out_dtype=fp32, cuBLAS)"
    return {
        "router_gemm.max_tokens": Value(
            16,
            f"from the design guide's engine history (that engine's JIT router kernel on SM100 against {against}: "
            f"wins at M <= 12, ties at 13-16); {_UNMEASURED} for hwprofile's kernel",
        ),
        "router_gemm.min_n": Value(256, _H200_BOX),
        "router_gemm.max_n": Value(384, _H200_BOX),
        "router_gemm.min_k": Value(7168, _H200_BOX),
        "router_gemm.max_k": Value(7168, _H200_BOX),
        "linear_bf16_fp32.max_tokens": Value(8, f"conservative: half the H200's M <= 16 ({_UNMEASURED} against {against})"),
        "linear_bf16_fp32.min_n": Value(256, _H200_BOX),
        "linear_bf16_fp32.max_n": Value(4096, _H200_BOX),
        "linear_bf16_fp32.min_k": Value(7168, _H200_BOX),
        "linear_bf16_fp32.max_k": Value(7168, _H200_BOX),
        "gemv.split_k": Value(
            True,
            "spread small N over 148 SMs with cluster split-K (the GEMVs, the router GEMM and the small-M linear kernel); "
            f"not bit-identical, opt out with HWPROFILE_GEMV_SPLIT_K=0; {_UNMEASURED}",
        ),
        "gemv.max_n": Value(4096, f"{_H200_BOX}: N <= 4096"),
        "gemv.max_k": Value(7168, f"{_H200_BOX}: K <= 7168"),
        "gemv.cublas_roof_n_min": Value(0, "no gap: the box already leaves cuBLAS's near-roof range (N >= 12288) to cuBLAS"),
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
    arch = _ARCH_LIST.get(device.compute_capability, "10.0a")
    return {
        "TORCH_CUDA_ARCH_LIST": EnvDefault(
            arch, f"build torch extensions for sm_{arch[:-1].replace('.', '')}a: tcgen05/TMEM need the arch-specific target"
        ),
        "CUDA_MODULE_LOADING": EnvDefault("LAZY", "load kernels on first use: less context memory, faster start"),
    }


@hookimpl
def hwprofile_kernels(device: DeviceInfo, target: str) -> list[KernelSpec]:
    """The shared skinny-GEMM family (and ``ops.moe_gate``'s fused gate on it) for sm_100a / sm_103a, planned for this device's SM count and shared memory."""
    return [*kernel_specs(__name__, "kernels/sm100_gemv.cu", TUNING, device=device), gate_kernel_spec(__name__, "kernels/sm100_gemv.cu", TUNING, device)]
