"""hwprofile-sm100: the architecture plugin for Blackwell datacenter GPUs.

Serves compute capability 10.0 (B200, GB200: ``sm_100a``) and 10.3 (B300, GB300: ``sm_103a``),
each matched exactly. Kernels have been compiled for both targets in CI, not run (no such GPU here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofile.plugin import ArchSpec, ArchTuning, DeviceInfo, EnvDefault, KernelSpec, Value, hookimpl, kernel_specs

NAME = "sm100"
# B200 and B300 have 148 SMs, GB300 152: plans take the device's own count (kernel_specs(device=)), this
# one only where it is unknown. 227 KB opt-in shared memory per block.
TUNING = ArchTuning(sm_count=148, max_shared_bytes=227 * 1024, max_cluster=8, prefix="hwp100")
_ARCH_LIST = {(10, 0): "10.0a", (10, 3): "10.3a"}


@hookimpl
def hwprofile_arch() -> ArchSpec:
    return ArchSpec({(10, 0): "sm_100a", (10, 3): "sm_103a"}, "NVIDIA Blackwell datacenter (B200, B300, GB300): tcgen05, TMEM")


@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    against = "linear_bf16_fp32 (torch.mm out_dtype=fp32, cuBLAS)"
    return {
        "router_gemm.max_tokens": Value(
            16,
            f"from the design guide's engine history (that engine's JIT router kernel on SM100 against {against}: "
            "wins at M <= 12, ties at 13-16); hwprofile's kernel is not yet measured on SM100",
        ),
        "linear_bf16_fp32.max_tokens": Value(8, f"conservative until measured on SM100 against {against}"),
        "gemv.split_k": Value(
            True,
            "spread small N over 148 SMs with cluster split-K (the GEMVs, the router GEMM and the small-M linear kernel); "
            "not bit-identical, opt out with HWPROFILE_GEMV_SPLIT_K=0",
        ),
        "gemv.cublas_roof_n_min": Value(12288, "assumed as on Hopper until swept on SM100"),
        "gemv.cublas_roof_n_max": Value(32768, "assumed as on Hopper until swept on SM100"),
        "fp8_gemv.cublas_roof_n_min": Value(0, "the FP8 fallback dequantises (bf16 chunks) first: the kernel is used at every N"),
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
    """The shared skinny-GEMM family for sm_100a / sm_103a, planned for this device's SM count and shared memory."""
    return kernel_specs(__name__, "kernels/sm100_gemv.cu", TUNING, device=device)
