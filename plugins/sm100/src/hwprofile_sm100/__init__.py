"""hwprofile-sm100: the architecture plugin for Blackwell datacenter GPUs.

Serves compute capability 10.0 (B200, GB200: ``sm_100a``) and 10.3 (B300, GB300: ``sm_103a``),
each matched exactly. Kernels have been compiled for both targets in CI, not run (no such GPU here).
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

NAME = "sm100"
# B200 and B300 have 148 SMs, GB300 152: plans take the device's own count (kernel_specs(device=)), this
# one only where it is unknown. 227 KB opt-in shared memory per block.
TUNING = ArchTuning(sm_count=148, max_shared_bytes=227 * 1024, max_cluster=8, prefix="hwp100")
ARCH = ArchSpec({(10, 0): "sm_100a", (10, 3): "sm_103a"}, "NVIDIA Blackwell datacenter (B200, B300, GB300): tcgen05, TMEM")


@hookimpl
def hwprofile_arch() -> ArchSpec:
    return ARCH


# Nothing here was measured on SM100 (no such GPU here): every value is hwprofile.plugin.unmeasured_settings's, the
# rule every plugin of an unmeasured SKU states (the cost model by the bandwidth rule at this device's peak, the kernels'
# M limits, split-K), so `hwprofile explain OP --shape MxNxK` says "predicted, not measured on this SKU" and
# `hwprofile tune` measures these ops first. Only what differs is stated here: the SKU and why split-K.
_SKU = "SM100"
_SPLIT_K = "spread small N over the SMs with cluster split-K (the GEMVs, the router GEMM and the small-M linear kernel)"


@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    return dict(unmeasured_settings(device, sku=_SKU, split_k_reason=_SPLIT_K))


@hookimpl
def hwprofile_env_defaults(device: DeviceInfo, settings: Mapping[str, Any]) -> dict[str, EnvDefault]:
    return arch_env_defaults(device, ARCH.targets, "tcgen05/TMEM need the arch-specific target")


@hookimpl
def hwprofile_kernels(device: DeviceInfo, target: str) -> list[KernelSpec]:
    """The shared skinny-GEMM family (and ``ops.moe_gate``'s fused gate on it) for sm_100a / sm_103a,
    planned for this device's SM count and shared memory."""
    return family_kernels(__name__, "kernels/sm100_gemv.cu", TUNING, device)
