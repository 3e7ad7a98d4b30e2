"""A downstream inference engine's hwprofile plugin (the design guide's case 2, for real).

* Declares ``myengine.fused_shared_experts``: a fused kernel path, off by default, turned on by
  default only on SM120/SM121 (RTX PRO 6000, DGX Spark), where the unfused path falls back to an
  fp32 SIMT GEMM costing ~14 % of each decode step. It is not bit-identical (split-K reduction
  order); the opt-out is ``HWPROFILE_MYENGINE_FUSED_SHARED_EXPERTS=0``, and any value the user sets
  wins because the user's environment is hwprofile's top layer.
* Overrides an architecture plugin's threshold: this engine runs EAGLE speculative decoding with
  at most 2 x 4 draft tokens per request, so it caps the router kernel at M = 8.
* Exports the flag as the engine's own env variable, as a default that never overwrites the user.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwprofile.plugin import DeviceInfo, EnvDefault, Setting, Value, hookimpl

SM12X = {(12, 0), (12, 1)}


@hookimpl
def hwprofile_declare_settings() -> list[Setting]:
    return [
        Setting(
            "myengine.fused_shared_experts",
            "bool",
            False,
            "fuse the shared-expert GEMM into the routed-expert kernel",
            bit_identical=False,
        )
    ]


@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "router_gemm.max_tokens": Value(
            min(8, resolved["router_gemm.max_tokens"]), "myengine: at most 8 speculative tokens reach the router"
        ),
    }
    if device.compute_capability in SM12X:
        out["myengine.fused_shared_experts"] = Value(
            True, "SM12x: unfused path is an fp32 SIMT GEMM (~14% of decode); ~99 KB smem fits the fused tile"
        )
    return out


@hookimpl
def hwprofile_env_defaults(device: DeviceInfo, settings: Mapping[str, Any]) -> dict[str, EnvDefault]:
    return {
        "MYENGINE_FUSED_SHARED_EXPERTS": EnvDefault(
            "1" if settings["myengine.fused_shared_experts"] else "0",
            "mirrors hwprofile setting myengine.fused_shared_experts for the engine's own flag",
            bit_identical=not settings["myengine.fused_shared_experts"],
        )
    }
