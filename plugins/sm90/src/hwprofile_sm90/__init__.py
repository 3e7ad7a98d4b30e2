"""hwprofile-sm90: the architecture plugin for Hopper (compute capability 9.0: H100, H200, H20).

Every value carries its reason. The per-shape tables and cost models were measured on an H200 (see
benchmarks/RESULTS.md); each carries the stamp of its sweep, shipped in measured/.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hwprofile.plugin import OPS, ArchSpec, DeviceInfo, EnvDefault, KernelSpec, Value, hookimpl, rule_model, shipped_values

NAME = "sm90"


@hookimpl
def hwprofile_arch() -> ArchSpec:
    return ArchSpec({(9, 0): "sm_90a"}, "NVIDIA Hopper (H100, H200, H20): wgmma, TMA, clusters, 227 KB smem/block")


# Every measured value carries the stamp of the sweep it came from: measured/OP.toml holds the [stamp] that
# `hwprofile sweep OP` wrote on the lent H200 (the catalog run of 2026-12-02: benchmarks/h200/2026-12-02-catalog-2/,
# 373 catalog and box-edge shapes) and, as [thresholds], its per-shape table (OP.measured) and the cost model fitted
# from its samples (OP.model). benchmarks/ship_sm90.py writes them from a run's tuned/ folder: re-shipping after a new
# run is that one command. The stamp records the fallback the sweep measured, so when hwprofile's fallback for an op
# changes, hwprofile reports that op's values stale at run time, as it does when the device generation, this plugin,
# the kernel source, its launch plan or, on a real GPU, the major.minor of the fallback's libraries change. The
# kernels' limits (what they take) are the op table's; inside them the measured shapes and the model decide.
# An op of the table with no file here (added since that run, or the gate) is predicted by the bandwidth rule until swept.


MEASURED = Path(__file__).with_name("measured")  #: the shipped sweep files, measured/OP.toml


def predicted() -> tuple[str, ...]:
    """The ops of the table this plugin ships no sweep of: their model is the bandwidth rule, which 'hwprofile tune'
    replaces with a fit on the device. An op added to the table since the H200 run, or one whose fallback changed
    after it (a shipped table would be stale, reported at every start: fp8_gemv, whose catalog run of 2026-12-02
    measured the dequantising fallback that torch._scaled_mm from 4 MiB of weight has replaced) until re-swept
    (benchmarks/run_h200.sh catalog, then benchmarks/ship_sm90.py)."""
    return tuple(op for op in OPS if not (MEASURED / f"{op}.toml").is_file())


def _measured(op: str) -> dict[str, Value]:
    """``op``'s per-shape table and cost model from ``measured/OP.toml``, with its stamp (read on the first call)."""
    return shipped_values(__name__, f"measured/{op}.toml", op, "the H200 catalog sweep (measured/ says which run)")


@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for op, d in OPS.items():  # the op table's ops, whichever it holds: a new op needs no change here
        if (MEASURED / f"{op}.toml").is_file():
            out.update(_measured(op))
        elif any(s[0] == f"{op}.model" for s in d.settings):
            # no sweep of it against today's fallback ships here (predicted()): the bandwidth rule, as for the gate below
            why = f"an H200 against today's {op} fallback (no sweep of it ships in hwprofile_sm90/measured/)"
            out[f"{op}.model"] = rule_model(op, device, sku=why)
    return {
        **out,
        # the fused gate is not swept yet: its model is the bandwidth rule at the device's peak, which
        # 'hwprofile tune' replaces with a fit (explain says "predicted, not measured on this SKU")
        "moe_gate.model": rule_model("moe_gate", device, sku=device.name),
        "linear_bf16_fp32.max_tokens": Value(16, "the kernel's limit (M <= 16); the H200 catalog sweep measured it at M = 1..16"),
        "gemv.split_k": Value(
            True,
            "small N leaves most of the 132 SMs idle without split-K over a cluster (the GEMVs, and the router GEMM "
            "and small-M linear plans); "
            "not bit-identical, opt out with HWPROFILE_GEMV_SPLIT_K=0",
        ),
    }


@hookimpl
def hwprofile_env_defaults(device: DeviceInfo, settings: Mapping[str, Any]) -> dict[str, EnvDefault]:
    return {
        "TORCH_CUDA_ARCH_LIST": EnvDefault("9.0a", "build torch extensions for sm_90a so wgmma/TMA code paths are compiled in"),
        "CUDA_MODULE_LOADING": EnvDefault("LAZY", "load kernels on first use: less context memory and a faster start with large libraries"),
    }


@hookimpl
def hwprofile_kernels(device: DeviceInfo, target: str) -> list[KernelSpec]:
    """sm_90a kernels: the op table's (``kernels/sm90_gemv.cu``), planned per shape (and for this device's SMs) by
    :mod:`hwprofile_sm90.planning`, and the fused gate of ``ops.moe_gate`` (``kernels/moe_gate.cu``, :mod:`hwprofile_sm90.moe_gate`)."""
    from .moe_gate import kernel_spec
    from .planning import kernel_specs

    return [*kernel_specs(__name__, device), kernel_spec(__name__, device)]
