"""hwprofile-sm120: the architecture plugin for Blackwell workstation GPUs and DGX Spark.

Serves compute capability 12.0 (RTX PRO 6000, RTX 5090: ``sm_120a``) and 12.1 (DGX Spark GB10:
``sm_121a``), each matched exactly. SM12x has no tcgen05/TMEM and about 99 KB of shared memory per
block, so datacenter-Blackwell kernels do not apply. Kernels compiled in CI, not run here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofile.plugin import (
    ArchSpec,
    ArchTuning,
    DeviceInfo,
    EnvDefault,
    KernelSpec,
    arch_env_defaults,
    family_kernels,
    hookimpl,
    unmeasured_settings,
)

NAME = "sm120"
_SMEM = 99 * 1024  # opt-in shared memory per block on SM12x
# The reference card of each capability; plans take the device's own SM count and shared memory
# (kernel_specs(device=): an RTX 5090 has 170 SMs, not the RTX PRO 6000's 188), these only where unknown.
_TUNING = {
    (12, 0): ArchTuning(sm_count=188, max_shared_bytes=_SMEM, max_cluster=8, prefix="hwp120"),  # RTX PRO 6000
    (12, 1): ArchTuning(sm_count=48, max_shared_bytes=_SMEM, max_cluster=8, prefix="hwp120"),  # DGX Spark GB10
}


ARCH = ArchSpec({(12, 0): "sm_120a", (12, 1): "sm_121a"}, "NVIDIA Blackwell workstation / DGX Spark: no tcgen05/TMEM, ~99 KB smem/block")


@hookimpl
def hwprofile_arch() -> ArchSpec:
    return ARCH


# Nothing here was measured on SM120 (no such GPU here): every value is hwprofile.plugin.unmeasured_settings's, the
# rule every plugin of an unmeasured SKU states (the cost model by the bandwidth rule at this device's peak, the kernels'
# M limits, split-K), so `hwprofile explain OP --shape MxNxK` says "predicted, not measured on this SKU" and
# `hwprofile tune` measures these ops first. Only what differs is stated here: the SKU and why split-K.
_SKU = "SM120"
_SPLIT_K = (
    "SM12x: no tcgen05/TMEM, ~99 KB smem/block: split-K over a cluster fills the SMs at small N "
    "(the GEMVs, the router GEMM and the small-M linear kernel)"
)


@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    return dict(unmeasured_settings(device, sku=_SKU, split_k_reason=_SPLIT_K))


@hookimpl
def hwprofile_env_defaults(device: DeviceInfo, settings: Mapping[str, Any]) -> dict[str, EnvDefault]:
    return arch_env_defaults(device, ARCH.targets, "the arch-specific SM12x target (FP4/FP8 block-scaled MMA)")


@hookimpl
def hwprofile_kernels(device: DeviceInfo, target: str) -> list[KernelSpec]:
    """The shared skinny-GEMM family (and ``ops.moe_gate``'s fused gate on it) for sm_120a / sm_121a,
    planned for this device's SM count and shared memory."""
    return family_kernels(__name__, "kernels/sm120_gemv.cu", _TUNING.get(device.compute_capability, _TUNING[(12, 0)]), device)
